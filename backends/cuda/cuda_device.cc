#include "backends/cuda/cuda_device.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string_view>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "backends/cuda/cuda_kernel.h"
#include "backends/cuda/cuda_stream.h"
#include "backends/cuda/cudnn_sdpa.h"
#include "backends/cuda/loaded_libraries.h"
#include "backends/cuda/nvrtc_compiler.h"
#include "base/status.h"
#include "spdlog/spdlog.h"

namespace kiln::cuda {
namespace {

// How long the allocation stream may take to order an allocation or free.
constexpr absl::Duration kAllocWait = absl::Seconds(30);

int Attribute(CUdevice d, CUdevice_attribute a) {
  int v = 0;
  Driver().cuDeviceGetAttribute(&v, a, d);
  return v;
}

}  // namespace

void PollBackoff(absl::Duration waited, int sleeps) {
  if (waited < kPollSpin) {
    std::this_thread::yield();
    return;
  }
  const int us = std::min(1000, 20 << std::min(6, sleeps / 16));
  std::this_thread::sleep_for(std::chrono::microseconds(us));
}

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(
    int ordinal, const backend::BackendOptions& options) {
  auto d = std::unique_ptr<CudaDevice>(new CudaDevice());
  KILN_RETURN_IF_ERROR(d->Init(ordinal, options));
  return d;
}

absl::Status CudaDevice::Init(int ordinal, const backend::BackendOptions& options) {
  const DriverApi& api = Driver();
  info_.id = absl::StrCat("cuda:", ordinal);
  KILN_RETURN_IF_ERROR(Check(api.cuDeviceGet(&device_, ordinal), "cuDeviceGet"));
  char name[256] = {};
  KILN_RETURN_IF_ERROR(Check(api.cuDeviceGetName(name, sizeof(name), device_), "cuDeviceGetName"));
  DeviceCaps& c = caps_;
  c.cc_major = Attribute(device_, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  c.cc_minor = Attribute(device_, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  if (c.cc_major < 7 || (c.cc_major == 7 && c.cc_minor < 5)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda: ", name, " is compute capability ", c.cc_major, ".", c.cc_minor,
                     "; the backend needs 7.5 or newer (NVRTC 13)"));
  }
  if (!Attribute(device_, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda: ", name, " lacks stream-ordered memory pools"));
  }
  c.sm_count = Attribute(device_, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  c.max_threads_per_block = Attribute(device_, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  c.max_grid_x = Attribute(device_, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X);
  c.max_shared_per_block_optin =
      Attribute(device_, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  c.memory_clock_khz = Attribute(device_, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE);
  c.bus_width_bits = Attribute(device_, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
  c.clock_khz = Attribute(device_, CU_DEVICE_ATTRIBUTE_CLOCK_RATE);
  size_t total = 0;
  KILN_RETURN_IF_ERROR(Check(api.cuDeviceTotalMem(&total, device_), "cuDeviceTotalMem"));
  c.memory_bytes = static_cast<int64_t>(total);
  c.arch = absl::StrCat("sm_", c.cc_major, c.cc_minor);
  CUuuid uuid;
  KILN_RETURN_IF_ERROR(Check(api.cuDeviceGetUuid(&uuid, device_), "cuDeviceGetUuid"));
  int driver = 0;
  api.cuDriverGetVersion(&driver);

  KILN_RETURN_IF_ERROR(
      Check(api.cuDevicePrimaryCtxRetain(&context_, device_), "cuDevicePrimaryCtxRetain"));
  KILN_RETURN_IF_ERROR(Enter());
  KILN_RETURN_IF_ERROR(
      Check(api.cuDeviceGetDefaultMemPool(&pool_, device_), "cuDeviceGetDefaultMemPool"));
  // Freed blocks stay in the pool (an arena the runtime reuses run to run).
  cuuint64_t keep = ~cuuint64_t{0};
  KILN_RETURN_IF_ERROR(
      Check(api.cuMemPoolSetAttribute(pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep),
            "cuMemPoolSetAttribute(RELEASE_THRESHOLD)"));
  {
    absl::MutexLock lock(&alloc_mu_);
    KILN_RETURN_IF_ERROR(
        Check(api.cuStreamCreate(&alloc_stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate"));
  }
  modules_ = std::make_unique<ModuleCache>(*this);

  backend::DeviceInfo& info = info_;
  info.kind = backend::DeviceKind::kGpu;
  info.max_concurrent_runs = 4;  // one run's host work overlaps another's kernels
  info.buffer_alignment = 256;   // cuBLASLt's fastest kernels want 256-byte operands
  // What the kernels reach of the roofline (docs/benchmarks.md): cuBLASLt
  // matmuls near peak, the NVRTC kernels near bandwidth; attention decomposes.
  info.roofline_efficiency = {{"matmul", 0.7}, {"attention", 0.3}, {"elementwise", 0.7},
                              {"norm", 0.6},   {"reduce", 0.5},    {"shape", 0.6}};
  info.backend = "cuda";
  info.name = name;
  info.arch = c.arch;
  info.driver_version = absl::StrCat("CUDA driver API ", driver / 1000, ".", (driver % 1000) / 10);
  info.identity = absl::StrFormat(
      "cuda|uuid=%s|%s|driver=%d",
      absl::BytesToHexString(std::string(reinterpret_cast<const char*>(uuid.bytes), 16)), c.arch,
      driver);
  info.memory_bytes = c.memory_bytes;
  info.host_memory = false;
  info.features = {c.arch, "memory_pools", "cublaslt", "nvrtc", "fp16", "bf16", "graphs"};
  if (c.cc_major >= 7) info.features.push_back("tensor_cores");
  // cuDNN is optional: without it attention stays on Kiln's own kernels.
  if (CudnnDisabledBy(std::getenv("KILN_CUDNN"))) {
    cudnn_missing_ = "disabled by KILN_CUDNN";
  } else if (absl::Status cudnn = LoadCudnn(); cudnn.ok()) {
    cudnn_version_ = CudnnVersion();
    info.features.push_back(absl::StrCat("cudnn-", CudnnVersionText(cudnn_version_)));
  } else {
    cudnn_missing_ = std::string(cudnn.message());
  }
  // Nominal until the engine calibrates: FP32 lanes x clock, HBM bus x clock.
  const double lanes = c.cc_major >= 8 && !(c.cc_major == 8 && c.cc_minor == 0) ? 128 : 64;
  backend::DeviceProfile& p = info.profile;
  p.peak_gflops_f32 = c.sm_count * lanes * 2.0 * c.clock_khz / 1e6;
  p.peak_gflops_f16 = p.peak_gflops_f32 * 8;  // tensor cores
  p.bandwidth_gbps = std::max(100.0, 2.0 * c.memory_clock_khz * (c.bus_width_bits / 8.0) / 1e6);
  p.launch_overhead_us = 4;
  p.host_to_device_gbps = 25;
  p.device_to_host_gbps = 25;
  p.sync_overhead_us = 15;
  p.calibrated = false;
  (void)options;
  OpenLibraries();
  return absl::OkStatus();
}

void CudaDevice::OpenLibraries() {
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  // Failures are not the device's: they are returned again at the first use
  // that needs the library (a cached cubin needs no NVRTC, attention without
  // cuDNN runs Kiln's kernels).
  auto t = Clock::now();
  (void)LoadNvrtc();
  const double nvrtc = ms(t);
  t = Clock::now();
  if (cudnn_version_ != 0) (void)cudnn_context();
  const double dnn = ms(t);
  const char* mode = std::getenv("KILN_CUDA_WARMUP");
  const std::string_view warm = mode != nullptr ? mode : "";
  spdlog::info(
      "{}: libraries open in {:.1f} ms (NVRTC {:.1f}, cuDNN's handle {:.1f}); cuBLASLt "
      "and cuDNN's engines warm up {}",
      info_.id, nvrtc + dnn, nvrtc, dnn,
      warm == "0"            ? "at first use (KILN_CUDA_WARMUP=0)"
      : warm == "background" ? "on a thread of their own (KILN_CUDA_WARMUP=background)"
                             : "now");
  if (warm == "0") return;
  if (warm == "background") {
    warm_up_ = std::thread([this] { WarmUp(); });
    return;
  }
  WarmUp();
}

void CudaDevice::WarmUp() {
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  const auto start = Clock::now();
  if (!Enter().ok()) return;
  auto t = Clock::now();
  absl::StatusOr<cublasLtHandle_t> handle = LtHandle();
  const double lt = ms(t);
  t = Clock::now();
  if (handle.ok()) WarmUpCublasLt(*handle);
  const double lt_types = ms(t);
  // cuDNN opens its engine libraries at the first plan that needs one (a
  // warm start's first attention prepare paid it): opened here instead.
  // KILN_CUDNN_PRELOAD=0 leaves them to cuDNN (a benchmark's comparison).
  t = Clock::now();
  std::string engines = "not opened";
  const char* preload = std::getenv("KILN_CUDNN_PRELOAD");
  if (cudnn_version_ != 0 && (preload == nullptr || std::string_view(preload) != "0")) {
    const std::set<std::string> opened = OpenCudnnEngineLibraries();
    engines = opened.empty() ? "none found" : absl::StrJoin(opened, ", ");
  }
  const double dnn_engines = ms(t);
  spdlog::info(
      "{}: warm-up done in {:.1f} ms (cuBLASLt's handle {:.1f}, its first query per data type "
      "{:.1f}, cuDNN's engine libraries {:.1f}: {})",
      info_.id, ms(start), lt, lt_types, dnn_engines, engines);
}

void CudaDevice::WarmUpCublasLt(cublasLtHandle_t handle) {
  const CublasLtApi& lt = CublasLt();
  for (const cudaDataType_t type : {CUDA_R_16BF, CUDA_R_16F, CUDA_R_32F}) {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t layout = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    const uint64_t n = 256, workspace = uint64_t{32} << 20;
    if (lt.cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) ==
            CUBLAS_STATUS_SUCCESS &&
        lt.cublasLtMatrixLayoutCreate(&layout, type, n, n, n) == CUBLAS_STATUS_SUCCESS &&
        lt.cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS) {
      lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                              &workspace, sizeof(workspace));
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      if (lt.cublasLtMatmulAlgoGetHeuristic(handle, desc, layout, layout, layout, layout, pref, 1,
                                            &result, &found) == CUBLAS_STATUS_SUCCESS &&
          found > 0) {
        cublasLtMatmulHeuristicResult_t check{};
        (void)lt.cublasLtMatmulAlgoCheck(handle, desc, layout, layout, layout, layout, &result.algo,
                                         &check);
      }
    }
    if (pref != nullptr) lt.cublasLtMatmulPreferenceDestroy(pref);
    if (layout != nullptr) lt.cublasLtMatrixLayoutDestroy(layout);
    if (desc != nullptr) lt.cublasLtMatmulDescDestroy(desc);
  }
}

CudaDevice::~CudaDevice() {
  if (warm_up_.joinable()) warm_up_.join();
  if (context_ == nullptr) return;
  const DriverApi& api = Driver();
  if (Enter().ok()) {
    absl::MutexLock lock(&alloc_mu_);
    if (alloc_stream_ != nullptr) {
      (void)WaitInternal(alloc_stream_, "the allocation stream");
      api.cuStreamDestroy(alloc_stream_);
    }
  }
  modules_.reset();
  {
    absl::MutexLock lock(&cudnn_mu_);
    cudnn_.reset();
  }
  {
    absl::MutexLock lock(&lt_mu_);
    if (lt_ != nullptr) CublasLt().cublasLtDestroy(lt_);
  }
  api.cuDevicePrimaryCtxRelease(device_);
}

absl::Status CudaDevice::Enter() const {
  if (faulted_.load(std::memory_order_acquire)) return Health();
  if (context_ == nullptr) return absl::OkStatus();  // during Init, before the context
  return Check(Driver().cuCtxSetCurrent(context_), "cuCtxSetCurrent");
}

absl::Status CudaDevice::Check(CUresult r, const char* call) const {
  absl::Status s = CuCheck(r, call, info_.id);
  if (!s.ok() && backend::FaultedDevice(s)) MarkFaulted(s);
  return s;
}

absl::StatusOr<cublasLtMatmulAlgo_t> CudaDevice::LtHeuristicAlgo(
    cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
    cublasLtMatrixLayout_t c, uint64_t workspace_bytes, uint32_t min_alignment,
    absl::string_view what) {
  const CublasLtApi& lt = CublasLt();
  KILN_ASSIGN_OR_RETURN(cublasLtHandle_t handle, LtHandle());
  cublasLtMatmulPreference_t pref = nullptr;
  KILN_RETURN_IF_ERROR(
      CheckCublas(lt.cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate"));
  lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                          &workspace_bytes, sizeof(workspace_bytes));
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    lt.cublasLtMatmulPreferenceSetAttribute(pref, attr, &min_alignment, sizeof(min_alignment));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const absl::Status s =
      CheckCublas(lt.cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, c, c, pref, 1, &result,
                                                    &found),
                  "cublasLtMatmulAlgoGetHeuristic");
  lt.cublasLtMatmulPreferenceDestroy(pref);
  KILN_RETURN_IF_ERROR(s) << "for " << what;
  if (found == 0 || result.state != CUBLAS_STATUS_SUCCESS) {
    return absl::UnimplementedError(
        absl::StrCat(info_.id, ": cuBLASLt has no algorithm for ", what));
  }
  return result.algo;
}

absl::Status CudaDevice::CheckCublas(cublasStatus_t r, const char* call) const {
  absl::Status s = CublasCheck(r, call, info_.id);
  if (!s.ok() && backend::FaultedDevice(s)) MarkFaulted(s);
  return s;
}

void CudaDevice::MarkFaulted(const absl::Status& fault) const {
  absl::MutexLock lock(&fault_mu_);
  if (fault_.ok()) fault_ = fault;
  faulted_.store(true, std::memory_order_release);
}

absl::Status CudaDevice::Health() const {
  if (!faulted_.load(std::memory_order_acquire)) return absl::OkStatus();
  absl::MutexLock lock(&fault_mu_);
  return fault_;
}

absl::Status CudaDevice::WaitInternal(CUstream stream, const char* what) const {
  return PollUntilDone([&] { return Driver().cuStreamQuery(stream); }, kAllocWait, what);
}

absl::StatusOr<std::unique_ptr<backend::Buffer>> CudaDevice::Allocate(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat(info_.id, ": negative allocation"));
  if (bytes == 0) return std::unique_ptr<backend::Buffer>(std::make_unique<CudaBuffer>(this, 0, 0));
  KILN_RETURN_IF_ERROR(Enter());
  CUdeviceptr ptr = 0;
  {
    absl::MutexLock lock(&alloc_mu_);
    const absl::Status s = Check(
        Driver().cuMemAllocFromPoolAsync(&ptr, static_cast<size_t>(bytes), pool_, alloc_stream_),
        "cuMemAllocFromPoolAsync");
    if (!s.ok()) return StatusBuilder(s) << info_.id << ": cannot allocate " << bytes << " bytes";
    // Ready for every stream once the allocation stream passed it.
    KILN_RETURN_IF_ERROR(WaitInternal(alloc_stream_, "an allocation"));
  }
  memory_in_use_ += bytes;
  return std::unique_ptr<backend::Buffer>(std::make_unique<CudaBuffer>(this, ptr, bytes));
}

void CudaDevice::FreeBuffer(CUdeviceptr ptr, int64_t bytes) {
  memory_in_use_ -= bytes;
  if (!Enter().ok()) return;  // a faulted context is torn down with the worker
  absl::MutexLock lock(&alloc_mu_);
  (void)Check(Driver().cuMemFreeAsync(ptr, alloc_stream_), "cuMemFreeAsync");
}

absl::StatusOr<std::unique_ptr<backend::Stream>> CudaDevice::CreateStream() {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<CudaStream> s, CudaStream::Create(*this));
  return std::unique_ptr<backend::Stream>(std::move(s));
}

absl::StatusOr<CudaStream*> AsCudaStream(backend::Stream& stream, const CudaDevice& device) {
  auto* s = dynamic_cast<CudaStream*>(&stream);
  if (s == nullptr || &s->device() != &device) {
    return absl::InvalidArgumentError(
        absl::StrCat(device.info().id, ": the stream belongs to another device"));
  }
  return s;
}

absl::StatusOr<CUdeviceptr> CudaDevice::Resolve(const backend::BufferView& view, int64_t need,
                                                const std::string& what) const {
  const auto* buf = dynamic_cast<const CudaBuffer*>(view.buffer);
  if (buf == nullptr || buf->owner() != this) {
    return absl::InvalidArgumentError(
        absl::StrCat(info_.id, ": ", what, " is not a buffer of this device"));
  }
  if (view.offset < 0 || need < 0 || view.bytes < need || view.offset + need > buf->size()) {
    return absl::OutOfRangeError(
        absl::StrCat(info_.id, ": ", what, " needs ", need, " bytes at offset ", view.offset,
                     " of a ", view.bytes, "-byte view into a ", buf->size(), "-byte buffer"));
  }
  if (need == 0) return CUdeviceptr{0};
  return buf->ptr() + static_cast<CUdeviceptr>(view.offset);
}

// One cuMemHostRegister'ed range; unregistered when destroyed.
class CudaHostRegistration final : public backend::HostRegistration {
 public:
  CudaHostRegistration(CudaDevice& device, void* base) : device_(device), base_(base) {}
  ~CudaHostRegistration() override {
    {
      absl::MutexLock lock(&device_.host_mu_);
      device_.registered_.erase(reinterpret_cast<uintptr_t>(base_));
    }
    if (device_.Enter().ok()) (void)device_.Check(Driver().cuMemHostUnregister(base_), "cuMemHostUnregister");
  }
  CudaHostRegistration(const CudaHostRegistration&) = delete;
  CudaHostRegistration& operator=(const CudaHostRegistration&) = delete;

 private:
  CudaDevice& device_;
  void* const base_;
};

absl::StatusOr<std::unique_ptr<backend::HostRegistration>> CudaDevice::RegisterHostMemory(
    void* base, int64_t bytes) {
  if (base == nullptr || bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(info_.id, ": cannot register ", bytes, " bytes of host memory at ",
                     absl::Hex(reinterpret_cast<uintptr_t>(base))));
  }
  const auto begin = reinterpret_cast<uintptr_t>(base);
  const uintptr_t end = begin + static_cast<uintptr_t>(bytes);
  {
    absl::MutexLock lock(&host_mu_);
    auto next = registered_.lower_bound(begin);
    const bool overlaps = (next != registered_.end() && next->first < end) ||
                          (next != registered_.begin() && std::prev(next)->second > begin);
    if (overlaps) {
      return absl::AlreadyExistsError(
          absl::StrCat(info_.id, ": the host range overlaps one already registered"));
    }
  }
  KILN_RETURN_IF_ERROR(Enter());
  // PORTABLE: the pages count as pinned in every context (cuBLASLt's, any
  // runtime-API code's), not only the primary one that registers them.
  KILN_RETURN_IF_ERROR(Check(Driver().cuMemHostRegister(base, static_cast<size_t>(bytes),
                                                        CU_MEMHOSTREGISTER_PORTABLE),
                             "cuMemHostRegister"))
      << "(" << bytes << " bytes)";
  {
    absl::MutexLock lock(&host_mu_);
    registered_[begin] = end;
  }
  return std::unique_ptr<backend::HostRegistration>(
      std::make_unique<CudaHostRegistration>(*this, base));
}

bool CudaDevice::IsRegistered(const void* ptr, int64_t bytes) const {
  const auto begin = reinterpret_cast<uintptr_t>(ptr);
  absl::MutexLock lock(&host_mu_);
  auto it = registered_.upper_bound(begin);
  if (it == registered_.begin()) return false;
  --it;
  return begin < it->second && bytes >= 0 && static_cast<uintptr_t>(bytes) <= it->second - begin;
}

absl::Status CudaDevice::CopyToDevice(backend::Stream& stream, const void* src,
                                      backend::BufferView dst) {
  KILN_ASSIGN_OR_RETURN(CudaStream * s, AsCudaStream(stream, *this));
  KILN_RETURN_IF_ERROR(s->failed());
  if (dst.bytes == 0) return absl::OkStatus();
  KILN_ASSIGN_OR_RETURN(CUdeviceptr d, Resolve(dst, dst.bytes, "copy destination"));
  return s->Upload(src, d, dst.bytes);
}

absl::Status CudaDevice::CopyToHost(backend::Stream& stream, backend::BufferView src, void* dst) {
  KILN_ASSIGN_OR_RETURN(CudaStream * s, AsCudaStream(stream, *this));
  KILN_RETURN_IF_ERROR(s->failed());
  if (src.bytes == 0) return absl::OkStatus();
  KILN_ASSIGN_OR_RETURN(CUdeviceptr from, Resolve(src, src.bytes, "copy source"));
  return s->Download(from, dst, src.bytes);
}

absl::Status CudaDevice::CopyOnDevice(backend::Stream& stream, backend::BufferView src,
                                      backend::BufferView dst) {
  KILN_ASSIGN_OR_RETURN(CudaStream * s, AsCudaStream(stream, *this));
  KILN_RETURN_IF_ERROR(s->failed());
  if (src.bytes == 0) return absl::OkStatus();
  KILN_ASSIGN_OR_RETURN(CUdeviceptr from, Resolve(src, src.bytes, "copy source"));
  KILN_ASSIGN_OR_RETURN(CUdeviceptr to, Resolve(dst, src.bytes, "copy destination"));
  if (from == to) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(Enter());
  const size_t n = static_cast<size_t>(src.bytes);
  const bool overlap = from < to + n && to < from + n;
  if (!overlap) {
    return s->Note(
        Check(Driver().cuMemcpyDtoDAsync(to, from, n, s->stream()), "cuMemcpyDtoDAsync"));
  }
  // Overlapping ranges: through stream-ordered temporary memory.
  KILN_ASSIGN_OR_RETURN(CUdeviceptr tmp, s->AllocateTemporary(src.bytes));
  absl::Status st =
      Check(Driver().cuMemcpyDtoDAsync(tmp, from, n, s->stream()), "cuMemcpyDtoDAsync");
  if (st.ok()) st = Check(Driver().cuMemcpyDtoDAsync(to, tmp, n, s->stream()), "cuMemcpyDtoDAsync");
  s->FreeTemporary(tmp);
  return s->Note(st);
}

absl::Status CudaDevice::CopyFromPeer(backend::Stream& stream, backend::Device& peer,
                                      backend::Stream& peer_stream, backend::BufferView src,
                                      backend::BufferView dst) {
  auto* other = dynamic_cast<CudaDevice*>(&peer);
  if (other == nullptr || other == this)
    return Device::CopyFromPeer(stream, peer, peer_stream, src, dst);
  KILN_ASSIGN_OR_RETURN(CudaStream * s, AsCudaStream(stream, *this));
  KILN_ASSIGN_OR_RETURN(CudaStream * ps, AsCudaStream(peer_stream, *other));
  KILN_RETURN_IF_ERROR(s->failed());
  KILN_RETURN_IF_ERROR(ps->failed());
  if (src.bytes == 0) return absl::OkStatus();
  KILN_ASSIGN_OR_RETURN(CUdeviceptr from, other->Resolve(src, src.bytes, "peer copy source"));
  KILN_ASSIGN_OR_RETURN(CUdeviceptr to, Resolve(dst, src.bytes, "peer copy destination"));
  KILN_RETURN_IF_ERROR(Enter());
  const DriverApi& api = Driver();
  {
    absl::MutexLock lock(&peers_mu_);
    auto it = peer_access_.find(other);
    if (it == peer_access_.end()) {
      int can = 0;
      KILN_RETURN_IF_ERROR(
          Check(api.cuDeviceCanAccessPeer(&can, device_, other->device_), "cuDeviceCanAccessPeer"));
      bool granted = false;
      if (can) {
        // Pool memory is not covered by context peer access: grant this
        // device access to the peer's pool.
        CUmemAccessDesc access{};
        access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        access.location.id = static_cast<int>(device_);
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        granted =
            Check(api.cuMemPoolSetAccess(other->pool_, &access, 1), "cuMemPoolSetAccess").ok();
      }
      it = peer_access_.emplace(other, granted).first;
    }
    if (!it->second) return Device::CopyFromPeer(stream, peer, peer_stream, src, dst);
  }
  // Order after the peer stream's work so far, then copy over NVLink/PCIe.
  KILN_RETURN_IF_ERROR(other->Enter());
  CUevent ready = nullptr;
  KILN_RETURN_IF_ERROR(
      other->Check(api.cuEventCreate(&ready, CU_EVENT_DISABLE_TIMING), "cuEventCreate"));
  absl::Status st = other->Check(api.cuEventRecord(ready, ps->stream()), "cuEventRecord");
  KILN_RETURN_IF_ERROR(Enter());
  if (st.ok()) st = Check(api.cuStreamWaitEvent(s->stream(), ready, 0), "cuStreamWaitEvent");
  api.cuEventDestroy(ready);  // released once the wait no longer needs it
  if (st.ok()) {
    st = Check(api.cuMemcpyDtoDAsync(to, from, static_cast<size_t>(src.bytes), s->stream()),
               "cuMemcpyDtoDAsync(peer)");
  }
  return s->Note(st);
}

absl::StatusOr<cublasLtHandle_t> CudaDevice::LtHandle() {
  KILN_RETURN_IF_ERROR(LoadCublasLt());
  absl::MutexLock lock(&lt_mu_);
  if (lt_ == nullptr) {
    KILN_RETURN_IF_ERROR(Enter());
    KILN_RETURN_IF_ERROR(CheckCublas(CublasLt().cublasLtCreate(&lt_), "cublasLtCreate"));
  }
  return lt_;
}

std::optional<cublasLtMatmulAlgo_t> CudaDevice::FindAlgo(const std::string& key) const {
  absl::MutexLock lock(&algos_mu_);
  auto it = algos_.find(key);
  if (it == algos_.end()) return std::nullopt;
  return it->second;
}

void CudaDevice::KeepAlgo(const std::string& key, const cublasLtMatmulAlgo_t& algo) {
  absl::MutexLock lock(&algos_mu_);
  algos_[key] = algo;
}

absl::StatusOr<CudnnContext*> CudaDevice::cudnn_context() {
  if (cudnn_version_ == 0) {
    return absl::FailedPreconditionError(absl::StrCat(info_.id, ": no cuDNN: ", cudnn_missing_));
  }
  absl::MutexLock lock(&cudnn_mu_);
  if (cudnn_ == nullptr) {
    KILN_ASSIGN_OR_RETURN(cudnn_, CudnnContext::Create(*this));
  }
  return cudnn_.get();
}

backend::Claim CudaDevice::Supports(const backend::KernelSpec& spec) const {
  if (absl::Status h = Health(); !h.ok()) return backend::Claim::Fault(h);
  const CudaOpEntry* entry = FindCudaOp(spec.op);
  if (entry == nullptr) {
    return backend::Claim::No(absl::StrCat("cuda has no kernel for ", v1::OpKind_Name(spec.op)));
  }
  return entry->supports(*this, spec);
}

absl::StatusOr<std::unique_ptr<backend::Kernel>> CudaDevice::PrepareKernel(
    const backend::KernelSpec& spec, backend::PrepareContext& context) {
  const backend::Claim claim = Supports(spec);
  if (!claim.fault.ok()) return claim.fault;
  if (!claim.native) {
    return absl::UnimplementedError(absl::StrCat(spec.label, ": ", claim.reason));
  }
  KILN_RETURN_IF_ERROR(Enter());
  absl::StatusOr<std::unique_ptr<backend::Kernel>> kernel =
      FindCudaOp(spec.op)->create(*this, spec, context);
  if (!kernel.ok()) return StatusBuilder(kernel.status()) << "while preparing " << spec.label;
  return kernel;
}

}  // namespace kiln::cuda
