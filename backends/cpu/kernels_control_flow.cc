// While: the CPU claims it, and the engine's executor builds its kernel
// (engine/runtime/while_kernel.h) from the cond and body programs the compile
// pipeline made — a backend cannot compile subgraphs (backends never see
// passes), so PrepareKernel here only says where the kernel comes from.
#include "absl/strings/str_cat.h"
#include "backends/cpu/cpu_backend.h"

namespace kiln::cpu {
namespace {

backend::Claim SupportsWhile(const backend::KernelSpec&) { return backend::Claim::Yes(); }

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateWhile(const backend::KernelSpec& spec) {
  return absl::FailedPreconditionError(absl::StrCat(
      spec.label, ": a While kernel is built by the engine's executor from its compiled cond and "
                  "body, not by the CPU backend alone"));
}

const CpuOpRegistration kRegistration({{v1::OP_WHILE, SupportsWhile, CreateWhile}});

}  // namespace
}  // namespace kiln::cpu
