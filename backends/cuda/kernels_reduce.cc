// Reduce (Sum, Mean, Max, Min, Prod; kernels/reduce.cu), ArgMax and Cumsum
// (kernels/scan.cu).
//
// Reduce: float reductions over axes that form one contiguous block once
// size-1 dims are dropped take the row / column kernels (f32 accumulation);
// every other case (axes split by kept dims, integer dtypes, empty reduced
// dims, scalars) takes the general kernel, which accumulates floats in f64
// and integers in wrapping 64 bits. Integer Mean and Max/Min over an empty
// axis are not claimed (the CPU rejects them too).
#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_kernel.h"
#include "backends/cuda/reduce_plan.h"
#include "base/status.h"

namespace kiln::cuda {
namespace {

using backend::Claim;
using backend::KernelSpec;

struct ReducePlan {
  int64_t outer = 1, r = 1, inner = 1;
  int kind = 0;  // reduce.cu's: 0 sum, 1 mean, 2 max, 3 min, 4 prod
};

absl::StatusOr<ReducePlan> PlanReduce(const KernelSpec& spec) {
  if (spec.inputs.size() != 1 || spec.outputs.size() != 1) {
    return absl::InvalidArgumentError("malformed spec");
  }
  const auto& a = spec.attrs.reduce();
  ReducePlan p;
  switch (a.kind()) {
    case v1::REDUCE_SUM:
      p.kind = 0;
      break;
    case v1::REDUCE_MEAN:
      p.kind = 1;
      break;
    case v1::REDUCE_MAX:
      p.kind = 2;
      break;
    case v1::REDUCE_MIN:
      p.kind = 3;
      break;
    case v1::REDUCE_PROD:
      p.kind = 4;
      break;
    default:
      return absl::InvalidArgumentError("unknown reduce kind");
  }
  const Dims& dims = spec.inputs[0].dims;
  const int64_t rank = static_cast<int64_t>(dims.size());
  std::vector<bool> reduced(rank, a.axes().empty());
  for (int64_t ax : a.axes()) {
    if (ax < 0) ax += rank;
    if (ax < 0 || ax >= rank) return absl::InvalidArgumentError("axis out of range");
    reduced[ax] = true;
  }
  // 0 = before the reduced block, 1 = in it, 2 = after it.
  int phase = 0;
  for (int64_t k = 0; k < rank; ++k) {
    if (dims[k] == 1) continue;
    if (reduced[k]) {
      if (phase == 2) return absl::InvalidArgumentError("the reduced axes are not contiguous");
      phase = 1;
      p.r *= dims[k];
    } else {
      if (phase == 1) phase = 2;
      (phase == 0 ? p.outer : p.inner) *= dims[k];
    }
  }
  if (dims.empty() || std::any_of(dims.begin(), dims.end(), [](int64_t d) { return d == 0; })) {
    return absl::InvalidArgumentError("an empty tensor");
  }
  return p;
}

// Threads for a fixed-order tree over `n` values: a power of two in [32, 256].
unsigned TreeBlock(int64_t n) {
  const unsigned block = static_cast<unsigned>(std::clamp<int64_t>((n + 31) / 32 * 32, 32, 256));
  return std::max(32u, 1u << (31 - __builtin_clz(block)));
}

// reduce.cu's ReduceGen (passed by value).
constexpr int kMaxGenRank = 8;
struct ReduceGen {
  int64_t kept_rank = 0, red_rank = 0, n_out = 1, n_red = 1;
  int64_t kept_dims[kMaxGenRank] = {}, kept_str[kMaxGenRank] = {};
  int64_t red_dims[kMaxGenRank] = {}, red_str[kMaxGenRank] = {};
};

// The general path's plan: size-1 dims dropped, neighbours of the same role
// merged, kept and reduced dims each in row-major order with their strides.
absl::StatusOr<ReduceGen> PlanGeneral(const KernelSpec& spec) {
  if (spec.inputs.size() != 1 || spec.outputs.size() != 1) {
    return absl::InvalidArgumentError("malformed spec");
  }
  const auto& a = spec.attrs.reduce();
  const Dims& dims = spec.inputs[0].dims;
  const int64_t rank = static_cast<int64_t>(dims.size());
  std::vector<bool> reduced(rank, a.axes().empty());
  for (int64_t ax : a.axes()) {
    if (ax < 0) ax += rank;
    if (ax < 0 || ax >= rank) return absl::InvalidArgumentError("axis out of range");
    if (reduced[ax] && !a.axes().empty()) return absl::InvalidArgumentError("repeated axis");
    reduced[ax] = true;
  }
  const std::vector<int64_t> strides = RowMajorStrides(dims);
  std::vector<int64_t> gd, gs;
  std::vector<bool> role;
  for (int64_t k = 0; k < rank; ++k) {
    if (dims[k] == 1) continue;
    if (!gd.empty() && role.back() == reduced[k] && gs.back() == strides[k] * dims[k]) {
      gd.back() *= dims[k];
      gs.back() = strides[k];
      continue;
    }
    gd.push_back(dims[k]);
    gs.push_back(strides[k]);
    role.push_back(reduced[k]);
  }
  ReduceGen g;
  for (size_t k = 0; k < gd.size(); ++k) {
    int64_t& r = role[k] ? g.red_rank : g.kept_rank;
    if (r == kMaxGenRank) {
      return absl::InvalidArgumentError(
          absl::StrCat("more than ", kMaxGenRank, " kept or reduced dims after merging"));
    }
    (role[k] ? g.red_dims : g.kept_dims)[r] = gd[k];
    (role[k] ? g.red_str : g.kept_str)[r] = gs[k];
    (role[k] ? g.n_red : g.n_out) *= gd[k];
    ++r;
  }
  return g;
}

Claim SupportsReduce(const CudaDevice&, const KernelSpec& spec) {
  absl::StatusOr<ReduceGen> g = PlanGeneral(spec);
  if (!g.ok()) return Claim::No(absl::StrCat("cuda reduce: ", g.status().message()));
  const DType dt = spec.inputs[0].dtype;
  if (spec.outputs[0].dtype != dt) {
    return Claim::No("cuda reduce: the result dtype differs from the input's");
  }
  if (spec.outputs[0].num_elements() != g->n_out) {
    return Claim::No("cuda reduce: the result shape does not match the axes");
  }
  const v1::ReduceKind kind = spec.attrs.reduce().kind();
  if (kind < v1::REDUCE_SUM || kind > v1::REDUCE_PROD) return Claim::No("unknown reduce kind");
  if (g->n_red == 0 && (kind == v1::REDUCE_MAX || kind == v1::REDUCE_MIN)) {
    return Claim::No("cuda reduce: max/min over an empty axis has no identity");
  }
  if (IsInteger(dt)) {
    if (kind == v1::REDUCE_MEAN) return Claim::No("cuda reduce: integer mean is not defined");
    return Claim::Yes();
  }
  return FloatDType(dt, "reduce");
}

class ReduceKernel final : public CudaKernel {
 public:
  ReduceKernel(CudaDevice& d, const KernelSpec& spec, LoadedFunction fn, ReducePlan plan,
               std::string impl)
      : CudaKernel(d, spec, std::move(impl)), fn_(std::move(fn)), plan_(plan) {}
  // Columns through the split kernel (reduce_plan.h), `finish` folding the
  // partials when there is more than one split.
  ReduceKernel(CudaDevice& d, const KernelSpec& spec, LoadedFunction split, LoadedFunction finish,
               ReducePlan plan, ColumnReducePlan columns, std::string impl)
      : CudaKernel(d, spec, std::move(impl)),
        fn_(std::move(split)),
        finish_(std::move(finish)),
        plan_(plan),
        columns_(columns) {}

 protected:
  absl::Status Enqueue(CudaStream& s, std::span<const CUdeviceptr> in,
                       std::span<const CUdeviceptr> out) override {
    CUdeviceptr x = in[0], y = out[0];
    int64_t outer = plan_.outer, r = plan_.r, inner = plan_.inner;
    int kind = plan_.kind;
    if (columns_.split) {
      int64_t splits = columns_.splits;
      CUdeviceptr part = 0;
      if (columns_.partial_bytes > 0) {
        KILN_ASSIGN_OR_RETURN(part, s.Workspace(columns_.partial_bytes));
      }
      void* args[] = {&x, &y, &part, &outer, &r, &inner, &splits, &kind};
      KILN_RETURN_IF_ERROR(LaunchKernel(s, fn_.fn, static_cast<unsigned>(columns_.tiles),
                                        static_cast<unsigned>(splits), 1, 256, 0, args));
      if (splits == 1) return absl::OkStatus();
      void* fargs[] = {&part, &y, &outer, &r, &inner, &splits, &kind};
      return LaunchKernel(s, finish_.fn, GridFor(device_.caps(), outer * inner, 256), 1, 1, 256, 0,
                          fargs);
    }
    if (inner == 1) {
      void* args[] = {&x, &y, &outer, &r, &kind};
      const unsigned grid =
          static_cast<unsigned>(std::min<int64_t>(outer, device_.caps().max_grid_x));
      return LaunchKernel(s, fn_.fn, grid, 1, 1, TreeBlock(r), 0, args);
    }
    void* args[] = {&x, &y, &outer, &r, &inner, &kind};
    return LaunchKernel(s, fn_.fn, GridFor(device_.caps(), outer * inner, 256), 1, 1, 256, 0, args);
  }

 private:
  LoadedFunction fn_, finish_;
  ReducePlan plan_;
  ColumnReducePlan columns_;
};

class ReduceGenKernel final : public CudaKernel {
 public:
  ReduceGenKernel(CudaDevice& d, const KernelSpec& spec, LoadedFunction fn, ReduceGen plan,
                  int kind, std::string impl)
      : CudaKernel(d, spec, std::move(impl)), fn_(std::move(fn)), plan_(plan), kind_(kind) {}

 protected:
  absl::Status Enqueue(CudaStream& s, std::span<const CUdeviceptr> in,
                       std::span<const CUdeviceptr> out) override {
    CUdeviceptr x = in[0], y = out[0];
    ReduceGen p = plan_;
    int kind = kind_;
    void* args[] = {&x, &y, &p, &kind};
    const unsigned grid =
        static_cast<unsigned>(std::min<int64_t>(p.n_out, device_.caps().max_grid_x));
    return LaunchKernel(s, fn_.fn, std::max(grid, 1u), 1, 1, TreeBlock(p.n_red), 0, args);
  }

 private:
  LoadedFunction fn_;
  ReduceGen plan_;
  int kind_;
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateReduce(CudaDevice& d, const KernelSpec& spec,
                                                              backend::PrepareContext& context) {
  const DType dtype = spec.inputs[0].dtype;
  const std::string dt = DTypeSuffix(dtype);
  const std::string kind =
      absl::AsciiStrToLower(v1::ReduceKind_Name(spec.attrs.reduce().kind()).substr(7));
  absl::StatusOr<ReducePlan> plan = PlanReduce(spec);
  if (plan.ok() && IsFloat(dtype) && plan->inner > 1) {
    const ColumnReducePlan columns =
        PlanColumnReduce(plan->outer, plan->r, plan->inner, d.caps().sm_count);
    if (columns.split && columns.tiles <= d.caps().max_grid_x) {
      KILN_ASSIGN_OR_RETURN(LoadedFunction split,
                            LoadFunction(d, "reduce", KernelSource("reduce.cu"),
                                         absl::StrCat("kiln_reduce_cols_split_", dt), context));
      KILN_ASSIGN_OR_RETURN(LoadedFunction finish,
                            LoadFunction(d, "reduce", KernelSource("reduce.cu"),
                                         absl::StrCat("kiln_reduce_cols_finish_", dt), context));
      return std::unique_ptr<backend::Kernel>(std::make_unique<ReduceKernel>(
          d, spec, std::move(split), std::move(finish), *plan, columns,
          absl::StrCat("nvrtc:reduce_", kind, "_", dt, "_cols_split", columns.splits)));
    }
  }
  if (plan.ok() && IsFloat(dtype)) {
    const std::string fn_name =
        absl::StrCat("kiln_reduce_", plan->inner == 1 ? "rows_" : "cols_", dt);
    KILN_ASSIGN_OR_RETURN(LoadedFunction fn,
                          LoadFunction(d, "reduce", KernelSource("reduce.cu"), fn_name, context));
    return std::unique_ptr<backend::Kernel>(std::make_unique<ReduceKernel>(
        d, spec, std::move(fn), *plan, absl::StrCat("nvrtc:reduce_", kind, "_", dt)));
  }
  KILN_ASSIGN_OR_RETURN(ReduceGen gen, PlanGeneral(spec));
  const int k = spec.attrs.reduce().kind() - v1::REDUCE_SUM;  // reduce.cu's kind numbering
  KILN_ASSIGN_OR_RETURN(LoadedFunction fn,
                        LoadFunction(d, "reduce", KernelSource("reduce.cu"),
                                     absl::StrCat("kiln_reduce_gen_", dt), context));
  return std::unique_ptr<backend::Kernel>(std::make_unique<ReduceGenKernel>(
      d, spec, std::move(fn), gen, k, absl::StrCat("nvrtc:reduce_", kind, "_", dt, "_general")));
}

// ---- ArgMax and Cumsum (scan.cu): the axis splits x into [outer, n, inner].

struct AxisSplit {
  int64_t outer = 1, n = 1, inner = 1;
};

absl::StatusOr<AxisSplit> SplitAxis(const Dims& dims, int64_t axis) {
  const int64_t rank = static_cast<int64_t>(dims.size());
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return absl::InvalidArgumentError("axis out of range");
  AxisSplit s;
  for (int64_t k = 0; k < axis; ++k) s.outer *= dims[k];
  s.n = dims[axis];
  for (int64_t k = axis + 1; k < rank; ++k) s.inner *= dims[k];
  return s;
}

Claim NumberDType(DType dt, const char* what) {
  if (IsFloat(dt) || IsInteger(dt)) return Claim::Yes();
  return Claim::No(absl::StrCat("cuda ", what, " runs f32, f16, bf16 and the integer types, not ",
                                DTypeName(dt)));
}

DType ArgMaxIndexType(const KernelSpec& spec) {
  const DType index = spec.attrs.argmax().index_dtype();
  return index == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_I64 : index;
}

Claim SupportsArgMax(const CudaDevice&, const KernelSpec& spec) {
  if (spec.inputs.size() != 1 || spec.outputs.size() != 1) return Claim::No("malformed spec");
  const DType index = ArgMaxIndexType(spec);
  if (index != v1::DTYPE_I32 && index != v1::DTYPE_I64) {
    return Claim::No("cuda argmax writes i32 or i64 indices");
  }
  if (spec.outputs[0].dtype != index) return Claim::No("cuda argmax: the result dtype differs");
  absl::StatusOr<AxisSplit> s = SplitAxis(spec.inputs[0].dims, spec.attrs.argmax().axis());
  if (!s.ok()) return Claim::No(absl::StrCat("cuda argmax: ", s.status().message()));
  if (s->n == 0) return Claim::No("cuda argmax: the axis is empty");
  if (spec.outputs[0].num_elements() != s->outer * s->inner) {
    return Claim::No("cuda argmax: the result shape does not match the axis");
  }
  return NumberDType(spec.inputs[0].dtype, "argmax");
}

Claim SupportsCumsum(const CudaDevice&, const KernelSpec& spec) {
  if (spec.inputs.size() != 1 || spec.outputs.size() != 1) return Claim::No("malformed spec");
  if (spec.outputs[0].dtype != spec.inputs[0].dtype ||
      spec.outputs[0].dims != spec.inputs[0].dims) {
    return Claim::No("cuda cumsum: the result must match x");
  }
  absl::StatusOr<AxisSplit> s = SplitAxis(spec.inputs[0].dims, spec.attrs.cumsum().axis());
  if (!s.ok()) return Claim::No(absl::StrCat("cuda cumsum: ", s.status().message()));
  return NumberDType(spec.inputs[0].dtype, "cumsum");
}

class ScanKernel final : public CudaKernel {
 public:
  ScanKernel(CudaDevice& d, const KernelSpec& spec, LoadedFunction fn, AxisSplit split,
             std::string impl)
      : CudaKernel(d, spec, std::move(impl)), fn_(std::move(fn)), split_(split) {}

 protected:
  absl::Status Enqueue(CudaStream& s, std::span<const CUdeviceptr> in,
                       std::span<const CUdeviceptr> out) override {
    CUdeviceptr x = in[0], y = out[0];
    int64_t outer = split_.outer, n = split_.n, inner = split_.inner;
    const unsigned grid = GridFor(device_.caps(), outer * inner, 256);
    if (spec_.op == v1::OP_ARGMAX) {
      void* args[] = {&x, &y, &outer, &n, &inner};
      return LaunchKernel(s, fn_.fn, grid, 1, 1, 256, 0, args);
    }
    int exclusive = spec_.attrs.cumsum().exclusive(), reverse = spec_.attrs.cumsum().reverse();
    void* args[] = {&x, &y, &outer, &n, &inner, &exclusive, &reverse};
    return LaunchKernel(s, fn_.fn, grid, 1, 1, 256, 0, args);
  }

 private:
  LoadedFunction fn_;
  AxisSplit split_;
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateScan(CudaDevice& d, const KernelSpec& spec,
                                                            backend::PrepareContext& context) {
  const bool argmax = spec.op == v1::OP_ARGMAX;
  KILN_ASSIGN_OR_RETURN(
      AxisSplit split, SplitAxis(spec.inputs[0].dims,
                                 argmax ? spec.attrs.argmax().axis() : spec.attrs.cumsum().axis()));
  const std::string dt = DTypeSuffix(spec.inputs[0].dtype);
  const std::string fn_name =
      argmax ? absl::StrCat("kiln_argmax_", dt, "_", DTypeSuffix(ArgMaxIndexType(spec)))
             : absl::StrCat("kiln_cumsum_", dt);
  KILN_ASSIGN_OR_RETURN(LoadedFunction fn,
                        LoadFunction(d, "scan", KernelSource("scan.cu"), fn_name, context));
  return std::unique_ptr<backend::Kernel>(std::make_unique<ScanKernel>(
      d, spec, std::move(fn), split, absl::StrCat("nvrtc:", argmax ? "argmax_" : "cumsum_", dt)));
}

const CudaOpRegistration kReduceRegistration({
    {v1::OP_REDUCE, &SupportsReduce, &CreateReduce},
    {v1::OP_ARGMAX, &SupportsArgMax, &CreateScan},
    {v1::OP_CUMSUM, &SupportsCumsum, &CreateScan},
});

}  // namespace
}  // namespace kiln::cuda
