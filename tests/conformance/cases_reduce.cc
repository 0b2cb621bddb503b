// Conformance cases for Reduce (every kind, any axes, keepdims), ArgMax and
// Cumsum (exclusive, reverse). References accumulate in long double for
// floats and in wrapping 64-bit arithmetic for integers.
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/conformance/reference_util.h"

namespace kiln::conformance {
namespace {

using ref::Ravel;
using ref::Shape;
using ref::Unravel;

struct ReduceSpec {
  Dims dims;
  std::vector<int64_t> axes;
};

std::vector<HostTensor> ReduceReference(const backend::KernelSpec& spec,
                                        const std::vector<HostTensor>& in) {
  const HostTensor& x = in[0];
  const auto& a = spec.attrs.reduce();
  const Dims& xd = x.dims();
  const int64_t r = static_cast<int64_t>(xd.size());
  std::vector<bool> red(r, a.axes().empty());
  for (int64_t ax : a.axes()) red[ax < 0 ? ax + r : ax] = true;
  Dims kept;  // output dims without keepdims
  for (int64_t k = 0; k < r; ++k) {
    if (!red[k]) kept.push_back(xd[k]);
  }
  const int64_t n_out = ref::NumElements(kept);
  const bool is_float = IsFloat(x.dtype());
  std::vector<long double> fsum(n_out, 0), fprod(n_out, 1), fmax(n_out, -INFINITY),
      fmin(n_out, INFINITY);
  std::vector<uint64_t> isum(n_out, 0), iprod(n_out, 1);
  std::vector<int64_t> count(n_out, 0);
  for (int64_t e = 0; e < x.num_elements(); ++e) {
    const std::vector<int64_t> idx = Unravel(e, xd);
    std::vector<int64_t> o;
    for (int64_t k = 0; k < r; ++k) {
      if (!red[k]) o.push_back(idx[k]);
    }
    const int64_t j = Ravel(o, kept);
    const double v = At(x, e);
    fsum[j] += v;
    fprod[j] *= v;
    if (std::isnan(v) || std::isnan(static_cast<double>(fmax[j]))) {
      fmax[j] = fmin[j] = NAN;
    } else {
      fmax[j] = std::max<long double>(fmax[j], v);
      fmin[j] = std::min<long double>(fmin[j], v);
    }
    if (!is_float) {
      isum[j] += static_cast<uint64_t>(static_cast<int64_t>(v));
      iprod[j] *= static_cast<uint64_t>(static_cast<int64_t>(v));
    }
    ++count[j];
  }
  std::vector<HostTensor> out;
  out.push_back(F64(spec.outputs[0].dims));
  for (int64_t j = 0; j < n_out; ++j) {
    double v = 0;
    switch (a.kind()) {
      case v1::REDUCE_SUM:
        v = is_float ? static_cast<double>(fsum[j])
                     : ref::WrapInt(static_cast<int64_t>(isum[j]), x.dtype());
        break;
      case v1::REDUCE_MEAN:
        v = static_cast<double>(fsum[j] / count[j]);
        break;
      case v1::REDUCE_PROD:
        v = is_float ? static_cast<double>(fprod[j])
                     : ref::WrapInt(static_cast<int64_t>(iprod[j]), x.dtype());
        break;
      case v1::REDUCE_MAX:
        v = static_cast<double>(fmax[j]);
        break;
      case v1::REDUCE_MIN:
        v = static_cast<double>(fmin[j]);
        break;
      default:
        break;
    }
    out[0].SetFromDouble(j, is_float ? ref::RoundTo(v, x.dtype()) : v);  // overflow -> inf
  }
  return out;
}

Case ReduceCase(const std::string& name, int kind, const ReduceSpec& s, bool keepdims,
                HostTensor x) {
  const int64_t r = static_cast<int64_t>(s.dims.size());
  std::vector<bool> red(r, s.axes.empty());
  for (int64_t ax : s.axes) red[ax < 0 ? ax + r : ax] = true;
  Dims out;
  int64_t k_len = 1;
  for (int64_t k = 0; k < r; ++k) {
    if (!red[k])
      out.push_back(s.dims[k]);
    else if (keepdims)
      out.push_back(1);
    if (red[k]) k_len *= s.dims[k];
  }
  v1::Attrs a;
  a.mutable_reduce()->set_kind(static_cast<v1::ReduceKind>(kind));
  for (int64_t ax : s.axes) a.mutable_reduce()->add_axes(ax);
  a.mutable_reduce()->set_keepdims(keepdims);
  const DType dt = x.dtype();
  Case c;
  c.name = name;
  c.spec = ref::Spec(name, v1::OP_REDUCE, a, {Desc(dt, s.dims)}, {Desc(dt, out)});
  c.inputs = ref::Tensors{std::move(x)};
  c.reference = ReduceReference;
  c.tol = IsFloat(dt)
              ? DefaultTolerance(dt, kind == v1::REDUCE_MAX || kind == v1::REDUCE_MIN ? 1 : k_len)
              : Tolerance{0, 0};
  return c;
}

std::vector<Case> ReduceCases() {
  std::vector<Case> cases;
  const std::vector<ReduceSpec> specs = {
      {{2, 3, 4}, {}}, {{2, 3, 4}, {1}},   {{2, 3, 4}, {0, 2}},    {{5, 7}, {-1}},
      {{5, 7}, {0}},   {{1000}, {0}},      {{3, 1, 4}, {1}},       {{0, 3}, {0}},
      {{0, 3}, {1}},   {{}, {}},           {{2, 3, 4, 5}, {1, 3}}, {{6, 1, 33}, {0, 2}},
      {{9, 300}, {1}}, {{33, 17}, {0, 1}},
  };
  for (int kind = v1::REDUCE_SUM; kind <= v1::REDUCE_PROD; ++kind) {
    std::vector<DType> types = ref::FloatTypes();
    if (kind != v1::REDUCE_MEAN)
      types.insert(types.end(), ref::IntTypes().begin(), ref::IntTypes().end());
    for (size_t di = 0; di < types.size(); ++di) {
      const DType dt = types[di];
      for (size_t k = 0; k < specs.size(); ++k) {
        if ((k + di) % 2 == 1 && k > 3) continue;  // a subset per dtype keeps the count sane
        const ReduceSpec& s = specs[k];
        bool empty_axis = false;
        for (int64_t ax : s.axes) empty_axis |= s.dims[ax < 0 ? ax + s.dims.size() : ax] == 0;
        if (empty_axis && (kind == v1::REDUCE_MAX || kind == v1::REDUCE_MIN)) continue;
        const std::string name =
            absl::StrCat("reduce/", kind, "_", DTypeName(dt), "_", Shape(s.dims), "_a",
                         absl::StrJoin(s.axes, ""), (k % 3 == 1) ? "_keep" : "");
        auto rng = RngFor(name);
        double lo = -1, hi = 1;
        if (kind == v1::REDUCE_PROD) lo = 0.95, hi = 1.05;
        if (!IsFloat(dt))
          std::tie(lo, hi) =
              kind == v1::REDUCE_PROD ? std::pair<double, double>{-3, 3} : ref::IntRange(dt);
        if (dt == v1::DTYPE_U8 && kind == v1::REDUCE_PROD) lo = 0;
        cases.push_back(
            ReduceCase(name, kind, s, k % 3 == 1, RandomTensor(rng, dt, s.dims, lo, hi)));
      }
    }
  }
  // Large: many rows, a few columns with long reductions (split over R), and
  // one long row (a full reduction in parallel).
  const std::vector<ReduceSpec> big = {
      {{256, 1024}, {1}}, {{4096, 64}, {0}}, {{1, 300000}, {}}, {{64, 2, 512}, {0, 2}}};
  for (const ReduceSpec& s : big) {
    for (int kind : {v1::REDUCE_SUM, v1::REDUCE_MAX, v1::REDUCE_MEAN}) {
      const std::string name =
          absl::StrCat("reduce/large_", kind, "_", Shape(s.dims), "_a", absl::StrJoin(s.axes, ""));
      auto rng = RngFor(name);
      cases.push_back(ReduceCase(name, kind, s, false, RandomTensor(rng, v1::DTYPE_F32, s.dims)));
    }
  }
  // NaN propagates through max/min and sums; inf through sums.
  for (int kind : {v1::REDUCE_SUM, v1::REDUCE_MAX, v1::REDUCE_MIN, v1::REDUCE_PROD}) {
    const std::string name = absl::StrCat("reduce/special_", kind);
    cases.push_back(ReduceCase(
        name, kind, {{3, 4}, {1}}, false,
        ref::Values(v1::DTYPE_F32, {3, 4}, {1, NAN, 2, 3, INFINITY, 1, 2, -5, -1, 0, -0.0, 7})));
  }
  return cases;
}

std::vector<Case> ArgMaxCases() {
  std::vector<Case> cases;
  const std::vector<std::pair<Dims, int64_t>> specs = {
      {{5, 7}, 1},  {{5, 7}, 0}, {{2, 3, 4}, 1}, {{1000}, 0},
      {{3, 1}, -1}, {{0, 4}, 1}, {{4, 300}, -1}, {{2, 33, 9}, 2}};
  std::vector<DType> types = ref::FloatTypes();
  types.insert(types.end(), ref::IntTypes().begin(), ref::IntTypes().end());
  int t = 0;
  for (DType dt : types) {
    for (const auto& [dims, axis_attr] : specs) {
      const bool keep = t % 2 == 0;
      const DType index = t++ % 3 == 0 ? v1::DTYPE_I32 : v1::DTYPE_I64;
      const std::string name = absl::StrCat("argmax/", DTypeName(dt), "_", Shape(dims), "_a",
                                            axis_attr, keep ? "_keep" : "");
      auto rng = RngFor(name);
      // Small integers: ties, where the first index must win.
      HostTensor x = RandomTensor(rng, dt, dims, dt == v1::DTYPE_U8 ? 0 : -4, 4);
      if (IsFloat(dt)) {
        for (int64_t i = 0; i < x.num_elements(); ++i)
          x.SetFromDouble(i, std::round(x.GetAsDouble(i) * 2));
      }
      const int64_t axis =
          axis_attr < 0 ? axis_attr + static_cast<int64_t>(dims.size()) : axis_attr;
      Dims out;
      for (int64_t k = 0; k < static_cast<int64_t>(dims.size()); ++k) {
        if (k != axis)
          out.push_back(dims[k]);
        else if (keep)
          out.push_back(1);
      }
      v1::Attrs a;
      a.mutable_argmax()->set_axis(axis_attr);
      a.mutable_argmax()->set_keepdims(keep);
      a.mutable_argmax()->set_index_dtype(index);
      Case c;
      c.name = name;
      c.spec = ref::Spec(name, v1::OP_ARGMAX, a, {Desc(dt, dims)}, {Desc(index, out)});
      c.inputs = ref::Tensors{std::move(x)};
      c.reference = [dims = dims, axis](const backend::KernelSpec& spec,
                                 const std::vector<HostTensor>& in) {
        std::vector<HostTensor> r;
        r.push_back(F64(spec.outputs[0].dims));
        const int64_t n = dims[axis];
        Dims rest = dims;
        rest[axis] = 1;
        for (int64_t j = 0; j < ref::NumElements(rest); ++j) {
          std::vector<int64_t> idx = Unravel(j, rest);
          int64_t best = 0;
          double bv = NAN;
          for (int64_t i = 0; i < n; ++i) {
            idx[axis] = i;
            const double v = At(in[0], Ravel(idx, dims));
            if (i == 0 || (!std::isnan(bv) && (v > bv || std::isnan(v)))) bv = v, best = i;
          }
          r[0].SetFromDouble(j, best);
        }
        return r;
      };
      c.tol = {0, 0};
      cases.push_back(std::move(c));
    }
  }
  // The first NaN wins.
  {
    const std::string name = "argmax/nan";
    v1::Attrs a;
    a.mutable_argmax()->set_axis(1);
    Case c;
    c.name = name;
    c.spec = ref::Spec(name, v1::OP_ARGMAX, a, {Desc(v1::DTYPE_F32, {3, 4})},
                       {Desc(v1::DTYPE_I64, {3})});
    c.inputs = ref::Tensors{
        ref::Values(v1::DTYPE_F32, {3, 4}, {1, NAN, 5, NAN, 9, 2, 9, 1, -1, -2, -3, NAN})};
    c.reference = [](const backend::KernelSpec&, const std::vector<HostTensor>&) {
      std::vector<HostTensor> r;
      r.push_back(ref::Values(v1::DTYPE_F64, {3}, {1, 0, 3}));
      return r;
    };
    c.tol = {0, 0};
    cases.push_back(std::move(c));
  }
  return cases;
}

std::vector<Case> CumsumCases() {
  std::vector<Case> cases;
  const std::vector<std::pair<Dims, int64_t>> specs = {{{7}, 0},       {{5, 9}, 1}, {{5, 9}, 0},
                                                       {{2, 3, 4}, 1}, {{1000}, 0}, {{0, 3}, 1},
                                                       {{3, 600}, 0},  {{4, 1}, -1}};
  const std::vector<DType> types = {v1::DTYPE_F32, v1::DTYPE_F16, v1::DTYPE_BF16, v1::DTYPE_F64,
                                    v1::DTYPE_I8,  v1::DTYPE_U8,  v1::DTYPE_I32,  v1::DTYPE_I64};
  int t = 0;
  for (DType dt : types) {
    for (const auto& [dims, axis_attr] : specs) {
      const bool exclusive = t % 2 == 1, reverse = (t / 2) % 2 == 1;
      ++t;
      const std::string name =
          absl::StrCat("cumsum/", DTypeName(dt), "_", Shape(dims), "_a", axis_attr,
                       exclusive ? "_ex" : "", reverse ? "_rev" : "");
      auto rng = RngFor(name);
      const auto [lo, hi] = IsFloat(dt) ? std::pair<double, double>{-1, 1} : ref::IntRange(dt);
      const int64_t axis =
          axis_attr < 0 ? axis_attr + static_cast<int64_t>(dims.size()) : axis_attr;
      v1::Attrs a;
      a.mutable_cumsum()->set_axis(axis_attr);
      a.mutable_cumsum()->set_exclusive(exclusive);
      a.mutable_cumsum()->set_reverse(reverse);
      Case c;
      c.name = name;
      c.spec = ref::Spec(name, v1::OP_CUMSUM, a, {Desc(dt, dims)}, {Desc(dt, dims)});
      c.inputs = ref::Tensors{RandomTensor(rng, dt, dims, lo, hi)};
      c.reference = [dims = dims, axis, exclusive, reverse](const backend::KernelSpec&,
                                                     const std::vector<HostTensor>& in) {
        std::vector<HostTensor> r;
        r.push_back(F64(dims));
        const int64_t n = dims[axis];
        Dims rest = dims;
        rest[axis] = 1;
        const bool is_float = IsFloat(in[0].dtype());
        for (int64_t j = 0; j < ref::NumElements(rest) && n > 0; ++j) {
          std::vector<int64_t> idx = Unravel(j, rest);
          long double fs = 0;
          uint64_t is = 0;
          for (int64_t step = 0; step < n; ++step) {
            idx[axis] = reverse ? n - 1 - step : step;
            const int64_t e = Ravel(idx, dims);
            const double v = At(in[0], e);
            auto value = [&] {
              return is_float ? static_cast<double>(fs)
                              : ref::WrapInt(static_cast<int64_t>(is), in[0].dtype());
            };
            if (exclusive) r[0].SetFromDouble(e, value());
            fs += v;
            if (!is_float) is += static_cast<uint64_t>(static_cast<int64_t>(v));
            if (!exclusive) r[0].SetFromDouble(e, value());
          }
        }
        return r;
      };
      c.tol = IsFloat(dt) ? DefaultTolerance(dt, dims.empty() ? 1 : dims[axis]) : Tolerance{0, 0};
      if (t % 3 == 0) c.in_place_input = 0;
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

const FamilyRegistration kReduce("reduce", ReduceCases);
const FamilyRegistration kArgMax("argmax", ArgMaxCases);
const FamilyRegistration kCumsum("cumsum", CumsumCases);

}  // namespace
}  // namespace kiln::conformance
