// Conformance cases for TopK (largest and smallest, any axis, k from 0 to the
// axis size, ties, NaN, i32 and i64 indices) and ScatterAdd (any axis, repeated
// and negative indices, every index type, out-of-range indices refused).
// References are f64 loops; TopK's order is: value descending (ascending for
// smallest), ties by lower index, NaN above +inf.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/conformance/reference_util.h"

namespace kiln::conformance {
namespace {

using ref::Axis;
using ref::Shape;

std::vector<HostTensor> TopKReference(const backend::KernelSpec& spec, const std::vector<HostTensor>& in) {
  const auto& a = spec.attrs.topk();
  const Dims& d = in[0].dims();
  const int64_t axis = Axis(a.has_axis() ? a.axis() : -1, d.size());
  const int64_t n = d[axis], k = a.k();
  const int64_t outer = ref::NumElements(Dims(d.begin(), d.begin() + axis));
  const int64_t inner = ref::NumElements(Dims(d.begin() + axis + 1, d.end()));
  Dims od = d;
  od[axis] = k;
  std::vector<HostTensor> out;
  out.push_back(F64(od));
  out.push_back(F64(od));
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      std::vector<std::pair<double, int64_t>> row;
      for (int64_t r = 0; r < n; ++r) row.emplace_back(At(in[0], (o * n + r) * inner + i), r);
      // A rank for sorting: NaN counts as +infinity plus one.
      auto rank = [](double v) { return std::isnan(v) ? INFINITY : v; };
      std::stable_sort(row.begin(), row.end(), [&](const auto& p, const auto& q) {
        const bool pn = std::isnan(p.first), qn = std::isnan(q.first);
        if (pn != qn) return a.smallest() ? qn : pn;
        if (rank(p.first) != rank(q.first)) {
          return a.smallest() ? rank(p.first) < rank(q.first) : rank(p.first) > rank(q.first);
        }
        return false;  // stable: lower index first
      });
      for (int64_t j = 0; j < k; ++j) {
        out[0].SetFromDouble((o * k + j) * inner + i, row[j].first);
        out[1].SetFromDouble((o * k + j) * inner + i, static_cast<double>(row[j].second));
      }
    }
  }
  return out;
}

std::vector<Case> TopKCases() {
  std::vector<Case> cases;
  struct S {
    Dims dims;
    int64_t axis, k;
  };
  const std::vector<S> specs = {{{10}, -1, 3},  {{4, 17}, 1, 17}, {{6, 5, 3}, 1, 2}, {{300}, 0, 1},
                                {{3, 8}, 0, 0}, {{2, 1000}, -1, 50}, {{5, 1}, 0, 5}};
  int t = 0;
  for (DType dt : {v1::DTYPE_F32, v1::DTYPE_F16, v1::DTYPE_BF16, v1::DTYPE_F64, v1::DTYPE_I32, v1::DTYPE_I8}) {
    for (size_t s = 0; s < specs.size(); ++s, ++t) {
      for (bool smallest : {false, true}) {
        const S& sp = specs[s];
        const DType index = t % 2 ? v1::DTYPE_I32 : v1::DTYPE_I64;
        const std::string name = absl::StrCat("topk/", DTypeName(dt), "_", Shape(sp.dims), "_a", sp.axis, "_k",
                                              sp.k, smallest ? "_smallest" : "_largest", "_", DTypeName(index));
        auto rng = RngFor(name);
        // Few distinct values, so ties are common and their order is tested.
        HostTensor x = RandomTensor(rng, dt, sp.dims, -4, 4);
        if (IsFloat(dt)) {
          for (int64_t i = 0; i < x.num_elements(); ++i) x.SetFromDouble(i, std::round(x.GetAsDouble(i) * 2) / 2);
          if (x.num_elements() > 3) {
            x.SetFromDouble(1, NAN);
            x.SetFromDouble(2, INFINITY);
            x.SetFromDouble(3, -INFINITY);
          }
        }
        v1::Attrs a;
        a.mutable_topk()->set_k(sp.k);
        if (sp.axis != -1) a.mutable_topk()->set_axis(sp.axis);
        a.mutable_topk()->set_smallest(smallest);
        if (index == v1::DTYPE_I32) a.mutable_topk()->set_index_dtype(index);
        Dims od = sp.dims;
        od[Axis(sp.axis, sp.dims.size())] = sp.k;
        Case c;
        c.name = name;
        c.spec = ref::Spec(name, v1::OP_TOPK, a, {Desc(dt, sp.dims)}, {Desc(dt, od), Desc(index, od)});
        c.inputs.push_back(std::move(x));
        c.reference = TopKReference;
        c.tol = {0, 0};  // values are copied, indices exact
        cases.push_back(std::move(c));
      }
    }
  }
  return cases;
}

std::vector<HostTensor> ScatterAddReference(const backend::KernelSpec& spec, const std::vector<HostTensor>& in) {
  const Dims& d = in[0].dims();
  const int64_t axis = Axis(spec.attrs.scatter_add().axis(), d.size());
  const int64_t n = d[axis];
  const int64_t pre = ref::NumElements(Dims(d.begin(), d.begin() + axis));
  const int64_t post = ref::NumElements(Dims(d.begin() + axis + 1, d.end()));
  const int64_t k = in[1].num_elements();
  std::vector<HostTensor> out;
  out.push_back(F64(d));
  std::vector<long double> acc(static_cast<size_t>(in[0].num_elements()));
  for (int64_t e = 0; e < in[0].num_elements(); ++e) acc[e] = At(in[0], e);
  for (int64_t p = 0; p < pre; ++p) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t v = static_cast<int64_t>(At(in[1], j));
      const int64_t r = v < 0 ? v + n : v;
      for (int64_t q = 0; q < post; ++q) acc[(p * n + r) * post + q] += At(in[2], (p * k + j) * post + q);
    }
  }
  const DType dt = spec.inputs[0].dtype;
  for (int64_t e = 0; e < in[0].num_elements(); ++e) {
    out[0].SetFromDouble(e, IsInteger(dt) ? ref::WrapInt(acc[e], dt) : static_cast<double>(acc[e]));
  }
  return out;
}

std::vector<Case> ScatterAddCases() {
  std::vector<Case> cases;
  struct S {
    Dims data, idx;
    int64_t axis;
  };
  const std::vector<S> specs = {{{10, 4}, {6}, 0},     {{3, 9, 2}, {2, 5}, 1}, {{4, 7}, {12}, -1},
                                {{5}, {0}, 0},         {{2, 3, 4}, {3, 1}, 2}, {{1000, 16}, {300}, 0}};
  const DType idx_types[] = {v1::DTYPE_I64, v1::DTYPE_I32, v1::DTYPE_I16, v1::DTYPE_I8, v1::DTYPE_U8};
  int t = 0;
  for (DType dt : {v1::DTYPE_F32, v1::DTYPE_F64, v1::DTYPE_F16, v1::DTYPE_BF16, v1::DTYPE_I32, v1::DTYPE_I64}) {
    for (size_t s = 0; s < specs.size(); ++s, ++t) {
      const S& sp = specs[s];
      const DType it = idx_types[t % 5];
      const std::string name = absl::StrCat("scatter_add/", DTypeName(dt), "_", s, "_", DTypeName(it));
      auto rng = RngFor(name);
      const int64_t axis = Axis(sp.axis, sp.data.size());
      const int64_t n = sp.data[axis];
      Dims ud(sp.data.begin(), sp.data.begin() + axis);
      ud.insert(ud.end(), sp.idx.begin(), sp.idx.end());
      ud.insert(ud.end(), sp.data.begin() + axis + 1, sp.data.end());
      v1::Attrs a;
      a.mutable_scatter_add()->set_axis(sp.axis);
      Case c;
      c.name = name;
      c.spec = ref::Spec(name, v1::OP_SCATTER_ADD, a, {Desc(dt, sp.data), Desc(it, sp.idx), Desc(dt, ud)},
                         {Desc(dt, sp.data)});
      c.inputs.push_back(RandomTensor(rng, dt, sp.data, -2, 2));
      // Indices repeat (the adds accumulate) and count from the end when negative.
      c.inputs.push_back(RandomTensor(rng, it, sp.idx, it == v1::DTYPE_U8 ? 0 : -n, n - 1));
      c.inputs.push_back(RandomTensor(rng, dt, ud, -2, 2));
      c.reference = ScatterAddReference;
      // Up to k updates land on one element: the accumulation's error budget.
      c.tol = DefaultTolerance(dt, ref::NumElements(sp.idx) + 1);
      cases.push_back(std::move(c));
    }
  }
  for (int bad : {10, -11}) {
    const std::string name = absl::StrCat("scatter_add/out_of_range_", bad);
    auto rng = RngFor(name);
    v1::Attrs a;
    Case c;
    c.name = name;
    c.spec = ref::Spec(name, v1::OP_SCATTER_ADD, a,
                       {Desc(v1::DTYPE_F32, {10, 2}), Desc(v1::DTYPE_I64, {3}), Desc(v1::DTYPE_F32, {3, 2})},
                       {Desc(v1::DTYPE_F32, {10, 2})});
    c.inputs.push_back(RandomTensor(rng, v1::DTYPE_F32, {10, 2}));
    c.inputs.push_back(ref::Values(v1::DTYPE_I64, {3}, {0, static_cast<double>(bad), 1}));
    c.inputs.push_back(RandomTensor(rng, v1::DTYPE_F32, {3, 2}));
    c.reference = ScatterAddReference;
    c.expect_error = absl::StrCat(c.spec.label, ": scatter_add index ", bad, " (at position 1) is out of range [-10, 10)");
    cases.push_back(std::move(c));
  }
  return cases;
}

const FamilyRegistration kTopK("topk", TopKCases);
const FamilyRegistration kScatterAdd("scatter_add", ScatterAddCases);

}  // namespace
}  // namespace kiln::conformance
