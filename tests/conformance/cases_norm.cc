// Conformance cases for Softmax and LogSoftmax (any axis), LayerNorm (axis,
// optional scale/bias, default epsilon), RmsNorm, FusedResidualNorm and GroupNorm.
// References are long double loops over each row.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/conformance/reference_util.h"

namespace kiln::conformance {
namespace {

using ref::Axis;
using ref::Shape;

std::vector<HostTensor> SoftmaxReference(const backend::KernelSpec& spec,
                                         const std::vector<HostTensor>& in) {
  const bool log = spec.op == v1::OP_LOG_SOFTMAX;
  const auto& a = log ? spec.attrs.log_softmax() : spec.attrs.softmax();
  const Dims& d = in[0].dims();
  const int64_t axis = Axis(a.has_axis() ? a.axis() : -1, d.size());
  const int64_t outer = ref::NumElements(Dims(d.begin(), d.begin() + axis)), n = d[axis];
  const int64_t inner = ref::NumElements(Dims(d.begin() + axis + 1, d.end()));
  std::vector<HostTensor> out;
  out.push_back(F64(d));
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t r) { return (o * n + r) * inner + i; };
      long double mx = -INFINITY, sum = 0;
      for (int64_t r = 0; r < n; ++r) mx = std::max<long double>(mx, At(in[0], at(r)));
      for (int64_t r = 0; r < n; ++r) sum += std::exp(At(in[0], at(r)) - mx);
      for (int64_t r = 0; r < n; ++r) {
        const long double z = At(in[0], at(r)) - mx;
        out[0].SetFromDouble(at(r),
                             static_cast<double>(log ? z - std::log(sum) : std::exp(z) / sum));
      }
    }
  }
  return out;
}

std::vector<Case> SoftmaxCases() {
  std::vector<Case> cases;
  const std::vector<std::pair<Dims, int64_t>> specs = {
      {{7}, -1},        {{3, 33}, -1}, {{4, 1000}, 1}, {{2, 5, 7}, 1}, {{300, 2, 3}, 0},
      {{2, 9, 300}, 1}, {{1}, 0},      {{0, 5}, -1},   {{5, 1}, 0},    {{6, 1}, -1},
  };
  for (v1::OpKind op : {v1::OP_SOFTMAX, v1::OP_LOG_SOFTMAX}) {
    for (DType dt : ref::FloatTypes()) {
      for (const auto& [dims, axis] : specs) {
        const std::string name = absl::StrCat(op == v1::OP_SOFTMAX ? "softmax/" : "log_softmax/",
                                              DTypeName(dt), "_", Shape(dims), "_a", axis);
        auto rng = RngFor(name);
        v1::Attrs a;
        auto* sa = op == v1::OP_SOFTMAX ? a.mutable_softmax() : a.mutable_log_softmax();
        if (axis != -1) sa->set_axis(axis);  // -1 stays the default
        Case c;
        c.name = name;
        c.spec = ref::Spec(name, op, a, {Desc(dt, dims)}, {Desc(dt, dims)});
        c.inputs = ref::Tensors{RandomTensor(rng, dt, dims, -10, 10)};
        c.reference = SoftmaxReference;
        c.tol = DefaultTolerance(dt);
        cases.push_back(std::move(c));
      }
      // In place (output over input), last and middle axis.
      for (const auto& [dims, axis] :
           std::vector<std::pair<Dims, int64_t>>{{{4, 300}, -1}, {{3, 50, 300}, 1}}) {
        const std::string name = absl::StrCat(op == v1::OP_SOFTMAX ? "softmax/" : "log_softmax/",
                                              DTypeName(dt), "_in_place_a", axis);
        auto rng = RngFor(name);
        v1::Attrs a;
        (op == v1::OP_SOFTMAX ? a.mutable_softmax() : a.mutable_log_softmax())->set_axis(axis);
        Case c;
        c.name = name;
        c.spec = ref::Spec(name, op, a, {Desc(dt, dims)}, {Desc(dt, dims)});
        c.inputs = ref::Tensors{RandomTensor(rng, dt, dims, -10, 10)};
        c.reference = SoftmaxReference;
        c.tol = DefaultTolerance(dt);
        c.in_place_input = 0;
        cases.push_back(std::move(c));
      }
    }
  }
  // Attention-sized rows, in parallel; rows with -inf (masked) entries and
  // huge logits (the max must be subtracted).
  for (v1::OpKind op : {v1::OP_SOFTMAX, v1::OP_LOG_SOFTMAX}) {
    const std::string base = op == v1::OP_SOFTMAX ? "softmax/" : "log_softmax/";
    {
      const std::string name = base + "large_12x128x128";
      auto rng = RngFor(name);
      Case c;
      c.name = name;
      c.spec = ref::Spec(name, op, v1::Attrs(), {Desc(v1::DTYPE_F32, {12, 128, 128})},
                         {Desc(v1::DTYPE_F32, {12, 128, 128})});
      c.inputs = ref::Tensors{RandomTensor(rng, v1::DTYPE_F32, {12, 128, 128}, -8, 8)};
      c.reference = SoftmaxReference;
      c.tol = DefaultTolerance(v1::DTYPE_F32);
      cases.push_back(std::move(c));
    }
    const std::string name = base + "special";
    Case c;
    c.name = name;
    c.spec = ref::Spec(name, op, v1::Attrs(), {Desc(v1::DTYPE_F32, {3, 9})},
                       {Desc(v1::DTYPE_F32, {3, 9})});
    c.inputs = ref::Tensors{ref::Values(
        v1::DTYPE_F32, {3, 9},
        {1,   -INFINITY, 2,        -INFINITY, 3,   0,    0,    0,    1,  // masked entries
         1e4, 1e4 - 1,   1e4 - 30, -1e4,      5e3, 1e4,  0,    1,    2,  // huge logits
         -50, -60,       -70,      -80,       -90, -100, -110, -120, -130})};
    c.reference = SoftmaxReference;
    c.tol = DefaultTolerance(v1::DTYPE_F32);
    cases.push_back(std::move(c));
  }
  return cases;
}

// LayerNorm / RmsNorm / FusedResidualNorm over rows of `n` trailing elements.
std::vector<HostTensor> NormReference(const backend::KernelSpec& spec,
                                      const std::vector<HostTensor>& in) {
  bool rms = spec.op == v1::OP_RMS_NORM, has_axis = false, has_eps = false, residual = false,
       emit_sum = false;
  int64_t axis_attr = -1;
  double eps = 0;
  int scale = -1, bias = -1;
  if (spec.op == v1::OP_LAYER_NORM) {
    const auto& a = spec.attrs.layer_norm();
    has_axis = a.has_axis(), axis_attr = a.axis(), has_eps = a.has_epsilon(), eps = a.epsilon();
    if (in.size() > 1) scale = 1;
    if (in.size() > 2) bias = 2;
  } else if (spec.op == v1::OP_RMS_NORM) {
    const auto& a = spec.attrs.rms_norm();
    has_axis = a.has_axis(), axis_attr = a.axis(), has_eps = a.has_epsilon(), eps = a.epsilon();
    if (in.size() > 1) scale = 1;
  } else {
    const auto& a = spec.attrs.fused_residual_norm();
    rms = a.rms(), residual = true, emit_sum = a.emit_sum();
    has_axis = a.has_axis(), axis_attr = a.axis(), has_eps = a.has_epsilon(), eps = a.epsilon();
    int next = 2;
    if (a.has_scale()) scale = next++;
    if (a.has_bias()) bias = next++;
  }
  if (!has_eps) eps = rms ? 1e-6 : 1e-5;
  const Dims& d = in[0].dims();
  const int64_t axis = Axis(has_axis ? axis_attr : -1, d.size());
  const int64_t n = ref::NumElements(Dims(d.begin() + axis, d.end()));
  const int64_t rows = ref::NumElements(Dims(d.begin(), d.begin() + axis));
  const DType dt = in[0].dtype();
  std::vector<HostTensor> out;
  out.push_back(F64(d));
  if (emit_sum) out.push_back(F64(d));
  std::vector<long double> x(n);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      x[i] = At(in[0], r * n + i);
      if (residual) {
        // The sum as stored in the dtype, which the norm then reads.
        x[i] = ref::RoundTo(static_cast<double>(x[i] + At(in[1], r * n + i)), dt);
        if (emit_sum) out[1].SetFromDouble(r * n + i, static_cast<double>(x[i]));
      }
    }
    long double mean = 0, var = 0;
    if (!rms) {
      for (int64_t i = 0; i < n; ++i) mean += x[i];
      mean /= n;
    }
    for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
    var /= n;
    const long double rstd = 1.0L / std::sqrt(var + eps);
    for (int64_t i = 0; i < n; ++i) {
      long double y = (x[i] - mean) * rstd;
      if (scale >= 0) y *= At(in[scale], i);
      if (bias >= 0) y += At(in[bias], i);
      out[0].SetFromDouble(r * n + i, static_cast<double>(y));
    }
  }
  return out;
}

struct NormSpec {
  Dims dims;
  int64_t axis;   // -1 = default (unset)
  int params;     // 0 none, 1 scale, 2 scale + bias
  double eps;     // 0 = default (unset)
  double offset;  // added to x: a large mean
};

std::vector<Case> NormCases() {
  std::vector<Case> cases;
  const std::vector<NormSpec> specs = {
      {{4, 768}, -1, 2, 0, 0}, {{3, 5, 7}, 1, 2, 1e-3, 0}, {{10, 33}, -1, 1, 0, 0},
      {{6, 17}, -1, 0, 0, 0},  {{2, 1}, -1, 2, 0, 0},      {{0, 8}, -1, 2, 0, 0},
      {{7}, 0, 1, 0, 0},       {{5, 300}, -1, 2, 0, 100},  {{384, 768}, -1, 2, 0, 0},
  };
  for (v1::OpKind op : {v1::OP_LAYER_NORM, v1::OP_RMS_NORM}) {
    for (DType dt : ref::FloatTypes()) {
      for (size_t k = 0; k < specs.size(); ++k) {
        const NormSpec& s = specs[k];
        if (dt != v1::DTYPE_F32 && ref::NumElements(s.dims) > 10000) continue;
        const int params = op == v1::OP_RMS_NORM ? std::min(s.params, 1) : s.params;
        const std::string name =
            absl::StrCat(op == v1::OP_LAYER_NORM ? "layer_norm/" : "rms_norm/", DTypeName(dt), "_",
                         Shape(s.dims), "_a", s.axis, "_p", params, s.eps > 0 ? "_eps" : "",
                         s.offset != 0 ? "_offset" : "");
        auto rng = RngFor(name);
        const int64_t axis = Axis(s.axis, s.dims.size());
        const Dims norm(s.dims.begin() + axis, s.dims.end());
        v1::Attrs a;
        if (op == v1::OP_LAYER_NORM) {
          if (s.axis != -1) a.mutable_layer_norm()->set_axis(s.axis);
          if (s.eps > 0) a.mutable_layer_norm()->set_epsilon(s.eps);
        } else {
          if (s.axis != -1) a.mutable_rms_norm()->set_axis(s.axis);
          if (s.eps > 0) a.mutable_rms_norm()->set_epsilon(s.eps);
        }
        std::vector<HostTensor> inputs;
        inputs.push_back(RandomTensor(rng, dt, s.dims, s.offset - 2, s.offset + 2));
        std::vector<backend::TensorDesc> descs = {Desc(dt, s.dims)};
        for (int p = 0; p < params; ++p) {
          inputs.push_back(RandomTensor(rng, dt, norm, p == 0 ? 0.5 : -1, p == 0 ? 1.5 : 1));
          descs.push_back(Desc(dt, norm));
        }
        Case c;
        c.name = name;
        c.spec = ref::Spec(name, op, a, std::move(descs), {Desc(dt, s.dims)});
        c.inputs = std::move(inputs);
        c.reference = NormReference;
        c.tol = DefaultTolerance(dt);
        if (k == 0) c.in_place_input = 0;  // y over x
        cases.push_back(std::move(c));
      }
    }
  }
  // FusedResidualNorm: both norms, every scale/bias combination, with and
  // without the sum output.
  int t = 0;
  for (bool rms : {false, true}) {
    for (DType dt : ref::FloatTypes()) {
      for (int combo = 0; combo < 4; ++combo, ++t) {
        const bool has_scale = combo & 1, has_bias = combo & 2, emit = t % 3 != 1;
        const Dims dims = t % 2 ? Dims{6, 96} : Dims{3, 4, 33};
        const int64_t axis = t % 4 == 3 ? 1 : -1;
        const std::string name =
            absl::StrCat("residual_norm/", rms ? "rms_" : "layer_", DTypeName(dt), "_", combo,
                         emit ? "_sum" : "", "_a", axis);
        auto rng = RngFor(name);
        v1::Attrs a;
        auto* fa = a.mutable_fused_residual_norm();
        fa->set_rms(rms);
        if (axis != -1) fa->set_axis(axis);
        fa->set_emit_sum(emit);
        fa->set_has_scale(has_scale);
        fa->set_has_bias(has_bias);
        const Dims norm(dims.begin() + Axis(axis, dims.size()), dims.end());
        std::vector<HostTensor> inputs;
        inputs.push_back(RandomTensor(rng, dt, dims, -2, 2));
        inputs.push_back(RandomTensor(rng, dt, dims, -2, 2));
        std::vector<backend::TensorDesc> descs = {Desc(dt, dims), Desc(dt, dims)};
        if (has_scale)
          inputs.push_back(RandomTensor(rng, dt, norm, 0.5, 1.5)), descs.push_back(Desc(dt, norm));
        if (has_bias)
          inputs.push_back(RandomTensor(rng, dt, norm, -1, 1)), descs.push_back(Desc(dt, norm));
        std::vector<backend::TensorDesc> outs = {Desc(dt, dims)};
        if (emit) outs.push_back(Desc(dt, dims));
        Case c;
        c.name = name;
        c.spec = ref::Spec(name, v1::OP_FUSED_RESIDUAL_NORM, a, std::move(descs), std::move(outs));
        c.inputs = std::move(inputs);
        c.reference = NormReference;
        c.tol = DefaultTolerance(dt);
        // Every third case writes y over x or over the residual (in place).
        if (t % 3 == 2) c.in_place_input = t % 2;
        cases.push_back(std::move(c));
      }
    }
  }
  return cases;
}

// GroupNorm over x [N, C, spatial...]: each group of C / groups channels is
// normalized over its channels and spatial positions together, then the
// optional per-channel scale and bias.
std::vector<HostTensor> GroupNormReference(const backend::KernelSpec& spec,
                                           const std::vector<HostTensor>& in) {
  const auto& a = spec.attrs.group_norm();
  const double eps = a.has_epsilon() ? a.epsilon() : 1e-5;
  const Dims& d = in[0].dims();
  const int64_t groups = a.groups(), cg = d[1] / groups;
  const int64_t spatial = ref::NumElements(Dims(d.begin() + 2, d.end())), n = cg * spatial;
  std::vector<HostTensor> out;
  out.push_back(F64(d));
  for (int64_t r = 0; r < d[0] * groups; ++r) {
    const int64_t base = r * n;
    long double mean = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) mean += At(in[0], base + i);
    mean /= n;
    for (int64_t i = 0; i < n; ++i) var += (At(in[0], base + i) - mean) * (At(in[0], base + i) - mean);
    var /= n;
    const long double rstd = 1.0L / std::sqrt(var + eps);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t ch = (r % groups) * cg + i / spatial;
      long double y = (At(in[0], base + i) - mean) * rstd;
      if (in.size() > 1) y *= At(in[1], ch);
      if (in.size() > 2) y += At(in[2], ch);
      out[0].SetFromDouble(base + i, static_cast<double>(y));
    }
  }
  return out;
}

struct GroupNormSpec {
  Dims dims;
  int64_t groups;
  int params;     // 0 none, 1 scale, 2 scale + bias
  double eps;     // 0 = default (unset)
  double offset;  // added to x: a large mean
};

std::vector<Case> GroupNormCases() {
  std::vector<Case> cases;
  const std::vector<GroupNormSpec> specs = {
      {{2, 8, 5, 3}, 4, 2, 0, 0},      // NCHW, 2 channels a group
      {{3, 6}, 3, 0, 0, 0},            // no spatial dims
      {{1, 4, 7}, 1, 1, 0, 0},         // one group of all channels
      {{2, 6, 2, 2, 2}, 6, 2, 1e-3, 0},  // a group per channel, 3-D spatial
      {{2, 5, 33}, 5, 2, 0, 0},        // odd sizes
      {{3, 9, 7, 5}, 3, 1, 0, 0},      // odd sizes, 3 channels a group
      {{0, 4, 3}, 2, 2, 0, 0},         // empty batch
      {{2, 4, 0}, 2, 2, 0, 0},         // empty spatial
      {{2, 6, 11, 13}, 2, 2, 0, 1000},  // a large mean
      {{1, 4, 50, 50}, 2, 2, 0, 0},    // groups longer than a workgroup
      {{2, 32, 64, 64}, 32, 2, 0, 0},  // large spatial, Stable-Diffusion-like groups
      {{1, 8, 96, 96}, 1, 2, 1e-6, 5},  // one group of 73728 elements
      // The GPUs' split path (fewer rows than twice the SMs / kGroupNormSplitRows, each
      // longer than a chunk of 4096): 16-byte loads with the channel changing
      // inside a vector (spatial 513), a partial last chunk...
      {{1, 16, 19, 27}, 2, 2, 0, 3},
      // ... and an odd row length (element loads) about a large mean.
      {{1, 3, 41, 123}, 1, 2, 0, 100},
  };
  for (DType dt : ref::FloatTypes()) {
    for (size_t k = 0; k < specs.size(); ++k) {
      const GroupNormSpec& s = specs[k];
      if (dt != v1::DTYPE_F32 && ref::NumElements(s.dims) > 20000) continue;
      const std::string name =
          absl::StrCat("group_norm/", DTypeName(dt), "_", Shape(s.dims), "_g", s.groups, "_p",
                       s.params, s.eps > 0 ? "_eps" : "", s.offset != 0 ? "_offset" : "");
      auto rng = RngFor(name);
      v1::Attrs a;
      a.mutable_group_norm()->set_groups(s.groups);
      if (s.eps > 0) a.mutable_group_norm()->set_epsilon(s.eps);
      const Dims ch = {s.dims[1]};
      std::vector<HostTensor> inputs;
      inputs.push_back(RandomTensor(rng, dt, s.dims, s.offset - 2, s.offset + 2));
      std::vector<backend::TensorDesc> descs = {Desc(dt, s.dims)};
      for (int p = 0; p < s.params; ++p) {
        inputs.push_back(RandomTensor(rng, dt, ch, p == 0 ? 0.5 : -1, p == 0 ? 1.5 : 1));
        descs.push_back(Desc(dt, ch));
      }
      Case c;
      c.name = name;
      c.spec = ref::Spec(name, v1::OP_GROUP_NORM, a, std::move(descs), {Desc(dt, s.dims)});
      c.inputs = std::move(inputs);
      c.reference = GroupNormReference;
      c.tol = DefaultTolerance(dt);
      if (k == 0) c.in_place_input = 0;  // y over x
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

const FamilyRegistration kSoftmax("softmax", SoftmaxCases);
const FamilyRegistration kNorm("norm", NormCases);
const FamilyRegistration kGroupNorm("group_norm", GroupNormCases);

}  // namespace
}  // namespace kiln::conformance
