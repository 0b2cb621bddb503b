// Loading a graph file for kilnd: `.kiln` text (sent as text; kilnd parses
// and verifies it), a binary kiln.v1.Graph, a kiln.v1.Graph in protobuf
// text format, or an ONNX model (imported here by engine/io/onnx, its
// initializers as constants; kilnd never parses ONNX). Thread-safe.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "kiln/v1/service.pb.h"

namespace kiln {

// By extension: `.kiln` text; `.pbtxt`/`.textproto`/`.txtpb` proto text;
// `.pb`/`.binpb` binary; `.onnx` an ONNX model. Any other name: binary, then proto text, then
// `.kiln` text when it starts like one (`graph "..."`).
absl::StatusOr<v1::GraphSource> LoadGraphFile(const std::string& path);

}  // namespace kiln
