// Factories of the passes, one per file; CreatePass (pass.cc) maps names.
#pragma once

#include <memory>

#include "engine/passes/pass.h"

namespace kiln::passes {

std::unique_ptr<Pass> MakeTransformsPass();
std::unique_ptr<Pass> MakeLegalizePass();
std::unique_ptr<Pass> MakeCsePass();
std::unique_ptr<Pass> MakeDcePass();
std::unique_ptr<Pass> MakeConstantFoldPass();
std::unique_ptr<Pass> MakeSimplifyPass();
std::unique_ptr<Pass> MakeCanonicalizePass();
std::unique_ptr<Pass> MakeFusePass();
std::unique_ptr<Pass> MakePlacePass();
std::unique_ptr<Pass> MakePlanMemoryPass();

// Inputs, params and constants: the nodes that compute nothing (shared by
// the passes that skip them; one definition, so the unity build's batches
// see no duplicate).
inline bool IsSource(const ir::Node& n) {
  return n.op == v1::OP_INPUT || n.op == v1::OP_PARAM || n.op == v1::OP_CONSTANT;
}

}  // namespace kiln::passes
