// Conformance cases for FusedElementwise regions: hand-written regions (bias
// + gelu, multi-output, casts, integers, every broadcast path) and random
// regions over random broadcast shapes, checked by the region interpreter of
// reference_elementwise.h (over the region as the shared decoder reads it).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/conformance/reference_elementwise.h"

namespace kiln::conformance {
namespace {

using ref::BinaryInstr;
using ref::CastInstr;
using ref::ClampInstr;
using ref::CompareInstr;
using ref::ConstantInstr;
using ref::UnaryInstr;
using ref::WhereInstr;

Case RegionCase(const std::string& name, std::vector<v1::FusedInstr> instrs,
                std::vector<int> results, std::vector<HostTensor> inputs, Tolerance tol) {
  v1::Attrs attrs;
  auto* fe = attrs.mutable_fused_elementwise();
  for (const auto& f : instrs) *fe->add_instrs() = f;
  for (int r : results) fe->add_results(r);
  std::vector<backend::TensorDesc> ins, outs;
  Dims out;
  for (const HostTensor& t : inputs) {
    ins.push_back(Desc(t.dtype(), t.dims()));
    out = ref::Broadcast(out, t.dims());
  }
  for (int r : results) outs.push_back(Desc(instrs[r].dtype(), out));
  Case c;
  c.name = name;
  c.spec = ref::Spec(name, v1::OP_FUSED_ELEMENTWISE, attrs, std::move(ins), std::move(outs));
  c.inputs = std::move(inputs);
  c.reference = ref::ElementwiseReference;
  c.tol = tol;
  return c;
}

std::vector<Case> HandCases() {
  std::vector<Case> cases;
  // Bias + gelu, the encoder's FFN epilogue, over shapes that hit in-place
  // rows (N >= 256), wrapping rows (N < 256) and the parallel path.
  const std::vector<std::pair<int64_t, int64_t>> mn = {{1, 1},   {3, 7},      {5, 33},
                                                       {4, 768}, {128, 3072}, {9, 1000}};
  for (DType dt : {v1::DTYPE_F32, v1::DTYPE_F16, v1::DTYPE_BF16, v1::DTYPE_F64}) {
    for (auto [m, n] : mn) {
      if (dt != v1::DTYPE_F32 && m * n > 10000) continue;
      const std::string name = absl::StrCat("fused/bias_gelu_", DTypeName(dt), "_", m, "x", n);
      auto rng = RngFor(name);
      cases.push_back(RegionCase(
          name, {BinaryInstr(v1::BINARY_ADD, 0, 1, dt), UnaryInstr(v1::UNARY_GELU, 2, dt)}, {1},
          ref::Tensors{RandomTensor(rng, dt, {m, n}, -4, 4), RandomTensor(rng, dt, {n})},
          DefaultTolerance(dt, 2)));
    }
  }
  // Output 0 written over input 0 (in-place reuse), f32 and f16.
  for (DType dt : {v1::DTYPE_F32, v1::DTYPE_F16}) {
    const std::string name = absl::StrCat("fused/bias_gelu_in_place_", DTypeName(dt));
    auto rng = RngFor(name);
    cases.push_back(RegionCase(
        name, {BinaryInstr(v1::BINARY_ADD, 0, 1, dt), UnaryInstr(v1::UNARY_GELU, 2, dt)}, {1},
        ref::Tensors{RandomTensor(rng, dt, {9, 1000}, -4, 4), RandomTensor(rng, dt, {1000})},
        DefaultTolerance(dt, 2)));
    cases.back().in_place_input = 0;
  }
  // Several results, compare + where, constants, and a value read twice.
  for (int k = 0; k < 4; ++k) {
    // k == 3: f32 again with output 0 written over input 0.
    const DType dt = k == 1 ? v1::DTYPE_F16 : (k == 2 ? v1::DTYPE_F64 : v1::DTYPE_F32);
    const std::string name =
        absl::StrCat("fused/multi_output_", DTypeName(dt), k == 3 ? "_in_place" : "");
    auto rng = RngFor(name);
    cases.push_back(RegionCase(
        name,
        {BinaryInstr(v1::BINARY_MUL, 0, 1, dt), ConstantInstr(1.5, dt),
         BinaryInstr(v1::BINARY_ADD, 2, 3, dt), CompareInstr(v1::COMPARE_GT, 4, 0),
         WhereInstr(5, 4, 0, dt), BinaryInstr(v1::BINARY_MUL, 6, 6, dt)},
        {5, 3, 0, 5},
        ref::Tensors{RandomTensor(rng, dt, {6, 50}, -2, 2), RandomTensor(rng, dt, {50}, -2, 2)},
        DefaultTolerance(dt, 4)));
    if (k == 3) cases.back().in_place_input = 0;
  }
  // Casts inside a region round to their dtype; integer arithmetic wraps.
  {
    const std::string name = "fused/cast_chain";
    auto rng = RngFor(name);
    const DType f32 = v1::DTYPE_F32, f16 = v1::DTYPE_F16;
    cases.push_back(RegionCase(
        name,
        {CastInstr(0, f16), BinaryInstr(v1::BINARY_MUL, 1, 1, f16), CastInstr(2, f32),
         UnaryInstr(v1::UNARY_SQRT, 3, f32), CastInstr(4, v1::DTYPE_I32)},
        {3, 4}, ref::Tensors{RandomTensor(rng, f32, {3, 333}, -30, 30)}, DefaultTolerance(f32, 2)));
  }
  {
    const std::string name = "fused/int_region";
    auto rng = RngFor(name);
    const DType i32 = v1::DTYPE_I32, i8 = v1::DTYPE_I8, f32 = v1::DTYPE_F32;
    v1::ClampAttrs clamp;
    clamp.set_min(-50);
    clamp.set_max(90.5);
    cases.push_back(RegionCase(
        name,
        {BinaryInstr(v1::BINARY_ADD, 0, 1, i32), ConstantInstr(3, i32),
         BinaryInstr(v1::BINARY_MAX, 2, 3, i32), CastInstr(4, i8),
         BinaryInstr(v1::BINARY_MUL, 5, 5, i8), ClampInstr(6, i8, clamp), CastInstr(7, f32),
         UnaryInstr(v1::UNARY_SQRT, 8, f32), BinaryInstr(v1::BINARY_DIV, 2, 1, i32)},
        {7, 5, 8},
        ref::Tensors{RandomTensor(rng, i32, {4, 1, 65}, -400, 400),
                     RandomTensor(rng, i32, {3, 1}, -20, 20)},
        DefaultTolerance(f32)));
  }
  // Every fetch path in one region: same shape, scalar, suffix row, column,
  // general broadcast; an unused input; a size-0 output.
  for (const auto& shapes :
       std::vector<std::vector<Dims>>{{{5, 6, 7}, {}, {7}, {5, 1, 1}, {1, 6, 1}},
                                      {{2, 3, 300}, {1}, {300}, {2, 1, 1}, {3, 1}},
                                      {{0, 4}, {}, {4}, {1, 1}, {0, 1}},
                                      {{}, {}, {}, {}, {}},
                                      {{1, 1, 1}, {1}, {1}, {1, 1, 1}, {1, 1}}}) {
    const DType dt = v1::DTYPE_F32;
    const std::string name =
        absl::StrCat("fused/fetch_paths_", ref::Shape(shapes[0]), "_", ref::Shape(shapes[4]));
    auto rng = RngFor(name);
    std::vector<HostTensor> inputs;
    for (const Dims& d : shapes) inputs.push_back(RandomTensor(rng, dt, d, -2, 2));
    v1::ClampAttrs clamp;
    clamp.set_max(1.25);
    cases.push_back(
        RegionCase(name,
                   {BinaryInstr(v1::BINARY_SUB, 0, 2, dt), BinaryInstr(v1::BINARY_MUL, 5, 1, dt),
                    BinaryInstr(v1::BINARY_ADD, 6, 4, dt), ClampInstr(7, dt, clamp),
                    UnaryInstr(v1::UNARY_EXP, 8, dt)},
                   {4, 2}, std::move(inputs), DefaultTolerance(dt, 4)));
  }
  // Inputs in f16/bf16 and f64 going through the converting fetch paths.
  for (DType dt : {v1::DTYPE_F16, v1::DTYPE_BF16, v1::DTYPE_F64, v1::DTYPE_I64}) {
    const std::string name = absl::StrCat("fused/strided_", DTypeName(dt));
    auto rng = RngFor(name);
    const bool f = IsFloat(dt);
    cases.push_back(RegionCase(
        name, {BinaryInstr(v1::BINARY_ADD, 0, 1, dt), BinaryInstr(v1::BINARY_MAX, 3, 2, dt)}, {1},
        ref::Tensors{RandomTensor(rng, dt, {3, 1, 37}, -9, 9), RandomTensor(rng, dt, {4, 1}, -9, 9),
                     RandomTensor(rng, dt, {1, 4, 1}, -9, 9)},
        f ? DefaultTolerance(dt, 2) : Tolerance{0, 0}));
  }
  // A long chain (slot reuse) with a result in the middle.
  {
    const std::string name = "fused/long_chain";
    auto rng = RngFor(name);
    const DType dt = v1::DTYPE_F32;
    std::vector<v1::FusedInstr> instrs;
    int v = 0;
    const int kinds[] = {v1::UNARY_TANH, v1::UNARY_SIGMOID, v1::UNARY_SILU, v1::UNARY_GELU_TANH};
    for (int j = 0; j < 24; ++j) {
      if (j % 3 == 2) {
        instrs.push_back(BinaryInstr(v1::BINARY_ADD, 2 + j - 1, 1, dt));
      } else {
        instrs.push_back(UnaryInstr(kinds[j % 4], v, dt));
      }
      v = 2 + j;
    }
    cases.push_back(RegionCase(
        name, std::move(instrs), {23, 11},
        ref::Tensors{RandomTensor(rng, dt, {17, 129}, -3, 3), RandomTensor(rng, dt, {129}, -1, 1)},
        DefaultTolerance(dt, 24)));
  }
  return cases;
}

// Random regions: 1-3 inputs of random broadcast shapes, 3-14 instructions
// drawn from ops whose outputs stay bounded, so an f64 reference with f32
// rounding per instruction is a fair judge.
std::vector<Case> RandomCases() {
  std::vector<Case> cases;
  const int safe_unary[] = {
      v1::UNARY_TANH, v1::UNARY_SIGMOID, v1::UNARY_GELU,    v1::UNARY_GELU_TANH, v1::UNARY_SILU,
      v1::UNARY_RELU, v1::UNARY_ABS,     v1::UNARY_NEG,     v1::UNARY_ERF,       v1::UNARY_SOFTPLUS,
      v1::UNARY_SIN,  v1::UNARY_COS,     v1::UNARY_IDENTITY};
  const int safe_binary[] = {v1::BINARY_ADD, v1::BINARY_SUB, v1::BINARY_MUL, v1::BINARY_MAX,
                             v1::BINARY_MIN};
  const int64_t sizes[] = {1, 2, 3, 5, 7, 8, 33, 300};
  for (int k = 0; k < 40; ++k) {
    const DType dt = k % 4 == 3 ? v1::DTYPE_F64 : v1::DTYPE_F32;
    const std::string name = absl::StrCat("fused_random/", k, "_", DTypeName(dt));
    auto rng = RngFor(name);
    auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
    const int rank = pick(5);
    Dims out(rank);
    for (auto& d : out) d = sizes[pick(8)];
    while (ref::NumElements(out) > 20000) out[pick(rank)] = 1;
    const int nin = 1 + pick(3);
    std::vector<HostTensor> inputs;
    for (int i = 0; i < nin; ++i) {
      Dims d(out.begin() + pick(rank + 1) * (i > 0), out.end());  // drop leading dims
      for (auto& x : d) {
        if (i > 0 && pick(3) == 0) x = 1;
      }
      inputs.push_back(RandomTensor(rng, dt, d, -2, 2));
    }
    std::vector<int> floats;  // values of dtype dt
    for (int i = 0; i < nin; ++i) floats.push_back(i);
    std::vector<v1::FusedInstr> instrs;
    auto value = [&]() { return floats[pick(static_cast<int>(floats.size()))]; };
    const int n = 3 + pick(12);
    while (static_cast<int>(instrs.size()) < n) {
      const int id = nin + static_cast<int>(instrs.size());
      switch (pick(6)) {
        case 0:
        case 1:
          instrs.push_back(UnaryInstr(safe_unary[pick(13)], value(), dt));
          break;
        case 2:
        case 3:
          instrs.push_back(BinaryInstr(safe_binary[pick(5)], value(), value(), dt));
          break;
        case 4:
          instrs.push_back(CompareInstr(v1::COMPARE_LT + pick(4), value(), value()));
          instrs.push_back(WhereInstr(id, value(), value(), dt));
          floats.push_back(id + 1);
          continue;
        default: {
          v1::ClampAttrs c;
          c.set_min(-1.5);
          if (pick(2)) c.set_max(2.0);
          instrs.push_back(pick(3) ? ClampInstr(value(), dt, c) : ConstantInstr(0.75, dt));
          break;
        }
      }
      floats.push_back(id);
    }
    std::vector<int> results = {static_cast<int>(instrs.size()) - 1};
    if (pick(2) && floats.back() - nin >= 1)
      results.push_back(floats[nin + pick(static_cast<int>(floats.size()) - nin)] - nin);
    cases.push_back(RegionCase(name, std::move(instrs), std::move(results), std::move(inputs),
                               DefaultTolerance(dt, n)));
  }
  return cases;
}

const FamilyRegistration kFused("fused_elementwise", HandCases);
const FamilyRegistration kFusedRandom("fused_elementwise_random", RandomCases);

}  // namespace
}  // namespace kiln::conformance
