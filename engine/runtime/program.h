// Program and RunContext (DESIGN.md section 5, "Programs and run contexts").
//
// A Program is a loaded executable: the LIR, its signature, and its constants
// resident on each device. It is immutable after Load and shared by every
// session and tenant that runs the graph. Each run takes a RunContext from the
// program's pool: the mutable half (per device: a stream, the arena, input
// staging; the prepared kernels, whose Launch is not reentrant). Concurrent
// runs of one program take separate contexts, so they proceed at once up to
// `max_contexts`; the per-device limit on concurrent runs is the scheduler's
// (DeviceLanes). A context is created on first need (preparing its kernels,
// which the kernel binary cache makes cheap) and kept for the next run; one
// whose run ended in a device fault is discarded, never reused.
//
// Runs stop between kernels when RunOptions' deadline passes or its cancel
// flag is set, and every device wait is bounded by a timeout derived from the
// cost model's estimate (ProgramOptions). The executor's boundary is
// message-shaped (the LIR in, outputs and a report out) so a device worker can
// live in its own process.
//
// Thread safety: Run is thread-safe. The Program keeps the device registry
// (and so its devices) and the kernel binary cache alive, so it may outlive
// the Engine that loaded it.
#pragma once

#include <atomic>
#include <array>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "backends/backend.h"
#include "backends/packing.h"

#include "backends/capture.h"
#include "engine/engine.h"
#include "engine/runtime/device_registry.h"
#include "engine/runtime/params.h"
#include "engine/runtime/run_memory.h"
#include "kiln/v1/report.pb.h"

namespace kiln::runtime {

struct ProgramOptions {
  // Run contexts of one program alive at once (concurrent runs beyond this
  // wait for a context). At least 1.
  int max_contexts = 4;
  // Device waits: `device_wait_slack` times the cost model's estimate of the
  // run, and never less than `device_wait_floor`. A wait that times out is a
  // device fault.
  absl::Duration device_wait_floor = absl::Seconds(10);
  double device_wait_slack = 100;
  // Body runs of one While step per run (engine/runtime/while_kernel.h).
  int64_t max_while_iterations = 1000000;
  // Where a run's context memory is charged to its tenant; may be null.
  std::shared_ptr<RunMemoryLedger> ledger;
  // Per device id: its launch cost per kernel in microseconds, as the engine
  // calibrated it (DeviceProfile::launch_overhead_us; CUDA graphs' AUTO
  // weighs it, UseCapturedGraphs). A device not listed uses its info's
  // nominal profile.
  std::map<std::string, double> launch_overhead_us;
  // CompileOptions.allow_int8_activations of the executable being loaded: set
  // on every kernel's spec (backend::KernelSpec.allow_int8_activations). The
  // LIR does not record it; the executable key does, so an executable is only
  // loaded (compiled, or found in a cache) for a request that asked the same.
  bool allow_int8_activations = false;
};

class RunContext;

// CUDA graphs (Executable.cuda_graphs, docs/cuda.md): whether runs of a
// program replay a captured graph. `capturable`: every step is a kernel on
// one device with the "graphs" feature, and every kernel is capturable.
// OFF: never; ON: when capturable; AUTO: when capturable and the graph saves
// at least kMinGraphSaving of a run: a replay is one launch for the device
// instead of `kernels`, so it saves about `kernels` x `launch_micros` (the
// device's launch cost per kernel, calibrated: DeviceProfile::
// launch_overhead_us) of a run the cost model estimates at
// `estimated_run_micros` (0: unknown, counted as launch-bound). The estimate
// runs high (1.5-2x the kernels' device time on an H100), which the small
// fraction absorbs.
inline constexpr double kMinGraphSaving = 0.01;
bool UseCapturedGraphs(v1::CudaGraphs mode, bool capturable, int kernels,
                       double estimated_run_micros, double launch_micros);

class Program final : public Executable {
 public:
  // Prepares the first run context (filling in each step's implementation
  // name when it is empty) and uploads the constants. `binaries` may be null.
  static absl::StatusOr<std::unique_ptr<Program>> Load(
      v1::Executable lir, std::shared_ptr<const DeviceRegistry> registry,
      std::shared_ptr<backend::KernelBinaryCache> binaries, backend::PrepareContext* prepare_stats,
      const ProgramOptions& options = {});
  ~Program() override;
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  const std::string& key() const override { return lir_.key(); }
  const v1::Executable& lir() const override { return lir_; }
  const GraphSignature& signature() const override { return signature_; }
  double estimated_run_micros() const override { return estimated_run_micros_; }
  void set_key(const std::string& key) { lir_.set_key(key); }
  // The device the program was placed on (its lane).
  const std::string& device() const { return lir_.placement().chosen(); }
  // The bound on one device wait of a run of this program.
  absl::Duration device_wait_timeout() const { return wait_timeout_; }

  // Runs once on a free run context. Fails UNAVAILABLE (with a device-fault
  // payload, backend::FaultedDevice) when a device faults or hangs,
  // CANCELLED / DEADLINE_EXCEEDED when the run was stopped between kernels.
  absl::StatusOr<RunResult> Run(std::span<const TensorRef> inputs, const ParamSetImpl* params,
                                const RunOptions& options);

  struct ContextStats {
    int live = 0;     // created and not discarded
    int idle = 0;     // of `live`, waiting in the pool
    int64_t created = 0;
    int64_t discarded = 0;  // after a device fault
    int64_t graph_captures = 0;  // CUDA graphs captured (one per context and binding)
    int64_t graph_replays = 0;   // runs that replayed one
    int64_t graph_failures = 0;  // captures that failed (the context then runs unrolled)
  };
  ContextStats context_stats() const;

  // A training step's param updates (LIR param_updates). `in_place`: the
  // updates its kernels wrote into the param set's spare buffer, made
  // current when the step succeeded (ParamSetImpl::Spare / CommitSpare):
  // no copy. `copied`, `copied_bytes`: those copied into the param after
  // the kernels instead (an update that is a view of another value, or
  // shares its slot's bytes with a view, or a device that replays a
  // captured graph, whose bindings must not change). Since Load.
  struct ParamUpdateStats {
    int64_t in_place = 0;
    int64_t copied = 0;
    int64_t copied_bytes = 0;
  };
  ParamUpdateStats param_update_stats() const;
  // Per LIR param update: whether runs write it in the set's spare buffer.
  const std::vector<bool>& updates_in_place() const { return update_in_place_; }
  // Operands packed for kernels that take them packed (backends/packing.h):
  // constants once per program (at Load), params once per inference
  // ParamSet. Counts every Pack call since Load.
  int64_t packs_made() const { return packs_made_.load(std::memory_order_relaxed); }

  // Whether runs capture and replay a CUDA graph (UseCapturedGraphs).
  bool uses_graphs() const { return !graph_device_.empty(); }

  // Where Load's time went, as the compile report's sub-stages (in the order
  // first met; nodes_after is how many times a phase ran):
  //   load.constants              uploading the constants
  //   load.streams                creating the first run context's streams
  //   load.allocate               its arenas and input staging buffers
  //   load.prepare.<family>       preparing its kernels, by the implementation
  //                               name's prefix (cublasLt, cudnn, nvrtc, kiln, cpu, ...)
  //   load.prepare.<family>.first the first kernel of a family alone: in a fresh
  //                               process it pays the library's one-time set-up
  //   load.sync                   waiting for the streams after preparing
  //   load.bind                   packing constants for the kernels that pack
  // A While step's cond and body programs add theirs under the same names.
  const std::vector<v1::StageTiming>& load_stages() const { return load_stages_; }

 private:
  // The constants on their devices, made in the device generations named
  // (backend::Device::generation): a device that restarted lost them, and
  // the next run uploads them again. A run holds the set it uses.
  struct Constants {
    std::map<std::string, uint64_t> generations;
    std::vector<std::unique_ptr<backend::Buffer>> buffers;
    // Packed copies of these buffers by "<constant index>/<packing key>",
    // made by the first run context (at Load) and shared by all.
    mutable absl::Mutex packed_mu;
    mutable std::map<std::string, std::shared_ptr<const backend::PackedOperand>> packed
        ABSL_GUARDED_BY(packed_mu);
  };
  Program(v1::Executable lir, std::shared_ptr<const DeviceRegistry> registry,
          std::shared_ptr<backend::KernelBinaryCache> binaries, const ProgramOptions& options);
  absl::Status CheckInputs(std::span<const TensorRef> inputs,
                           std::vector<const TensorRef*>* by_index) const;
  absl::Status CheckParams(const ParamSetImpl* params) const;
  // `stages`, when given, gets the phases' times (load_stages()).
  absl::StatusOr<std::unique_ptr<RunContext>> CreateContext(
      backend::PrepareContext& prepare, std::vector<v1::StageTiming>* stages = nullptr);
  // The engine's kernel for While step `step` (while_kernel.h).
  std::unique_ptr<backend::Kernel> MakeWhileKernel(int step, backend::KernelSpec spec) const;
  // A free context, a new one when fewer than max_contexts live, else waits.
  absl::StatusOr<std::unique_ptr<RunContext>> AcquireContext();
  // Back to the pool; a context whose run ended in a fault of
  // `faulted_device` is discarded instead, abandoning that device's memory.
  void ReleaseContext(std::unique_ptr<RunContext> context,
                      const std::optional<std::string>& faulted_device);
  // Binds every packable input of the context's kernels for one run: the
  // packed copy of a constant or of an inference param (made on first use),
  // else none. `hold` keeps what was bound alive for the run.
  absl::Status BindPacked(RunContext& context, const Constants& constants,
                          const ParamSetImpl* params,
                          std::vector<std::shared_ptr<const backend::PackedOperand>>* hold);

  // Captures the kernel steps on `stream` (with an event before and after
  // each when `events`); the capture is ended whatever fails.
  absl::Status Capture(RunContext& context, backend::Stream& stream,
                       backend::CapturingStream& capturing,
                       const std::vector<backend::BufferView>& views, bool events);
  absl::StatusOr<RunResult> RunOn(RunContext& context, const Constants& constants,
                                  const std::vector<const TensorRef*>& by_index,
                                  const ParamSetImpl* params, const RunOptions& options);

  // Declared first so the devices outlive every buffer, stream and kernel below.
  std::shared_ptr<const DeviceRegistry> registry_;
  std::shared_ptr<backend::KernelBinaryCache> binaries_;
  const ProgramOptions options_;
  v1::Executable lir_;
  GraphSignature signature_;
  double estimated_run_micros_ = 0;
  absl::Duration wait_timeout_;
  std::vector<v1::StageTiming> load_stages_;
  absl::StatusOr<std::shared_ptr<const Constants>> UploadConstants() const;
  // The current set, uploaded again when one of its devices restarted.
  absl::StatusOr<std::shared_ptr<const Constants>> CurrentConstants();
  bool Stale(const std::map<std::string, uint64_t>& generations) const;
  absl::Mutex constants_mu_;
  std::shared_ptr<const Constants> constants_ ABSL_GUARDED_BY(constants_mu_);
  // Per slot: a graph output that kernels may write straight into the
  // caller's result tensor (host-memory device, written by one kernel step,
  // sharing no arena bytes with any other slot), saving the copy-out.
  std::vector<bool> direct_output_;
  // Per LIR param update: its slot is written by one kernel step and shares
  // no bytes with a view slot made after it, so runs may bind it to the
  // param set's spare buffer (ParamUpdateStats).
  std::vector<bool> update_in_place_;
  std::atomic<int64_t> updates_in_place_{0}, updates_copied_{0}, update_bytes_copied_{0};
  std::atomic<int64_t> packs_made_{0};
  // Per step: a While step's cond and body programs (null for other steps).
  std::vector<std::array<std::shared_ptr<Program>, 2>> while_programs_;

  // The device whose runs replay a captured graph; empty when runs launch
  // kernel by kernel (UseCapturedGraphs).
  std::string graph_device_;
  std::atomic<int64_t> graph_captures_{0}, graph_replays_{0}, graph_failures_{0};

  mutable absl::Mutex contexts_mu_;
  std::vector<std::unique_ptr<RunContext>> idle_contexts_ ABSL_GUARDED_BY(contexts_mu_);
  int live_contexts_ ABSL_GUARDED_BY(contexts_mu_) = 0;
  int64_t contexts_created_ ABSL_GUARDED_BY(contexts_mu_) = 0;
  int64_t contexts_discarded_ ABSL_GUARDED_BY(contexts_mu_) = 0;
};

}  // namespace kiln::runtime
