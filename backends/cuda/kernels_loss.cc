// Losses (kernels/loss.cu) for f32, f16 and bf16: SoftmaxCrossEntropy
// (integer labels of any integer type or probability labels, label
// smoothing, ignore_index, mean / sum / none) and MeanSquaredError (NumPy
// broadcasting between prediction and target, mean / sum / none).
//
// Mean and sum take two launches: per-row (cross entropy) or per-block (MSE)
// f64 partials in a stream-ordered temporary, then one block that sums them
// in a fixed order. An integer label outside [0, C) that is not ignore_index
// fails the run through the stream's error slot, naming the node, the label
// and its row, as on the CPU.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_kernel.h"
#include "base/status.h"

namespace kiln::cuda {
namespace {

using backend::Claim;
using backend::KernelSpec;

constexpr int kMaxMseRank = 8;
constexpr unsigned kSumBlock = 1024;  // loss_sum's threads
constexpr unsigned kMseBlocks = 264;  // MSE partials: 2 per SM on the H200

// loss.cu's MseParams (passed by value).
struct MseParams {
  int64_t rank = 0, count = 0;
  int64_t dims[kMaxMseRank] = {}, ps[kMaxMseRank] = {}, ts[kMaxMseRank] = {};
};

int LabelKind(DType dt) {
  switch (dt) {
    case v1::DTYPE_I8:
      return 1;
    case v1::DTYPE_U8:
      return 2;
    case v1::DTYPE_I16:
      return 3;
    case v1::DTYPE_I32:
      return 4;
    case v1::DTYPE_I64:
      return 5;
    default:
      return 0;
  }
}

absl::Status CheckReduction(v1::Reduction r, const KernelSpec& spec, const Dims& none_dims) {
  if (r != v1::REDUCTION_MEAN && r != v1::REDUCTION_SUM && r != v1::REDUCTION_NONE) {
    return absl::InvalidArgumentError("unknown reduction");
  }
  const Dims want = r == v1::REDUCTION_NONE ? none_dims : Dims{};
  if (spec.outputs.size() != 1 || spec.outputs[0].dims != want ||
      spec.outputs[0].dtype != spec.inputs[0].dtype) {
    return absl::InvalidArgumentError("the result's type does not match the reduction");
  }
  return absl::OkStatus();
}

// ---- SoftmaxCrossEntropy ----

struct XentPlan {
  int64_t rows = 0, classes = 0;
  int label_kind = 0;  // 0 = probabilities
  double smoothing = 0;
  bool has_ignore = false;
  int64_t ignore = 0;
  v1::Reduction reduction = v1::REDUCTION_MEAN;
};

absl::StatusOr<XentPlan> PlanXent(const KernelSpec& spec) {
  if (spec.inputs.size() != 2 || spec.outputs.size() != 1) {
    return absl::InvalidArgumentError("expects logits and labels");
  }
  const backend::TensorDesc& x = spec.inputs[0];
  const backend::TensorDesc& y = spec.inputs[1];
  const auto& a = spec.attrs.softmax_cross_entropy();
  if (x.dims.empty()) return absl::InvalidArgumentError("logits need rank >= 1 (classes last)");
  if (!(a.label_smoothing() >= 0 && a.label_smoothing() <= 1)) {
    return absl::InvalidArgumentError("label_smoothing must be in [0, 1]");
  }
  XentPlan p;
  p.classes = x.dims.back();
  p.rows = 1;
  for (size_t k = 0; k + 1 < x.dims.size(); ++k) p.rows *= x.dims[k];
  p.label_kind = LabelKind(y.dtype);
  p.smoothing = a.label_smoothing();
  p.has_ignore = a.has_ignore_index();
  p.ignore = a.ignore_index();
  p.reduction = a.reduction();
  const Dims batch(x.dims.begin(), x.dims.end() - 1);
  if (p.label_kind != 0 ? y.dims != batch : (y.dims != x.dims || y.dtype != x.dtype)) {
    return absl::InvalidArgumentError(
        "labels must be integer class ids [batch] or probabilities shaped as the logits");
  }
  KILN_RETURN_IF_ERROR(CheckReduction(p.reduction, spec, batch));
  return p;
}

Claim SupportsXent(const CudaDevice&, const KernelSpec& spec) {
  absl::StatusOr<XentPlan> p = PlanXent(spec);
  if (!p.ok()) return Claim::No(absl::StrCat("cuda cross entropy: ", p.status().message()));
  return FloatDType(spec.inputs[0].dtype, "cross entropy");
}

class XentKernel final : public CudaKernel {
 public:
  XentKernel(CudaDevice& d, const KernelSpec& spec, LoadedFunction rows, LoadedFunction sum,
             XentPlan plan)
      : CudaKernel(d, spec,
                   absl::StrCat("nvrtc:softmax_cross_entropy_", DTypeSuffix(spec.inputs[0].dtype))),
        rows_(std::move(rows)),
        sum_(std::move(sum)),
        plan_(plan) {}

  bool capturable() const override { return false; }  // an error slot and temporaries per launch

 protected:
  absl::Status Enqueue(CudaStream& s, std::span<const CUdeviceptr> in,
                       std::span<const CUdeviceptr> out) override {
    const bool none = plan_.reduction == v1::REDUCTION_NONE;
    CUdeviceptr tmp = 0;
    if (plan_.rows > 0) {
      CUdeviceptr err = 0;
      if (plan_.label_kind != 0) {
        const std::string label = spec_.label;
        const int64_t c = plan_.classes;
        KILN_ASSIGN_OR_RETURN(err, s.ReserveErrorSlot([label, c](uint64_t row, uint64_t v) {
          return absl::OutOfRangeError(absl::StrCat(label, ": label ", static_cast<int64_t>(v),
                                                    " of row ", row, " is out of range [0, ", c,
                                                    ")"));
        }));
      }
      if (!none) {
        KILN_ASSIGN_OR_RETURN(tmp, s.AllocateTemporary(plan_.rows * 2 * 8));
      }
      CUdeviceptr x = in[0], labels = plan_.label_kind != 0 ? in[1] : 0,
                  probs = plan_.label_kind != 0 ? 0 : in[1], loss = tmp,
                  valid = tmp == 0 ? 0 : tmp + plan_.rows * 8, y = none ? out[0] : 0;
      int label_kind = plan_.label_kind, has_ignore = plan_.has_ignore;
      int64_t rows = plan_.rows, c = plan_.classes, ignore = plan_.ignore;
      double smoothing = plan_.smoothing;
      void* args[] = {&x,    &labels, &label_kind, &probs,      &loss,   &valid, &y,
                      &rows, &c,      &smoothing,  &has_ignore, &ignore, &err};
      const unsigned grid =
          static_cast<unsigned>(std::min<int64_t>(rows, device_.caps().max_grid_x));
      const unsigned block =
          static_cast<unsigned>(std::clamp<int64_t>((c + 31) / 32 * 32, 32, 256));
      absl::Status st = LaunchKernel(s, rows_.fn, grid, 1, 1, block, 0, args);
      if (!st.ok()) {
        if (tmp != 0) s.FreeTemporary(tmp);
        return st;
      }
    }
    if (none) return absl::OkStatus();
    CUdeviceptr values = tmp, valid = tmp == 0 ? 0 : tmp + plan_.rows * 8, y = out[0];
    int64_t n = plan_.rows;
    double count = 0;
    int mean = plan_.reduction == v1::REDUCTION_MEAN;
    void* args[] = {&values, &valid, &n, &count, &mean, &y};
    absl::Status st = LaunchKernel(s, sum_.fn, 1, 1, 1, kSumBlock, 0, args);
    if (tmp != 0) s.FreeTemporary(tmp);
    return st;
  }

 private:
  LoadedFunction rows_, sum_;
  XentPlan plan_;
};

// ---- MeanSquaredError ----

absl::StatusOr<MseParams> PlanMse(const KernelSpec& spec) {
  if (spec.inputs.size() != 2 || spec.outputs.size() != 1) {
    return absl::InvalidArgumentError("expects prediction and target");
  }
  const Dims& pd = spec.inputs[0].dims;
  const Dims& td = spec.inputs[1].dims;
  if (spec.inputs[1].dtype != spec.inputs[0].dtype) {
    return absl::InvalidArgumentError("prediction and target differ in dtype");
  }
  if (td.size() > pd.size()) {
    return absl::InvalidArgumentError("target must not add dims to the prediction");
  }
  if (pd.size() > static_cast<size_t>(kMaxMseRank)) {
    return absl::InvalidArgumentError(absl::StrCat("rank above ", kMaxMseRank));
  }
  MseParams p;
  p.rank = static_cast<int64_t>(pd.size());
  p.count = 1;
  const std::vector<int64_t> psr = RowMajorStrides(pd), tsr = RowMajorStrides(td);
  const size_t lead = pd.size() - td.size();
  for (size_t k = 0; k < pd.size(); ++k) {
    const int64_t a = pd[k], b = k < lead ? 1 : td[k - lead];
    if (a != b && a != 1 && b != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("prediction and target do not broadcast at dim ", k));
    }
    p.dims[k] = a == 1 ? b : a;
    p.ps[k] = a == 1 ? 0 : psr[k];
    p.ts[k] = (k < lead || b == 1) ? 0 : tsr[k - lead];
    p.count *= p.dims[k];
  }
  KILN_RETURN_IF_ERROR(CheckReduction(spec.attrs.mean_squared_error().reduction(), spec,
                                      Dims(p.dims, p.dims + p.rank)));
  return p;
}

Claim SupportsMse(const CudaDevice&, const KernelSpec& spec) {
  absl::StatusOr<MseParams> p = PlanMse(spec);
  if (!p.ok()) return Claim::No(absl::StrCat("cuda mean squared error: ", p.status().message()));
  return FloatDType(spec.inputs[0].dtype, "mean squared error");
}

class MseKernel final : public CudaKernel {
 public:
  MseKernel(CudaDevice& d, const KernelSpec& spec, LoadedFunction mse, LoadedFunction sum,
            MseParams params)
      : CudaKernel(d, spec,
                   absl::StrCat("nvrtc:mean_squared_error_", DTypeSuffix(spec.inputs[0].dtype))),
        mse_(std::move(mse)),
        sum_(std::move(sum)),
        params_(params) {}

  bool capturable() const override { return false; }  // temporaries per launch

 protected:
  absl::Status Enqueue(CudaStream& s, std::span<const CUdeviceptr> in,
                       std::span<const CUdeviceptr> out) override {
    const v1::Reduction reduction = spec_.attrs.mean_squared_error().reduction();
    MseParams p = params_;
    CUdeviceptr pred = in[0], target = in[1];
    if (reduction == v1::REDUCTION_NONE) {
      CUdeviceptr y = out[0], partial = 0;
      void* args[] = {&pred, &target, &y, &partial, &p};
      return LaunchKernel(s, mse_.fn, GridFor(device_.caps(), p.count, 256), 1, 1, 256, 0, args);
    }
    const unsigned blocks = static_cast<unsigned>(
        std::clamp<int64_t>((p.count + 255) / 256, 1, static_cast<int64_t>(kMseBlocks)));
    KILN_ASSIGN_OR_RETURN(CUdeviceptr tmp, s.AllocateTemporary(int64_t{8} * blocks));
    CUdeviceptr none = 0, partial = tmp;
    void* args[] = {&pred, &target, &none, &partial, &p};
    absl::Status st = LaunchKernel(s, mse_.fn, blocks, 1, 1, 256, 0, args);
    if (st.ok()) {
      CUdeviceptr valid = 0, y = out[0];
      int64_t n = blocks;
      double count = static_cast<double>(p.count);
      int mean = reduction == v1::REDUCTION_MEAN;
      void* sum_args[] = {&partial, &valid, &n, &count, &mean, &y};
      st = LaunchKernel(s, sum_.fn, 1, 1, 1, kSumBlock, 0, sum_args);
    }
    s.FreeTemporary(tmp);
    return st;
  }

 private:
  LoadedFunction mse_, sum_;
  MseParams params_;
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateLoss(CudaDevice& d, const KernelSpec& spec,
                                                            backend::PrepareContext& context) {
  const std::string dt = DTypeSuffix(spec.inputs[0].dtype);
  const std::string source = KernelSource("loss.cu");
  KILN_ASSIGN_OR_RETURN(
      LoadedFunction sum,
      LoadFunction(d, "loss", source, absl::StrCat("kiln_loss_sum_", dt), context));
  if (spec.op == v1::OP_SOFTMAX_CROSS_ENTROPY) {
    KILN_ASSIGN_OR_RETURN(XentPlan plan, PlanXent(spec));
    KILN_ASSIGN_OR_RETURN(LoadedFunction rows,
                          LoadFunction(d, "loss", source, absl::StrCat("kiln_xent_", dt), context));
    return std::unique_ptr<backend::Kernel>(
        std::make_unique<XentKernel>(d, spec, std::move(rows), std::move(sum), plan));
  }
  KILN_ASSIGN_OR_RETURN(MseParams params, PlanMse(spec));
  KILN_ASSIGN_OR_RETURN(LoadedFunction mse,
                        LoadFunction(d, "loss", source, absl::StrCat("kiln_mse_", dt), context));
  return std::unique_ptr<backend::Kernel>(
      std::make_unique<MseKernel>(d, spec, std::move(mse), std::move(sum), params));
}

const CudaOpRegistration kLossRegistration({
    {v1::OP_SOFTMAX_CROSS_ENTROPY, &SupportsXent, &CreateLoss},
    {v1::OP_MEAN_SQUARED_ERROR, &SupportsMse, &CreateLoss},
});

}  // namespace
}  // namespace kiln::cuda
