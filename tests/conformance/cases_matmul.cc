// Conformance cases for MatMul and FusedMatMul: NumPy-broadcast batches,
// rank-1 promotion, transposes, size-0 and size-1 dims, every fusable
// activation, bias and residual; f32, f16 and bf16 storage. References are
// plain f64 loops over the stored (already rounded) inputs.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/conformance/conformance.h"

namespace kiln::conformance {
namespace {

using backend::KernelSpec;

std::vector<double> ToDoubles(const HostTensor& t) {
  std::vector<double> v(t.num_elements());
  for (int64_t i = 0; i < t.num_elements(); ++i) v[i] = At(t, i);
  return v;
}

double Activate(v1::UnaryKind kind, double x) {
  switch (kind) {
    case v1::UNARY_RELU: return x > 0 ? x : 0;
    case v1::UNARY_GELU: return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case v1::UNARY_GELU_TANH:
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case v1::UNARY_SILU: return x / (1 + std::exp(-x));
    case v1::UNARY_SIGMOID: return 1 / (1 + std::exp(-x));
    case v1::UNARY_TANH: return std::tanh(x);
    case v1::UNARY_EXP: return std::exp(x);
    case v1::UNARY_LOG: return std::log(x);
    case v1::UNARY_SQRT: return std::sqrt(x);
    case v1::UNARY_RSQRT: return 1 / std::sqrt(x);
    case v1::UNARY_NEG: return -x;
    case v1::UNARY_ABS: return std::fabs(x);
    case v1::UNARY_RECIPROCAL: return 1 / x;
    case v1::UNARY_SOFTPLUS: return std::log1p(std::exp(x));
    default: return x;
  }
}

// numpy.matmul over f64 copies, then act(. + bias) + residual.
std::vector<HostTensor> MatMulReference(const KernelSpec& spec, const std::vector<HostTensor>& in) {
  bool ta, tb, has_bias = false, has_residual = false;
  v1::UnaryKind act = v1::UNARY_KIND_UNSPECIFIED;
  if (spec.op == v1::OP_MATMUL) {
    ta = spec.attrs.matmul().transpose_a();
    tb = spec.attrs.matmul().transpose_b();
  } else {
    const auto& f = spec.attrs.fused_matmul();
    ta = f.transpose_a();
    tb = f.transpose_b();
    has_bias = f.has_bias();
    has_residual = f.has_residual();
    act = f.activation();
  }
  Dims a = in[0].dims(), b = in[1].dims();
  if (a.size() == 1) a.insert(a.begin(), 1);
  if (b.size() == 1) b.push_back(1);
  const size_t ra = a.size(), rb = b.size();
  const int64_t m = ta ? a[ra - 1] : a[ra - 2], k = ta ? a[ra - 2] : a[ra - 1];
  const int64_t n = tb ? b[rb - 2] : b[rb - 1];
  const size_t r = std::max(ra, rb) - 2;
  Dims ab(r, 1), bb(r, 1), cb(r, 1);
  std::copy(a.begin(), a.end() - 2, ab.begin() + (r - (ra - 2)));
  std::copy(b.begin(), b.end() - 2, bb.begin() + (r - (rb - 2)));
  int64_t batches = 1;
  for (size_t i = 0; i < r; ++i) batches *= (cb[i] = ab[i] == 1 ? bb[i] : ab[i]);
  const std::vector<double> av = ToDoubles(in[0]), bv = ToDoubles(in[1]);
  HostTensor out = F64(spec.outputs[0].dims);
  std::vector<int64_t> idx(r);
  for (int64_t bi = 0; bi < batches; ++bi) {
    int64_t rem = bi, ao = 0, bo = 0, as = 1, bs = 1;
    for (size_t d = r; d-- > 0;) {
      idx[d] = rem % cb[d];
      rem /= cb[d];
      ao += (ab[d] == 1 ? 0 : idx[d]) * as;
      bo += (bb[d] == 1 ? 0 : idx[d]) * bs;
      as *= ab[d];
      bs *= bb[d];
    }
    ao *= m * k;
    bo *= k * n;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double x = av[ao + (ta ? p * m + i : i * k + p)];
          const double y = bv[bo + (tb ? j * k + p : p * n + j)];
          sum += x * y;
        }
        out.SetFromDouble((bi * m + i) * n + j, sum);
      }
    }
  }
  int next = 2;
  const HostTensor* bias = has_bias ? &in[next++] : nullptr;
  const HostTensor* res = has_residual ? &in[next] : nullptr;
  for (int64_t i = 0; i < out.num_elements(); ++i) {
    double v = out.GetAsDouble(i);
    // The bias runs along the result's last dim (M when b is a vector).
    if (bias != nullptr) v += At(*bias, i % bias->num_elements());
    v = Activate(act, v);
    if (res != nullptr) v += At(*res, i);
    out.SetFromDouble(i, v);
  }
  std::vector<HostTensor> result;
  result.push_back(std::move(out));
  return result;
}

// The result dims numpy.matmul gives, as the shape rules do.
Dims ResultDims(Dims a, Dims b, bool ta, bool tb) {
  const bool a_vec = a.size() == 1, b_vec = b.size() == 1;
  if (a_vec) a.insert(a.begin(), 1);
  if (b_vec) b.push_back(1);
  const size_t ra = a.size(), rb = b.size(), r = std::max(ra, rb) - 2;
  Dims ab(r, 1), bb(r, 1), out(r);
  std::copy(a.begin(), a.end() - 2, ab.begin() + (r - (ra - 2)));
  std::copy(b.begin(), b.end() - 2, bb.begin() + (r - (rb - 2)));
  for (size_t i = 0; i < r; ++i) out[i] = ab[i] == 1 ? bb[i] : ab[i];
  if (!a_vec) out.push_back(ta ? a[ra - 1] : a[ra - 2]);
  if (!b_vec) out.push_back(tb ? b[rb - 2] : b[rb - 1]);
  return out;
}

struct Shape {
  Dims a, b;
  bool ta = false, tb = false;
};

int64_t ContractionLength(const Shape& s) {
  if (s.a.size() == 1) return s.a[0];
  return s.ta ? s.a[s.a.size() - 2] : s.a.back();
}

std::string ShapeName(const Shape& s, DType dtype) {
  return absl::StrCat(DTypeName(dtype), "_", absl::StrJoin(s.a, "x"), s.ta ? "T" : "", "_@_",
                      absl::StrJoin(s.b, "x"), s.tb ? "T" : "");
}

struct Epilogue {
  bool bias = false, residual = false;
  v1::UnaryKind act = v1::UNARY_KIND_UNSPECIFIED;
};

Case MakeCase(const std::string& family, const Shape& s, DType dtype, const Epilogue* epi,
              double lo = -1, double hi = 1) {
  Case c;
  const Dims out = ResultDims(s.a, s.b, s.ta, s.tb);
  c.name = absl::StrCat(family, "/", ShapeName(s, dtype));
  if (epi != nullptr) {
    absl::StrAppend(&c.name, epi->bias ? "+bias" : "", "+", v1::UnaryKind_Name(epi->act),
                    epi->residual ? "+residual" : "");
  }
  std::mt19937_64 rng = RngFor(c.name);
  c.spec.name = c.name;
  c.spec.label = absl::StrCat("case ", c.name);
  c.spec.inputs = {Desc(dtype, s.a), Desc(dtype, s.b)};
  c.spec.outputs = {Desc(dtype, out)};
  c.inputs.push_back(RandomTensor(rng, dtype, s.a, lo, hi));
  c.inputs.push_back(RandomTensor(rng, dtype, s.b, lo, hi));
  if (epi == nullptr) {
    c.spec.op = v1::OP_MATMUL;
    c.spec.attrs.mutable_matmul()->set_transpose_a(s.ta);
    c.spec.attrs.mutable_matmul()->set_transpose_b(s.tb);
  } else {
    c.spec.op = v1::OP_FUSED_MATMUL;
    auto* f = c.spec.attrs.mutable_fused_matmul();
    f->set_transpose_a(s.ta);
    f->set_transpose_b(s.tb);
    f->set_has_bias(epi->bias);
    f->set_has_residual(epi->residual);
    f->set_activation(epi->act);
    if (epi->bias) {
      const Dims bias = {out.empty() ? 1 : out.back()};
      c.spec.inputs.push_back(Desc(dtype, bias));
      c.inputs.push_back(RandomTensor(rng, dtype, bias, lo, hi));
    }
    if (epi->residual) {
      c.spec.inputs.push_back(Desc(dtype, out));
      c.inputs.push_back(RandomTensor(rng, dtype, out, lo, hi));
    }
  }
  c.reference = MatMulReference;
  // Inputs in [-1, 1): sums grow like sqrt(K), so the budget does too.
  c.tol = DefaultTolerance(dtype, ContractionLength(s) + 1);
  return c;
}

std::vector<Shape> PlainShapes() {
  return {
      {{1, 1}, {1, 1}},
      {{3, 17}, {17, 65}},
      {{65, 130}, {130, 3}},
      {{17, 1}, {1, 17}},
      {{3, 0}, {0, 5}},  // K = 0: zeros
      {{0, 4}, {4, 5}},  // M = 0
      {{4, 5}, {5, 0}},  // N = 0
      {{17}, {17, 5}},   // vector @ matrix
      {{5, 17}, {17}},   // matrix @ vector
      {{65}, {65}},      // dot product: a scalar
      {{0}, {0}},        // empty dot product: 0
      {{130, 65}, {65, 130}},
      {{2, 3, 17, 5}, {2, 3, 5, 7}},
      {{4, 17, 33}, {33, 9}},        // x @ W: folded into one 2-D product
      {{17, 33}, {4, 33, 9}},        // a broadcast over b's batch
      {{2, 1, 5, 7}, {1, 3, 7, 4}},  // both broadcast
      {{2, 3, 4, 5}, {5, 6}},
      {{3, 1, 4, 5}, {2, 5, 6}},
      {{5}, {3, 5, 2}},
      {{3, 4, 5}, {5}},
      {{0, 3, 4}, {4, 5}},     // empty batch
      {{2, 1, 3}, {2, 3, 1}},  // size-1 matrix dims with a batch
      {{2, 64, 256}, {256, 128}},
      {{3, 1, 2, 17, 3}, {1, 4, 1, 3, 17}},  // rank 5, broadcast in three places
  };
}

std::vector<Shape> TransposedShapes() {
  return {
      {{17, 3}, {17, 65}, true, false},
      {{3, 17}, {65, 17}, false, true},
      {{17, 3}, {65, 17}, true, true},
      {{130, 65}, {3, 130}, true, true},
      {{0, 3}, {5, 0}, true, true},         // K = 0 transposed
      {{4, 33, 17}, {33, 9}, true, false},  // transposed a: not folded
      {{4, 17, 33}, {9, 33}, false, true},  // folded, b transposed
      {{2, 1, 7, 5}, {1, 3, 4, 7}, true, true},
      {{1, 17}, {1, 5}, true, false},  // K = 1, transposed
  };
}

// Random ranks, broadcast patterns, transposes and odd sizes (deterministic).
std::vector<Shape> RandomShapes(const std::string& seed, int count) {
  std::mt19937_64 rng = RngFor(seed);
  auto pick = [&rng](std::vector<int64_t> from) { return from[rng() % from.size()]; };
  std::vector<Shape> shapes;
  while (static_cast<int>(shapes.size()) < count) {
    Shape s;
    const int64_t m = pick({1, 2, 3, 17, 33, 65}), n = pick({1, 3, 5, 17, 65, 130});
    const int64_t k = pick({1, 3, 17, 65, 130});
    const int ra = static_cast<int>(pick({1, 2, 2, 3, 4})),
              rb = static_cast<int>(pick({1, 2, 2, 3, 4}));
    s.ta = ra > 1 && rng() % 2;
    s.tb = rb > 1 && rng() % 2;
    const int r = std::max(ra, rb) - 2;
    Dims batch(std::max(r, 0));
    for (int64_t& d : batch) d = pick({1, 2, 3});
    auto operand_batch = [&](int rank) {
      Dims b;
      for (int i = r - (rank - 2); i < r; ++i) b.push_back(rng() % 3 == 0 ? 1 : batch[i]);
      return b;
    };
    if (ra == 1) {
      s.a = {k};
    } else {
      s.a = operand_batch(ra);
      s.a.push_back(s.ta ? k : m);
      s.a.push_back(s.ta ? m : k);
    }
    if (rb == 1) {
      s.b = {k};
    } else {
      s.b = operand_batch(rb);
      s.b.push_back(s.tb ? n : k);
      s.b.push_back(s.tb ? k : n);
    }
    shapes.push_back(s);
  }
  return shapes;
}

// f16 with M, N and K multiples of 16: the Vulkan cooperative-matrix kernel
// where the device has one. Small products take its small tiles; the
// 2000 x 2096 ones its largest, with partial tiles on both edges and a K
// that is not a whole number of stages.
std::vector<Shape> CoopShapes() {
  return {
      {{144, 48}, {48, 80}},
      {{2, 3, 32, 64}, {2, 3, 64, 48}},  // batched
      {{2, 1, 64, 32}, {1, 3, 32, 16}},  // both broadcast
      {{64, 48}, {64, 96}, true, false},
      {{48, 64}, {96, 64}, false, true},
      {{3, 64, 48}, {3, 80, 64}, true, true},
      {{2000, 48}, {48, 2096}},
      {{48, 2000}, {2096, 48}, true, true},
  };
}

std::vector<Case> MatMulCases() {
  std::vector<Case> cases;
  for (const Shape& s : PlainShapes())
    cases.push_back(MakeCase("matmul", s, v1::DTYPE_F32, nullptr));
  for (const Shape& s : TransposedShapes())
    cases.push_back(MakeCase("matmul", s, v1::DTYPE_F32, nullptr));
  int i = 0;
  for (const Shape& s : RandomShapes("matmul_random_f32", 24)) {
    cases.push_back(MakeCase(absl::StrCat("matmul/random", i++), s, v1::DTYPE_F32, nullptr));
  }
  for (DType dtype : {v1::DTYPE_F16, v1::DTYPE_BF16}) {
    for (const Shape& s : RandomShapes(absl::StrCat("matmul_random_", DTypeName(dtype)), 6)) {
      cases.push_back(MakeCase(absl::StrCat("matmul/random", i++), s, dtype, nullptr));
    }
  }
  // A rank-1 b with transpose_b is consistent only when it has length 1.
  cases.push_back(MakeCase("matmul", {{5, 1}, {1}, false, true}, v1::DTYPE_F32, nullptr));
  const std::vector<Shape> low = {
      {{3, 17}, {17, 65}},    {{65, 130}, {130, 3}, false, false}, {{17, 3}, {65, 17}, true, true},
      {{4, 17, 33}, {33, 9}}, {{2, 1, 5, 7}, {1, 3, 7, 4}},        {{3, 0}, {0, 5}},
      {{17}, {17, 5}},        {{2, 64, 256}, {256, 128}},
  };
  for (DType dtype : {v1::DTYPE_F16, v1::DTYPE_BF16}) {
    for (const Shape& s : low) cases.push_back(MakeCase("matmul", s, dtype, nullptr));
  }
  for (const Shape& s : CoopShapes())
    cases.push_back(MakeCase("matmul", s, v1::DTYPE_F16, nullptr));
  return cases;
}

std::vector<Case> FusedMatMulCases() {
  std::vector<Case> cases;
  const std::vector<v1::UnaryKind> acts = {v1::UNARY_KIND_UNSPECIFIED,
                                           v1::UNARY_IDENTITY,
                                           v1::UNARY_RELU,
                                           v1::UNARY_GELU,
                                           v1::UNARY_GELU_TANH,
                                           v1::UNARY_SILU,
                                           v1::UNARY_SIGMOID,
                                           v1::UNARY_TANH,
                                           v1::UNARY_EXP,
                                           v1::UNARY_NEG,
                                           v1::UNARY_ABS,
                                           v1::UNARY_SOFTPLUS};
  // Activations defined only for positive arguments get positive operands.
  const std::vector<v1::UnaryKind> positive = {v1::UNARY_LOG, v1::UNARY_SQRT, v1::UNARY_RSQRT,
                                               v1::UNARY_RECIPROCAL};
  const Shape mid = {{17, 65}, {65, 33}};
  for (v1::UnaryKind act : acts) {
    const Epilogue bias_act = {true, false, act};
    cases.push_back(MakeCase("fused_matmul", mid, v1::DTYPE_F32, &bias_act));
  }
  for (v1::UnaryKind act : positive) {
    const Epilogue bias_act = {true, false, act};
    cases.push_back(MakeCase("fused_matmul", mid, v1::DTYPE_F32, &bias_act, 0.1, 1.0));
  }
  const Epilogue all = {true, true, v1::UNARY_GELU};
  const Epilogue residual_only = {false, true, v1::UNARY_KIND_UNSPECIFIED};
  const Epilogue act_residual = {false, true, v1::UNARY_RELU};
  const Epilogue bias_only = {true, false, v1::UNARY_KIND_UNSPECIFIED};
  const std::vector<std::pair<Shape, const Epilogue*>> mixed = {
      {{{4, 17, 33}, {33, 9}}, &all},                    // folded batch
      {{{2, 3, 17, 5}, {2, 3, 5, 7}}, &all},             // batched
      {{{2, 1, 7, 5}, {1, 3, 4, 7}, true, true}, &all},  // broadcast + transposes
      {{{3, 0}, {0, 5}}, &all},                          // K = 0: act(bias) + residual
      {{{0, 4}, {4, 5}}, &all},                          // M = 0
      {{{1, 1}, {1, 1}}, &all},
      {{{17}, {17, 5}}, &all},           // rank-1 a
      {{{5, 17}, {17}}, &bias_only},     // rank-1 b: bias along M
      {{{4, 5, 17}, {17}}, &bias_only},  // ... repeated over a batch
      {{{17}, {17}}, &all},              // scalar result, bias [1]
      {{{65, 130}, {130, 3}}, &residual_only},
      {{{3, 130}, {65, 130}, false, true}, &act_residual},
  };
  for (const auto& [shape, epi] : mixed) {
    cases.push_back(MakeCase("fused_matmul", shape, v1::DTYPE_F32, epi));
  }
  std::mt19937_64 rng = RngFor("fused_matmul_random");
  int i = 0;
  for (const Shape& s : RandomShapes("fused_matmul_random_shapes", 10)) {
    const Epilogue epi = {rng() % 2 == 0, rng() % 2 == 0, acts[rng() % acts.size()]};
    cases.push_back(MakeCase(absl::StrCat("fused_matmul/random", i++), s, v1::DTYPE_F32, &epi));
  }
  const Epilogue gelu_tanh_all = {true, true, v1::UNARY_GELU_TANH};
  const Epilogue silu_bias = {true, false, v1::UNARY_SILU};
  for (DType dtype : {v1::DTYPE_F16, v1::DTYPE_BF16}) {
    cases.push_back(MakeCase("fused_matmul", {{17, 65}, {65, 33}}, dtype, &gelu_tanh_all));
    cases.push_back(
        MakeCase("fused_matmul", {{4, 17, 33}, {9, 33}, false, true}, dtype, &silu_bias));
    cases.push_back(MakeCase("fused_matmul", {{3, 0}, {0, 5}}, dtype, &all));
  }
  // The cooperative-matrix kernel's epilogue (f16, dims multiples of 16).
  cases.push_back(MakeCase("fused_matmul", {{2, 48, 32}, {2, 32, 80}}, v1::DTYPE_F16, &all));
  cases.push_back(MakeCase("fused_matmul", {{32, 2000}, {2096, 32}, true, true}, v1::DTYPE_F16,
                           &gelu_tanh_all));
  cases.push_back(
      MakeCase("fused_matmul", {{4, 32, 48}, {80, 48}, false, true}, v1::DTYPE_F16, &silu_bias));
  return cases;
}

// Products with few rows (the CPU's own small-M micro-kernel takes M <= 64):
// The f32 case of `family` twice: as given, and with B packed ("/packed";
// the same inputs, which MakeCase draws from the case's name).
void AddPlainAndPacked(std::vector<Case>& cases, const char* family, const Shape& s,
                       const Epilogue* e) {
  cases.push_back(MakeCase(family, s, v1::DTYPE_F32, e));
  Case packed = MakeCase(family, s, v1::DTYPE_F32, e);
  packed.name += "/packed";
  packed.spec.name = packed.name;
  packed.pack_inputs = true;
  cases.push_back(std::move(packed));
}

// M = 1, 2, 3, 7, 16, 64 against odd and even K and N (a partial last
// column panel or none), every epilogue the micro-kernel computes in
// registers, B plain and transposed, read as given and packed beforehand (as
// the engine packs constants and params).
std::vector<Case> SmallMCases() {
  std::vector<Case> cases;
  auto both = [&](const Shape& s, const Epilogue* e) {
    AddPlainAndPacked(cases, "matmul_small_m", s, e);
  };
  const std::vector<std::pair<int64_t, int64_t>> kn = {{33, 47}, {64, 96}, {784, 130}};
  const std::vector<Epilogue> epilogues = {
      {true, false, v1::UNARY_KIND_UNSPECIFIED}, {true, false, v1::UNARY_RELU},
      {true, true, v1::UNARY_GELU},              {false, false, v1::UNARY_GELU_TANH},
      {true, false, v1::UNARY_SILU},             {false, true, v1::UNARY_SIGMOID},
      {true, true, v1::UNARY_TANH}};
  for (int64_t m : {1, 2, 3, 7, 16, 64}) {
    for (auto [k, n] : kn) {
      for (bool tb : {false, true}) {
        const Shape s = {{m, k}, tb ? Dims{n, k} : Dims{k, n}, false, tb};
        both(s, nullptr);
        for (size_t i = 0; i < epilogues.size(); ++i) {
          // The long K: the epilogues that differ in what they read.
          if (k < 784 || i == 1 || i == 2) both(s, &epilogues[i]);
        }
      }
    }
  }
  // Zero-width operands, a folded batch (4 x 16 rows share B), a vector b
  // (a bias would run along M: oneDNN's), M = 65 (oneDNN) and 1 x 1 x 1.
  const Epilogue all = {true, true, v1::UNARY_GELU};
  for (const Shape& s : std::vector<Shape>{{{3, 0}, {0, 5}},
                                           {{4, 16, 33}, {33, 17}},
                                           {{7, 33}, {33}},
                                           {{65, 33}, {33, 20}},
                                           {{1, 1}, {1, 1}}}) {
    both(s, s.b.size() == 1 ? nullptr : &all);
  }
  // The residual overwritten by the result (an in-place plan).
  for (bool packed : {false, true}) {
    Case c = MakeCase("matmul_small_m", {{5, 40}, {40, 24}}, v1::DTYPE_F32, &all);
    c.name += packed ? "/in_place_residual/packed" : "/in_place_residual";
    c.spec.name = c.name;
    c.in_place_input = 3;  // a, b, bias, residual
    c.pack_inputs = packed;
    cases.push_back(std::move(c));
  }
  return cases;
}

// Products with more rows than the small-M kernel takes at every epilogue
// (M = 65, 120, 128, 130), B plain and transposed, read as given and packed
// beforehand. On an AVX-512 CPU the own micro-kernel takes M <= 128 with B
// packed and no transcendental activation (its 8-row tiles: 120 and 128 are
// whole, 65 is not); the other products run oneDNN, whose packed copy is B
// reordered into its preferred layout (MatMulKernel's packed path), with
// every epilogue fused into that primitive. Then the BERT-base encoder
// layer's own products at seq 128.
std::vector<Case> PackedCases() {
  std::vector<Case> cases;
  auto both = [&](const Shape& s, const Epilogue* e) {
    AddPlainAndPacked(cases, "matmul_packed", s, e);
  };
  const std::vector<Epilogue> epilogues = {{true, false, v1::UNARY_KIND_UNSPECIFIED},
                                           {true, false, v1::UNARY_GELU},
                                           {true, true, v1::UNARY_KIND_UNSPECIFIED},
                                           {false, true, v1::UNARY_RELU},
                                           {true, true, v1::UNARY_GELU}};
  for (int64_t m : {65, 120, 128, 130}) {
    for (auto [k, n] : std::vector<std::pair<int64_t, int64_t>>{{33, 47}, {96, 130}}) {
      for (bool tb : {false, true}) {
        const Shape s = {{m, k}, tb ? Dims{n, k} : Dims{k, n}, false, tb};
        both(s, nullptr);
        for (const Epilogue& e : epilogues) both(s, &e);
      }
    }
  }
  const Epilogue bias_residual = {true, true, v1::UNARY_KIND_UNSPECIFIED};
  const Epilogue bias = {true, false, v1::UNARY_KIND_UNSPECIFIED};
  const Epilogue bias_gelu = {true, false, v1::UNARY_GELU};
  both({{128, 768}, {768, 768}}, &bias);           // Q, K, V
  both({{128, 768}, {768, 768}}, &bias_residual);  // output projection + x
  both({{128, 768}, {768, 3072}}, &bias_gelu);     // FFN up
  both({{128, 3072}, {3072, 768}}, &bias_residual);  // FFN down + h1
  // The residual overwritten by the result (an in-place plan): with GELU
  // (oneDNN above 64 rows) and without (the own kernel's exact alias).
  const Epilogue all = {true, true, v1::UNARY_GELU};
  for (const Epilogue* e : {&all, &bias_residual}) {
    for (bool packed : {false, true}) {
      Case c = MakeCase("matmul_packed", {{128, 40}, {40, 24}}, v1::DTYPE_F32, e);
      c.name += e == &all ? "/in_place_residual" : "/in_place_residual_no_act";
      if (packed) c.name += "/packed";
      c.spec.name = c.name;
      c.in_place_input = 3;  // a, b, bias, residual
      c.pack_inputs = packed;
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

const FamilyRegistration kMatMul("matmul", MatMulCases);
const FamilyRegistration kPacked("matmul_packed", PackedCases);
const FamilyRegistration kSmallM("matmul_small_m", SmallMCases);
const FamilyRegistration kFusedMatMul("fused_matmul", FusedMatMulCases);

}  // namespace
}  // namespace kiln::conformance
