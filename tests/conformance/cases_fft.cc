// Conformance cases for Fft / Rfft / Irfft: power-of-two and other lengths
// (the CPU's Bluestein path), n longer (zero padding) and shorter (cut) than
// the axis, inverse, normalize, batches, every float type. The reference is
// the O(n^2) definition in long double.
#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/conformance/reference_util.h"

namespace kiln::conformance {
namespace {

using ref::Shape;

std::vector<HostTensor> FftReference(const backend::KernelSpec& spec, const std::vector<HostTensor>& in) {
  const v1::OpKind op = spec.op;
  const v1::FftAttrs& a = op == v1::OP_FFT ? spec.attrs.fft() : op == v1::OP_RFFT ? spec.attrs.rfft() : spec.attrs.irfft();
  const Dims& xd = in[0].dims();
  const Dims& od = spec.outputs[0].dims;
  const bool cin = op != v1::OP_RFFT, cout = op != v1::OP_IRFFT;
  const int64_t len = xd[cin ? xd.size() - 2 : xd.size() - 1];
  const int64_t out_len = od[cout ? od.size() - 2 : od.size() - 1];
  const int64_t n = op == v1::OP_IRFFT ? out_len : (a.n() ? a.n() : len);
  const int64_t rows = ref::NumElements(xd) / (len * (cin ? 2 : 1));
  const bool inverse = op == v1::OP_IRFFT || (op == v1::OP_FFT && a.inverse());
  const long double sign = inverse ? 1 : -1;
  const long double scale = a.normalize() && n ? 1.0L / n : 1.0L;
  std::vector<HostTensor> out;
  out.push_back(F64(od));
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<long double> re(n, 0), im(n, 0);
    if (op == v1::OP_IRFFT) {
      for (int64_t k = 0; k <= n / 2 && k < len; ++k) {
        re[k] = At(in[0], (r * len + k) * 2);
        im[k] = At(in[0], (r * len + k) * 2 + 1);
      }
      im[0] = 0;
      if (n % 2 == 0 && n > 0) im[n / 2] = 0;
      for (int64_t k = 1; k < (n + 1) / 2; ++k) {
        re[n - k] = re[k];
        im[n - k] = -im[k];
      }
    } else {
      for (int64_t t = 0; t < std::min(n, len); ++t) {
        re[t] = cin ? At(in[0], (r * len + t) * 2) : At(in[0], r * len + t);
        im[t] = cin ? At(in[0], (r * len + t) * 2 + 1) : 0;
      }
    }
    for (int64_t k = 0; k < out_len; ++k) {
      long double sr = 0, si = 0;
      for (int64_t t = 0; t < n; ++t) {
        const long double ang = sign * 2 * std::numbers::pi_v<long double> * ((k * t) % n) / n;
        sr += re[t] * std::cos(ang) - im[t] * std::sin(ang);
        si += re[t] * std::sin(ang) + im[t] * std::cos(ang);
      }
      if (cout) {
        out[0].SetFromDouble((r * out_len + k) * 2, static_cast<double>(sr * scale));
        out[0].SetFromDouble((r * out_len + k) * 2 + 1, static_cast<double>(si * scale));
      } else {
        out[0].SetFromDouble(r * out_len + k, static_cast<double>(sr * scale));
      }
    }
  }
  return out;
}

std::vector<Case> FftCases() {
  std::vector<Case> cases;
  struct S {
    v1::OpKind op;
    Dims x;
    int64_t n;
    bool inverse, normalize;
  };
  const std::vector<S> specs = {
      {v1::OP_FFT, {8, 2}, 0, false, false},       {v1::OP_FFT, {3, 12, 2}, 0, false, false},
      {v1::OP_FFT, {2, 100, 2}, 0, true, true},    {v1::OP_FFT, {1, 2}, 0, false, false},
      {v1::OP_FFT, {4, 10, 2}, 16, false, false},  {v1::OP_FFT, {4, 10, 2}, 7, true, false},
      {v1::OP_FFT, {256, 2}, 0, false, true},      {v1::OP_RFFT, {16}, 0, false, false},
      {v1::OP_RFFT, {3, 33}, 0, false, false},     {v1::OP_RFFT, {2, 7}, 12, false, true},
      {v1::OP_RFFT, {1}, 0, false, false},         {v1::OP_IRFFT, {5, 2}, 0, false, true},
      {v1::OP_IRFFT, {2, 5, 2}, 9, false, true},   {v1::OP_IRFFT, {3, 17, 2}, 0, false, false},
  };
  for (DType dt : ref::FloatTypes()) {
    for (size_t k = 0; k < specs.size(); ++k) {
      const S& s = specs[k];
      const char* opname = s.op == v1::OP_FFT ? "fft" : s.op == v1::OP_RFFT ? "rfft" : "irfft";
      const std::string name = absl::StrCat(opname, "/", DTypeName(dt), "_", k, "_", Shape(s.x), "_n", s.n);
      auto rng = RngFor(name);
      v1::Attrs a;
      v1::FftAttrs* f = s.op == v1::OP_FFT ? a.mutable_fft() : s.op == v1::OP_RFFT ? a.mutable_rfft() : a.mutable_irfft();
      f->set_n(s.n);
      f->set_inverse(s.inverse);
      f->set_normalize(s.normalize);
      Dims od = s.x;
      int64_t points = 0;
      if (s.op == v1::OP_FFT) {
        if (s.n) od[od.size() - 2] = s.n;
        points = s.n ? s.n : s.x[s.x.size() - 2];
      } else if (s.op == v1::OP_RFFT) {
        points = s.n ? s.n : s.x.back();
        od.back() = points / 2 + 1;
        od.push_back(2);
      } else {
        od.pop_back();
        od.back() = s.n ? s.n : 2 * (s.x[s.x.size() - 2] - 1);
        points = od.back();
      }
      Case c;
      c.name = name;
      c.spec = ref::Spec(name, s.op, a, {Desc(dt, s.x)}, {Desc(dt, od)});
      c.inputs.push_back(RandomTensor(rng, dt, s.x));
      c.reference = FftReference;
      c.tol = DefaultTolerance(dt, points);
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

const FamilyRegistration kFft("fft", FftCases);

}  // namespace
}  // namespace kiln::conformance
