// The shared elementwise-region decoder (backends/common/elementwise_region.h):
// what a well-formed region decodes to, and each structural check, whose
// message names the instruction at fault.
#include "backends/common/elementwise_region.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

namespace kiln::backend {
namespace {

using ::testing::HasSubstr;

constexpr DType kF32 = v1::DTYPE_F32;
constexpr DType kF16 = v1::DTYPE_F16;
constexpr DType kI32 = v1::DTYPE_I32;
constexpr DType kBool = v1::DTYPE_BOOL;

v1::FusedInstr Unary(v1::UnaryKind kind, int a, DType dtype) {
  v1::Attrs attrs;
  attrs.mutable_unary()->set_kind(kind);
  return InstrFor(v1::OP_UNARY, attrs, std::vector<int>{a}, dtype);
}
v1::FusedInstr Binary(v1::BinaryKind kind, int a, int b, DType dtype) {
  v1::Attrs attrs;
  attrs.mutable_binary()->set_kind(kind);
  return InstrFor(v1::OP_BINARY, attrs, std::vector<int>{a, b}, dtype);
}
v1::FusedInstr Compare(v1::CompareKind kind, int a, int b) {
  v1::Attrs attrs;
  attrs.mutable_compare()->set_kind(kind);
  return InstrFor(v1::OP_COMPARE, attrs, std::vector<int>{a, b}, kBool);
}
v1::FusedInstr Where(int c, int a, int b, DType dtype) {
  return InstrFor(v1::OP_WHERE, v1::Attrs(), std::vector<int>{c, a, b}, dtype);
}
v1::FusedInstr Cast(int a, DType to) {
  v1::Attrs attrs;
  attrs.mutable_cast()->set_to(to);
  return InstrFor(v1::OP_CAST, attrs, std::vector<int>{a}, to);
}
v1::FusedInstr Clamp(int a, DType dtype, std::optional<double> lo, std::optional<double> hi) {
  v1::Attrs attrs;
  if (lo) attrs.mutable_clamp()->set_min(*lo);
  if (hi) attrs.mutable_clamp()->set_max(*hi);
  return InstrFor(v1::OP_CLAMP, attrs, std::vector<int>{a}, dtype);
}
v1::FusedInstr Constant(double v, DType dtype) {
  v1::FusedInstr f;
  f.set_op(v1::OP_CONSTANT);
  f.set_scalar(v);
  f.set_dtype(dtype);
  return f;
}

v1::FusedElementwiseAttrs Region(std::vector<v1::FusedInstr> instrs, std::vector<int> results) {
  v1::FusedElementwiseAttrs r;
  for (auto& f : instrs) *r.add_instrs() = std::move(f);
  for (int k : results) r.add_results(k);
  return r;
}

// The message of a region that must not decode.
std::string Error(const v1::FusedElementwiseAttrs& region, std::vector<DType> inputs,
                  std::vector<DType> outputs) {
  absl::StatusOr<ElementwiseRegion> r = DecodeRegion(region, inputs, outputs);
  EXPECT_FALSE(r.ok());
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

TEST(ElementwiseRegionTest, DecodesEveryInstructionKind) {
  // Values: 0 x:f32, 1 y:f32, 2 c:i32; instructions from value 3.
  const auto region = Region({Binary(v1::BINARY_ADD, 0, 1, kF32),  // 3
                              Unary(v1::UNARY_GELU, 3, kF32),      // 4
                              Constant(0.5, kF32),                 // 5
                              Compare(v1::COMPARE_GT, 4, 5),       // 6
                              Where(6, 4, 0, kF32),                // 7
                              Cast(7, kF16),                       // 8
                              Clamp(2, kI32, -3.5, 7.0)},          // 9
                             {5, 3, 6});
  absl::StatusOr<ElementwiseRegion> r = DecodeRegion(region, std::vector<DType>{kF32, kF32, kI32},
                                                     std::vector<DType>{kF16, kBool, kI32});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->inputs, (std::vector<DType>{kF32, kF32, kI32}));
  ASSERT_EQ(r->instrs.size(), 7u);
  EXPECT_EQ(r->num_values(), 10);
  EXPECT_EQ(r->results, (std::vector<int>{5, 3, 6}));
  EXPECT_TRUE(r->is_result(3));
  EXPECT_FALSE(r->is_result(4));

  const RegionInstr& add = r->instrs[0];
  EXPECT_EQ(add.op, v1::OP_BINARY);
  EXPECT_EQ(add.kind, v1::BINARY_ADD);
  EXPECT_EQ(add.num_args, 2);
  EXPECT_EQ(add.args[0], 0);
  EXPECT_EQ(add.args[1], 1);
  EXPECT_EQ(add.dtype, kF32);
  EXPECT_EQ(add.arg_dtype, kF32);
  EXPECT_EQ(r->instrs[1].kind, v1::UNARY_GELU);
  EXPECT_EQ(r->instrs[2].num_args, 0);
  EXPECT_EQ(r->instrs[2].scalar, 0.5);
  EXPECT_EQ(r->instrs[3].kind, v1::COMPARE_GT);
  EXPECT_EQ(r->instrs[3].dtype, kBool);
  EXPECT_EQ(r->instrs[3].arg_dtype, kF32);
  EXPECT_EQ(r->instrs[4].num_args, 3);
  EXPECT_EQ(r->instrs[4].args[2], 0);
  EXPECT_EQ(r->instrs[5].arg_dtype, kF32);  // cast source
  EXPECT_EQ(r->instrs[5].dtype, kF16);      // cast target
  const RegionInstr& clamp = r->instrs[6];
  EXPECT_TRUE(clamp.has_lo && clamp.has_hi);
  EXPECT_EQ(clamp.lo, -3.5);
  EXPECT_EQ(clamp.hi, 7.0);
  EXPECT_EQ(r->value_dtype(2), kI32);
  EXPECT_EQ(r->value_dtype(8), kF16);
  EXPECT_EQ(InstrName(r->instrs[1]), "gelu");
  EXPECT_EQ(InstrName(r->instrs[3]), "gt");
  EXPECT_EQ(InstrName(r->instrs[5]), "cast_f32_to");
}

TEST(ElementwiseRegionTest, ChecksArity) {
  v1::FusedInstr f = Unary(v1::UNARY_EXP, 0, kF32);
  f.add_args(0);
  EXPECT_THAT(Error(Region({Unary(v1::UNARY_EXP, 0, kF32), f}, {1}), {kF32}, {kF32}),
              HasSubstr("instruction 1 (OP_UNARY) takes 1 operands, got 2"));
  v1::FusedInstr c = Constant(1, kF32);
  c.add_args(0);
  EXPECT_THAT(Error(Region({c}, {0}), {kF32}, {kF32}),
              HasSubstr("instruction 0 (OP_CONSTANT) takes 0 operands, got 1"));
}

TEST(ElementwiseRegionTest, OperandsAreDefinedBeforeUse) {
  // Two inputs: instruction 0 is value 2, so it may read 0 and 1 only.
  EXPECT_THAT(Error(Region({Binary(v1::BINARY_ADD, 0, 2, kF32)}, {0}), {kF32, kF32}, {kF32}),
              HasSubstr("instruction 0 (OP_BINARY) reads value 2, which is not defined before it"));
  EXPECT_THAT(Error(Region({Unary(v1::UNARY_EXP, 0, kF32), Unary(v1::UNARY_EXP, -1, kF32)}, {1}),
                    {kF32}, {kF32}),
              HasSubstr("instruction 1 (OP_UNARY) reads value -1"));
}

TEST(ElementwiseRegionTest, RejectsMixedDTypes) {
  EXPECT_THAT(Error(Region({Binary(v1::BINARY_MUL, 0, 1, kF32)}, {0}), {kF32, kF16}, {kF32}),
              HasSubstr("instruction 0 (OP_BINARY) mixes f32 and f16"));
  EXPECT_THAT(Error(Region({Compare(v1::COMPARE_LT, 0, 1)}, {0}), {kI32, kF32}, {kBool}),
              HasSubstr("instruction 0 (OP_COMPARE) mixes i32 and f32"));
  EXPECT_THAT(Error(Region({Compare(v1::COMPARE_LT, 0, 0), Where(2, 0, 1, kF32)}, {1}),
                    {kF32, kF16}, {kF32}),
              HasSubstr("instruction 1 (OP_WHERE) mixes f32 and f16"));
}

TEST(ElementwiseRegionTest, ChecksDeclaredResultDTypes) {
  EXPECT_THAT(Error(Region({Unary(v1::UNARY_TANH, 0, kF16)}, {0}), {kF32}, {kF16}),
              HasSubstr("instruction 0 (OP_UNARY) declares result f16, computes f32"));
  v1::FusedInstr cmp = Compare(v1::COMPARE_EQ, 0, 0);
  cmp.set_dtype(kF32);
  EXPECT_THAT(Error(Region({cmp}, {0}), {kF32}, {kF32}),
              HasSubstr("instruction 0 (OP_COMPARE) declares result f32, computes bool"));
  v1::FusedInstr cast = Cast(0, kF16);
  cast.set_dtype(kI32);
  EXPECT_THAT(Error(Region({cast}, {0}), {kF32}, {kI32}),
              HasSubstr("instruction 0 (OP_CAST) declares result i32, computes f16"));
  // A cast without a target casts to its declared result.
  v1::FusedInstr implicit = Cast(0, kF16);
  implicit.mutable_cast()->clear_to();
  absl::StatusOr<ElementwiseRegion> r =
      DecodeRegion(Region({implicit}, {0}), std::vector<DType>{kF32}, std::vector<DType>{kF16});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->instrs[0].dtype, kF16);
}

TEST(ElementwiseRegionTest, WhereNeedsABoolCondition) {
  EXPECT_THAT(Error(Region({Where(0, 1, 1, kF32)}, {0}), {kF32, kF32}, {kF32}),
              HasSubstr("instruction 0 (OP_WHERE) needs a bool condition, got f32"));
}

TEST(ElementwiseRegionTest, ClampBoundsAreOrderedNumbers) {
  EXPECT_THAT(Error(Region({Clamp(0, kF32, NAN, 1.0)}, {0}), {kF32}, {kF32}),
              HasSubstr("instruction 0 (OP_CLAMP) has bounds [nan, 1]"));
  EXPECT_THAT(Error(Region({Clamp(0, kF32, std::nullopt, NAN)}, {0}), {kF32}, {kF32}),
              HasSubstr("instruction 0 (OP_CLAMP) has bounds [-inf, nan]"));
  EXPECT_THAT(
      Error(Region({Unary(v1::UNARY_EXP, 0, kF32), Clamp(1, kF32, 2.0, 1.0)}, {1}), {kF32}, {kF32}),
      HasSubstr("instruction 1 (OP_CLAMP) has bounds [2, 1]"));
  // One-sided bounds and lo == hi are fine.
  EXPECT_TRUE(DecodeRegion(Region({Clamp(0, kF32, 1.0, 1.0)}, {0}), std::vector<DType>{kF32},
                           std::vector<DType>{kF32})
                  .ok());
}

TEST(ElementwiseRegionTest, ReadsDenseTypesOnly) {
  EXPECT_THAT(Error(Region({Unary(v1::UNARY_EXP, 0, v1::DTYPE_Q8_0)}, {0}), {v1::DTYPE_Q8_0},
                    {v1::DTYPE_Q8_0}),
              HasSubstr("input 0 is q8_0"));
  EXPECT_THAT(Error(Region({Unary(v1::UNARY_EXP, 0, kF32)}, {0}), {v1::DTYPE_UNSPECIFIED}, {kF32}),
              HasSubstr("input 0 is unspecified"));
  EXPECT_THAT(Error(Region({Cast(0, v1::DTYPE_Q4_0)}, {0}), {kF32}, {v1::DTYPE_Q4_0}),
              HasSubstr("instruction 0 (OP_CAST) casts to q4_0, not a dense type"));
  EXPECT_THAT(Error(Region({Constant(1, v1::DTYPE_Q4_K)}, {0}), {kF32}, {v1::DTYPE_Q4_K}),
              HasSubstr("instruction 0 (OP_CONSTANT) has dtype q4_k"));
}

TEST(ElementwiseRegionTest, RejectsUnknownOpsAndKinds) {
  v1::FusedInstr mm;
  mm.set_op(v1::OP_MATMUL);
  mm.add_args(0);
  mm.add_args(0);
  mm.set_dtype(kF32);
  EXPECT_THAT(Error(Region({mm}, {0}), {kF32}, {kF32}),
              HasSubstr("instruction 0 (OP_MATMUL) is not an elementwise instruction"));
  EXPECT_THAT(Error(Region({Unary(v1::UNARY_KIND_UNSPECIFIED, 0, kF32)}, {0}), {kF32}, {kF32}),
              HasSubstr("instruction 0 (OP_UNARY) has unknown unary kind 0"));
  EXPECT_THAT(
      Error(Region({Binary(static_cast<v1::BinaryKind>(99), 0, 0, kF32)}, {0}), {kF32}, {kF32}),
      HasSubstr("instruction 0 (OP_BINARY) has unknown binary kind 99"));
  EXPECT_THAT(Error(Region({Compare(v1::COMPARE_KIND_UNSPECIFIED, 0, 0)}, {0}), {kF32}, {kBool}),
              HasSubstr("instruction 0 (OP_COMPARE) has unknown compare kind 0"));
}

TEST(ElementwiseRegionTest, ChecksInputsAndResults) {
  const auto one = Region({Unary(v1::UNARY_EXP, 0, kF32)}, {0});
  EXPECT_THAT(Error(one, {}, {kF32}), HasSubstr("needs at least one input"));
  EXPECT_THAT(Error(Region({Unary(v1::UNARY_EXP, 0, kF32)}, {}), {kF32}, {}),
              HasSubstr("needs at least one result"));
  EXPECT_THAT(Error(one, {kF32}, {kF32, kF32}), HasSubstr("region has 1 results but 2 outputs"));
  EXPECT_THAT(Error(Region({Unary(v1::UNARY_EXP, 0, kF32)}, {1}), {kF32}, {kF32}),
              HasSubstr("region result 0 reads instruction 1, which does not exist"));
  EXPECT_THAT(Error(one, {kF32}, {kF16}),
              HasSubstr("output 0 is f16 but instruction 0 computes f32"));
}

KernelSpec SpecOf(v1::OpKind op, v1::Attrs attrs, std::vector<DType> inputs, DType output) {
  KernelSpec spec;
  spec.op = op;
  spec.attrs = std::move(attrs);
  for (DType d : inputs) spec.inputs.push_back(TensorDesc{d, {4}});
  spec.outputs.push_back(TensorDesc{output, {4}});
  return spec;
}

TEST(ElementwiseRegionTest, StandaloneOpIsAOneInstructionRegion) {
  v1::Attrs attrs;
  attrs.mutable_binary()->set_kind(v1::BINARY_SUB);
  absl::StatusOr<ElementwiseRegion> r =
      DecodeSpec(SpecOf(v1::OP_BINARY, attrs, {kI32, kI32}, kI32));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->instrs.size(), 1u);
  EXPECT_EQ(r->instrs[0].kind, v1::BINARY_SUB);
  EXPECT_EQ(r->instrs[0].args[0], 0);
  EXPECT_EQ(r->instrs[0].args[1], 1);
  EXPECT_EQ(r->results, std::vector<int>{0});

  v1::Attrs clamp;
  clamp.mutable_clamp()->set_max(6);
  r = DecodeSpec(SpecOf(v1::OP_CLAMP, clamp, {kF32}, kF32));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->instrs[0].has_lo);
  EXPECT_TRUE(r->instrs[0].has_hi);
  EXPECT_EQ(r->instrs[0].hi, 6);

  r = DecodeSpec(SpecOf(v1::OP_WHERE, v1::Attrs(), {kBool, kF16, kF16}, kF16));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->instrs[0].num_args, 3);

  // The same checks, on the spec's dtypes.
  r = DecodeSpec(SpecOf(v1::OP_BINARY, attrs, {kI32}, kI32));
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("expects 2 inputs and 1 output, got 1 and 1"));
  r = DecodeSpec(SpecOf(v1::OP_BINARY, attrs, {kI32, kF32}, kI32));
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("instruction 0 (OP_BINARY) mixes i32 and f32"));
  v1::Attrs cast;
  cast.mutable_cast()->set_to(kF16);
  r = DecodeSpec(SpecOf(v1::OP_CAST, cast, {kF32}, kI32));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("declares result i32, computes f16"));
  r = DecodeSpec(SpecOf(v1::OP_MATMUL, v1::Attrs(), {kF32, kF32}, kF32));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("OP_MATMUL is not an elementwise op"));
}

TEST(ElementwiseRegionTest, FusedSpecDecodesItsRegion) {
  v1::Attrs attrs;
  *attrs.mutable_fused_elementwise() =
      Region({Binary(v1::BINARY_ADD, 0, 1, kF32), Unary(v1::UNARY_RELU, 2, kF32)}, {1});
  KernelSpec spec;
  spec.op = v1::OP_FUSED_ELEMENTWISE;
  spec.attrs = attrs;
  spec.inputs = {TensorDesc{kF32, {2, 3}}, TensorDesc{kF32, {3}}};
  spec.outputs = {TensorDesc{kF32, {2, 3}}};
  absl::StatusOr<ElementwiseRegion> r = DecodeSpec(spec);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->instrs.size(), 2u);
  EXPECT_EQ(r->instrs[1].args[0], 2);
  spec.outputs[0].dtype = kF16;
  EXPECT_FALSE(DecodeSpec(spec).ok());
}

TEST(ElementwiseRegionTest, InstrForCopiesTheOpsAttributes) {
  v1::Attrs attrs;
  attrs.mutable_clamp()->set_min(-1);
  const v1::FusedInstr f = InstrFor(v1::OP_CLAMP, attrs, std::vector<int>{3}, kF32);
  EXPECT_EQ(f.op(), v1::OP_CLAMP);
  EXPECT_EQ(f.args_size(), 1);
  EXPECT_EQ(f.args(0), 3);
  EXPECT_EQ(f.dtype(), kF32);
  EXPECT_TRUE(f.clamp().has_min());
  EXPECT_FALSE(f.clamp().has_max());
  EXPECT_TRUE(IsStandaloneElementwise(v1::OP_WHERE));
  EXPECT_FALSE(IsStandaloneElementwise(v1::OP_FUSED_ELEMENTWISE));
  EXPECT_EQ(StandaloneArity(v1::OP_WHERE), 3);
}

}  // namespace
}  // namespace kiln::backend
