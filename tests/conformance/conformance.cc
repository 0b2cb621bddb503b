#include "tests/conformance/conformance.h"

#include <cmath>
#include <mutex>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "backends/packing.h"

namespace kiln::conformance {
namespace {

std::vector<Family>& Registry() {
  static auto* families = new std::vector<Family>();
  return *families;
}

}  // namespace

FamilyRegistration::FamilyRegistration(std::string family, CaseGenerator generator) {
  Registry().push_back({std::move(family), std::move(generator)});
}

std::vector<Family> Families() { return Registry(); }

Tolerance DefaultTolerance(DType dtype, int64_t k) {
  const double scale = std::sqrt(static_cast<double>(std::max<int64_t>(k, 1)));
  switch (dtype) {
    case v1::DTYPE_F64: return {1e-10 * scale, 1e-10 * scale};
    case v1::DTYPE_F32: return {2e-6 * scale, 2e-6 * scale};
    case v1::DTYPE_F16: return {2e-3 * scale, 2e-3 * scale};
    case v1::DTYPE_BF16: return {1.6e-2 * scale, 1.6e-2 * scale};
    default: return {0, 0};
  }
}

std::mt19937_64 RngFor(const std::string& case_name) {
  return std::mt19937_64(absl::Hash<std::string>()(case_name) ^ 0x6b696c6eULL);
}

HostTensor RandomTensor(std::mt19937_64& rng, DType dtype, const Dims& dims, double lo, double hi) {
  HostTensor t = std::move(HostTensor::Create(dtype, dims)).value();
  if (IsFloat(dtype)) {
    std::uniform_real_distribution<double> u(lo, hi);
    for (int64_t i = 0; i < t.num_elements(); ++i) t.SetFromDouble(i, u(rng));
  } else if (dtype == v1::DTYPE_BOOL) {
    std::bernoulli_distribution b(0.5);
    for (int64_t i = 0; i < t.num_elements(); ++i) t.SetFromDouble(i, b(rng) ? 1 : 0);
  } else {
    double tlo = lo, thi = hi;
    if (dtype == v1::DTYPE_U8) tlo = std::max(tlo, 0.0), thi = std::min(thi, 255.0);
    if (dtype == v1::DTYPE_I8) tlo = std::max(tlo, -128.0), thi = std::min(thi, 127.0);
    std::uniform_int_distribution<int64_t> u(static_cast<int64_t>(std::ceil(tlo)),
                                             static_cast<int64_t>(std::floor(thi)));
    for (int64_t i = 0; i < t.num_elements(); ++i) t.SetFromDouble(i, static_cast<double>(u(rng)));
  }
  return t;
}

backend::TensorDesc Desc(DType dtype, Dims dims) { return {dtype, std::move(dims)}; }

HostTensor F64(const Dims& dims) { return std::move(HostTensor::Create(v1::DTYPE_F64, dims)).value(); }

std::vector<int64_t> Strides(const Dims& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (int64_t i = static_cast<int64_t>(dims.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * dims[i + 1];
  return s;
}

absl::StatusOr<std::vector<HostTensor>> RunOnDevice(backend::Device& device, const Case& c) {
  backend::PrepareContext ctx;
  auto kernel = device.PrepareKernel(c.spec, ctx);
  if (!kernel.ok()) return kernel.status();
  auto stream = device.CreateStream();
  if (!stream.ok()) return stream.status();
  std::vector<std::unique_ptr<backend::Buffer>> buffers;
  std::vector<backend::BufferView> ins, outs;
  for (const HostTensor& t : c.inputs) {
    auto buf = device.Allocate(t.num_bytes());
    if (!buf.ok()) return buf.status();
    backend::BufferView v{buf->get(), 0, t.num_bytes()};
    if (t.num_bytes() > 0) {
      if (auto s = device.CopyToDevice(**stream, t.data(), v); !s.ok()) return s;
    }
    ins.push_back(v);
    buffers.push_back(std::move(buf).value());
  }
  for (const backend::TensorDesc& d : c.spec.outputs) {
    if (outs.empty() && c.in_place_input >= 0) {
      if (c.in_place_input >= static_cast<int>(ins.size()) ||
          ins[c.in_place_input].bytes != d.num_bytes()) {
        return absl::InvalidArgumentError("in_place_input does not fit output 0");
      }
      outs.push_back(ins[c.in_place_input]);
      continue;
    }
    auto buf = device.Allocate(d.num_bytes());
    if (!buf.ok()) return buf.status();
    outs.push_back(backend::BufferView{buf->get(), 0, d.num_bytes()});
    buffers.push_back(std::move(buf).value());
  }
  std::vector<std::shared_ptr<const backend::PackedOperand>> packed;
  auto* packing = dynamic_cast<backend::PackingKernel*>(kernel->get());
  if (c.pack_inputs && packing != nullptr) {
    if (auto s = (*stream)->Synchronize(); !s.ok()) return s;  // Pack reads the uploaded bytes
    for (int i : packing->packable_inputs()) {
      auto p = packing->Pack(i, ins.at(i));
      if (!p.ok()) return p.status();
      packing->UsePacked(i, p->get());
      packed.push_back(std::move(p).value());
    }
  }
  if (auto s = (*kernel)->Launch(**stream, ins, outs); !s.ok()) return s;
  if (auto s = (*stream)->Synchronize(); !s.ok()) return s;
  std::vector<HostTensor> results;
  for (size_t i = 0; i < outs.size(); ++i) {
    const auto& d = c.spec.outputs[i];
    HostTensor t = std::move(HostTensor::Create(d.dtype, d.dims)).value();
    if (t.num_bytes() > 0) {
      if (auto s = device.CopyToHost(**stream, outs[i], t.data()); !s.ok()) return s;
    }
    results.push_back(std::move(t));
  }
  if (auto s = (*stream)->Synchronize(); !s.ok()) return s;
  return results;
}

std::string Compare(const HostTensor& got, const HostTensor& want, const Tolerance& tol) {
  if (got.dims() != want.dims()) {
    return absl::StrCat("shape ", DimsToString(got.dims()), " != reference ",
                        DimsToString(want.dims()));
  }
  double worst_excess = 0;
  int64_t worst = -1, bad = 0;
  for (int64_t i = 0; i < got.num_elements(); ++i) {
    const double g = got.GetAsDouble(i), w = want.GetAsDouble(i);
    if (std::isnan(w) && std::isnan(g)) continue;
    if (std::isinf(w) && g == w) continue;
    const double err = std::fabs(g - w);
    const double allowed = tol.atol + tol.rtol * std::fabs(w);
    if (!(err <= allowed)) {
      ++bad;
      const double excess = std::isnan(err) ? INFINITY : err - allowed;
      if (worst < 0 || excess > worst_excess) worst_excess = excess, worst = i;
    }
  }
  if (bad == 0) return "";
  return absl::StrCat(bad, " of ", got.num_elements(), " elements off; worst at ", worst, ": got ",
                      got.GetAsDouble(worst), ", want ", want.GetAsDouble(worst), " (atol ",
                      tol.atol, ", rtol ", tol.rtol, ")");
}

}  // namespace kiln::conformance
