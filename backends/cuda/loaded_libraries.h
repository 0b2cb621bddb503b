// The CUDA libraries this process has mapped (cuDNN's and cuBLAS's, whose
// names start with libcudnn / libcublas), for the prepare diagnostics:
// cuDNN 9 opens its engine sub-libraries at their first use and cuBLASLt
// sets up a data type's kernels at its first query, both inside whichever
// prepare comes first. A slow prepare's log line names the libraries opened
// while it ran, so a warm start's report says where its time went.
#pragma once

#include <chrono>
#include <set>
#include <string>
#include <utility>

namespace kiln::cuda {

// The file names (without directories) of the mapped cuDNN and cuBLAS libraries.
std::set<std::string> LoadedCudaLibraries();

// The names in LoadedCudaLibraries() that `before` lacks, comma-separated,
// or "none".
std::string LibrariesOpenedSince(const std::set<std::string>& before);

// Opens (RTLD_LAZY | RTLD_LOCAL; they stay open) the cuDNN engine
// libraries (libcudnn_engines_*.so.<major>) beside the mapped cuDNN: cuDNN
// would open them at the first plan that needs them. Returns the names opened; none where cuDNN is
// not mapped or has no engine libraries.
std::set<std::string> OpenCudnnEngineLibraries();

// Times a prepare step from its construction; its destruction logs (info)
// "<what> <outcome> in <ms> ms (libraries opened meanwhile: ...)" when the
// step took at least `threshold_ms`.
class SlowStepLog {
 public:
  explicit SlowStepLog(std::string what, double threshold_ms = 5.0);
  ~SlowStepLog();
  SlowStepLog(const SlowStepLog&) = delete;
  SlowStepLog& operator=(const SlowStepLog&) = delete;
  void set_outcome(std::string outcome) { outcome_ = std::move(outcome); }

 private:
  std::string what_, outcome_;
  double threshold_ms_;
  std::set<std::string> before_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace kiln::cuda
