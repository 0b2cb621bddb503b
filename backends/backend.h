// The one interface between the engine and the devices (DESIGN.md section 5).
//
// A Backend owns Devices. A Device owns its memory (Buffers), its in-order work
// queues (Streams), and builds Kernels from KernelSpecs after claiming them.
// The interface assumes devices with their own memory and asynchronous queues;
// the CPU simply completes work as it is enqueued. Backends never see passes:
// they answer "can you run this op on these types?" (Supports) and "build it"
// (PrepareKernel), and the engine does the rest.
//
// Lifetimes: a Device outlives every Buffer, Stream and Kernel it created.
// Thread safety: Device and Backend methods are thread-safe. A Stream is used
// by one thread at a time. Kernel::Launch is not reentrant: the executor never
// launches one Kernel object from two threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/dtype.h"
#include "base/host_tensor.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::backend {

// A value as a kernel sees it: concrete dims, dense row-major layout.
struct TensorDesc {
  DType dtype = v1::DTYPE_UNSPECIFIED;
  Dims dims;

  int64_t rank() const { return static_cast<int64_t>(dims.size()); }
  int64_t num_elements() const;
  int64_t num_bytes() const;
};

// Everything needed to build one kernel: op, attributes, operand and result
// types. `label` names the node(s) for error messages ("node 7 \"fc1\" (matmul)").
struct KernelSpec {
  std::string name;
  std::string label;
  v1::OpKind op = v1::OP_KIND_UNSPECIFIED;
  v1::Attrs attrs;
  std::vector<TensorDesc> inputs;
  std::vector<TensorDesc> outputs;
  // CompileOptions.allow_int8_activations of the executable the kernel belongs
  // to (runtime::ProgramOptions): a DequantMatMul may round its activations to
  // int8 blocks. Only backends whose device lists the feature
  // kFeatureInt8Activations act on it; the others ignore it and stay exact. Not
  // sent to device workers (no backend in a worker claims the feature).
  bool allow_int8_activations = false;
};

// DeviceInfo.features entry of a device whose DequantMatMul honours
// KernelSpec.allow_int8_activations.
inline constexpr char kFeatureInt8Activations[] = "dequant_matmul_int8_activations";

// Measured (or nominal, until calibrated) speed of a device, for the cost model.
struct DeviceProfile {
  double peak_gflops_f32 = 0;
  double peak_gflops_f16 = 0;
  double bandwidth_gbps = 0;       // memory bandwidth, bytes read + written
  double launch_overhead_us = 0;   // fixed cost per kernel launch
  double host_to_device_gbps = 0;  // copy bandwidth; 0 = shares host memory
  double device_to_host_gbps = 0;  // read-back bandwidth; 0 = as host_to_device
  double sync_overhead_us = 0;     // fixed cost per run: submit + wait for the queue
  bool calibrated = false;
};

// What a device is, for placement and isolation: the host's own cores, or an
// accelerator with its own queues (a CPU-emulated Vulkan device is kCpu).
enum class DeviceKind { kCpu, kGpu };

struct DeviceInfo {
  std::string id;              // "cpu:0", "vulkan:0", "cuda:0"
  DeviceKind kind = DeviceKind::kCpu;
  // Runs the device serves at once to good effect: the device scheduler's
  // slots (1 on the CPU, whose one OpenMP team takes every core; several
  // streams on a GPU, so host work of one run overlaps device work of another).
  int max_concurrent_runs = 1;
  // Offsets of buffer views bound to kernels must be multiples of this (a
  // power of two; the memory planner aligns every arena slot of the device).
  int64_t buffer_alignment = 64;
  // Cost-model corrections: the fraction of the roofline this device's kernels
  // reach per op family ("matmul", "conv", "attention", "elementwise",
  // "reduce", "norm", "shape", "other"); a family not listed counts as 1.
  std::map<std::string, double> roofline_efficiency;
  std::string backend;         // "cpu", "vulkan", "cuda"
  std::string name;            // human-readable model name
  std::string arch;            // "x86-64-v3+avx512", "sm_90", Vulkan device type
  std::string driver_version;
  std::string identity;        // stable across restarts: keys calibration and caches
  int64_t memory_bytes = 0;
  int threads = 0;             // host threads the device's kernels use (CPU)
  bool host_memory = false;    // buffers are directly host-addressable
  std::vector<std::string> features;  // "avx512f", "fp16", "subgroups", "cooperative_matrix"
  DeviceProfile profile;
};

// Device memory; released when destroyed.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual int64_t size() const = 0;
  // Host address of byte 0 when the memory is host-addressable, else nullptr.
  virtual void* host_ptr() const { return nullptr; }
};

// A byte range of a Buffer. Non-owning.
struct BufferView {
  Buffer* buffer = nullptr;
  int64_t offset = 0;
  int64_t bytes = 0;

  // REQUIRES: buffer->host_ptr() != nullptr.
  void* host() const { return static_cast<char*>(buffer->host_ptr()) + offset; }
  template <typename T>
  T* as() const { return static_cast<T*>(host()); }
};

// A point in a stream's timeline.
class Event {
 public:
  virtual ~Event() = default;
  // Microseconds from `earlier` to this event. REQUIRES: both events are on
  // the same stream and the stream has been synchronized past this event.
  virtual absl::StatusOr<double> MicrosSince(const Event& earlier) const = 0;
};

// An in-order queue of copies and kernels on one device.
class Stream {
 public:
  // How long Synchronize() waits when the caller names no bound: a device that
  // has not finished a few kernels in this long is treated as hung.
  static constexpr absl::Duration kDefaultWaitTimeout = absl::Seconds(120);

  virtual ~Stream() = default;
  // Blocks until everything enqueued so far has finished, for at most
  // `timeout`; returns the first asynchronous failure, if any. A wait that
  // times out is a device fault: UNAVAILABLE naming the device, and the stream
  // stays failed (every later call returns the same status). No device wait
  // in Kiln is unbounded.
  virtual absl::Status SynchronizeFor(absl::Duration timeout) = 0;
  absl::Status Synchronize() { return SynchronizeFor(kDefaultWaitTimeout); }
  // Work enqueued on this stream after Wait starts only after the work that
  // preceded `event` on its stream finished. `event` must come from a stream
  // of the same device (INVALID_ARGUMENT otherwise) whose work up to the event
  // has been handed to the device (FlushWork; FAILED_PRECONDITION otherwise).
  // Cross-device order is the engine's, through copies.
  virtual absl::Status Wait(const Event& event) = 0;
  // Hands everything enqueued so far to the device without waiting for it.
  virtual absl::Status FlushWork() = 0;
  // Records an event after all work enqueued so far.
  virtual absl::StatusOr<std::unique_ptr<Event>> Record() = 0;
};

// Device faults: a device that hung (a wait timed out), lost its context or
// crashed its worker. The status is UNAVAILABLE, its message names the device
// and what happened, and it carries the device id as a payload so the engine
// can tell a fault (mark the device unhealthy, discard the run context,
// restart) from an ordinary error without parsing messages.
inline constexpr char kDeviceFaultPayload[] = "type.kiln.dev/kiln.DeviceFault";
absl::Status DeviceFault(const std::string& device, const std::string& what);
// The faulted device's id, or nullopt when `status` is not a device fault.
std::optional<std::string> FaultedDevice(const absl::Status& status);

// Binary artifacts a backend's codegen may cache (SPIR-V, cubins), keyed by
// the backend over kernel source, codegen version, arch and flags. Implemented
// by the engine's compile cache; thread-safe.
class KernelBinaryCache {
 public:
  virtual ~KernelBinaryCache() = default;
  virtual std::optional<std::string> Lookup(const std::string& key) = 0;
  virtual void Store(const std::string& key, std::string_view binary) = 0;
};

struct PrepareContext {
  KernelBinaryCache* binaries = nullptr;  // may be null (no cache)
  int kernel_cache_hits = 0;              // incremented by the backend
  int kernel_cache_misses = 0;
};

// A kernel built for one KernelSpec on one device.
class Kernel {
 public:
  virtual ~Kernel() = default;
  // What runs, e.g. "onednn:matmul+bias+gelu", "cpu:softmax_f32", "spirv:softmax_f32".
  virtual std::string implementation() const = 0;
  // Enqueues the kernel on `stream`. Views stay valid until the stream has
  // completed the work. Inputs and outputs are in KernelSpec order; outputs
  // may alias inputs only where the engine planned an in-place reuse.
  virtual absl::Status Launch(Stream& stream, std::span<const BufferView> inputs,
                              std::span<const BufferView> outputs) = 0;
};

// Whether a device runs a spec natively, and if not, why (for reports and
// UNSUPPORTED messages).
struct Claim {
  bool native = false;
  std::string reason;
  // Not OK when the device could not answer at all (a device fault: its
  // worker died): the compile fails with this status, UNAVAILABLE, rather
  // than calling the op unsupported.
  absl::Status fault;
  static Claim Yes() { return {true, "", absl::OkStatus()}; }
  static Claim No(std::string why) { return {false, std::move(why), absl::OkStatus()}; }
  static Claim Fault(absl::Status s) {
    std::string why(s.message());
    return {false, std::move(why), std::move(s)};
  }
};

class Device {
 public:
  virtual ~Device() = default;
  virtual const DeviceInfo& info() const = 0;

  virtual absl::StatusOr<std::unique_ptr<Buffer>> Allocate(int64_t bytes) = 0;
  virtual absl::StatusOr<std::unique_ptr<Stream>> CreateStream() = 0;
  // Copies are enqueued on `stream` (one of this device's) in order with its
  // kernels. Host-pointer lifetimes:
  // - CopyToDevice reads `src` (dst.bytes of it) before it returns (staging it
  //   if the device needs time): the caller may reuse or free it at once.
  // - CopyToHost writes `dst` by the time a Synchronize of `stream` passes the
  //   copy; `dst` must stay valid and untouched until then.
  // - CopyOnDevice: `src` and `dst` may overlap.
  virtual absl::Status CopyToDevice(Stream& stream, const void* src, BufferView dst) = 0;
  virtual absl::Status CopyToHost(Stream& stream, BufferView src, void* dst) = 0;
  virtual absl::Status CopyOnDevice(Stream& stream, BufferView src, BufferView dst) = 0;
  // Device-to-device without host staging: enqueues on `stream` (one of this
  // device's) a copy of `src`, a buffer of `peer`, into `dst`, ordered after
  // the work enqueued on `peer_stream` (one of `peer`'s) so far. UNIMPLEMENTED
  // when this device cannot reach `peer`'s memory directly (no peer access,
  // another backend, another process): the engine then stages the bytes
  // through host memory, as it does for devices without this.
  virtual absl::Status CopyFromPeer(Stream& stream, Device& peer, Stream& peer_stream,
                                    BufferView src, BufferView dst) {
    return absl::UnimplementedError(absl::StrCat(info().id, " cannot copy from ", peer.info().id,
                                                 " without host staging"));
  }

  // The capability claim: can this device run `spec` as one kernel?
  virtual Claim Supports(const KernelSpec& spec) const = 0;
  // Builds the kernel; fails UNIMPLEMENTED when Supports says no.
  virtual absl::StatusOr<std::unique_ptr<Kernel>> PrepareKernel(const KernelSpec& spec,
                                                                PrepareContext& context) = 0;
  // Bytes currently allocated through this device.
  virtual int64_t memory_in_use() const = 0;

  // Restarts: a device whose work runs in a worker process is restarted
  // after a fault by starting a fresh worker; its memory, streams and kernels
  // are gone. `generation` counts those restarts: buffers, streams and
  // kernels from an earlier generation fail as device faults, so the engine
  // makes what it keeps (constants, parameter mirrors, run contexts) again.
  // An in-process device never restarts (a restart is a probe by the engine).
  virtual uint64_t generation() const { return 0; }
  virtual absl::Status Restart() { return absl::OkStatus(); }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual std::string version() const = 0;
  // The devices found at creation; empty when the driver or library is missing.
  virtual std::vector<Device*> devices() const = 0;
};

struct BackendOptions {
  int cpu_threads = 0;          // 0 = every core
  std::string cache_dir;        // for backend-owned persistent state (pipeline caches)
};

// Backends register a factory at static-initialization time; the engine
// creates every registered backend at start. A factory that fails (no driver)
// returns an error that is logged, and the backend lists no devices.
using BackendFactory =
    std::function<absl::StatusOr<std::unique_ptr<Backend>>(const BackendOptions&)>;

struct BackendRegistration {
  BackendRegistration(std::string name, int priority, BackendFactory factory);
};

struct RegisteredBackend {
  std::string name;
  int priority;  // lower first; the CPU backend is 0
  BackendFactory factory;
};
std::vector<RegisteredBackend> RegisteredBackends();

}  // namespace kiln::backend
