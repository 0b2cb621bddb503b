#include "backends/cuda/cudnn_sdpa.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_device.h"
#include "backends/cuda/loaded_libraries.h"
#include "backends/cuda/prepare_cache.h"
#include "base/status.h"

namespace kiln::cuda {
namespace {

// Deprecated in cudnn_graph.h (so named by value here to keep -Werror quiet)
// but still what 9.x reads to bind the operation graph and the execution
// plan to a handle.
constexpr auto kOperationGraphHandle = static_cast<cudnnBackendAttributeName_t>(800);
constexpr auto kExecutionPlanHandle = static_cast<cudnnBackendAttributeName_t>(400);

// The kernel-cache entry kind of a serialized plan (prepare_cache.h).
constexpr char kCudnnPlanEntry[] = "cudnn-plan";

// The operands' unique ids in the variant pack.
enum Uid : int64_t {
  kQ = 1,
  kK = 2,
  kV = 3,
  kO = 4,
  kScale = 5,
  kNegInf = 6,
  kSeqKv = 7,
  kSeqQ = 8,
  kVirtual = 100,  // virtual tensors count up from here
};

using Dims4 = std::array<int64_t, 4>;

Dims4 Dense(const Dims4& d) { return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1}; }

// Builds the op graph's descriptors; each one it creates goes into `owned`.
class GraphBuilder {
 public:
  GraphBuilder(const CudaDevice& device, std::vector<cudnnBackendDescriptor_t>& owned)
      : device_(device), owned_(owned) {}

  absl::StatusOr<cudnnBackendDescriptor_t> Make(cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d = nullptr;
    KILN_RETURN_IF_ERROR(
        Check(Cudnn().cudnnBackendCreateDescriptor(type, &d), "cudnnBackendCreateDescriptor"));
    owned_.push_back(d);
    return d;
  }
  absl::Status Set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                   cudnnBackendAttributeType_t type, int64_t count, const void* value) {
    return Check(Cudnn().cudnnBackendSetAttribute(d, name, type, count, value),
                 "cudnnBackendSetAttribute");
  }
  absl::Status Finalize(cudnnBackendDescriptor_t d, const char* what) {
    return Check(Cudnn().cudnnBackendFinalize(d), what);
  }

  absl::StatusOr<cudnnBackendDescriptor_t> Tensor(int64_t uid, cudnnDataType_t dt,
                                                  const Dims4& dims, const Dims4& strides,
                                                  bool is_virtual, bool by_value = false) {
    KILN_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t t, Make(CUDNN_BACKEND_TENSOR_DESCRIPTOR));
    const int64_t alignment = 16;
    KILN_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt));
    KILN_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data()));
    KILN_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data()));
    KILN_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
    KILN_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment));
    KILN_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual));
    if (by_value) {
      KILN_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value));
    }
    KILN_RETURN_IF_ERROR(Finalize(t, "cudnnBackendFinalize(tensor)"));
    return t;
  }
  // A virtual tensor with the next free uid.
  absl::StatusOr<cudnnBackendDescriptor_t> Virtual(cudnnDataType_t dt, const Dims4& dims,
                                                   const Dims4& strides) {
    return Tensor(next_uid_++, dt, dims, strides, true);
  }

  // y = mode(x[, b][, t]) computed in `prec`; `axis` for GEN_INDEX.
  absl::Status Pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                         cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                         cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t t = nullptr,
                         int64_t axis = -1) {
    KILN_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t pw, Make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR));
    KILN_RETURN_IF_ERROR(Set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
    KILN_RETURN_IF_ERROR(Set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec));
    if (axis >= 0) {
      KILN_RETURN_IF_ERROR(Set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis));
    }
    KILN_RETURN_IF_ERROR(Finalize(pw, "cudnnBackendFinalize(pointwise)"));
    KILN_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t op,
                          Make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR));
    KILN_RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw));
    KILN_RETURN_IF_ERROR(
        Set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    if (b != nullptr) {
      KILN_RETURN_IF_ERROR(
          Set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b));
    }
    if (t != nullptr) {
      KILN_RETURN_IF_ERROR(
          Set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t));
    }
    KILN_RETURN_IF_ERROR(
        Set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    const float one = 1.0f;
    KILN_RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one));
    KILN_RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one));
    KILN_RETURN_IF_ERROR(Finalize(op, "cudnnBackendFinalize(pointwise operation)"));
    ops_.push_back(op);
    return absl::OkStatus();
  }

  absl::Status Reduction(cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x,
                         cudnnBackendDescriptor_t y) {
    KILN_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t r, Make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR));
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    KILN_RETURN_IF_ERROR(
        Set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how));
    KILN_RETURN_IF_ERROR(Set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32));
    KILN_RETURN_IF_ERROR(Finalize(r, "cudnnBackendFinalize(reduction)"));
    KILN_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t op,
                          Make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR));
    KILN_RETURN_IF_ERROR(
        Set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r));
    KILN_RETURN_IF_ERROR(
        Set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    KILN_RETURN_IF_ERROR(
        Set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    KILN_RETURN_IF_ERROR(Finalize(op, "cudnnBackendFinalize(reduction operation)"));
    ops_.push_back(op);
    return absl::OkStatus();
  }

  absl::Status Matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                      cudnnBackendDescriptor_t c) {
    KILN_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t m, Make(CUDNN_BACKEND_MATMUL_DESCRIPTOR));
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    KILN_RETURN_IF_ERROR(Set(m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32));
    KILN_RETURN_IF_ERROR(Finalize(m, "cudnnBackendFinalize(matmul)"));
    KILN_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t op,
                          Make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR));
    KILN_RETURN_IF_ERROR(
        Set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a));
    KILN_RETURN_IF_ERROR(
        Set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b));
    KILN_RETURN_IF_ERROR(
        Set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c));
    KILN_RETURN_IF_ERROR(
        Set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m));
    KILN_RETURN_IF_ERROR(Finalize(op, "cudnnBackendFinalize(matmul operation)"));
    ops_.push_back(op);
    return absl::OkStatus();
  }

  const std::vector<cudnnBackendDescriptor_t>& ops() const { return ops_; }

 private:
  absl::Status Check(cudnnStatus_t r, const char* call) const {
    return CudnnCheck(r, call, device_.info().id);
  }

  const CudaDevice& device_;
  std::vector<cudnnBackendDescriptor_t>& owned_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_uid_ = kVirtual;
};

cudnnDataType_t IoType(DType dt) {
  return dt == v1::DTYPE_F16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
}

}  // namespace

CudnnSdpaPlan::~CudnnSdpaPlan() {
  for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) {
    Cudnn().cudnnBackendDestroyDescriptor(*it);
  }
}

absl::StatusOr<std::unique_ptr<CudnnContext>> CudnnContext::Create(const CudaDevice& device) {
  KILN_RETURN_IF_ERROR(LoadCudnn());
  auto c = std::unique_ptr<CudnnContext>(new CudnnContext(device));
  KILN_RETURN_IF_ERROR(device.Enter());
  absl::MutexLock lock(&c->handle_mu_);
  KILN_RETURN_IF_ERROR(c->Check(Cudnn().cudnnCreate(&c->handle_), "cudnnCreate"));
  return c;
}

CudnnContext::~CudnnContext() {
  {
    absl::MutexLock lock(&plans_mu_);
    plans_.clear();
  }
  absl::MutexLock lock(&handle_mu_);
  if (handle_ != nullptr && device_.Enter().ok()) Cudnn().cudnnDestroy(handle_);
}

absl::Status CudnnContext::Check(cudnnStatus_t r, const char* call) const {
  absl::Status s = CudnnCheck(r, call, device_.info().id);
  if (!s.ok() && backend::FaultedDevice(s)) device_.MarkFaulted(s);
  return s;
}

int64_t CudnnContext::plans_built() const {
  absl::MutexLock lock(&plans_mu_);
  return plans_built_;
}

int64_t CudnnContext::plans_loaded() const {
  absl::MutexLock lock(&plans_mu_);
  return plans_loaded_;
}

absl::StatusOr<std::shared_ptr<const CudnnSdpaPlan>> CudnnContext::SdpaPlan(
    const SdpaShape& shape, backend::PrepareContext* context) {
  const std::string key = CudnnSdpaKey(shape, CudnnVersion());
  absl::MutexLock lock(&plans_mu_);
  if (auto it = plans_.find(key); it != plans_.end()) {
    if (context != nullptr && it->second.ok()) ++context->kernel_cache_hits;
    return it->second;
  }
  backend::KernelBinaryCache* binaries = context != nullptr ? context->binaries : nullptr;
  // The plan is the device model's (cuDNN deserializes a plan on an
  // identical GPU), whichever ordinal the device has.
  const std::string disk_key =
      binaries == nullptr
          ? std::string()
          : PrepareCacheKey(kCudnnPlanEntry,
                            {{"plan", key},
                             {"device", absl::StrCat(device_.info().name, "|", device_.caps().arch,
                                                     "|sm=", device_.caps().sm_count)}});
  if (binaries != nullptr) {
    const std::optional<std::string> entry = binaries->Lookup(disk_key);
    const std::optional<std::string> json =
        entry ? DecodePrepareEntry(kCudnnPlanEntry, disk_key, *entry) : std::nullopt;
    if (json) {
      auto plan = std::make_shared<CudnnSdpaPlan>();
      absl::Status loaded;
      {
        SlowStepLog slow(absl::StrCat(device_.info().id, ": cuDNN attention plan"));
        slow.set_outcome("finalized from its cached JSON");
        absl::MutexLock handle_lock(&handle_mu_);
        loaded = Load(shape, *json, *plan);
      }
      if (loaded.ok()) {
        ++plans_loaded_;
        ++context->kernel_cache_hits;
        std::shared_ptr<const CudnnSdpaPlan> shared = std::move(plan);
        plans_.emplace(key, shared);
        return shared;
      }
      if (backend::FaultedDevice(loaded)) return loaded;
      // Not a plan this cuDNN finalizes (another build's, damaged): built
      // again below and overwritten.
    }
  }
  auto plan = std::make_shared<CudnnSdpaPlan>();
  absl::Status built;
  {
    SlowStepLog slow(absl::StrCat(device_.info().id, ": cuDNN attention plan"));
    slow.set_outcome("built");
    absl::MutexLock handle_lock(&handle_mu_);
    built = Build(shape, *plan);
  }
  ++plans_built_;
  if (context != nullptr && built.ok()) ++context->kernel_cache_misses;
  if (built.ok() && binaries != nullptr) {
    // An engine cuDNN cannot serialize is rebuilt on every start.
    if (const std::string json = Serialize(*plan); !json.empty()) {
      binaries->Store(disk_key, EncodePrepareEntry(kCudnnPlanEntry, disk_key, json));
    }
  }
  absl::StatusOr<std::shared_ptr<const CudnnSdpaPlan>> result =
      built.ok() ? absl::StatusOr<std::shared_ptr<const CudnnSdpaPlan>>(std::move(plan))
                 : absl::StatusOr<std::shared_ptr<const CudnnSdpaPlan>>(built);
  // A device fault is not a property of the shape: not remembered.
  if (built.ok() || !backend::FaultedDevice(built)) plans_.emplace(key, result);
  return result;
}

absl::Status CudnnContext::Load(const SdpaShape& s, const std::string& json, CudnnSdpaPlan& plan) {
  plan.shape_ = s;
  KILN_RETURN_IF_ERROR(device_.Enter());
  GraphBuilder g(device_, plan.owned_);
  // As cudnn-frontend's ExecutionPlanBuilder::loadFromJson: the JSON, then
  // the handle, then finalize (which loads the plan's kernels).
  KILN_ASSIGN_OR_RETURN(auto p, g.Make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR));
  KILN_RETURN_IF_ERROR(g.Set(p, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                             static_cast<int64_t>(json.size()), json.data()));
  KILN_RETURN_IF_ERROR(g.Set(p, kExecutionPlanHandle, CUDNN_TYPE_HANDLE, 1, &handle_));
  KILN_RETURN_IF_ERROR(g.Finalize(p, "cudnnBackendFinalize(execution plan from JSON)"));
  plan.plan_ = p;
  return Describe(plan);
}

std::string CudnnContext::Serialize(const CudnnSdpaPlan& plan) const {
  const CudnnApi& api = Cudnn();
  int64_t n = 0;
  if (plan.plan_ == nullptr ||
      api.cudnnBackendGetAttribute(plan.plan_, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION,
                                   CUDNN_TYPE_CHAR, 0, &n, nullptr) != CUDNN_STATUS_SUCCESS ||
      n <= 0) {
    return "";
  }
  std::string json(static_cast<size_t>(n), '\0');
  if (api.cudnnBackendGetAttribute(plan.plan_, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION,
                                   CUDNN_TYPE_CHAR, n, &n, json.data()) != CUDNN_STATUS_SUCCESS) {
    return "";
  }
  json.resize(std::min<size_t>(json.size(), static_cast<size_t>(std::max<int64_t>(n, 0))));
  while (!json.empty() && json.back() == '\0') json.pop_back();
  return json;
}

absl::Status CudnnContext::Describe(CudnnSdpaPlan& plan) const {
  const CudnnApi& api = Cudnn();
  int64_t ws = 0, n = 0;
  KILN_RETURN_IF_ERROR(
      Check(api.cudnnBackendGetAttribute(plan.plan_, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                         CUDNN_TYPE_INT64, 1, &n, &ws),
            "cudnnBackendGetAttribute(workspace size)"));
  plan.workspace_bytes_ = ws;
  // Which engine: the plan's config's engine's global index (for the report).
  cudnnBackendDescriptor_t cfg = nullptr, engine = nullptr;
  if (api.cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg) !=
      CUDNN_STATUS_SUCCESS) {
    return absl::OkStatus();
  }
  plan.owned_.push_back(cfg);
  if (api.cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) !=
      CUDNN_STATUS_SUCCESS) {
    return absl::OkStatus();
  }
  plan.owned_.push_back(engine);
  int64_t index = -1;
  if (api.cudnnBackendGetAttribute(plan.plan_, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                   &cfg) == CUDNN_STATUS_SUCCESS &&
      api.cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                   1, &n, &engine) == CUDNN_STATUS_SUCCESS &&
      api.cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                                   &index) == CUDNN_STATUS_SUCCESS) {
    plan.engine_ = index;
  }
  return absl::OkStatus();
}

absl::Status CudnnContext::Build(const SdpaShape& s, CudnnSdpaPlan& plan) {
  plan.shape_ = s;
  KILN_RETURN_IF_ERROR(device_.Enter());
  GraphBuilder g(device_, plan.owned_);
  const cudnnDataType_t io = IoType(s.dtype);
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, i32 = CUDNN_DATA_INT32,
                        boolean = CUDNN_DATA_BOOLEAN;
  const Dims4 one = {1, 1, 1, 1};
  const Dims4 qd = {s.B, s.Hq, s.Sq, s.D}, vd = {s.B, s.Hkv, s.Sk, s.Dv},
              od = {s.B, s.Hq, s.Sq, s.Dv};
  // K as K^T [B, Hkv, D, Sk] over K's own row-major [B, Hkv, Sk, D] memory.
  const Dims4 ktd = {s.B, s.Hkv, s.D, s.Sk};
  const Dims4 kts = {s.Hkv * s.Sk * s.D, s.Sk * s.D, 1, s.D};
  const Dims4 sd = {s.B, s.Hq, s.Sq, s.Sk}, ss = Dense(sd);
  const Dims4 rd = {s.B, s.Hq, s.Sq, 1}, rs = {s.Hq * s.Sq, s.Sq, 1, 1};

  KILN_ASSIGN_OR_RETURN(auto q, g.Tensor(kQ, io, qd, Dense(qd), false));
  KILN_ASSIGN_OR_RETURN(auto kt, g.Tensor(kK, io, ktd, kts, false));
  KILN_ASSIGN_OR_RETURN(auto v, g.Tensor(kV, io, vd, Dense(vd), false));
  KILN_ASSIGN_OR_RETURN(auto o, g.Tensor(kO, io, od, Dense(od), false));
  KILN_ASSIGN_OR_RETURN(auto scale, g.Tensor(kScale, f32, one, one, false, true));

  KILN_ASSIGN_OR_RETURN(auto scores, g.Virtual(f32, sd, ss));
  KILN_RETURN_IF_ERROR(g.Matmul(q, kt, scores));
  KILN_ASSIGN_OR_RETURN(auto scaled, g.Virtual(f32, sd, ss));
  KILN_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_MUL, f32, scores, scale, scaled));
  auto logits = scaled;
  if (s.mask == v1::MASK_CAUSAL) {
    // Key j is kept for query row i when i + Sk - Sq >= j: the causal
    // diagonal aligned to the end of the keys, as Kiln's kernels align it
    // (the row index plus Sk, minus Sq: the form cuDNN's fusion engine
    // recognises for a bottom-right diagonal; nothing when Sq == Sk).
    KILN_ASSIGN_OR_RETURN(auto row, g.Virtual(i32, sd, ss));
    KILN_RETURN_IF_ERROR(
        g.Pointwise(CUDNN_POINTWISE_GEN_INDEX, f32, scaled, nullptr, row, nullptr, 2));
    KILN_ASSIGN_OR_RETURN(auto col, g.Virtual(i32, sd, ss));
    KILN_RETURN_IF_ERROR(
        g.Pointwise(CUDNN_POINTWISE_GEN_INDEX, f32, scaled, nullptr, col, nullptr, 3));
    if (s.Sk != s.Sq) {
      KILN_ASSIGN_OR_RETURN(auto sk, g.Tensor(kSeqKv, i32, one, one, false, true));
      KILN_ASSIGN_OR_RETURN(auto sq, g.Tensor(kSeqQ, i32, one, one, false, true));
      KILN_ASSIGN_OR_RETURN(auto plus_sk, g.Virtual(i32, sd, ss));
      KILN_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_ADD, i32, row, sk, plus_sk, nullptr, 3));
      KILN_ASSIGN_OR_RETURN(auto minus_sq, g.Virtual(i32, sd, ss));
      KILN_RETURN_IF_ERROR(
          g.Pointwise(CUDNN_POINTWISE_SUB, i32, plus_sk, sq, minus_sq, nullptr, 3));
      row = minus_sq;
    }
    KILN_ASSIGN_OR_RETURN(auto keep, g.Virtual(boolean, sd, ss));
    KILN_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_CMP_GE, boolean, row, col, keep));
    KILN_ASSIGN_OR_RETURN(auto neg_inf, g.Tensor(kNegInf, f32, one, one, false, true));
    KILN_ASSIGN_OR_RETURN(auto masked, g.Virtual(f32, sd, ss));
    KILN_RETURN_IF_ERROR(
        g.Pointwise(CUDNN_POINTWISE_BINARY_SELECT, f32, scaled, neg_inf, masked, keep));
    logits = masked;
  }
  // Softmax over the keys, with the log-sum-exp statistics the fused engine
  // expects beside it (virtual: the forward does not store them).
  KILN_ASSIGN_OR_RETURN(auto row_max, g.Virtual(f32, rd, rs));
  KILN_RETURN_IF_ERROR(g.Reduction(CUDNN_REDUCE_TENSOR_MAX, logits, row_max));
  KILN_ASSIGN_OR_RETURN(auto centered, g.Virtual(f32, sd, ss));
  KILN_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_SUB, f32, logits, row_max, centered));
  KILN_ASSIGN_OR_RETURN(auto e, g.Virtual(f32, sd, ss));
  KILN_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_EXP, f32, centered, nullptr, e));
  KILN_ASSIGN_OR_RETURN(auto row_sum, g.Virtual(f32, rd, rs));
  KILN_RETURN_IF_ERROR(g.Reduction(CUDNN_REDUCE_TENSOR_ADD, e, row_sum));
  KILN_ASSIGN_OR_RETURN(auto log_sum, g.Virtual(f32, rd, rs));
  KILN_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_LOG, f32, row_sum, nullptr, log_sum));
  KILN_ASSIGN_OR_RETURN(auto stats, g.Virtual(f32, rd, rs));
  KILN_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_ADD, f32, row_max, log_sum, stats));
  KILN_ASSIGN_OR_RETURN(auto probs, g.Virtual(io, sd, ss));
  KILN_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_DIV, f32, e, row_sum, probs));
  KILN_RETURN_IF_ERROR(g.Matmul(probs, v, o));

  KILN_ASSIGN_OR_RETURN(auto graph, g.Make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR));
  KILN_RETURN_IF_ERROR(g.Set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                             static_cast<int64_t>(g.ops().size()), g.ops().data()));
  KILN_RETURN_IF_ERROR(g.Set(graph, kOperationGraphHandle, CUDNN_TYPE_HANDLE, 1, &handle_));
  KILN_RETURN_IF_ERROR(g.Finalize(graph, "cudnnBackendFinalize(operation graph)"));

  KILN_ASSIGN_OR_RETURN(auto heur, g.Make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR));
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  KILN_RETURN_IF_ERROR(
      g.Set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph));
  KILN_RETURN_IF_ERROR(g.Set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
  KILN_RETURN_IF_ERROR(g.Finalize(heur, "cudnnBackendFinalize(engine heuristic)"));
  int64_t count = 0;
  KILN_RETURN_IF_ERROR(
      Check(Cudnn().cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
            "cudnnBackendGetAttribute(heuristic result count)"));
  if (count <= 0) {
    return absl::UnimplementedError(
        absl::StrCat(device_.info().id, ": cudnn sdpa: no engine for ", CudnnSdpaKey(s, 0)));
  }
  std::vector<cudnnBackendDescriptor_t> configs;
  for (int64_t i = 0; i < count; ++i) {
    KILN_ASSIGN_OR_RETURN(auto cfg, g.Make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    configs.push_back(cfg);
  }
  int64_t got = 0;
  KILN_RETURN_IF_ERROR(Check(
      Cudnn().cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, configs.data()),
      "cudnnBackendGetAttribute(heuristic results)"));
  absl::Status last = absl::UnimplementedError("no engine config finalized");
  for (int64_t i = 0; i < got; ++i) {
    KILN_ASSIGN_OR_RETURN(auto p, g.Make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR));
    KILN_RETURN_IF_ERROR(g.Set(p, kExecutionPlanHandle, CUDNN_TYPE_HANDLE, 1, &handle_));
    KILN_RETURN_IF_ERROR(g.Set(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &configs[i]));
    last = g.Finalize(p, "cudnnBackendFinalize(execution plan)");
    if (!last.ok()) {
      if (backend::FaultedDevice(last)) return last;
      continue;
    }
    plan.plan_ = p;
    return Describe(plan);
  }
  return absl::UnimplementedError(absl::StrCat(device_.info().id, ": cudnn sdpa: none of ", got,
                                               " engine configs finalized (last: ", last.message(),
                                               ")"));
}

absl::Status CudnnContext::ExecuteSdpa(const CudnnSdpaPlan& plan, CUstream stream, CUdeviceptr q,
                                       CUdeviceptr k, CUdeviceptr v, CUdeviceptr o,
                                       CUdeviceptr workspace, float scale) {
  const CudnnApi& api = Cudnn();
  float neg_inf = -std::numeric_limits<float>::infinity();
  int32_t seq_kv = static_cast<int32_t>(plan.shape().Sk);
  int32_t seq_q = static_cast<int32_t>(plan.shape().Sq);
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kScale};
  std::vector<void*> ptrs = {reinterpret_cast<void*>(q), reinterpret_cast<void*>(k),
                             reinterpret_cast<void*>(v), reinterpret_cast<void*>(o), &scale};
  if (plan.shape().mask == v1::MASK_CAUSAL) {
    uids.push_back(kNegInf);
    ptrs.push_back(&neg_inf);
    if (seq_kv != seq_q) {
      uids.insert(uids.end(), {kSeqKv, kSeqQ});
      ptrs.insert(ptrs.end(), {&seq_kv, &seq_q});
    }
  }
  void* ws = reinterpret_cast<void*>(workspace);
  cudnnBackendDescriptor_t pack = nullptr;
  KILN_RETURN_IF_ERROR(
      Check(api.cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack),
            "cudnnBackendCreateDescriptor(variant pack)"));
  absl::Status s = [&]() -> absl::Status {
    KILN_RETURN_IF_ERROR(Check(
        api.cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                     static_cast<int64_t>(uids.size()), uids.data()),
        "cudnnBackendSetAttribute(variant pack ids)"));
    KILN_RETURN_IF_ERROR(Check(api.cudnnBackendSetAttribute(
                                   pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                                   static_cast<int64_t>(ptrs.size()), ptrs.data()),
                               "cudnnBackendSetAttribute(variant pack pointers)"));
    KILN_RETURN_IF_ERROR(Check(api.cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                                            CUDNN_TYPE_VOID_PTR, 1, &ws),
                               "cudnnBackendSetAttribute(variant pack workspace)"));
    KILN_RETURN_IF_ERROR(
        Check(api.cudnnBackendFinalize(pack), "cudnnBackendFinalize(variant pack)"));
    KILN_RETURN_IF_ERROR(device_.Enter());
    absl::MutexLock lock(&handle_mu_);
    KILN_RETURN_IF_ERROR(Check(api.cudnnSetStream(handle_, stream), "cudnnSetStream"));
    return Check(api.cudnnBackendExecute(handle_, plan.plan_, pack), "cudnnBackendExecute");
  }();
  api.cudnnBackendDestroyDescriptor(pack);
  return s;
}

}  // namespace kiln::cuda
