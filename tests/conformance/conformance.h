// The conformance suite: every op family contributes cases (a KernelSpec, its
// inputs, and a plain f64 reference), and one test runs every case on every
// device of every registered backend, comparing with the reference under
// per-dtype error budgets. A backend added later runs the same cases by
// registering itself; nothing here names a backend.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "base/host_tensor.h"

namespace kiln::conformance {

// Reference outputs are f64 tensors (ints and bools as exact values) with the
// spec's output dims.
using ReferenceFn =
    std::function<std::vector<HostTensor>(const backend::KernelSpec&, const std::vector<HostTensor>&)>;

struct Tolerance {
  double atol = 1e-5;
  double rtol = 1e-5;
};

struct Case {
  std::string name;  // family/detail, unique
  backend::KernelSpec spec;
  std::vector<HostTensor> inputs;
  ReferenceFn reference;
  Tolerance tol;
  // Optional: expected failure substring (data-dependent errors, e.g. an
  // out-of-range gather index). Empty = must succeed.
  std::string expect_error;
  // Optional: output 0 is written into input `in_place_input`'s buffer (the
  // in-place reuse plan_memory may choose; the shapes' bytes must match).
  // -1 = separate buffers.
  int in_place_input = -1;
  // Optional: inputs the kernel can take packed (backend::PackingKernel) are
  // packed before the launch, as the engine packs constants and params. A
  // kernel that packs nothing runs the case as given.
  bool pack_inputs = false;
  // Optional: a precision trade the spec allows (e.g. spec.allow_int8_activations)
  // that a device claims by listing `traded_feature` in DeviceInfo.features
  // (backend::kFeatureInt8Activations). On such a device the outputs are
  // compared with `traded_reference` (the traded algorithm in f64) under
  // `traded_tol`; every other device must match `reference` as usual. Empty:
  // no trade.
  std::string traded_feature;
  ReferenceFn traded_reference;
  Tolerance traded_tol;
};

using CaseGenerator = std::function<std::vector<Case>()>;

struct FamilyRegistration {
  FamilyRegistration(std::string family, CaseGenerator generator);
};

struct Family {
  std::string name;
  CaseGenerator generator;
};
std::vector<Family> Families();

// Default error budget for an output dtype; `k` is the length of the longest
// accumulation (dot products, reductions) the op performs.
Tolerance DefaultTolerance(DType dtype, int64_t k = 1);

// Deterministic random tensors. Floats are uniform in [lo, hi); ints uniform
// in [lo, hi] (clamped to the type); bools with p = 0.5.
HostTensor RandomTensor(std::mt19937_64& rng, DType dtype, const Dims& dims, double lo = -1.0,
                        double hi = 1.0);
std::mt19937_64 RngFor(const std::string& case_name);

backend::TensorDesc Desc(DType dtype, Dims dims);
// An f64 tensor of `dims`, zero-filled, for references to write into.
HostTensor F64(const Dims& dims);

// Element `i` of a tensor as double, reading any dense dtype.
inline double At(const HostTensor& t, int64_t i) { return t.GetAsDouble(i); }

// Row-major strides of dims.
std::vector<int64_t> Strides(const Dims& dims);

// Runs `c` on `device`. Returns the outputs copied back to the host.
absl::StatusOr<std::vector<HostTensor>> RunOnDevice(backend::Device& device, const Case& c);

// Compares `got` with f64 `want`; returns an empty string on success or a
// description of the worst mismatch.
std::string Compare(const HostTensor& got, const HostTensor& want, const Tolerance& tol);

}  // namespace kiln::conformance
