#include "clients/cpp/checkpoint.h"

#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/deterministic_bytes.h"
#include "base/sha256.h"
#include "base/status.h"
#include "engine/io/mapped_file.h"
#include "engine/io/safetensors.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"

namespace kiln {
namespace {

constexpr char kStepTensor[] = "opt/step";
constexpr char kStatePrefix[] = "opt/";
constexpr char kLsqScaleSuffix[] = "/lsq_scale";  // QAT's learned scales (engine/passes/qat.h)

// The metadata keys Kiln owns; the caller's may not reuse them.
constexpr const char* kOwnKeys[] = {"format", "format_version", "step", "training_spec",
                                    "graph_sha256"};

absl::Status Invalid(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("checkpoint ", io::QuotedName(path), ": ", what));
}

std::string TypeOf(DType dtype, const Dims& dims) {
  return absl::StrCat(DTypeName(dtype), DimsToString(dims));
}

// The differences between two specs, one field per clause ("modified:
// optimizer.lr: 0.01 -> 0.02; added: optimizer.weight_decay: 0").
std::string SpecDifferences(const v1::TrainingSpec& saved, const v1::TrainingSpec& now) {
  std::string report;
  google::protobuf::util::MessageDifferencer differ;
  differ.ReportDifferencesToString(&report);
  differ.Compare(saved, now);
  std::vector<std::string> lines = absl::StrSplit(report, '\n', absl::SkipWhitespace());
  return absl::StrJoin(lines, "; ");
}

}  // namespace

std::string GraphIdentity(const v1::GraphSource& graph) {
  return Sha256Hex(DeterministicBytes(graph));
}

absl::StatusOr<int64_t> SaveCheckpoint(const Client& client, const std::string& session_id,
                                       const std::string& path, const CheckpointInfo& info) {
  for (const char* key : kOwnKeys) {
    if (info.extra.contains(key)) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint metadata key \"", key,
                                                     "\" is Kiln's own; rename the extra key"));
    }
  }
  KILN_ASSIGN_OR_RETURN(TensorMap params, client.GetParams(session_id));
  int64_t step = 0;
  if (auto it = params.find(kStepTensor); it != params.end()) {
    if (it->second.dtype() != v1::DTYPE_I64 || it->second.num_elements() != 1) {
      return absl::DataLossError(absl::StrCat("the session's opt/step is ",
                                              TypeOf(it->second.dtype(), it->second.dims()),
                                              ", not i64[]"));
    }
    step = it->second.data_as<int64_t>()[0];
  } else {
    params.emplace(kStepTensor, HostTensor::FromVector<int64_t>(v1::DTYPE_I64, {}, {0}));
  }
  std::string spec_json;
  google::protobuf::util::JsonPrintOptions json_options;
  json_options.preserve_proto_field_names = true;
  const auto printed =
      google::protobuf::util::MessageToJsonString(info.training, &spec_json, json_options);
  if (!printed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write the training spec as JSON: ", printed.ToString()));
  }
  std::map<std::string, std::string> metadata = info.extra;
  metadata["format"] = kCheckpointFormat;
  metadata["format_version"] = absl::StrCat(kCheckpointVersion);
  metadata["step"] = absl::StrCat(step);
  metadata["training_spec"] = spec_json;
  metadata["graph_sha256"] = info.graph_sha256;
  std::vector<io::SafetensorsItem> items;
  items.reserve(params.size());
  for (const auto& [name, t] : params) items.emplace_back(name, &t);
  KILN_RETURN_IF_ERROR(io::WriteSafetensors(path, items, metadata))
      << "while writing checkpoint " << io::QuotedName(path);
  return step;
}

absl::StatusOr<RestoredCheckpoint> RestoreCheckpoint(const Client& client,
                                                     const std::string& session_id,
                                                     const v1::Signature& signature,
                                                     const std::string& path,
                                                     const CheckpointInfo& expect) {
  KILN_ASSIGN_OR_RETURN(io::SafetensorsFile file, io::SafetensorsFile::Open(path));
  const std::map<std::string, std::string>& meta = file.metadata();
  auto get = [&](const char* key) -> absl::StatusOr<std::string> {
    auto it = meta.find(key);
    if (it == meta.end()) {
      return Invalid(path, absl::StrCat("the metadata has no \"", key,
                                        "\" (not a Kiln checkpoint, or a damaged one)"));
    }
    return it->second;
  };
  KILN_ASSIGN_OR_RETURN(std::string format, get("format"));
  if (format != kCheckpointFormat) {
    return Invalid(path, absl::StrCat("format is ", io::QuotedName(format), ", not \"",
                                      kCheckpointFormat, "\""));
  }
  KILN_ASSIGN_OR_RETURN(std::string version_text, get("format_version"));
  int64_t version = 0;
  if (!absl::SimpleAtoi(version_text, &version) || version < 1) {
    return Invalid(path, absl::StrCat("format_version ", io::QuotedName(version_text),
                                      " is not a positive integer"));
  }
  if (version > kCheckpointVersion) {
    return Invalid(path,
                   absl::StrCat("format_version ", version, " is newer than this client reads (",
                                kCheckpointVersion, "): upgrade the client"));
  }
  KILN_ASSIGN_OR_RETURN(std::string step_text, get("step"));
  RestoredCheckpoint out;
  if (!absl::SimpleAtoi(step_text, &out.step) || out.step < 0) {
    return Invalid(
        path, absl::StrCat("step ", io::QuotedName(step_text), " is not a non-negative integer"));
  }
  KILN_ASSIGN_OR_RETURN(std::string spec_json, get("training_spec"));
  v1::TrainingSpec saved;
  if (const auto parsed = google::protobuf::util::JsonStringToMessage(spec_json, &saved);
      !parsed.ok()) {
    return Invalid(path, absl::StrCat("training_spec is not a kiln.v1.TrainingSpec in JSON: ",
                                      parsed.ToString()));
  }
  if (!google::protobuf::util::MessageDifferencer::Equals(saved, expect.training)) {
    return Invalid(path, absl::StrCat("it was saved with another training spec (saved -> now: ",
                                      SpecDifferences(saved, expect.training),
                                      "); resume with the same loss, params, optimizer and "
                                      "schedule"));
  }
  KILN_ASSIGN_OR_RETURN(std::string graph, get("graph_sha256"));
  if (graph != expect.graph_sha256) {
    return Invalid(path, absl::StrCat("it was saved from another graph (graph_sha256 ",
                                      io::QuotedName(graph.substr(0, 16)), "... , this one ",
                                      expect.graph_sha256.substr(0, 16), "...)"));
  }

  // Every param of the graph, with its declared type.
  std::map<std::string, const v1::TensorType*> declared;
  for (const v1::SignatureEntry& e : signature.params()) {
    declared.emplace(e.name(), &e.type());
    const io::SafetensorsEntry* t = file.Find(e.name());
    if (t == nullptr) {
      return Invalid(path, absl::StrCat("it has no tensor for param ", io::QuotedName(e.name())));
    }
    bool fits =
        t->dtype == e.type().dtype() && t->dims.size() == static_cast<size_t>(e.type().dims_size());
    for (int i = 0; fits && i < e.type().dims_size(); ++i) {
      fits = !e.type().dims(i).has_size() || e.type().dims(i).size() == t->dims[i];
    }
    if (!fits) {
      Dims want;
      for (const v1::Dim& d : e.type().dims()) want.push_back(d.has_size() ? d.size() : -1);
      return Invalid(
          path, absl::StrCat("param ", io::QuotedName(e.name()), " is ", TypeOf(t->dtype, t->dims),
                             " in the file, ", TypeOf(e.type().dtype(), want), " in the graph"));
    }
  }
  bool has_state = false;
  for (const io::SafetensorsEntry& t : file.tensors()) {
    if (declared.contains(t.name)) continue;
    if (absl::EndsWith(t.name, kLsqScaleSuffix) &&
        declared.contains(t.name.substr(0, t.name.size() - std::strlen(kLsqScaleSuffix)))) {
      // A QAT run's learned weight scale: trained state, as the optimizer's
      // is; kilnd checks its shape.
      if (t.dtype != v1::DTYPE_F32) {
        return Invalid(path, absl::StrCat(io::QuotedName(t.name), " is ", TypeOf(t.dtype, t.dims),
                                          ", not f32"));
      }
      has_state = true;
      continue;
    }
    if (!absl::StartsWith(t.name, kStatePrefix)) {
      return Invalid(path, absl::StrCat("tensor ", io::QuotedName(t.name),
                                        " is neither a param of the graph nor optimizer state"));
    }
    if (t.name != kStepTensor) has_state = true;
  }
  const io::SafetensorsEntry* step_entry = file.Find(kStepTensor);
  if (step_entry == nullptr || step_entry->dtype != v1::DTYPE_I64 || !step_entry->dims.empty()) {
    return Invalid(path,
                   step_entry == nullptr
                       ? std::string("it has no opt/step tensor")
                       : absl::StrCat("opt/step is ", TypeOf(step_entry->dtype, step_entry->dims),
                                      ", not i64[]"));
  }
  KILN_ASSIGN_OR_RETURN(HostTensor step_tensor, file.Read(kStepTensor));
  if (step_tensor.data_as<int64_t>()[0] != out.step) {
    return Invalid(path, absl::StrCat("opt/step holds ", step_tensor.data_as<int64_t>()[0],
                                      " but the metadata's step is ", out.step));
  }

  TensorMap values;
  for (const io::SafetensorsEntry& t : file.tensors()) {
    // A checkpoint of a session that never stepped has no state: its params
    // start a fresh run (opt/step alone would ask kilnd to continue one).
    if (t.name == kStepTensor && out.step == 0 && !has_state) continue;
    KILN_ASSIGN_OR_RETURN(HostTensor v, file.Read(t.name));
    values.emplace(t.name, std::move(v));
  }
  KILN_RETURN_IF_ERROR(client.SetParams(session_id, values).status())
      << "while restoring checkpoint " << io::QuotedName(path);
  out.metadata = meta;
  return out;
}

}  // namespace kiln
