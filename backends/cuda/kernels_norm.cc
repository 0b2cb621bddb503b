// Normalization and softmax: LayerNorm, RmsNorm, FusedResidualNorm,
// GroupNorm (kernels/norm.cu) and Softmax, LogSoftmax (kernels/softmax.cu), for f32,
// f16 and bf16.
//
// Rows whose length is a multiple of a 16-byte vector (4 f32, 8 f16/bf16)
// and at most 8192 vectors take the vectorized kernels when every pointer
// of the launch is 16-byte aligned (checked per launch: planned buffers may
// sit at any offset of an arena): one block per row, the row in registers
// (NV in {1, 2, 4, 8} vectors per thread, at most 256 threads up to 2048
// vectors, then up to 1024), 16-byte loads and stores, one read and one
// write of each element. Other rows take the scalar kernels.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_kernel.h"
#include "base/status.h"

namespace kiln::cuda {
namespace {

using backend::Claim;
using backend::KernelSpec;

// Threads per block for a row of `n`: a multiple of 32, up to 256.
unsigned RowBlock(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + 31) / 32 * 32, 32, 256));
}

// The vectorized layout of a row of `n` elements of `dtype`: vectors per
// thread (0 = the row does not vectorize) and threads per block.
struct VecLayout {
  int nv = 0;
  unsigned threads = 0;
};

VecLayout VecLayoutFor(DType dtype, int64_t n) {
  const int64_t width = dtype == v1::DTYPE_F32 ? 4 : 8;
  if (n <= 0 || n % width != 0) return {};
  const int64_t nvec = n / width;
  for (int nv : {1, 2, 4, 8}) {
    if (nvec <= int64_t{256} * nv) {
      return {nv, static_cast<unsigned>((((nvec + nv - 1) / nv) + 31) / 32 * 32)};
    }
  }
  if (nvec > int64_t{1024} * 8) return {};
  return {8, static_cast<unsigned>((((nvec + 7) / 8) + 31) / 32 * 32)};
}

bool Aligned16(std::initializer_list<CUdeviceptr> ptrs) {
  for (CUdeviceptr p : ptrs) {
    if (p % 16 != 0) return false;
  }
  return true;
}

struct NormPlan {
  bool rms = false, residual = false, emit_sum = false, scale = false, bias = false;
  int64_t axis = -1;
  double eps = 0;
};

absl::StatusOr<NormPlan> PlanNorm(const KernelSpec& spec) {
  NormPlan p;
  bool has_axis = false, has_eps = false;
  switch (spec.op) {
    case v1::OP_LAYER_NORM: {
      const auto& a = spec.attrs.layer_norm();
      has_axis = a.has_axis(), p.axis = a.axis(), has_eps = a.has_epsilon(), p.eps = a.epsilon();
      p.scale = spec.inputs.size() > 1;
      p.bias = spec.inputs.size() > 2;
      if (spec.inputs.size() > 3)
        return absl::InvalidArgumentError("layer_norm takes x, scale, bias");
      break;
    }
    case v1::OP_RMS_NORM: {
      const auto& a = spec.attrs.rms_norm();
      p.rms = true;
      has_axis = a.has_axis(), p.axis = a.axis(), has_eps = a.has_epsilon(), p.eps = a.epsilon();
      p.scale = spec.inputs.size() > 1;
      if (spec.inputs.size() > 2) return absl::InvalidArgumentError("rms_norm takes no bias");
      break;
    }
    case v1::OP_FUSED_RESIDUAL_NORM: {
      const auto& a = spec.attrs.fused_residual_norm();
      p.rms = a.rms(), p.residual = true, p.emit_sum = a.emit_sum();
      p.scale = a.has_scale(), p.bias = a.has_bias();
      has_axis = a.has_axis(), p.axis = a.axis(), has_eps = a.has_epsilon(), p.eps = a.epsilon();
      if (spec.inputs.size() != 2u + p.scale + p.bias) {
        return absl::InvalidArgumentError("operand count does not match has_scale/has_bias");
      }
      break;
    }
    default:
      return absl::InvalidArgumentError("not a norm");
  }
  if (spec.outputs.size() != (p.emit_sum ? 2u : 1u)) {
    return absl::InvalidArgumentError("output count does not match emit_sum");
  }
  if (!has_eps) p.eps = p.rms ? 1e-6 : 1e-5;
  if (!has_axis) p.axis = -1;
  const int64_t rank = static_cast<int64_t>(spec.inputs[0].dims.size());
  if (p.axis < 0) p.axis += rank;
  if (p.axis < 0 || p.axis >= rank) return absl::InvalidArgumentError("axis out of range");
  if (p.residual && spec.inputs[1].dims != spec.inputs[0].dims) {
    return absl::InvalidArgumentError("x and residual differ in shape");
  }
  int64_t n = 1;
  for (size_t k = p.axis; k < spec.inputs[0].dims.size(); ++k) n *= spec.inputs[0].dims[k];
  for (size_t i = 1 + p.residual; i < spec.inputs.size(); ++i) {
    if (spec.inputs[i].num_elements() != n) {
      return absl::InvalidArgumentError("scale and bias must have the normalized dims' size");
    }
  }
  return p;
}

Claim SameFloatDType(const KernelSpec& spec, const char* what) {
  const DType dt = spec.inputs[0].dtype;
  for (const auto& t : spec.inputs) {
    if (t.dtype != dt) return Claim::No(absl::StrCat("cuda ", what, ": operands differ in dtype"));
  }
  for (const auto& t : spec.outputs) {
    if (t.dtype != dt) return Claim::No(absl::StrCat("cuda ", what, ": results differ in dtype"));
  }
  return FloatDType(dt, what);
}

Claim SupportsNorm(const CudaDevice&, const KernelSpec& spec) {
  if (spec.inputs.empty() || spec.outputs.empty()) return Claim::No("malformed spec");
  absl::StatusOr<NormPlan> p = PlanNorm(spec);
  if (!p.ok()) return Claim::No(absl::StrCat("cuda norm: ", p.status().message()));
  return SameFloatDType(spec, "norm");
}

class NormKernel final : public CudaKernel {
 public:
  NormKernel(CudaDevice& d, const KernelSpec& spec, LoadedFunction fn, LoadedFunction vec_fn,
             VecLayout vec, unsigned vec_grid, NormPlan plan, int64_t rows, int64_t n,
             std::string impl)
      : CudaKernel(d, spec, std::move(impl)),
        fn_(std::move(fn)),
        vec_fn_(std::move(vec_fn)),
        vec_(vec),
        vec_grid_(vec_grid),
        plan_(plan),
        rows_(rows),
        n_(n) {}

 protected:
  absl::Status Enqueue(CudaStream& s, std::span<const CUdeviceptr> in,
                       std::span<const CUdeviceptr> out) override {
    size_t next = 1;
    CUdeviceptr x = in[0], res = 0, scale = 0, bias = 0, y = out[0], sum = 0;
    if (plan_.residual) res = in[next++];
    if (plan_.scale) scale = in[next++];
    if (plan_.bias) bias = in[next++];
    if (plan_.emit_sum) sum = out[1];
    float eps = static_cast<float>(plan_.eps);
    int rms = plan_.rms, has_res = plan_.residual, has_scale = plan_.scale, has_bias = plan_.bias,
        emit = plan_.emit_sum;
    int64_t rows = rows_, n = n_;
    void* args[] = {&x, &res, &scale, &bias,    &y,         &sum,      &rows,
                    &n, &eps, &rms,   &has_res, &has_scale, &has_bias, &emit};
    const unsigned grid =
        static_cast<unsigned>(std::min<int64_t>(rows_, device_.caps().max_grid_x));
    if (vec_.nv != 0 && Aligned16({x, res, scale, bias, y, sum})) {
      return LaunchKernel(s, vec_fn_.fn, vec_grid_, 1, 1, vec_.threads, 0, args);
    }
    return LaunchKernel(s, fn_.fn, std::max(grid, 1u), 1, 1, RowBlock(n_), 0, args);
  }

 private:
  LoadedFunction fn_, vec_fn_;
  VecLayout vec_;
  unsigned vec_grid_;  // the vectorized kernel's blocks: as many as are resident at once
  NormPlan plan_;
  int64_t rows_, n_;
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateNorm(CudaDevice& d, const KernelSpec& spec,
                                                            backend::PrepareContext& context) {
  KILN_ASSIGN_OR_RETURN(NormPlan plan, PlanNorm(spec));
  const Dims& dims = spec.inputs[0].dims;
  int64_t rows = 1, n = 1;
  for (int64_t k = 0; k < plan.axis; ++k) rows *= dims[k];
  for (size_t k = plan.axis; k < dims.size(); ++k) n *= dims[k];
  const std::string dt = DTypeSuffix(spec.inputs[0].dtype);
  const std::string source = KernelSource("norm.cu");
  KILN_ASSIGN_OR_RETURN(LoadedFunction fn,
                        LoadFunction(d, "norm", source, absl::StrCat("kiln_norm_", dt), context));
  const VecLayout vec = VecLayoutFor(spec.inputs[0].dtype, n);
  LoadedFunction vec_fn;
  unsigned vec_grid = 1;
  if (vec.nv != 0) {
    KILN_ASSIGN_OR_RETURN(
        vec_fn,
        LoadFunction(d, "norm", source, absl::StrCat("kiln_norm_v", vec.nv, "_", dt), context));
    // Blocks stride over rows, prefetching the next (norm.cu): one block per
    // row would give every block a single row and nothing to overlap.
    KILN_ASSIGN_OR_RETURN(vec_grid, ResidentBlocks(d, vec_fn.fn, vec.threads));
    vec_grid = static_cast<unsigned>(std::clamp<int64_t>(rows, 1, vec_grid));
  }
  const char* what = plan.residual ? (plan.rms ? "residual_rms_norm_" : "residual_layer_norm_")
                                   : (plan.rms ? "rms_norm_" : "layer_norm_");
  return std::unique_ptr<backend::Kernel>(
      std::make_unique<NormKernel>(d, spec, std::move(fn), std::move(vec_fn), vec, vec_grid, plan,
                                   rows, n,
                                   absl::StrCat("nvrtc:", what, dt, vec.nv != 0 ? "_vec" : "")));
}

// ---- GroupNorm (kernels/norm.cu): N * groups rows of one group's channels
// times the spatial positions. Rows at least as many as the SMs: one block
// per row, up to 1024 threads (kiln_group_norm_*). Fewer rows than twice the
// SMs, each longer than one chunk (kGroupNormChunk elements): the split path, a block
// per (chunk, row) for the statistics (kiln_group_norm_stats_*, partial mean
// and M2 per chunk), then a block per (chunk, row) that combines its row's
// partials and normalizes the chunk (kiln_group_norm_apply_*): every SM busy
// in both, x read twice. KILN_GROUP_NORM_SPLIT=0 / 1 forces the row kernel /
// the split path wherever it applies (benchmarks compare the two).

constexpr int64_t kGroupNormChunk = 4096;  // K_GN_CHUNK in norm.cu

struct GroupNormPlan {
  int64_t rows = 0, groups = 1, n = 0, spatial = 1;
  int64_t splits = 0;  // chunks per row on the split path; 0: the row kernel
  double eps = 1e-5;
  bool scale = false, bias = false;
};

// The split path's chunks per row for `rows` rows of `n` on `sm_count` SMs,
// or 0 for the row kernel.
int64_t GroupNormSplits(int64_t rows, int64_t n, int sm_count) {
  const int64_t splits = (n + kGroupNormChunk - 1) / kGroupNormChunk;
  // grid.y holds the rows; the kernels index a row with 32 bits, chunk ends included.
  if (splits < 2 || rows > 65535 || n > int64_t{UINT32_MAX} - kGroupNormChunk) return 0;
  const char* force = std::getenv("KILN_GROUP_NORM_SPLIT");
  if (force != nullptr && (force[0] == '0' || force[0] == '1') && force[1] == '\0') {
    return force[0] == '1' ? splits : 0;
  }
  // On an H100 (132 SMs) the split path is 2-7x faster at 32-64 rows and ~10%
  // at 256 rows of 25088 (docs/benchmarks.md, "kern10").
  return rows < 2 * std::max(sm_count, 1) ? splits : 0;
}

absl::StatusOr<GroupNormPlan> PlanGroupNorm(const KernelSpec& spec) {
  if (spec.inputs.empty() || spec.inputs.size() > 3 || spec.outputs.size() != 1) {
    return absl::InvalidArgumentError("group_norm takes x and optional scale and bias");
  }
  const Dims& d = spec.inputs[0].dims;
  const auto& a = spec.attrs.group_norm();
  if (d.size() < 2) return absl::InvalidArgumentError("group_norm needs x [N, C, ...]");
  if (a.groups() <= 0 || d[1] % a.groups() != 0) {
    return absl::InvalidArgumentError("groups must divide the channels");
  }
  for (size_t i = 1; i < spec.inputs.size(); ++i) {
    if (spec.inputs[i].dims != Dims{d[1]}) {
      return absl::InvalidArgumentError("scale and bias must be [C]");
    }
  }
  if (spec.outputs[0].dims != d) return absl::InvalidArgumentError("y must have x's shape");
  GroupNormPlan p;
  p.groups = a.groups();
  p.eps = a.has_epsilon() ? a.epsilon() : 1e-5;
  for (size_t k = 2; k < d.size(); ++k) p.spatial *= d[k];
  p.rows = d[0] * p.groups;
  p.n = d[1] / p.groups * p.spatial;
  // The kernel indexes a row with 32 bits.
  if (p.n > int64_t{UINT32_MAX}) return absl::InvalidArgumentError("a group over 2^32 elements");
  p.scale = spec.inputs.size() > 1;
  p.bias = spec.inputs.size() > 2;
  return p;
}

Claim SupportsGroupNorm(const CudaDevice&, const KernelSpec& spec) {
  absl::StatusOr<GroupNormPlan> p = PlanGroupNorm(spec);
  if (!p.ok()) return Claim::No(absl::StrCat("cuda group_norm: ", p.status().message()));
  return SameFloatDType(spec, "group_norm");
}

class GroupNormKernel final : public CudaKernel {
 public:
  // `split`: the split path's stats and apply kernels, vector (_v) and
  // scalar (_s) forms; empty on the row kernel's plans.
  GroupNormKernel(CudaDevice& d, const KernelSpec& spec, LoadedFunction fn,
                  std::array<LoadedFunction, 4> split, GroupNormPlan plan, std::string impl)
      : CudaKernel(d, spec, std::move(impl)),
        fn_(std::move(fn)),
        split_(std::move(split)),
        plan_(plan) {}

 protected:
  absl::Status Enqueue(CudaStream& s, std::span<const CUdeviceptr> in,
                       std::span<const CUdeviceptr> out) override {
    CUdeviceptr x = in[0], scale = plan_.scale ? in[1] : 0, bias = plan_.bias ? in[2] : 0,
                y = out[0];
    int64_t rows = plan_.rows, groups = plan_.groups;
    unsigned n = static_cast<unsigned>(plan_.n), spatial = static_cast<unsigned>(plan_.spatial);
    float eps = static_cast<float>(plan_.eps);
    int has_scale = plan_.scale, has_bias = plan_.bias;
    if (plan_.splits > 0) {
      if (partials_ == nullptr) {
        // Owned by the kernel (a run context's kernels run one launch at a
        // time), so a launch allocates nothing and a captured CUDA graph
        // replays it as is.
        KILN_ASSIGN_OR_RETURN(partials_, device_.Allocate(plan_.rows * plan_.splits * 8));
      }
      CUdeviceptr part = static_cast<CudaBuffer*>(partials_.get())->ptr();
      const int64_t width = spec_.inputs[0].dtype == v1::DTYPE_F32 ? 4 : 8;
      const bool vec = plan_.n % width == 0 && Aligned16({x, y});
      unsigned splits = static_cast<unsigned>(plan_.splits);
      const auto grid_y = static_cast<unsigned>(plan_.rows);
      void* sargs[] = {&x, &part, &n, &splits};
      KILN_RETURN_IF_ERROR(
          LaunchKernel(s, split_[vec ? 0 : 2].fn, splits, grid_y, 1, 256, 0, sargs));
      void* aargs[] = {&x,     &scale,   &bias, &y,   &part,      &groups,
                       &n,     &spatial, &splits, &eps, &has_scale, &has_bias};
      return LaunchKernel(s, split_[vec ? 1 : 3].fn, splits, grid_y, 1, 256, 0, aargs);
    }
    void* args[] = {&x, &scale, &bias, &y, &rows, &groups, &n, &spatial, &eps, &has_scale,
                    &has_bias};
    const unsigned grid =
        static_cast<unsigned>(std::min<int64_t>(plan_.rows, device_.caps().max_grid_x));
    const auto block =
        static_cast<unsigned>(std::clamp<int64_t>((plan_.n + 31) / 32 * 32, 32, 1024));
    return LaunchKernel(s, fn_.fn, std::max(grid, 1u), 1, 1, block, 0, args);
  }

 private:
  LoadedFunction fn_;
  std::array<LoadedFunction, 4> split_;  // stats_v, apply_v, stats_s, apply_s
  GroupNormPlan plan_;
  std::unique_ptr<backend::Buffer> partials_;  // the split path's (mean, M2) per chunk
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateGroupNorm(
    CudaDevice& d, const KernelSpec& spec, backend::PrepareContext& context) {
  KILN_ASSIGN_OR_RETURN(GroupNormPlan plan, PlanGroupNorm(spec));
  plan.splits = GroupNormSplits(plan.rows, plan.n, d.caps().sm_count);
  const std::string dt = DTypeSuffix(spec.inputs[0].dtype);
  const std::string source = KernelSource("norm.cu");
  KILN_ASSIGN_OR_RETURN(LoadedFunction fn, LoadFunction(d, "norm", source,
                                                        absl::StrCat("kiln_group_norm_", dt),
                                                        context));
  std::array<LoadedFunction, 4> split;
  if (plan.splits > 0) {
    const char* names[] = {"stats_v_", "apply_v_", "stats_s_", "apply_s_"};
    for (int i = 0; i < 4; ++i) {
      KILN_ASSIGN_OR_RETURN(split[i],
                            LoadFunction(d, "norm", source,
                                         absl::StrCat("kiln_group_norm_", names[i], dt), context));
    }
  }
  std::string impl = plan.splits > 0
                         ? absl::StrCat("nvrtc:group_norm_split", plan.splits, "_", dt)
                         : absl::StrCat("nvrtc:group_norm_", dt);
  return std::unique_ptr<backend::Kernel>(std::make_unique<GroupNormKernel>(
      d, spec, std::move(fn), std::move(split), plan, std::move(impl)));
}

// ---- Softmax / LogSoftmax ----

Claim SupportsSoftmax(const CudaDevice&, const KernelSpec& spec) {
  if (spec.inputs.size() != 1 || spec.outputs.size() != 1 || spec.inputs[0].dims.empty() ||
      spec.inputs[0].dims != spec.outputs[0].dims) {
    return Claim::No("malformed spec");
  }
  const auto& a = spec.op == v1::OP_LOG_SOFTMAX ? spec.attrs.log_softmax() : spec.attrs.softmax();
  const int64_t rank = static_cast<int64_t>(spec.inputs[0].dims.size());
  const int64_t axis = a.has_axis() ? a.axis() : -1;
  if (axis < -rank || axis >= rank) return Claim::No("cuda softmax: axis out of range");
  return SameFloatDType(spec, "softmax");
}

class SoftmaxKernel final : public CudaKernel {
 public:
  SoftmaxKernel(CudaDevice& d, const KernelSpec& spec, LoadedFunction fn, LoadedFunction vec_fn,
                VecLayout vec, int64_t outer, int64_t n, int64_t inner, bool log, std::string impl)
      : CudaKernel(d, spec, std::move(impl)),
        fn_(std::move(fn)),
        vec_fn_(std::move(vec_fn)),
        vec_(vec),
        outer_(outer),
        n_(n),
        inner_(inner),
        log_(log) {}

 protected:
  absl::Status Enqueue(CudaStream& s, std::span<const CUdeviceptr> in,
                       std::span<const CUdeviceptr> out) override {
    CUdeviceptr x = in[0], y = out[0];
    int64_t outer = outer_, n = n_, inner = inner_;
    int log = log_;
    if (inner_ == 1) {
      void* args[] = {&x, &y, &outer, &n, &log};
      const unsigned grid =
          static_cast<unsigned>(std::min<int64_t>(outer_, device_.caps().max_grid_x));
      if (vec_.nv != 0 && Aligned16({x, y})) {
        return LaunchKernel(s, vec_fn_.fn, std::max(grid, 1u), 1, 1, vec_.threads, 0, args);
      }
      return LaunchKernel(s, fn_.fn, std::max(grid, 1u), 1, 1, RowBlock(n_), 0, args);
    }
    void* args[] = {&x, &y, &outer, &n, &inner, &log};
    return LaunchKernel(s, fn_.fn, GridFor(device_.caps(), outer_ * inner_, 256), 1, 1, 256, 0,
                        args);
  }

 private:
  LoadedFunction fn_, vec_fn_;
  VecLayout vec_;
  int64_t outer_, n_, inner_;
  bool log_;
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateSoftmax(CudaDevice& d,
                                                               const KernelSpec& spec,
                                                               backend::PrepareContext& context) {
  const bool log = spec.op == v1::OP_LOG_SOFTMAX;
  const auto& a = log ? spec.attrs.log_softmax() : spec.attrs.softmax();
  const Dims& dims = spec.inputs[0].dims;
  int64_t axis = a.has_axis() ? a.axis() : -1;
  if (axis < 0) axis += static_cast<int64_t>(dims.size());
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < axis; ++k) outer *= dims[k];
  for (size_t k = axis + 1; k < dims.size(); ++k) inner *= dims[k];
  const std::string dt = DTypeSuffix(spec.inputs[0].dtype);
  const std::string fn_name = absl::StrCat("kiln_softmax_", inner == 1 ? "rows_" : "cols_", dt);
  const std::string source = KernelSource("softmax.cu");
  KILN_ASSIGN_OR_RETURN(LoadedFunction fn, LoadFunction(d, "softmax", source, fn_name, context));
  const VecLayout vec = inner == 1 ? VecLayoutFor(spec.inputs[0].dtype, dims[axis]) : VecLayout{};
  LoadedFunction vec_fn;
  if (vec.nv != 0) {
    KILN_ASSIGN_OR_RETURN(
        vec_fn, LoadFunction(d, "softmax", source, absl::StrCat("kiln_softmax_v", vec.nv, "_", dt),
                             context));
  }
  return std::unique_ptr<backend::Kernel>(std::make_unique<SoftmaxKernel>(
      d, spec, std::move(fn), std::move(vec_fn), vec, outer, dims[axis], inner, log,
      absl::StrCat("nvrtc:", log ? "log_softmax_" : "softmax_", dt, vec.nv != 0 ? "_vec" : "")));
}

const CudaOpRegistration kNormRegistration({
    {v1::OP_LAYER_NORM, &SupportsNorm, &CreateNorm},
    {v1::OP_RMS_NORM, &SupportsNorm, &CreateNorm},
    {v1::OP_FUSED_RESIDUAL_NORM, &SupportsNorm, &CreateNorm},
    {v1::OP_GROUP_NORM, &SupportsGroupNorm, &CreateGroupNorm},
    {v1::OP_SOFTMAX, &SupportsSoftmax, &CreateSoftmax},
    {v1::OP_LOG_SOFTMAX, &SupportsSoftmax, &CreateSoftmax},
});

}  // namespace
}  // namespace kiln::cuda
