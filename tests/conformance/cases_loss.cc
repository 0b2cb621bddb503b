// Conformance cases for SoftmaxCrossEntropy (integer and probability labels,
// every reduction, label smoothing, ignore_index, the out-of-range label
// error) and MeanSquaredError (broadcast target, every reduction).
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/conformance/reference_util.h"

namespace kiln::conformance {
namespace {

using ref::Shape;

std::vector<HostTensor> XentReference(const backend::KernelSpec& spec,
                                      const std::vector<HostTensor>& in) {
  const auto& a = spec.attrs.softmax_cross_entropy();
  const HostTensor& x = in[0];
  const HostTensor& y = in[1];
  const int64_t c = x.dims().back();
  const int64_t n =
      c == 0 ? ref::NumElements(Dims(x.dims().begin(), x.dims().end() - 1)) : x.num_elements() / c;
  const bool int_labels = !IsFloat(y.dtype());
  const long double s = a.label_smoothing();
  std::vector<long double> loss(n, 0);
  long double count = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (int_labels && a.has_ignore_index() && At(y, r) == a.ignore_index()) continue;
    ++count;
    long double mx = -INFINITY, sum = 0;
    for (int64_t k = 0; k < c; ++k) mx = std::max<long double>(mx, At(x, r * c + k));
    for (int64_t k = 0; k < c; ++k) sum += std::exp(At(x, r * c + k) - mx);
    const long double lse = mx + std::log(sum);
    for (int64_t k = 0; k < c; ++k) {
      const long double p = int_labels ? (At(y, r) == k ? 1 : 0) : At(y, r * c + k);
      const long double q = (1 - s) * p + s / c;
      loss[r] += q * (lse - At(x, r * c + k));
    }
  }
  std::vector<HostTensor> out;
  out.push_back(F64(spec.outputs[0].dims));
  if (a.reduction() == v1::REDUCTION_NONE) {
    for (int64_t r = 0; r < n; ++r) out[0].SetFromDouble(r, static_cast<double>(loss[r]));
    return out;
  }
  long double total = 0;
  for (long double l : loss) total += l;
  out[0].SetFromDouble(
      0, static_cast<double>(a.reduction() == v1::REDUCTION_SUM ? total : total / count));
  return out;
}

std::vector<Case> XentCases() {
  std::vector<Case> cases;
  const std::vector<Dims> shapes = {{8, 5}, {3, 4, 7}, {1, 1000}, {0, 5}, {64, 3000}, {5}, {2, 1}};
  const DType label_types[] = {v1::DTYPE_I64, v1::DTYPE_I32, v1::DTYPE_I8, v1::DTYPE_U8,
                               v1::DTYPE_I16};
  int t = 0;
  for (DType dt : ref::FloatTypes()) {
    for (size_t k = 0; k < shapes.size(); ++k) {
      for (bool prob : {false, true}) {
        for (int reduction = v1::REDUCTION_MEAN; reduction <= v1::REDUCTION_NONE;
             ++reduction, ++t) {
          const Dims& dims = shapes[k];
          if (dt != v1::DTYPE_F32 && ref::NumElements(dims) > 10000) continue;
          const double smoothing = t % 3 == 0 ? 0.1 : 0.0;
          const bool ignore = !prob && t % 2 == 1;
          const DType lt = prob ? dt : label_types[t % 5];
          const std::string name =
              absl::StrCat("xent/", DTypeName(dt), "_", Shape(dims), prob ? "_prob" : "_int_",
                           prob ? "" : DTypeName(lt), "_r", reduction, smoothing > 0 ? "_ls" : "",
                           ignore ? "_ignore" : "");
          auto rng = RngFor(name);
          const int64_t c = dims.back();
          const Dims batch(dims.begin(), dims.end() - 1);
          HostTensor logits = RandomTensor(rng, dt, dims, -5, 5);
          HostTensor labels;
          if (prob) {
            labels = RandomTensor(rng, dt, dims, 0, 1);
            for (int64_t r = 0; r * c < labels.num_elements(); ++r) {  // rows sum to 1
              double sum = 0;
              for (int64_t j = 0; j < c; ++j) sum += labels.GetAsDouble(r * c + j);
              for (int64_t j = 0; j < c; ++j)
                labels.SetFromDouble(r * c + j, labels.GetAsDouble(r * c + j) / sum);
            }
          } else {
            labels = RandomTensor(rng, lt, batch, 0, c - 1);
            // ignore_index 3 (in range, so it must be skipped, not looked up).
            if (ignore && labels.num_elements() > 1) labels.SetFromDouble(1, 3);
          }
          v1::Attrs a;
          auto* xa = a.mutable_softmax_cross_entropy();
          xa->set_reduction(static_cast<v1::Reduction>(reduction));
          xa->set_label_smoothing(smoothing);
          if (ignore) xa->set_ignore_index(3);
          Case cs;
          cs.name = name;
          cs.spec = ref::Spec(name, v1::OP_SOFTMAX_CROSS_ENTROPY, a,
                              {Desc(dt, dims), Desc(labels.dtype(), labels.dims())},
                              {Desc(dt, reduction == v1::REDUCTION_NONE ? batch : Dims{})});
          cs.inputs = ref::Tensors{std::move(logits), std::move(labels)};
          cs.reference = XentReference;
          cs.tol = DefaultTolerance(dt);
          cases.push_back(std::move(cs));
        }
      }
    }
  }
  // Every row ignored: the mean of nothing is NaN.
  {
    const std::string name = "xent/all_ignored";
    v1::Attrs a;
    a.mutable_softmax_cross_entropy()->set_ignore_index(-100);
    Case c;
    c.name = name;
    c.spec = ref::Spec(name, v1::OP_SOFTMAX_CROSS_ENTROPY, a,
                       {Desc(v1::DTYPE_F32, {2, 3}), Desc(v1::DTYPE_I64, {2})},
                       {Desc(v1::DTYPE_F32, {})});
    auto rng = RngFor(name);
    c.inputs = ref::Tensors{RandomTensor(rng, v1::DTYPE_F32, {2, 3}),
                            ref::Values(v1::DTYPE_I64, {2}, {-100, -100})};
    c.reference = XentReference;
    c.tol = DefaultTolerance(v1::DTYPE_F32);
    cases.push_back(std::move(c));
  }
  // A label outside [0, C) that is not ignore_index fails, naming the node.
  for (int bad : {5, -1}) {
    const std::string name = absl::StrCat("xent/bad_label_", bad);
    Case c;
    c.name = name;
    c.spec = ref::Spec(name, v1::OP_SOFTMAX_CROSS_ENTROPY, v1::Attrs(),
                       {Desc(v1::DTYPE_F32, {3, 5}), Desc(v1::DTYPE_I32, {3})},
                       {Desc(v1::DTYPE_F32, {})});
    auto rng = RngFor(name);
    c.inputs = ref::Tensors{RandomTensor(rng, v1::DTYPE_F32, {3, 5}),
                            ref::Values(v1::DTYPE_I32, {3}, {0, 4, static_cast<double>(bad)})};
    c.reference = XentReference;
    c.expect_error =
        absl::StrCat(c.spec.label, ": label ", bad, " of row 2 is out of range [0, 5)");
    cases.push_back(std::move(c));
  }
  return cases;
}

std::vector<HostTensor> MseReference(const backend::KernelSpec& spec,
                                     const std::vector<HostTensor>& in) {
  const Dims d = ref::Broadcast(in[0].dims(), in[1].dims());
  const int64_t n = ref::NumElements(d);
  const bool none = spec.attrs.mean_squared_error().reduction() == v1::REDUCTION_NONE;
  std::vector<HostTensor> out;
  out.push_back(F64(none ? d : Dims{}));
  long double total = 0;
  for (int64_t e = 0; e < n; ++e) {
    const long double diff =
        static_cast<long double>(At(in[0], ref::BroadcastIndex(d, in[0].dims(), e))) -
        At(in[1], ref::BroadcastIndex(d, in[1].dims(), e));
    if (none) out[0].SetFromDouble(e, static_cast<double>(diff * diff));
    total += diff * diff;
  }
  if (!none) {
    const bool sum = spec.attrs.mean_squared_error().reduction() == v1::REDUCTION_SUM;
    out[0].SetFromDouble(0, static_cast<double>(sum ? total : total / n));
  }
  return out;
}

std::vector<Case> MseCases() {
  std::vector<Case> cases;
  const std::vector<std::pair<Dims, Dims>> shapes = {
      {{4, 5}, {4, 5}},         {{4, 5}, {5}},     {{3, 1}, {3, 4}}, {{}, {}}, {{0, 3}, {3}},
      {{300, 700}, {300, 700}}, {{7, 33}, {1, 33}}};
  for (DType dt : ref::FloatTypes()) {
    for (const auto& [dp, dtg] : shapes) {
      for (int reduction = v1::REDUCTION_MEAN; reduction <= v1::REDUCTION_NONE; ++reduction) {
        if (dt != v1::DTYPE_F32 && ref::NumElements(dp) > 10000) continue;
        const std::string name =
            absl::StrCat("mse/", DTypeName(dt), "_", Shape(dp), "_", Shape(dtg), "_r", reduction);
        auto rng = RngFor(name);
        const Dims d = ref::Broadcast(dp, dtg);
        v1::Attrs a;
        a.mutable_mean_squared_error()->set_reduction(static_cast<v1::Reduction>(reduction));
        Case c;
        c.name = name;
        c.spec = ref::Spec(name, v1::OP_MEAN_SQUARED_ERROR, a, {Desc(dt, dp), Desc(dt, dtg)},
                           {Desc(dt, reduction == v1::REDUCTION_NONE ? d : Dims{})});
        c.inputs =
            ref::Tensors{RandomTensor(rng, dt, dp, -2, 2), RandomTensor(rng, dt, dtg, -2, 2)};
        c.reference = MseReference;
        c.tol = DefaultTolerance(dt);
        cases.push_back(std::move(c));
      }
    }
  }
  return cases;
}

const FamilyRegistration kXent("softmax_cross_entropy", XentCases);
const FamilyRegistration kMse("mean_squared_error", MseCases);

}  // namespace
}  // namespace kiln::conformance
