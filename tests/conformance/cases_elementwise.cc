// Conformance cases for the standalone elementwise ops: unary (every kind),
// binary with broadcasting, compare, where, cast (every dense pair), clamp,
// and IEEE edge values. References: reference_elementwise.h.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "tests/conformance/reference_elementwise.h"

namespace kiln::conformance {
namespace {

using ref::Shape;

std::string Lower(const std::string& s) { return absl::AsciiStrToLower(s); }

// A standalone elementwise op as a case: the reference is the one-instruction
// region of the same op (backend::DecodeSpec's reading of the spec).
Case OpCase(const std::string& name, v1::OpKind op, const v1::Attrs& attrs,
            std::vector<HostTensor> inputs, DType out_dtype, Tolerance tol) {
  std::vector<backend::TensorDesc> in_descs;
  Dims out;
  for (const HostTensor& t : inputs) {
    in_descs.push_back(Desc(t.dtype(), t.dims()));
    out = ref::Broadcast(out, t.dims());
  }
  Case c;
  c.name = name;
  c.spec = ref::Spec(name, op, attrs, std::move(in_descs), {Desc(out_dtype, out)});
  c.inputs = std::move(inputs);
  c.reference = ref::ElementwiseReference;
  c.tol = tol;
  return c;
}

v1::Attrs UnaryAttrs(int kind) {
  v1::Attrs a;
  a.mutable_unary()->set_kind(static_cast<v1::UnaryKind>(kind));
  return a;
}
v1::Attrs BinaryAttrs(int kind) {
  v1::Attrs a;
  a.mutable_binary()->set_kind(static_cast<v1::BinaryKind>(kind));
  return a;
}
v1::Attrs CompareAttrs(int kind) {
  v1::Attrs a;
  a.mutable_compare()->set_kind(static_cast<v1::CompareKind>(kind));
  return a;
}

// Inputs where each unary kind is defined and its f16 result is finite.
std::pair<double, double> UnaryRange(int kind) {
  switch (kind) {
    case v1::UNARY_LOG:
    case v1::UNARY_SQRT:
    case v1::UNARY_RSQRT:
      return {0.01, 10};
    case v1::UNARY_RECIPROCAL:
      return {0.25, 4};
    case v1::UNARY_EXP:
      return {-10, 10};
    default:
      return {-6, 6};
  }
}

// Shapes that break vector widths and blocks: scalars, empty, 1, odd sizes,
// rows longer than a block.
const std::vector<Dims>& UnaryShapes() {
  static const std::vector<Dims> s = {{}, {0}, {1}, {7}, {33}, {3, 257}, {2, 1000}, {1, 1, 9}};
  return s;
}

std::vector<Case> UnaryCases() {
  std::vector<Case> cases;
  const auto& shapes = UnaryShapes();
  for (int kind = v1::UNARY_IDENTITY; kind <= v1::UNARY_SOFTPLUS; ++kind) {
    const std::string kname = Lower(v1::UnaryKind_Name(static_cast<v1::UnaryKind>(kind)).substr(6));
    for (size_t di = 0; di < ref::FloatTypes().size(); ++di) {
      const DType dt = ref::FloatTypes()[di];
      for (size_t s : {(kind + di) % shapes.size(), (kind + di + 5) % shapes.size()}) {
        const std::string name =
            absl::StrCat("unary/", kname, "_", DTypeName(dt), "_", Shape(shapes[s]));
        auto rng = RngFor(name);
        const auto [lo, hi] = UnaryRange(kind);
        cases.push_back(OpCase(name, v1::OP_UNARY, UnaryAttrs(kind),
                               ref::Tensors{RandomTensor(rng, dt, shapes[s], lo, hi)}, dt,
                               DefaultTolerance(dt)));
      }
    }
  }
  // Signed integers: the kinds that make sense on them, with wrapping at INT_MIN.
  for (int kind :
       {v1::UNARY_IDENTITY, v1::UNARY_RELU, v1::UNARY_NEG, v1::UNARY_ABS, v1::UNARY_SIGN}) {
    for (DType dt : {v1::DTYPE_I8, v1::DTYPE_I16, v1::DTYPE_I32, v1::DTYPE_I64}) {
      const std::string name = absl::StrCat("unary/", kind, "_", DTypeName(dt));
      auto rng = RngFor(name);
      const auto [lo, hi] = ref::IntRange(dt);
      HostTensor x = RandomTensor(rng, dt, {5, 41}, lo, hi);
      if (dt == v1::DTYPE_I8) x.SetFromDouble(0, -128);
      cases.push_back(
          OpCase(name, v1::OP_UNARY, UnaryAttrs(kind), ref::Tensors{std::move(x)}, dt, {0, 0}));
    }
  }
  // Output written over the input (in-place reuse).
  for (DType dt : {v1::DTYPE_F32, v1::DTYPE_F16, v1::DTYPE_F64}) {
    const std::string name = absl::StrCat("unary/gelu_in_place_", DTypeName(dt));
    auto rng = RngFor(name);
    cases.push_back(OpCase(name, v1::OP_UNARY, UnaryAttrs(v1::UNARY_GELU),
                           ref::Tensors{RandomTensor(rng, dt, {7, 1001}, -6, 6)}, dt,
                           DefaultTolerance(dt)));
    cases.back().in_place_input = 0;
  }
  // Large enough to run in parallel; gelu, the encoder's activation.
  for (int kind : {v1::UNARY_GELU, v1::UNARY_TANH, v1::UNARY_EXP}) {
    const std::string name = absl::StrCat("unary/large_", kind);
    auto rng = RngFor(name);
    cases.push_back(OpCase(name, v1::OP_UNARY, UnaryAttrs(kind),
                           ref::Tensors{RandomTensor(rng, v1::DTYPE_F32, {256, 769}, -8, 8)},
                           v1::DTYPE_F32, DefaultTolerance(v1::DTYPE_F32)));
  }
  return cases;
}

// Every f32 activation over a dense sweep of a wide range, where the
// approximations must hold (~1e-6 relative) all the way into the tails.
std::vector<Case> UnaryWideCases() {
  std::vector<Case> cases;
  auto sweep = [](double lo, double hi, int64_t n, bool log_spaced) {
    std::vector<double> v(n);
    for (int64_t i = 0; i < n; ++i) {
      const double t = static_cast<double>(i) / (n - 1);
      v[i] = log_spaced ? std::pow(10.0, lo + (hi - lo) * t) : lo + (hi - lo) * t;
    }
    return v;
  };
  struct Sweep {
    int kind;
    double lo, hi;
    bool log_spaced;
  };
  const Sweep sweeps[] = {
      {v1::UNARY_EXP, -104, 89, false},      {v1::UNARY_TANH, -40, 40, false},
      {v1::UNARY_SIGMOID, -110, 110, false}, {v1::UNARY_SILU, -110, 110, false},
      {v1::UNARY_GELU, -30, 30, false},      {v1::UNARY_GELU_TANH, -30, 30, false},
      {v1::UNARY_ERF, -12, 12, false},       {v1::UNARY_SOFTPLUS, -110, 110, false},
      {v1::UNARY_LOG, -42, 38, true},        {v1::UNARY_SQRT, -42, 38, true},
      {v1::UNARY_RSQRT, -36, 36, true},      {v1::UNARY_RECIPROCAL, -36, 36, true},
      {v1::UNARY_SIN, -100, 100, false},     {v1::UNARY_COS, -100, 100, false},
  };
  for (const Sweep& s : sweeps) {
    for (DType dt : {v1::DTYPE_F32, v1::DTYPE_F64}) {
      const std::string name = absl::StrCat("unary_wide/", s.kind, "_", DTypeName(dt));
      HostTensor x = ref::Values(dt, {20001}, sweep(s.lo, s.hi, 20001, s.log_spaced));
      const Tolerance tol = DefaultTolerance(dt);
      cases.push_back(
          OpCase(name, v1::OP_UNARY, UnaryAttrs(s.kind), ref::Tensors{std::move(x)}, dt, tol));
    }
  }
  return cases;
}

const std::vector<std::pair<Dims, Dims>>& BinaryShapes() {
  static const std::vector<std::pair<Dims, Dims>> s = {
      {{3, 4}, {3, 4}}, {{2, 3, 33}, {33}},  {{5, 1, 7}, {1, 6, 1}}, {{}, {4, 5}},
      {{0, 3}, {3}},    {{7}, {1}},          {{4, 300}, {4, 1}},     {{2, 3, 300}, {3, 300}},
      {{1}, {}},        {{6, 1}, {1, 1000}}, {{1, 1030}, {3, 1}},    {{2, 1, 3, 1}, {4, 1, 5}},
  };
  return s;
}

std::vector<Case> BinaryCases() {
  std::vector<Case> cases;
  const auto& shapes = BinaryShapes();
  for (int kind = v1::BINARY_ADD; kind <= v1::BINARY_POW; ++kind) {
    const std::string kname =
        Lower(v1::BinaryKind_Name(static_cast<v1::BinaryKind>(kind)).substr(7));
    for (size_t di = 0; di < ref::FloatTypes().size(); ++di) {
      const DType dt = ref::FloatTypes()[di];
      for (size_t k = 0; k < 3; ++k) {
        const auto& [da, db] = shapes[(kind * 3 + di + k * 4) % shapes.size()];
        const std::string name =
            absl::StrCat("binary/", kname, "_", DTypeName(dt), "_", Shape(da), "_", Shape(db));
        auto rng = RngFor(name);
        double alo = -4, ahi = 4, blo = -4, bhi = 4;
        if (kind == v1::BINARY_DIV) blo = 0.5, bhi = 2;  // f16 stays finite
        if (kind == v1::BINARY_POW) alo = 0.1, ahi = 3, blo = -3, bhi = 3;
        cases.push_back(OpCase(
            name, v1::OP_BINARY, BinaryAttrs(kind),
            ref::Tensors{RandomTensor(rng, dt, da, alo, ahi), RandomTensor(rng, dt, db, blo, bhi)},
            dt, DefaultTolerance(dt)));
      }
    }
    if (kind == v1::BINARY_POW) continue;  // floats only
    for (size_t di = 0; di < ref::IntTypes().size(); ++di) {
      const DType dt = ref::IntTypes()[di];
      for (size_t k = 0; k < 2; ++k) {
        const auto& [da, db] = shapes[(kind * 5 + di + k * 6) % shapes.size()];
        const std::string name =
            absl::StrCat("binary/", kname, "_", DTypeName(dt), "_", Shape(da), "_", Shape(db));
        auto rng = RngFor(name);
        auto [lo, hi] = ref::IntRange(dt);
        double blo = lo, bhi = hi;
        if (kind == v1::BINARY_DIV) blo = std::max(lo, -5.0), bhi = 5;  // hits x / 0
        cases.push_back(OpCase(
            name, v1::OP_BINARY, BinaryAttrs(kind),
            ref::Tensors{RandomTensor(rng, dt, da, lo, hi), RandomTensor(rng, dt, db, blo, bhi)},
            dt, {0, 0}));
      }
    }
  }
  // Parallel path with a bias row: [M, N] + [N].
  for (DType dt : {v1::DTYPE_F32, v1::DTYPE_F16}) {
    const std::string name = absl::StrCat("binary/bias_add_large_", DTypeName(dt));
    auto rng = RngFor(name);
    cases.push_back(
        OpCase(name, v1::OP_BINARY, BinaryAttrs(v1::BINARY_ADD),
               ref::Tensors{RandomTensor(rng, dt, {384, 768}), RandomTensor(rng, dt, {768})}, dt,
               DefaultTolerance(dt)));
  }
  return cases;
}

// Small integers (as any dtype) so that equal elements occur.
HostTensor SmallInts(std::mt19937_64& rng, DType dt, const Dims& dims) {
  std::uniform_int_distribution<int> u(dt == v1::DTYPE_U8 || dt == v1::DTYPE_BOOL ? 0 : -3,
                                       dt == v1::DTYPE_BOOL ? 1 : 3);
  HostTensor t = std::move(HostTensor::Create(dt, dims)).value();
  for (int64_t i = 0; i < t.num_elements(); ++i) t.SetFromDouble(i, u(rng));
  return t;
}

std::vector<Case> CompareWhereCases() {
  std::vector<Case> cases;
  const auto& shapes = BinaryShapes();
  for (int kind = v1::COMPARE_EQ; kind <= v1::COMPARE_GE; ++kind) {
    for (size_t di = 0; di < ref::DenseTypes().size(); ++di) {
      const DType dt = ref::DenseTypes()[di];
      const auto& [da, db] = shapes[(kind + di) % shapes.size()];
      const std::string name =
          absl::StrCat("compare/", kind, "_", DTypeName(dt), "_", Shape(da), "_", Shape(db));
      auto rng = RngFor(name);
      cases.push_back(OpCase(name, v1::OP_COMPARE, CompareAttrs(kind),
                             ref::Tensors{SmallInts(rng, dt, da), SmallInts(rng, dt, db)},
                             v1::DTYPE_BOOL, {0, 0}));
    }
  }
  const std::vector<std::vector<Dims>> where_shapes = {
      {{4, 5}, {4, 5}, {4, 5}},           {{4, 1}, {1, 5}, {}}, {{}, {3, 7}, {7}},
      {{2, 1, 300}, {3, 1}, {2, 3, 300}}, {{0, 2}, {2}, {1}},
  };
  for (size_t di = 0; di < ref::DenseTypes().size(); ++di) {
    const DType dt = ref::DenseTypes()[di];
    for (size_t k = 0; k < 2; ++k) {
      const auto& s = where_shapes[(di + k * 2) % where_shapes.size()];
      const std::string name = absl::StrCat("where/", DTypeName(dt), "_", Shape(s[0]), "_",
                                            Shape(s[1]), "_", Shape(s[2]));
      auto rng = RngFor(name);
      const auto [lo, hi] = IsFloat(dt) ? std::pair<double, double>{-5, 5} : ref::IntRange(dt);
      cases.push_back(OpCase(
          name, v1::OP_WHERE, v1::Attrs(),
          ref::Tensors{RandomTensor(rng, v1::DTYPE_BOOL, s[0]), RandomTensor(rng, dt, s[1], lo, hi),
                       RandomTensor(rng, dt, s[2], lo, hi)},
          dt, IsFloat(dt) ? DefaultTolerance(dt) : Tolerance{0, 0}));
    }
  }
  return cases;
}

std::vector<Case> CastCases() {
  std::vector<Case> cases;
  for (DType from : ref::DenseTypes()) {
    for (DType to : ref::DenseTypes()) {
      const std::string name = absl::StrCat("cast/", DTypeName(from), "_to_", DTypeName(to));
      auto rng = RngFor(name);
      // Fractions and values past i8/u8 range (truncation, saturation); wide
      // integers that wrap into narrow ones and overflow f16.
      double lo = -300, hi = 300;
      if (!IsFloat(from)) std::tie(lo, hi) = ref::IntRange(from);
      if (from == v1::DTYPE_I32 || from == v1::DTYPE_I64) lo = -70000, hi = 70000;
      v1::Attrs a;
      a.mutable_cast()->set_to(to);
      if (ElementSize(from) == ElementSize(to)) {  // same bytes: also in place
        auto rng2 = RngFor(name + "_in_place");
        cases.push_back(OpCase(name + "_in_place", v1::OP_CAST, a,
                               ref::Tensors{RandomTensor(rng2, from, {5, 301}, lo, hi)}, to,
                               IsFloat(to) ? DefaultTolerance(to) : Tolerance{0, 0}));
        cases.back().in_place_input = 0;
      }
      cases.push_back(OpCase(name, v1::OP_CAST, a,
                             ref::Tensors{RandomTensor(rng, from, {3, 37}, lo, hi)}, to,
                             IsFloat(to) ? DefaultTolerance(to) : Tolerance{0, 0}));
    }
  }
  return cases;
}

std::vector<Case> ClampCases() {
  std::vector<Case> cases;
  std::vector<DType> types = ref::FloatTypes();
  types.insert(types.end(), ref::IntTypes().begin(), ref::IntTypes().end());
  for (DType dt : types) {
    for (int bounds = 0; bounds < 3; ++bounds) {
      const std::string name = absl::StrCat("clamp/", DTypeName(dt), "_", bounds);
      auto rng = RngFor(name);
      v1::Attrs a;
      const bool f = IsFloat(dt);
      if (bounds != 1) a.mutable_clamp()->set_min(f ? -0.3 : -10.5);
      if (bounds != 0) a.mutable_clamp()->set_max(f ? 0.55 : 20.5);
      const auto [lo, hi] = f ? std::pair<double, double>{-1, 1} : ref::IntRange(dt);
      cases.push_back(OpCase(name, v1::OP_CLAMP, a,
                             ref::Tensors{RandomTensor(rng, dt, {7, 33}, lo, hi)}, dt,
                             f ? DefaultTolerance(dt) : Tolerance{0, 0}));
    }
  }
  return cases;
}

// IEEE and integer edge values: NaN, +-inf, +-0, subnormals, huge values,
// exact halves, division by zero, INT_MIN / -1.
std::vector<Case> SpecialCases() {
  std::vector<Case> cases;
  const std::vector<double> specials = {NAN,   INFINITY, -INFINITY, 0.0, -0.0, 1e-40, -1e-40, 1e30,
                                        -1e30, 88.8,     -88.8,     0.5, -0.5, 1.5,   2.5,    -2.5,
                                        1e-8,  20,       -20,       100, -100, 3.0,   -1.0,   1.0};
  for (DType dt : {v1::DTYPE_F32, v1::DTYPE_F64, v1::DTYPE_F16}) {
    for (int kind = v1::UNARY_IDENTITY; kind <= v1::UNARY_SOFTPLUS; ++kind) {
      const std::string name = absl::StrCat("special/unary_", kind, "_", DTypeName(dt));
      cases.push_back(
          OpCase(name, v1::OP_UNARY, UnaryAttrs(kind),
                 ref::Tensors{ref::Values(dt, {static_cast<int64_t>(specials.size())}, specials)},
                 dt, DefaultTolerance(dt)));
    }
    // Every pair of a small special set, for every binary kind.
    const std::vector<double> s = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 1.0, -2.5, 3.0, 0.5};
    std::vector<double> a, b;
    for (double x : s) {
      for (double y : s) a.push_back(x), b.push_back(y);
    }
    const Dims d = {static_cast<int64_t>(a.size())};
    for (int kind = v1::BINARY_ADD; kind <= v1::BINARY_POW; ++kind) {
      const std::string name = absl::StrCat("special/binary_", kind, "_", DTypeName(dt));
      cases.push_back(OpCase(name, v1::OP_BINARY, BinaryAttrs(kind),
                             ref::Tensors{ref::Values(dt, d, a), ref::Values(dt, d, b)}, dt,
                             DefaultTolerance(dt)));
    }
    for (int kind = v1::COMPARE_EQ; kind <= v1::COMPARE_GE; ++kind) {
      const std::string name = absl::StrCat("special/compare_", kind, "_", DTypeName(dt));
      cases.push_back(OpCase(name, v1::OP_COMPARE, CompareAttrs(kind),
                             ref::Tensors{ref::Values(dt, d, a), ref::Values(dt, d, b)},
                             v1::DTYPE_BOOL, {0, 0}));
    }
    for (DType to : ref::DenseTypes()) {
      const std::string name = absl::StrCat("special/cast_", DTypeName(dt), "_to_", DTypeName(to));
      v1::Attrs attrs;
      attrs.mutable_cast()->set_to(to);
      cases.push_back(
          OpCase(name, v1::OP_CAST, attrs,
                 ref::Tensors{ref::Values(dt, {static_cast<int64_t>(specials.size())}, specials)},
                 to, IsFloat(to) ? DefaultTolerance(to) : Tolerance{0, 0}));
    }
    v1::Attrs clamp;
    clamp.mutable_clamp()->set_min(-1);
    clamp.mutable_clamp()->set_max(2);
    cases.push_back(
        OpCase(absl::StrCat("special/clamp_", DTypeName(dt)), v1::OP_CLAMP, clamp,
               ref::Tensors{ref::Values(dt, {static_cast<int64_t>(specials.size())}, specials)}, dt,
               DefaultTolerance(dt)));
  }
  // Integer edges: INT_MIN / -1 and x / 0 wrap or give 0; INT_MIN negated.
  for (DType dt : {v1::DTYPE_I8, v1::DTYPE_I16, v1::DTYPE_I32}) {
    const double mn = dt == v1::DTYPE_I8 ? -128 : (dt == v1::DTYPE_I16 ? -32768 : -2147483648.0);
    const std::vector<double> a = {mn, mn, 7, -7, 0, mn, -mn - 1, 5};
    const std::vector<double> b = {-1, 0, 0, 2, 0, 1, -1, -3};
    for (int kind : {v1::BINARY_DIV, v1::BINARY_MUL, v1::BINARY_SUB, v1::BINARY_ADD}) {
      const std::string name = absl::StrCat("special/int_", kind, "_", DTypeName(dt));
      cases.push_back(OpCase(name, v1::OP_BINARY, BinaryAttrs(kind),
                             ref::Tensors{ref::Values(dt, {8}, a), ref::Values(dt, {8}, b)}, dt,
                             {0, 0}));
    }
    for (int kind : {v1::UNARY_NEG, v1::UNARY_ABS}) {
      const std::string name = absl::StrCat("special/int_unary_", kind, "_", DTypeName(dt));
      cases.push_back(OpCase(name, v1::OP_UNARY, UnaryAttrs(kind),
                             ref::Tensors{ref::Values(dt, {8}, a)}, dt, {0, 0}));
    }
  }
  return cases;
}

const FamilyRegistration kUnary("unary", UnaryCases);
const FamilyRegistration kUnaryWide("unary_wide", UnaryWideCases);
const FamilyRegistration kBinary("binary", BinaryCases);
const FamilyRegistration kCompareWhere("compare_where", CompareWhereCases);
const FamilyRegistration kCast("cast", CastCases);
const FamilyRegistration kClamp("clamp", ClampCases);
const FamilyRegistration kSpecial("elementwise_special", SpecialCases);

}  // namespace
}  // namespace kiln::conformance
