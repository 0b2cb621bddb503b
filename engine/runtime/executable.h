// LoadedExecutable: an LIR bound to devices — arenas allocated, constants
// uploaded, kernels prepared — ready to run. The executor's boundary is
// message-shaped (the LIR in, outputs and a report out) so a device worker can
// later live in its own process.
//
// Thread safety: Run is thread-safe; runs of one executable are serialized on
// run_mu_ (they share the arena and the kernels' scratch state).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "backends/backend.h"
#include "engine/engine.h"
#include "engine/runtime/device_registry.h"
#include "engine/runtime/params.h"

namespace kiln::runtime {

class LoadedExecutable final : public Executable {
 public:
  // Prepares every kernel (filling in each step's implementation name when it
  // is empty) and allocates arenas and constants. `binaries` may be null. The
  // executable keeps `registry` (and so the devices its buffers live on) alive,
  // so it may outlive the Engine that compiled it.
  static absl::StatusOr<std::unique_ptr<LoadedExecutable>> Load(
      v1::Executable lir, std::shared_ptr<const DeviceRegistry> registry, backend::KernelBinaryCache* binaries,
      backend::PrepareContext* prepare_stats);

  const std::string& key() const override { return lir_.key(); }
  const v1::Executable& lir() const override { return lir_; }
  const GraphSignature& signature() const override { return signature_; }
  double estimated_run_micros() const override { return estimated_run_micros_; }
  void set_key(const std::string& key) { lir_.set_key(key); }

  absl::StatusOr<RunResult> Run(std::span<const TensorRef> inputs, const ParamSetImpl* params,
                                const RunOptions& options);

 private:
  struct DeviceState {
    backend::Device* device = nullptr;
    std::unique_ptr<backend::Stream> stream;
    std::unique_ptr<backend::Buffer> arena;
    // Device copies of inputs for devices without host memory, by slot.
    std::map<int, std::unique_ptr<backend::Buffer>> input_staging;
  };

  LoadedExecutable(v1::Executable lir, std::shared_ptr<const DeviceRegistry> registry)
      : registry_(std::move(registry)), lir_(std::move(lir)) {}
  absl::Status CheckInputs(std::span<const TensorRef> inputs, std::vector<const TensorRef*>* by_index) const;
  absl::Status CheckParams(const ParamSetImpl* params) const;

  // Declared first so the devices outlive every buffer, stream and kernel below.
  std::shared_ptr<const DeviceRegistry> registry_;
  v1::Executable lir_;
  GraphSignature signature_;
  double estimated_run_micros_ = 0;
  std::map<std::string, DeviceState> devices_;
  std::vector<std::unique_ptr<backend::Kernel>> kernels_;  // per step; null for copies
  std::vector<std::unique_ptr<backend::Buffer>> constants_;
  // Per slot: a graph output that kernels may write straight into the
  // caller's result tensor (host-memory device, written by one kernel step,
  // sharing no arena bytes with any other slot), saving the copy-out.
  std::vector<bool> direct_output_;
  absl::Mutex run_mu_;
};

}  // namespace kiln::runtime
