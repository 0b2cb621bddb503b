// kiln::Engine: the compiler + runtime in one object, used in-process and by
// kilnd. It verifies a wire graph, compiles it through the staged pipeline
// (with the two-level disk cache), places it on the local devices, and runs it.
//
// Thread safety: every method is thread-safe. Executables and ParamSets are
// immutable after creation and shared (shared_ptr): a session holds them while
// the engine's in-memory cache may drop them. Runs of one Executable proceed
// at once on separate run contexts, up to the device's concurrent-run limit
// (DeviceStats::slots); runs on different devices proceed concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "backends/backend.h"
#include "base/host_tensor.h"
#include "engine/ir/verifier.h"
#include "kiln/v1/executable.pb.h"
#include "kiln/v1/graph.pb.h"
#include "kiln/v1/report.pb.h"
#include "kiln/v1/train.pb.h"

namespace kiln {

namespace runtime {
class LoadedExecutable;
class DeviceRegistry;
}  // namespace runtime
namespace compile {
class DiskCache;
}  // namespace compile

struct EngineOptions {
  // Disk cache directory; empty disables the disk cache. kilnd defaults to
  // $XDG_CACHE_HOME/kiln (or ~/.cache/kiln).
  std::string cache_dir;
  int64_t cache_max_bytes = int64_t{4} << 30;
  int cpu_threads = 0;                         // 0 = every core
  ir::VerifyOptions verify;                    // graph limits (nodes, rank, elements, depth)
  int64_t max_memory_executables = 256;        // in-memory executable cache entries
  std::vector<std::string> disabled_backends;  // e.g. {"vulkan"}
  // Device calibration (micro-benchmarks for the cost model): measured once
  // and cached in cache_dir; kIfCacheDir skips it when there is no cache dir
  // (profiles stay nominal), kAlways measures at every start without one.
  enum class Calibration { kIfCacheDir, kAlways, kNever };
  Calibration calibration = Calibration::kIfCacheDir;
  // A calibration measured while the host's load average per core is above
  // this is used but not cached (the next start measures again).
  double calibration_max_load_per_core = 2.0;
  // A run whose executable the cost model estimates at or below this many
  // microseconds runs on the caller's thread when its device is idle, instead
  // of waking the device's worker thread (a wake-up costs tens of
  // microseconds on a virtualized host). Engine::Run, whose caller waits for
  // the run anyway, runs a run of a device whose memory is not host memory (a
  // GPU, a device worker) on its thread whatever the estimate. 0 always hands
  // runs to the worker.
  double inline_run_micros = 250;
  // Runs of one program that may proceed at once, each on its own run
  // context (arena, streams, kernels).
  int max_run_contexts_per_program = 4;
  // Body runs of one While node per run before it fails RESOURCE_EXHAUSTED
  // naming the node (kilnd's limits.max_while_iterations).
  int64_t max_while_iterations = 1000000;
  // Concurrent runs per device, by device id, overriding what the backend
  // reports (DeviceInfo::max_concurrent_runs).
  std::map<std::string, int> device_slots;
  // Caps every device's concurrent runs (0 = no cap): kilnd's max_concurrent_runs.
  int max_device_slots = 0;
  // Runs waiting on one device, all tenants together (RESOURCE_EXHAUSTED past it).
  int64_t max_queued_runs_per_device = 4096;
  // Every device wait is bounded: device_wait_slack x the cost model's
  // estimate of the run, and never less than device_wait_floor. A wait that
  // times out is a device fault: the run fails UNAVAILABLE naming the device,
  // which is marked unhealthy until a probe succeeds (DeviceStats).
  absl::Duration device_wait_floor = absl::Seconds(10);
  double device_wait_slack = 100;
  // Where each backend other than the CPU's runs (runtime/device_registry.h):
  // kProcess in a kiln-device-worker child process per device, so a crash or
  // hang there fails only the runs on that device and the worker restarts;
  // kThread in this process; kAuto (the default) like kProcess, falling back
  // to kThread when no worker executable is found.
  enum class DeviceIsolation { kAuto, kThread, kProcess };
  DeviceIsolation device_isolation = DeviceIsolation::kAuto;
  // The worker executable; empty = $KILN_DEVICE_WORKER, else beside the
  // running executable, else this build tree's.
  std::string device_worker;
  // How long past a device wait's own bound a worker may stay silent before
  // it counts as hung and is killed.
  absl::Duration device_worker_grace = absl::Seconds(5);
};

// Per-device worker statistics (busy time, runs, queue length).
struct DeviceStats {
  std::string device;
  int64_t runs = 0;
  int64_t inline_runs = 0;  // of `runs`, run on the caller's thread
  double busy_micros = 0;
  double uptime_micros = 0;
  int queued = 0;
  int running = 0;
  int slots = 0;         // concurrent runs the device's scheduler allows
  int64_t dropped = 0;   // deadline passed in the queue, or cancelled
  int64_t rejected = 0;  // the device's queue was full
  std::map<std::string, double> tenant_device_micros;  // device time by tenant
  std::map<std::string, int> tenant_queued;            // runs waiting, by tenant
  std::map<std::string, int> tenant_running;           // runs executing, by tenant
  // Device memory of the run contexts tenants' executing runs hold (arenas,
  // input staging), by tenant; idle contexts belong to their program.
  std::map<std::string, int64_t> tenant_run_memory_bytes;
  bool healthy = true;
  std::string fault;  // the last device fault, if any
  int64_t faults = 0;
  int64_t restarts = 0;    // times the device came back after a fault
  bool isolated = false;   // runs in a device worker process
  int64_t worker_pid = 0;  // that process, while it lives
  // Messages to that process since it started: requests it answered (a run
  // makes one round trip: its synchronize) and one-way ones (command lists).
  int64_t worker_round_trips = 0;
  int64_t worker_one_way_messages = 0;
  int64_t memory_in_use = 0;
  bool calibrated = false;
  bool calibration_from_cache = false;
  bool calibration_contended = false;  // measured on a busy host, not cached
};

struct CompileOptions {
  std::string device = "auto";  // "auto" or a device id
  bool prefer_common_ir = false;
  bool enable_fusion = true;
  // f32 MatMul / FusedMatMul may use TF32 (v1::CompileOptions.allow_tf32):
  // the compiler sets MatMulAttrs.allow_tf32 on them before lowering, so it
  // reaches each device's kernel spec. Part of the executable key.
  bool allow_tf32 = false;
  // DequantMatMul may round its activations to int8 per 32 values and multiply
  // in integers (v1::CompileOptions.allow_int8_activations; docs/quantization.md)
  // on devices that claim it (the CPU); other devices stay exact. Reaches the
  // kernels through runtime::ProgramOptions. Part of the executable key.
  bool allow_int8_activations = false;
  // CUDA graphs (v1::CompileOptions.cuda_graphs; recorded in the LIR as
  // Executable.cuda_graphs, read by the Program). Part of the executable key
  // when not AUTO.
  v1::CudaGraphs cuda_graphs = v1::CUDA_GRAPHS_AUTO;
  // Writes the text IR after every stage into this directory (also set by
  // the KILN_DUMP environment variable).
  std::string dump_dir;
  // Autodiff and training-step transforms (kiln/v1/train.proto; the
  // transforms stage, engine/passes/transforms.cc). Part of the executable key.
  v1::TransformSpec transforms;
  // Session state (kilnd's CreateSessionRequest.state): (output, param) pairs.
  // Each output becomes an in-place update of its param (LIR param_updates,
  // as a training step's) instead of a result: runs need a state set
  // (Engine::CreateStateParams) and are serialized on it. Part of the
  // executable key when non-empty. Not with transforms.training.
  std::vector<std::pair<std::string, std::string>> state_updates;
};

// A tensor the caller owns, read during the call. Data is dense row-major,
// little-endian; alignment is not required.
struct TensorRef {
  std::string name;
  DType dtype = v1::DTYPE_UNSPECIFIED;
  Dims dims;
  const void* data = nullptr;
  int64_t bytes = 0;

  static TensorRef Of(std::string name, const HostTensor& t) {
    return {std::move(name), t.dtype(), t.dims(), t.data(), t.num_bytes()};
  }
};

// Signature of a graph: what a client must send.
struct GraphSignature {
  struct Entry {
    std::string name;
    v1::TensorType type;  // may carry symbolic dims
  };
  std::vector<Entry> inputs;
  std::vector<Entry> params;
  std::vector<Entry> outputs;
};

// A compiled executable for one graph and one input-shape signature.
class Executable {
 public:
  virtual ~Executable() = default;
  virtual const std::string& key() const = 0;
  virtual const v1::Executable& lir() const = 0;
  virtual const GraphSignature& signature() const = 0;  // concrete types
  // The cost model's estimate of one run on the device it was placed on, in
  // microseconds; 0 when there is none.
  virtual double estimated_run_micros() const = 0;
};

// Parameter values resident on device memory, by name. Created from host
// tensors; shared by every executable of a session.
class ParamSet {
 public:
  virtual ~ParamSet() = default;
  virtual int64_t total_bytes() const = 0;
  virtual std::vector<std::string> names() const = 0;
  // Copies a parameter back to the host (GetParams).
  virtual absl::StatusOr<HostTensor> Read(const std::string& name) const = 0;
  // A training set (Engine::CreateTrainingParams): training steps update its
  // values in place on its device.
  virtual bool training() const { return false; }
};

struct RunOptions {
  bool report = false;  // fill RunResult::report (steps, timings)
  std::string request_id;
  std::string tenant;
  // The run stops between kernels (DEADLINE_EXCEEDED) once this passes, and is
  // not started (in the device's queue) after it.
  absl::Time deadline = absl::InfiniteFuture();
  // Optional, owned by the caller and valid for the call: the run stops
  // between kernels (CANCELLED) once it is true (the client went away).
  const std::atomic<bool>* cancelled = nullptr;
  // Scheduling on the device: weighted fair queuing across tenants by device
  // time, then priority (higher first) and arrival inside a tenant.
  double tenant_weight = 1;
  int priority = 0;
  int64_t tenant_max_queue = 1024;  // this tenant's runs waiting on the device
  // Host memory the caller owns (kilnd: a client's shared-memory region),
  // valid until the run ends, where named outputs go instead of a new
  // HostTensor: `bytes` must equal the output's size (else INVALID_ARGUMENT).
  // Kernels write such an output there directly where the program allows
  // it; otherwise it is copied there once at the end.
  struct OutputDestination {
    std::string name;
    void* data = nullptr;
    int64_t bytes = 0;
  };
  std::vector<OutputDestination> output_destinations;
  // RunAsync's caller waits for this run anyway and runs many (kilnd's
  // shared-memory connection thread, which blocks until its training step
  // is answered): when the device is idle the run goes on the calling
  // thread, whatever the device and its estimate, instead of being handed
  // to the device's thread and back (two thread wakes per run). On the CPU
  // the kernels then use the calling thread's own OpenMP team, which stays
  // warm between its runs (a thread that runs once pays the team's start).
  // Engine::Run does this by itself for devices whose memory is not the
  // host's.
  bool on_caller_when_idle = false;
};

struct RunResult {
  // Graph output order. An output written to its RunOptions destination has
  // an empty HostTensor here and in_destination[i] true.
  std::vector<std::pair<std::string, HostTensor>> outputs;
  std::vector<bool> in_destination;  // empty when no destination was given
  v1::DispatchReport report;         // filled when RunOptions::report
};

struct CompileResult {
  std::shared_ptr<Executable> executable;
  v1::CompileReport report;  // cache outcome, stage timings, memory plan
};

struct CacheStats {
  int64_t memory_hits = 0, disk_hits = 0, misses = 0, corrupt = 0, evictions = 0;
  int64_t kernel_hits = 0, kernel_misses = 0;
  int64_t disk_bytes = 0, disk_entries = 0;
};

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Every device of every backend that found one, the CPU first, with its
  // calibrated profile when calibration ran.
  std::vector<const backend::DeviceInfo*> Devices() const;
  std::vector<DeviceStats> DeviceStatistics() const;
  // Bytes allocated on each device now, in Devices() order.
  std::vector<int64_t> DeviceMemoryInUse() const;
  // Backends that found no device, and why ("vulkan: no driver").
  std::vector<std::string> UnavailableBackends() const;

  // Verifies `graph` without compiling; returns its signature.
  absl::StatusOr<GraphSignature> Inspect(const v1::Graph& graph) const;

  // Compiles `graph` for the given concrete input shapes (inputs whose type
  // is already concrete may be left out). Served from the in-memory cache, then
  // the disk cache, then compiled and stored.
  absl::StatusOr<CompileResult> Compile(const v1::Graph& graph, const CompileOptions& options,
                                        const std::vector<std::pair<std::string, Dims>>& shapes);

  // Uploads parameters (names unique, byte sizes matching their types). Runs
  // check that every param an executable reads is present with its type.
  absl::StatusOr<std::shared_ptr<ParamSet>> CreateParams(std::span<const TensorRef> values);

  // The param set of a training step (an executable compiled with
  // CompileOptions::transforms.training): resident on the executable's device
  // and updated there in place by each run (no host round trip). `values`
  // holds every param of the graph; optimizer state (names under "opt/",
  // engine/train/train_step.h) and QAT's learned scales ("<w>/lsq_scale",
  // passes/qat.h) may be given (a resumed run) and are otherwise zero; when "opt/step" is given, all of it must be (INVALID_ARGUMENT
  // naming the first missing tensor). Runs of a step on one set are
  // serialized; Read sees whole steps.
  absl::StatusOr<std::shared_ptr<ParamSet>> CreateTrainingParams(
      const Executable& step, std::span<const TensorRef> values);

  // The param set of an executable compiled with CompileOptions::state_updates:
  // resident on the executable's device; each run writes the state params
  // (and only those) in place after its last kernel, so a run that fails or
  // is cancelled leaves them as they were. Runs on one set are serialized.
  // `values` holds every param of the graph (INVALID_ARGUMENT naming the
  // first one missing, or one the graph lacks). The other params stay
  // read-only and may be packed once, as in a plain set.
  absl::StatusOr<std::shared_ptr<ParamSet>> CreateStateParams(const Executable& executable,
                                                              std::span<const TensorRef> values);

  // Runs an executable through the scheduler of the device it was placed on
  // (queue, fairness, deadline: RunOptions), on a free run context, and blocks
  // until it ends. Every input must be given with the compiled shape; every
  // param of the graph must be in `params`. Fails RESOURCE_EXHAUSTED when the
  // device's queue is full, UNAVAILABLE (backend::FaultedDevice) when the
  // device faulted or is unhealthy, CANCELLED / DEADLINE_EXCEEDED when the run
  // was stopped before it started or between kernels.
  absl::StatusOr<RunResult> Run(Executable& executable, std::span<const TensorRef> inputs,
                                const ParamSet* params, const RunOptions& options);

  // Run without blocking: the run is queued on its device's scheduler (or run
  // at once on the calling thread under the inline rule) and `done` is called
  // exactly once with the outcome, on a device thread or the calling thread.
  // The engine keeps `executable`, `params` and `inputs` (views: the caller
  // keeps their bytes valid until `done`) until then. An error returned here
  // (queue full, device unhealthy) means `done` is never called.
  // The ticket names a queued run for CancelQueued (id 0: it already ran,
  // inline).
  using RunDone = std::function<void(absl::StatusOr<RunResult>)>;
  struct RunTicket {
    std::string device;
    uint64_t id = 0;
  };
  absl::StatusOr<RunTicket> RunAsync(std::shared_ptr<Executable> executable,
                                     std::vector<TensorRef> inputs,
                                     std::shared_ptr<const ParamSet> params, RunOptions options,
                                     RunDone done);
  // Drops a run still waiting in its device's queue: its `done` gets CANCELLED
  // (on this thread, before this returns). False when it started or ended; a
  // started run stops between kernels when RunOptions::cancelled is set.
  bool CancelQueued(const RunTicket& ticket);

  // Compile (cached) + run, with shapes taken from `inputs`.
  absl::StatusOr<RunResult> RunGraph(const v1::Graph& graph, std::span<const TensorRef> inputs,
                                     const ParamSet* params, const CompileOptions& compile,
                                     const RunOptions& run);

  CacheStats cache_stats() const;

 private:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
