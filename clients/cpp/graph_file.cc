#include "clients/cpp/graph_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "engine/io/onnx/onnx_import.h"
#include "engine/io/onnx/onnx_specialize.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace kiln {
namespace {

bool LooksLikeKilnText(const std::string& text) {
  // Skip comments and blank lines; the first statement is `graph "name"`.
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view l = absl::StripAsciiWhitespace(line);
    if (l.empty() || l[0] == '#') continue;
    return absl::StartsWith(l, "graph ");
  }
  return false;
}

// Keeps the parser's first complaint for the error message (the default
// collector logs to stderr, which a fallback attempt must not do).
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty()) first_ = absl::StrCat(line + 1, ":", column + 1, ": ", message);
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

absl::StatusOr<v1::GraphSource> FromProtoText(const std::string& text, const std::string& path) {
  v1::GraphSource src;
  FirstError errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, src.mutable_graph())) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a kiln.v1.Graph in protobuf text format: ", errors.first()));
  }
  return src;
}

absl::StatusOr<v1::GraphSource> FromBinary(const std::string& bytes, const std::string& path) {
  v1::GraphSource src;
  if (!src.mutable_graph()->ParseFromString(bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a binary kiln.v1.Graph"));
  }
  return src;
}

}  // namespace

absl::StatusOr<v1::GraphSource> LoadGraphFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  std::ostringstream ss;
  ss << f.rdbuf();
  std::string bytes = ss.str();
  auto ends = [&](const char* ext) { return absl::EndsWith(path, ext); };
  if (ends(".kiln")) {
    v1::GraphSource src;
    src.set_text(std::move(bytes));
    return src;
  }
  if (ends(".pbtxt") || ends(".textproto") || ends(".txtpb")) return FromProtoText(bytes, path);
  if (ends(".pb") || ends(".binpb")) return FromBinary(bytes, path);
  if (ends(".onnx")) {
    // Imported here, on the client: kilnd only ever receives a kiln.v1.Graph.
    // Initializers become constants (kilnctl import --param makes params).
    auto graph = io::ImportOnnx(bytes, io::OnnxImportOptions{});
    if (!graph.ok()) {
      return absl::Status(graph.status().code(),
                          absl::StrCat(path, ": ", graph.status().message()));
    }
    v1::GraphSource src;
    *src.mutable_graph() = *std::move(graph);
    return src;
  }
  if (LooksLikeKilnText(bytes)) {
    v1::GraphSource src;
    src.set_text(std::move(bytes));
    return src;
  }
  // A binary parse of text rarely succeeds, but an empty graph is no graph.
  auto bin = FromBinary(bytes, path);
  if (bin.ok() && bin->graph().nodes_size() > 0) return bin;
  auto text = FromProtoText(bytes, path);
  if (text.ok()) return text;
  return absl::InvalidArgumentError(
      absl::StrCat(path,
                   ": not a graph: expected `.kiln` text, a binary kiln.v1.Graph (.pb) or a "
                   "kiln.v1.Graph in protobuf text format (.pbtxt)"));
}

absl::StatusOr<v1::GraphSource> LoadGraphFileForInputs(const std::string& path,
                                                       const std::map<std::string, HostTensor>& inputs,
                                                       std::vector<std::string>* fixed) {
  fixed->clear();
  absl::StatusOr<v1::GraphSource> plain = LoadGraphFile(path);
  if (plain.ok() || !absl::IsUnimplemented(plain.status()) || !absl::EndsWith(path, ".onnx")) return plain;
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  auto specializer = io::OnnxSpecializer::Create(ss.str(), {});
  if (!specializer.ok()) return plain.status();
  std::vector<std::pair<std::string, const HostTensor*>> values;
  for (const auto& [name, t] : inputs) values.emplace_back(name, &t);
  auto model = (*specializer)->For(values);
  if (!model.ok()) {
    return absl::Status(model.status().code(), absl::StrCat(path, ": ", model.status().message()));
  }
  *fixed = (*specializer)->value_inputs();
  v1::GraphSource src;
  *src.mutable_graph() = (*model)->graph;
  return src;
}

}  // namespace kiln
