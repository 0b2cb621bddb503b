// Conformance cases for DenseSolve: batched systems with vector and matrix
// right-hand sides, every float type, sizes 1 to 64, rows that need pivoting,
// and singular or non-finite systems refused naming the batch element. The
// reference is Gaussian elimination with partial pivoting in long double.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/conformance/reference_util.h"

namespace kiln::conformance {
namespace {

using ref::Shape;

std::vector<HostTensor> SolveReference(const backend::KernelSpec& spec, const std::vector<HostTensor>& in) {
  const Dims& ad = in[0].dims();
  const Dims& bd = in[1].dims();
  const int64_t n = ad.back();
  const bool vec = bd.size() == ad.size() - 1;
  const int64_t k = vec ? 1 : bd.back();
  const int64_t batch = ref::NumElements(Dims(ad.begin(), ad.end() - 2));
  std::vector<HostTensor> out;
  out.push_back(F64(bd));
  for (int64_t t = 0; t < batch; ++t) {
    std::vector<long double> m(n * n), r(n * k);
    for (int64_t i = 0; i < n * n; ++i) m[i] = At(in[0], t * n * n + i);
    for (int64_t i = 0; i < n * k; ++i) r[i] = At(in[1], t * n * k + i);
    for (int64_t c = 0; c < n; ++c) {
      int64_t p = c;
      for (int64_t row = c + 1; row < n; ++row) {
        if (std::fabs(m[row * n + c]) > std::fabs(m[p * n + c])) p = row;
      }
      for (int64_t j = 0; j < n; ++j) std::swap(m[c * n + j], m[p * n + j]);
      for (int64_t j = 0; j < k; ++j) std::swap(r[c * k + j], r[p * k + j]);
      for (int64_t row = c + 1; row < n; ++row) {
        const long double f = m[row * n + c] / m[c * n + c];
        for (int64_t j = c; j < n; ++j) m[row * n + j] -= f * m[c * n + j];
        for (int64_t j = 0; j < k; ++j) r[row * k + j] -= f * r[c * k + j];
      }
    }
    for (int64_t row = n - 1; row >= 0; --row) {
      for (int64_t j = 0; j < k; ++j) {
        long double s = r[row * k + j];
        for (int64_t c = row + 1; c < n; ++c) s -= m[row * n + c] * r[c * k + j];
        r[row * k + j] = s / m[row * n + row];
      }
    }
    for (int64_t i = 0; i < n * k; ++i) out[0].SetFromDouble(t * n * k + i, static_cast<double>(r[i]));
  }
  return out;
}

std::vector<Case> DenseSolveCases() {
  std::vector<Case> cases;
  struct S {
    Dims a, b;
  };
  const std::vector<S> specs = {{{1, 1}, {1}},         {{3, 3}, {3}},          {{4, 5, 5}, {4, 5, 2}},
                                {{2, 3, 8, 8}, {2, 3, 8}}, {{64, 64}, {64, 16}}, {{7, 7}, {7, 1}}};
  for (DType dt : ref::FloatTypes()) {
    for (size_t s = 0; s < specs.size(); ++s) {
      const S& sp = specs[s];
      const std::string name = absl::StrCat("dense_solve/", DTypeName(dt), "_", Shape(sp.a), "_", Shape(sp.b));
      auto rng = RngFor(name);
      const int64_t n = sp.a.back();
      // Well conditioned (diagonally dominant), but with a small diagonal in
      // the first row so the elimination must pivot.
      HostTensor a = RandomTensor(rng, dt, sp.a, -1, 1);
      const int64_t batch = a.num_elements() / (n * n);
      for (int64_t t = 0; t < batch; ++t) {
        for (int64_t i = 0; i < n; ++i) {
          const int64_t d = t * n * n + i * n + i;
          a.SetFromDouble(d, i == 0 && n > 1 ? 0.0625 : a.GetAsDouble(d) + (a.GetAsDouble(d) < 0 ? -n : n));
        }
        if (n > 1) a.SetFromDouble(t * n * n + n, static_cast<double>(n) + 1.5);  // row 1 leads column 0
      }
      Case c;
      c.name = name;
      c.spec = ref::Spec(name, v1::OP_DENSE_SOLVE, {}, {Desc(dt, sp.a), Desc(dt, sp.b)}, {Desc(dt, sp.b)});
      c.inputs.push_back(std::move(a));
      c.inputs.push_back(RandomTensor(rng, dt, sp.b, -1, 1));
      c.reference = SolveReference;
      c.tol = DefaultTolerance(dt, 4 * n);
      cases.push_back(std::move(c));
    }
  }
  // A singular second system, and a non-finite one.
  for (int kind = 0; kind < 2; ++kind) {
    const std::string name = kind == 0 ? "dense_solve/singular" : "dense_solve/not_finite";
    Case c;
    c.name = name;
    c.spec = ref::Spec(name, v1::OP_DENSE_SOLVE, {}, {Desc(v1::DTYPE_F32, {2, 2, 2}), Desc(v1::DTYPE_F32, {2, 2})},
                       {Desc(v1::DTYPE_F32, {2, 2})});
    c.inputs.push_back(ref::Values(v1::DTYPE_F32, {2, 2, 2}, {2, 1, 1, 3, 1, 2, 2, 4}));  // [[1,2],[2,4]]
    if (kind == 1) c.inputs.back().SetFromDouble(5, NAN);
    c.inputs.push_back(ref::Values(v1::DTYPE_F32, {2, 2}, {1, 2, 3, 4}));
    c.reference = SolveReference;
    c.expect_error = kind == 0 ? absl::StrCat(c.spec.label, ": dense_solve matrix 1 is singular")
                               : absl::StrCat(c.spec.label, ": dense_solve system 1 has a non-finite value");
    cases.push_back(std::move(c));
  }
  return cases;
}

const FamilyRegistration kDenseSolve("dense_solve", DenseSolveCases);

}  // namespace
}  // namespace kiln::conformance
