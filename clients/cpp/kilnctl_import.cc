// `kilnctl import`: an ONNX model to a Kiln graph file, offline (no kilnd).
//
//   kilnctl import model.onnx -o model.kiln            # text IR
//   kilnctl import model.onnx -o model.pb              # binary kiln.v1.Graph
//   kilnctl import model.onnx -o m.pb --all-params --params-dir w/
//   kilnctl run m.pb --params-dir w/ --input x=x.npy
#include "clients/cpp/kilnctl_import.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/io/npy.h"
#include "engine/io/onnx/onnx_import.h"
#include "engine/ir/text.h"
#include "engine/ir/verifier.h"
#include "google/protobuf/text_format.h"

namespace kiln {
namespace {

struct ImportFlags {
  std::string model;
  std::string out;
  std::vector<std::string> params;
  bool all_params = false;
  std::string params_dir;
  std::vector<std::string> shapes;
};

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

absl::Status WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) return absl::DataLossError(absl::StrCat("short write to ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::pair<std::string, Dims>> ParseShape(const std::string& arg) {
  const size_t eq = arg.find('=');
  if (eq == std::string::npos || eq == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--shape ", arg, ": expected name=d0,d1,..."));
  }
  Dims dims;
  for (absl::string_view d : absl::StrSplit(arg.substr(eq + 1), ',', absl::SkipEmpty())) {
    int64_t v;
    if (!absl::SimpleAtoi(d, &v) || v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--shape ", arg, ": '", std::string(d), "' is not a size"));
    }
    dims.push_back(v);
  }
  return std::make_pair(arg.substr(0, eq), dims);
}

absl::Status CmdImport(const ImportFlags& f) {
  io::OnnxImportOptions options;
  options.params = f.params;
  options.all_initializers_as_params = f.all_params;
  for (const std::string& s : f.shapes) {
    auto kv = ParseShape(s);
    if (!kv.ok()) return kv.status();
    options.input_shapes.push_back(*std::move(kv));
  }
  auto bytes = ReadAll(f.model);
  if (!bytes.ok()) return bytes.status();
  auto model = io::ImportOnnxModel(*bytes, options);
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrCat(f.model, ": ", model.status().message()));
  }
  if (!model->params.empty() && f.params_dir.empty()) {
    return absl::InvalidArgumentError(
        "the graph has params: give --params-dir to write their values");
  }
  std::string out;
  if (absl::EndsWith(f.out, ".kiln")) {
    auto g = ir::ImportGraph(model->graph);
    if (!g.ok()) return g.status();
    out = ir::PrintGraph(**g);
  } else if (absl::EndsWith(f.out, ".pbtxt") || absl::EndsWith(f.out, ".textproto") ||
             absl::EndsWith(f.out, ".txtpb")) {
    google::protobuf::TextFormat::PrintToString(model->graph, &out);
  } else {
    if (!model->graph.SerializeToString(&out)) {
      return absl::ResourceExhaustedError("the graph is too large for one protobuf message");
    }
  }
  if (auto s = WriteAll(f.out, out); !s.ok()) return s;
  if (!f.params_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(f.params_dir, ec);
    if (ec) {
      return absl::PermissionDeniedError(absl::StrCat("cannot create ", f.params_dir, ": ",
                                                      ec.message()));
    }
    for (const auto& [name, t] : model->params) {
      if (name.find('/') != std::string::npos || name == "." || name == "..") {
        return absl::InvalidArgumentError(absl::StrCat(
            "param \"", name, "\" cannot be a file name in --params-dir (it has a '/')"));
      }
      if (auto s = WriteNpy((std::filesystem::path(f.params_dir) / (name + ".npy")).string(), t);
          !s.ok()) {
        return s;
      }
    }
  }
  int inputs = 0, params = 0;
  for (const auto& n : model->graph.nodes()) {
    inputs += n.op() == v1::OP_INPUT;
    params += n.op() == v1::OP_PARAM;
  }
  std::fprintf(stderr, "kilnctl: %s -> %s: %d nodes, %d inputs, %d params, %d outputs\n",
               f.model.c_str(), f.out.c_str(), model->graph.nodes_size(), inputs, params,
               model->graph.outputs_size());
  return absl::OkStatus();
}

}  // namespace

void AddImportCommand(CLI::App& app) {
  auto flags = std::make_shared<ImportFlags>();
  CLI::App* cmd = app.add_subcommand(
      "import", "convert an ONNX model to a Kiln graph file (.kiln text, .pb, .pbtxt); offline");
  cmd->add_option("model", flags->model, "the .onnx file")->required();
  cmd->add_option("--out,-o", flags->out, "output graph: .kiln, .pb or .pbtxt")->required();
  cmd->add_option("--param,-p", flags->params,
                  "an initializer (or Constant output) to make a param instead of a constant");
  cmd->add_flag("--all-params", flags->all_params, "every initializer becomes a param");
  cmd->add_option("--params-dir", flags->params_dir,
                  "write each param's value to <dir>/<name>.npy (for kilnctl run --params-dir)");
  cmd->add_option("--shape", flags->shapes,
                  "pin an input's shape: name=d0,d1,... (folds shape arithmetic on it)");
  // Runs during parsing and ends the process: kilnctl's dispatch never sees it.
  cmd->callback([flags]() {
    const absl::Status s = CmdImport(*flags);
    if (!s.ok()) {
      std::fprintf(stderr, "kilnctl: %s: %s\n", absl::StatusCodeToString(s.code()).c_str(),
                   std::string(s.message()).c_str());
    }
    std::fflush(stdout);
    std::exit(s.ok() ? 0 : 1);
  });
}

}  // namespace kiln
