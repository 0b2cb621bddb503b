// Loading a graph file for kilnd: `.kiln` text (sent as text; kilnd parses
// and verifies it), a binary kiln.v1.Graph, a kiln.v1.Graph in protobuf
// text format, or an ONNX model (imported here by engine/io/onnx, its
// initializers as constants; kilnd never parses ONNX). Thread-safe.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/host_tensor.h"
#include "kiln/v1/service.pb.h"

namespace kiln {

// By extension: `.kiln` text; `.pbtxt`/`.textproto`/`.txtpb` proto text;
// `.pb`/`.binpb` binary; `.onnx` an ONNX model. Any other name: binary, then proto text, then
// `.kiln` text when it starts like one (`graph "..."`).
absl::StatusOr<v1::GraphSource> LoadGraphFile(const std::string& path);

// LoadGraphFile for one run with these inputs. A `.onnx` model whose shapes
// depend on input values (a Loop's trip count or a Slice bound given as an
// input) is imported for the values given (io::OnnxSpecializer: the value
// becomes a constant of the graph sent); `fixed` receives the inputs so
// fixed, which the caller must not send. Any other file: LoadGraphFile.
absl::StatusOr<v1::GraphSource> LoadGraphFileForInputs(const std::string& path,
                                                       const std::map<std::string, HostTensor>& inputs,
                                                       std::vector<std::string>* fixed);

}  // namespace kiln
