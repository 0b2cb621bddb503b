#include "engine/passes/pass.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/passes/passes_internal.h"

namespace kiln::passes {

std::vector<std::string> PipelineStages() {
  return {"transforms", "legalize", "canonicalize", "fuse", "place", "plan_memory"};
}

absl::StatusOr<std::unique_ptr<Pass>> CreatePass(std::string_view name) {
  if (name == "transforms") return MakeTransformsPass();
  if (name == "legalize") return MakeLegalizePass();
  if (name == "canonicalize") return MakeCanonicalizePass();
  if (name == "cse") return MakeCsePass();
  if (name == "dce") return MakeDcePass();
  if (name == "constant_fold") return MakeConstantFoldPass();
  if (name == "simplify") return MakeSimplifyPass();
  if (name == "fuse") return MakeFusePass();
  if (name == "place") return MakePlacePass();
  if (name == "plan_memory") return MakePlanMemoryPass();
  return absl::NotFoundError(absl::StrCat(
      "no pass named \"", std::string(name), "\"; passes: ",
      absl::StrJoin(PipelineStages(), ", "), ", cse, dce, constant_fold, simplify"));
}

}  // namespace kiln::passes
