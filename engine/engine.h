// kiln::Engine: the compiler + runtime in one object, used in-process and by
// kilnd. It verifies a wire graph, compiles it through the staged pipeline
// (with the two-level disk cache), places it on the local devices, and runs it.
//
// Thread safety: every method is thread-safe. Executables and ParamSets are
// immutable after creation and shared (shared_ptr): a session holds them while
// the engine's in-memory cache may drop them. Runs of one Executable are
// serialized on its arena; runs of different executables proceed concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "engine/base/host_tensor.h"
#include "engine/ir/verifier.h"
#include "kiln/v1/executable.pb.h"
#include "kiln/v1/graph.pb.h"
#include "kiln/v1/report.pb.h"

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
  int cpu_threads = 0;               // 0 = every core
  ir::VerifyOptions verify;          // graph limits (nodes, rank, elements, depth)
  int64_t max_memory_executables = 256;  // in-memory executable cache entries
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
  // microseconds on a virtualized host). 0 always hands runs to the worker.
  double inline_run_micros = 250;
};

// Per-device worker statistics (busy time, runs, queue length).
struct DeviceStats {
  std::string device;
  int64_t runs = 0;
  int64_t inline_runs = 0;  // of `runs`, run on the caller's thread
  double busy_micros = 0;
  double uptime_micros = 0;
  int queued = 0;
  int64_t memory_in_use = 0;
  bool calibrated = false;
  bool calibration_from_cache = false;
  bool calibration_contended = false;  // measured on a busy host, not cached
};

struct CompileOptions {
  std::string device = "auto";       // "auto" or a device id
  bool prefer_common_ir = false;
  bool enable_fusion = true;
  // Writes the text IR after every stage into this directory (also set by
  // the KILN_DUMP environment variable).
  std::string dump_dir;
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
};

struct RunOptions {
  bool report = false;               // fill RunResult::report (steps, timings)
  std::string request_id;
  std::string tenant;
};

struct RunResult {
  std::vector<std::pair<std::string, HostTensor>> outputs;  // graph output order
  v1::DispatchReport report;         // filled when RunOptions::report
};

struct CompileResult {
  std::shared_ptr<Executable> executable;
  v1::CompileReport report;          // cache outcome, stage timings, memory plan
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

  // Runs an executable on the worker of the device it was placed on (runs on
  // different devices proceed concurrently). Every input must be given with
  // the compiled shape; every param of the graph must be in `params`.
  absl::StatusOr<RunResult> Run(Executable& executable, std::span<const TensorRef> inputs,
                                const ParamSet* params, const RunOptions& options);

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
