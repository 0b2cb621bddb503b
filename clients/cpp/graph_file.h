// Loading a graph file for kilnd: `.kiln` text (sent as text; kilnd parses
// and verifies it), a binary kiln.v1.Graph, or a kiln.v1.Graph in protobuf
// text format. Thread-safe.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "kiln/v1/service.pb.h"

namespace kiln {

// By extension: `.kiln` text; `.pbtxt`/`.textproto`/`.txtpb` proto text;
// `.pb`/`.binpb` binary. Any other name: binary, then proto text, then
// `.kiln` text when it starts like one (`graph "..."`).
absl::StatusOr<v1::GraphSource> LoadGraphFile(const std::string& path);

}  // namespace kiln
