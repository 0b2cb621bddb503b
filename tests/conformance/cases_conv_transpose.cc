// Conformance cases for ConvTranspose2d: strides, dilations, asymmetric pads,
// output_padding, groups and bias, every float type. The reference scatters
// each input element into the output (the op's definition), in long double;
// the CPU kernel gathers, so the two are independent computations.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/conformance/reference_util.h"

namespace kiln::conformance {
namespace {

using ref::Shape;

struct S {
  Dims x, w;
  int64_t stride, dilation, lo, hi, out_pad, groups;
  bool bias;
};

std::vector<HostTensor> ConvTransposeReference(const backend::KernelSpec& spec, const std::vector<HostTensor>& in) {
  const auto& a = spec.attrs.conv_transpose2d();
  const Dims& xd = in[0].dims();
  const Dims& wd = in[1].dims();
  const Dims& od = spec.outputs[0].dims;
  const int64_t groups = a.groups() == 0 ? 1 : a.groups();
  const int64_t c = xd[1], cpg = c / groups, opg = wd[1];
  const int64_t s0 = a.stride(0), s1 = a.stride(1), d0 = a.dilation(0), d1 = a.dilation(1);
  const int64_t l0 = a.pad_low(0), l1 = a.pad_low(1);
  std::vector<long double> acc(static_cast<size_t>(ref::NumElements(od)), 0);
  for (int64_t n = 0; n < xd[0]; ++n)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t i = 0; i < xd[2]; ++i)
        for (int64_t j = 0; j < xd[3]; ++j) {
          const long double xv = At(in[0], ((n * c + ch) * xd[2] + i) * xd[3] + j);
          const int64_t g = ch / cpg;
          for (int64_t oc = 0; oc < opg; ++oc)
            for (int64_t p = 0; p < wd[2]; ++p)
              for (int64_t q = 0; q < wd[3]; ++q) {
                const int64_t y = i * s0 - l0 + p * d0, x = j * s1 - l1 + q * d1;
                if (y < 0 || y >= od[2] || x < 0 || x >= od[3]) continue;
                const int64_t o = g * opg + oc;
                acc[((n * od[1] + o) * od[2] + y) * od[3] + x] += xv * At(in[1], ((ch * opg + oc) * wd[2] + p) * wd[3] + q);
              }
        }
  std::vector<HostTensor> out;
  out.push_back(F64(od));
  for (int64_t e = 0; e < out[0].num_elements(); ++e) {
    const int64_t o = (e / (od[2] * od[3])) % od[1];
    out[0].SetFromDouble(e, static_cast<double>(acc[e] + (in.size() > 2 ? At(in[2], o) : 0)));
  }
  return out;
}

std::vector<Case> ConvTransposeCases() {
  std::vector<Case> cases;
  const std::vector<S> specs = {
      {{1, 2, 3, 3}, {2, 3, 3, 3}, 1, 1, 0, 0, 0, 1, false},
      {{2, 4, 5, 4}, {4, 2, 3, 3}, 2, 1, 1, 1, 1, 2, true},   // stride 2, output_padding, 2 groups
      {{1, 3, 4, 6}, {3, 5, 2, 3}, 3, 2, 0, 2, 0, 1, true},   // dilation 2, asymmetric pads
      {{1, 1, 1, 1}, {1, 1, 4, 4}, 1, 1, 0, 0, 0, 1, false},  // one pixel in, the kernel out
      {{2, 8, 7, 7}, {8, 4, 4, 4}, 2, 1, 1, 1, 0, 1, true},   // a DCGAN-style up-sampling layer
      // The input gradient of the Fashion CNN's second conv (3x3, pad 1), 4 images.
      {{4, 32, 7, 7}, {32, 16, 3, 3}, 1, 1, 1, 1, 0, 1, false},
      // Output padding at the stride: rows no tap reaches hold the bias
      // (computed in gather form; oneDNN's size rule does not cover it).
      {{1, 2, 3, 3}, {2, 2, 2, 2}, 2, 1, 0, 0, 2, 1, true},
  };
  for (DType dt : ref::FloatTypes()) {
    for (size_t k = 0; k < specs.size(); ++k) {
      const S& s = specs[k];
      const std::string name = absl::StrCat("conv_transpose2d/", DTypeName(dt), "_", k, "_", Shape(s.x));
      auto rng = RngFor(name);
      v1::Attrs a;
      auto* t = a.mutable_conv_transpose2d();
      for (int i = 0; i < 2; ++i) {
        t->add_stride(s.stride);
        t->add_dilation(s.dilation);
        t->add_pad_low(s.lo);
        t->add_pad_high(s.hi);
        t->add_output_padding(s.out_pad);
      }
      t->set_groups(s.groups);
      Dims od = {s.x[0], s.w[1] * s.groups};
      for (int i = 0; i < 2; ++i) {
        od.push_back((s.x[2 + i] - 1) * s.stride - s.lo - s.hi + s.dilation * (s.w[2 + i] - 1) + s.out_pad + 1);
      }
      std::vector<backend::TensorDesc> ins = {Desc(dt, s.x), Desc(dt, s.w)};
      if (s.bias) ins.push_back(Desc(dt, {od[1]}));
      Case c;
      c.name = name;
      c.spec = ref::Spec(name, v1::OP_CONV_TRANSPOSE2D, a, ins, {Desc(dt, od)});
      c.inputs.push_back(RandomTensor(rng, dt, s.x));
      c.inputs.push_back(RandomTensor(rng, dt, s.w));
      if (s.bias) c.inputs.push_back(RandomTensor(rng, dt, {od[1]}));
      c.reference = ConvTransposeReference;
      c.tol = DefaultTolerance(dt, s.x[1] / s.groups * s.w[2] * s.w[3]);
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

const FamilyRegistration kConvTranspose("conv_transpose2d", ConvTransposeCases);

}  // namespace
}  // namespace kiln::conformance
