// Losses: SoftmaxCrossEntropy (integer or probability labels, label
// smoothing, ignore_index, mean/sum/none) and MeanSquaredError (NumPy
// broadcasting between prediction and target).
//
// Cross entropy per row: loss = sum_c q_c (lse - x_c), lse = logsumexp(x),
// q = (1 - s) * onehot(y) + s / C (integer labels) or (1 - s) * p + s / C
// (probabilities). Rows whose label is ignore_index give 0 and do not count
// towards the mean (PyTorch semantics; all rows ignored -> mean is NaN). An
// integer label outside [0, C) that is not ignore_index fails the launch
// naming the node. Row math and the final reduction are in f64.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/elementwise.h"
#include "backends/cpu/kernel_util.h"
#include "backends/cpu/parallel.h"

namespace kiln::cpu {
namespace {

using backend::Claim;
using backend::KernelSpec;
using KernelOr = absl::StatusOr<std::unique_ptr<backend::Kernel>>;

// Writes the reduced scalar or the per-row values (as the output dtype).
void WriteLoss(const std::vector<double>& values, double count, v1::Reduction reduction, DType dt,
               void* out) {
  if (reduction == v1::REDUCTION_NONE) {
    uint64_t reg = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      ew::Fill(ew::ClassOf(dt), dt, values[i], 1, &reg);
      ew::Store(&reg, dt, 1, static_cast<char*>(out) + i * ElementSize(dt));
    }
    return;
  }
  double sum = 0;
  for (double v : values) sum += v;
  const double v = reduction == v1::REDUCTION_SUM ? sum : sum / count;
  uint64_t reg = 0;
  ew::Fill(ew::ClassOf(dt), dt, v, 1, &reg);
  ew::Store(&reg, dt, 1, out);
}

template <typename T>
void LoadLabels(const void* p, int64_t n, int64_t* out) {
  const T* src = static_cast<const T*>(p);
  for (int64_t i = 0; i < n; ++i)
    out[i] = static_cast<int64_t>(src[i]);  // NOLINT(bugprone-signed-char-misuse)
}

struct XentPlan {
  DType dtype = v1::DTYPE_UNSPECIFIED, label_dtype = v1::DTYPE_UNSPECIFIED;
  int64_t rows = 0, classes = 0;
  bool int_labels = true;
  double smoothing = 0;
  bool has_ignore = false;
  int64_t ignore = 0;
  v1::Reduction reduction = v1::REDUCTION_MEAN;
  std::string label;
};

// Row of logits as f64 (any float dtype).
void RowToF64(const char* p, DType dt, int64_t n, double* out) {
  if (dt == v1::DTYPE_F64) {
    std::memcpy(out, p, n * 8);
    return;
  }
  std::vector<float> f(n);
  WidenRow(p, dt, n, f.data());
  for (int64_t i = 0; i < n; ++i) out[i] = f[i];
}

absl::Status RunXent(const XentPlan& p, std::span<const backend::BufferView> inputs,
                     std::span<const backend::BufferView> outputs) {
  const int64_t n = p.rows, c = p.classes, esize = ElementSize(p.dtype);
  std::vector<int64_t> labels;
  std::vector<double> loss(n, 0.0);
  double count = static_cast<double>(n);
  if (p.int_labels && n > 0) {
    labels.resize(n);
    const void* lp = HostPtr(inputs[1]);
    switch (p.label_dtype) {
      case v1::DTYPE_I8:
        LoadLabels<int8_t>(lp, n, labels.data());
        break;
      case v1::DTYPE_U8:
        LoadLabels<uint8_t>(lp, n, labels.data());
        break;
      case v1::DTYPE_I16:
        LoadLabels<int16_t>(lp, n, labels.data());
        break;
      case v1::DTYPE_I32:
        LoadLabels<int32_t>(lp, n, labels.data());
        break;
      default:
        LoadLabels<int64_t>(lp, n, labels.data());
        break;
    }
    count = 0;
    for (int64_t r = 0; r < n; ++r) {
      if (p.has_ignore && labels[r] == p.ignore) continue;
      if (labels[r] < 0 || labels[r] >= c) {
        return absl::OutOfRangeError(absl::StrCat(p.label, ": label ", labels[r], " of row ", r,
                                                  " is out of range [0, ", c, ")"));
      }
      ++count;
    }
  }
  const char* x = n * c > 0 ? static_cast<const char*>(HostPtr(inputs[0])) : nullptr;
  const char* probs =
      !p.int_labels && n * c > 0 ? static_cast<const char*>(HostPtr(inputs[1])) : nullptr;
  const double s = p.smoothing;
  ParallelFor(n, std::max<int64_t>(1, (int64_t{1} << 13) / std::max<int64_t>(c, 1)),
              [&](int64_t b, int64_t e) {
                std::vector<double> row(c), q(p.int_labels ? 0 : c);
                for (int64_t r = b; r < e; ++r) {
                  if (p.int_labels && p.has_ignore && labels[r] == p.ignore) continue;
                  RowToF64(x + r * c * esize, p.dtype, c, row.data());
                  double mx = -INFINITY, sum = 0, mean = 0;
                  for (double v : row) mx = (v > mx || std::isnan(v)) ? v : mx;
                  for (double v : row) sum += std::exp(v - mx), mean += v;
                  const double lse = mx + std::log(sum);
                  if (p.int_labels) {
                    mean /= static_cast<double>(c);
                    loss[r] = (1 - s) * (lse - row[labels[r]]) + (s > 0 ? s * (lse - mean) : 0.0);
                    continue;
                  }
                  RowToF64(probs + r * c * esize, p.dtype, c, q.data());
                  double l = 0;
                  for (int64_t k = 0; k < c; ++k)
                    l += ((1 - s) * q[k] + s / static_cast<double>(c)) * (lse - row[k]);
                  loss[r] = l;
                }
              });
  WriteLoss(loss, count, p.reduction, p.dtype, HostPtr(outputs[0]));
  return absl::OkStatus();
}

KernelOr CreateXent(const KernelSpec& spec) {
  if (auto s = CheckArity(spec, 2, 2, 1); !s.ok()) return s;
  const auto& x = spec.inputs[0];
  const auto& y = spec.inputs[1];
  const auto& a = spec.attrs.softmax_cross_entropy();
  if (x.rank() < 1) return SpecError(spec, "logits need rank >= 1 (classes last)");
  if (a.label_smoothing() < 0 || a.label_smoothing() > 1)
    return SpecError(spec, "label_smoothing must be in [0, 1]");
  XentPlan p;
  p.dtype = x.dtype;
  p.label_dtype = y.dtype;
  p.classes = x.dims.back();
  p.rows = Product(x.dims, 0, x.dims.size() - 1);
  p.int_labels = IsInteger(y.dtype);
  p.smoothing = a.label_smoothing();
  p.has_ignore = a.has_ignore_index();
  p.ignore = a.ignore_index();
  p.reduction = a.reduction();
  p.label = spec.label;
  const Dims batch(x.dims.begin(), x.dims.end() - 1);
  if (p.int_labels ? y.dims != batch : (y.dims != x.dims || y.dtype != x.dtype)) {
    return SpecError(spec, "labels ", TypeString(y), " do not fit logits ", TypeString(x));
  }
  if (!v1::Reduction_IsValid(p.reduction)) return SpecError(spec, "unknown reduction");
  if (auto s = CheckOutput(spec, 0, x.dtype, p.reduction == v1::REDUCTION_NONE ? batch : Dims{});
      !s.ok())
    return s;
  return FnKernel::Make(spec, absl::StrCat("cpu:softmax_cross_entropy_", DTypeName(x.dtype)),
                        [p](auto inputs, auto outputs) { return RunXent(p, inputs, outputs); });
}

Claim SupportsXent(const KernelSpec& spec) {
  if (spec.inputs.size() != 2) return Claim::No("expects logits and labels");
  const DType x = spec.inputs[0].dtype, y = spec.inputs[1].dtype;
  if (!IsFloat(x)) return Claim::No(absl::StrCat("logits must be float, got ", DTypeName(x)));
  if (!IsInteger(y) && y != x) {
    return Claim::No(absl::StrCat("labels must be integer class ids or ", DTypeName(x),
                                  " probabilities, got ", DTypeName(y)));
  }
  return Claim::Yes();
}

// ---- MeanSquaredError: (pred - target)^2 through the elementwise executor.

KernelOr CreateMse(const KernelSpec& spec) {
  if (auto s = CheckArity(spec, 2, 2, 1); !s.ok()) return s;
  const auto& pred = spec.inputs[0];
  const auto& target = spec.inputs[1];
  const v1::Reduction reduction = spec.attrs.mean_squared_error().reduction();
  if (pred.dtype != target.dtype || !IsFloat(pred.dtype)) {
    return SpecError(spec, "prediction and target must share a float dtype: ", TypeString(pred),
                     ", ", TypeString(target));
  }
  auto dims = BroadcastShapes(spec, spec.inputs);
  if (!dims.ok()) return dims.status();
  if (dims->size() != pred.dims.size())
    return SpecError(spec, "target must not add dims to the prediction");
  if (!v1::Reduction_IsValid(reduction)) return SpecError(spec, "unknown reduction");
  if (auto s = CheckOutput(spec, 0, pred.dtype, reduction == v1::REDUCTION_NONE ? *dims : Dims{});
      !s.ok())
    return s;
  // The square is computed in the register type (f32 or f64) and rounded once.
  const DType compute = pred.dtype == v1::DTYPE_F64 ? v1::DTYPE_F64 : v1::DTYPE_F32;
  ew::Program prog;
  prog.inputs = {pred.dtype, target.dtype};
  ew::Instr sub, sq;
  sub.op = sq.op = v1::OP_BINARY;
  sub.kind = v1::BINARY_SUB, sub.args[0] = 0, sub.args[1] = 1, sub.num_args = 2;
  sq.kind = v1::BINARY_MUL, sq.args[0] = 2, sq.args[1] = 2, sq.num_args = 2;
  sub.dtype = sq.dtype = sub.arg_dtype = sq.arg_dtype = compute;
  prog.instrs = {sub, sq};
  prog.results = {1};
  const DType store = reduction == v1::REDUCTION_NONE ? pred.dtype : compute;
  auto ex = ew::Executor::Create(prog, {pred.dims, target.dims}, *dims, {store});
  if (!ex.ok()) return SpecError(spec, ex.status().message());
  std::shared_ptr<ew::Executor> executor = *std::move(ex);
  const DType dt = pred.dtype;
  return FnKernel::Make(
      spec, absl::StrCat("cpu:mean_squared_error_", DTypeName(dt)), [=](auto inputs, auto outputs) {
        const void* in[2] = {HostPtr(inputs[0]), HostPtr(inputs[1])};
        const int64_t n = executor->num_elements();
        if (reduction == v1::REDUCTION_NONE) {
          void* out[1] = {HostPtr(outputs[0])};
          executor->Run(in, out);
          return absl::OkStatus();
        }
        std::vector<double> sq(compute == v1::DTYPE_F64 ? n : 0);
        std::vector<float> sqf(compute == v1::DTYPE_F64 ? 0 : n);
        void* out[1] = {compute == v1::DTYPE_F64 ? static_cast<void*>(sq.data())
                                                 : static_cast<void*>(sqf.data())};
        executor->Run(in, out);
        // Partial sums over fixed chunks: parallel, and the same result for any
        // thread count.
        constexpr int64_t kChunk = int64_t{1} << 14;
        std::vector<double> partial((n + kChunk - 1) / kChunk, 0.0);
        ParallelFor(static_cast<int64_t>(partial.size()), 4, [&](int64_t b, int64_t e) {
          for (int64_t k = b; k < e; ++k) {
            double acc = 0;
            const int64_t end = std::min(n, (k + 1) * kChunk);
            if (compute == v1::DTYPE_F64) {
              for (int64_t i = k * kChunk; i < end; ++i) acc += sq[i];
            } else {
              for (int64_t i = k * kChunk; i < end; ++i) acc += sqf[i];
            }
            partial[k] = acc;
          }
        });
        double sum = 0;
        for (double v : partial) sum += v;
        const std::vector<double> total = {sum};
        WriteLoss(total, static_cast<double>(n), reduction, dt, HostPtr(outputs[0]));
        return absl::OkStatus();
      });
}

Claim SupportsMse(const KernelSpec& spec) {
  if (spec.inputs.size() != 2 || !IsFloat(spec.inputs[0].dtype)) {
    return Claim::No("cpu computes mean squared error of two float tensors");
  }
  return Claim::Yes();
}

const CpuOpRegistration kRegistration({
    {v1::OP_SOFTMAX_CROSS_ENTROPY, SupportsXent, CreateXent},
    {v1::OP_MEAN_SQUARED_ERROR, SupportsMse, CreateMse},
});

}  // namespace
}  // namespace kiln::cpu
