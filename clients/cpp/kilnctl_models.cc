#include "clients/cpp/kilnctl_models.h"

#include <charconv>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "clients/cpp/report_format.h"

namespace kiln {
namespace {

std::string StateName(v1::ModelState s) {
  switch (s) {
    case v1::MODEL_STATE_AVAILABLE: return "available";
    case v1::MODEL_STATE_LOADING: return "loading";
    case v1::MODEL_STATE_READY: return "ready";
    case v1::MODEL_STATE_FAILED: return "FAILED";
    case v1::MODEL_STATE_UNLOADING: return "unloading";
    default: return "?";
  }
}

void PrintModels(const std::vector<const v1::ModelVersionInfo*>& models) {
  std::vector<std::vector<std::string>> rows;
  for (const v1::ModelVersionInfo* m : models) {
    std::string inputs;
    for (const v1::SignatureEntry& e : m->signature().inputs()) {
      absl::StrAppend(&inputs, inputs.empty() ? "" : ", ", e.name());
      // An input the import needs by value: each distinct value compiles its own program.
      for (const std::string& v : m->value_inputs()) {
        if (v == e.name()) absl::StrAppend(&inputs, " (by value)");
      }
    }
    rows.push_back({m->name(), absl::StrCat(m->version()), StateName(m->state()), m->graph_file(),
                    absl::StrJoin(m->weight_files(), " "),
                    m->param_bytes() > 0 ? HumanBytes(m->param_bytes()) : std::string("-"),
                    absl::StrCat(m->sessions()), inputs.empty() ? "-" : inputs});
  }
  std::printf("%s", FormatTable({"model", "version", "state", "graph", "weights", "params", "sessions", "inputs"},
                                {false, true, false, false, false, true, true, false}, rows)
                        .c_str());
  for (const v1::ModelVersionInfo* m : models) {
    if (!m->error().empty()) std::printf("%s:%lld: %s\n", m->name().c_str(), static_cast<long long>(m->version()),
                                         m->error().c_str());
  }
}

}  // namespace

CLI::App* AddModelsCommand(CLI::App& app, ModelsFlags& flags) {
  CLI::App* models = app.add_subcommand("models", "the server's model repository");
  models->require_subcommand(0, 1);
  CLI::App* list = models->add_subcommand("list", "every model version and its state (the default)");
  list->add_option("name", flags.name, "only this model");
  CLI::App* load = models->add_subcommand("load", "load a model version (admin tenants)");
  load->add_option("name", flags.name, "model name")->required();
  load->add_option("--version", flags.version, "version (0 = the newest on disk)")->capture_default_str();
  CLI::App* unload = models->add_subcommand("unload", "unload a model's versions (admin tenants)");
  unload->add_option("name", flags.name, "model name")->required();
  unload->add_option("--version", flags.version, "version (0 = every loaded one)")->capture_default_str();
  return models;
}

absl::Status RunModelsCommand(const CLI::App& models, const ModelsFlags& flags,
                              const std::function<absl::StatusOr<std::unique_ptr<Client>>()>& connect) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, connect());
  if (models.got_subcommand("load")) {
    KILN_ASSIGN_OR_RETURN(v1::ModelVersionInfo m, client->LoadModel(flags.name, flags.version));
    PrintModels({&m});
    return absl::OkStatus();
  }
  if (models.got_subcommand("unload")) {
    KILN_ASSIGN_OR_RETURN(v1::UnloadModelResponse r, client->UnloadModel(flags.name, flags.version));
    std::vector<const v1::ModelVersionInfo*> rows;
    for (const v1::ModelVersionInfo& m : r.unloaded()) rows.push_back(&m);
    PrintModels(rows);
    return absl::OkStatus();
  }
  KILN_ASSIGN_OR_RETURN(v1::ListModelsResponse r, client->ListModels(flags.name));
  if (r.repository().empty()) {
    std::printf("this kilnd has no model repository (kilnd --model_repository=DIR)\n");
    return absl::OkStatus();
  }
  std::printf("repository: %s\n", r.repository().c_str());
  std::vector<const v1::ModelVersionInfo*> rows;
  for (const v1::ModelVersionInfo& m : r.models()) rows.push_back(&m);
  PrintModels(rows);
  return absl::OkStatus();
}

absl::StatusOr<v1::ModelRef> ParseModelRef(const std::string& text) {
  v1::ModelRef ref;
  const size_t colon = text.rfind(':');
  ref.set_name(text.substr(0, colon));
  if (colon != std::string::npos) {
    const std::string v = text.substr(colon + 1);
    int64_t version = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), version);
    if (v.empty() || ec != std::errc() || end != v.data() + v.size() || version <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model ", text, ": the version after ':' must be a positive integer"));
    }
    ref.set_version(version);
  }
  if (ref.name().empty()) return absl::InvalidArgumentError("--model needs a model name (NAME or NAME:VERSION)");
  return ref;
}

}  // namespace kiln
