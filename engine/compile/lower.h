// Lowering to the LIR (DESIGN.md section 3, stage 8): the placed, planned
// graph becomes a v1::Executable — slots (where each value lives), an ordered
// list of kernel launches and copies per device, arena sizes, constants, and
// the names of inputs, params and outputs.
#pragma once

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/compile/cache_key.h"
#include "engine/ir/graph.h"
#include "engine/passes/pass.h"
#include "kiln/v1/executable.pb.h"

namespace kiln::compile {

// The LIR format this compiler writes; readers reject any other.
inline constexpr uint32_t kLirFormatVersion = 2;

// What the user's graph called each node, so reports can name the user's
// nodes a kernel covers even after passes replaced them.
struct OriginInfo {
  std::string name;
  v1::OpKind op = v1::OP_KIND_UNSPECIFIED;
};

absl::StatusOr<v1::Executable> Lower(const ir::Graph& graph, const passes::PassContext& context,
                                     const absl::flat_hash_map<int32_t, OriginInfo>& origins);

}  // namespace kiln::compile
