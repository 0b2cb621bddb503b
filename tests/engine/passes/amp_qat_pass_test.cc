// The AMP and QAT rewrites (engine/passes/amp.h, qat.h) as IR text in,
// checked IR text out: which ops AMP casts to the compute dtype and which it
// leaves in f32 (norms, softmax, losses, elementwise), and where QAT puts
// fake quantization (weights per channel, activations per tensor, LSQ's
// learned-scale params).
#include <gtest/gtest.h>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/ir/text.h"
#include "engine/passes/amp.h"
#include "engine/passes/qat.h"

namespace kiln::passes {
namespace {

std::string Normalized(const std::string& text) {
  std::string out;
  for (absl::string_view l : absl::StrSplit(text, '\n')) {
    l = absl::StripTrailingAsciiWhitespace(l);
    if (!l.empty()) absl::StrAppend(&out, l, "\n");
  }
  return out;
}

constexpr char kBlock[] = R"(graph "block"
input x: f32[4, 8]
input y: i64[4]
param w1: f32[8, 16]
param w2: f32[16, 3]
let h = layer_norm(x @ w1, axis=-1)
let a = softmax(h, axis=-1)
let logits = (a * h) @ w2
let again = h @ transpose(w1, perm=[1, 0])
let loss = softmax_cross_entropy(logits, y)
out loss
out again
)";

TEST(AmpPass, CastsProductsAndKeepsTheRestInF32) {
  auto g = ir::ParseGraph(kBlock);
  ASSERT_TRUE(g.ok()) << g.status();
  v1::AmpSpec spec;
  spec.set_compute(v1::DTYPE_BF16);
  ASSERT_TRUE(ValidateAmp(spec).ok());
  auto changed = ApplyAmp(**g, spec);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  const std::string got = ir::PrintGraph(**g);
  EXPECT_EQ(Normalized(got), Normalized(R"(
graph "block"
input x: f32[4, 8]
input y: i64[4]
param w1: f32[8, 16]
param w2: f32[16, 3]
let %9: f32[16, 8] = transpose(w1, perm=[1, 0])
let %12: bf16[4, 8] = cast(x, to=bf16)
let %13: bf16[8, 16] = cast(w1, to=bf16)
let %14: bf16[4, 16] = matmul(%12, %13)
let %15: f32[4, 16] = cast(%14, to=f32)
let h: f32[4, 16] = layer_norm(%15, axis=-1)
let a: f32[4, 16] = softmax(h, axis=-1)
let %7: f32[4, 16] = mul(a, h)
let %16: bf16[4, 16] = cast(%7, to=bf16)
let %17: bf16[16, 3] = cast(w2, to=bf16)
let %18: bf16[4, 3] = matmul(%16, %17)
let logits: f32[4, 3] = cast(%18, to=f32)
let loss: f32[] = softmax_cross_entropy(logits, y)
let %20: bf16[4, 16] = cast(h, to=bf16)
let %21: bf16[16, 8] = cast(%9, to=bf16)
let %22: bf16[4, 8] = matmul(%20, %21)
let again: f32[4, 8] = cast(%22, to=f32)
out loss
out again
)")) << got;
}

TEST(AmpPass, LeavesGraphsWithoutProductsAlone) {
  auto g = ir::ParseGraph("graph \"e\"\ninput x: f32[4]\nout y = exp(x)\n");
  ASSERT_TRUE(g.ok());
  v1::AmpSpec spec;
  spec.set_compute(v1::DTYPE_F16);
  auto changed = ApplyAmp(**g, spec);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
}

TEST(QatPass, QuantizesWeightsPerChannelAndActivationsPerTensor) {
  auto g = ir::ParseGraph(kBlock);
  ASSERT_TRUE(g.ok()) << g.status();
  v1::QatSpec spec;
  spec.set_weight_per_channel(true);
  ASSERT_TRUE(ValidateQat(spec).ok());
  std::vector<LsqScale> lsq;
  auto changed = ApplyQat(**g, spec, &lsq);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  EXPECT_TRUE(lsq.empty());
  const std::string got = ir::PrintGraph(**g);
  EXPECT_EQ(Normalized(got), Normalized(R"(
graph "block"
input x: f32[4, 8]
input y: i64[4]
param w1: f32[8, 16]
param w2: f32[16, 3]
let %9: f32[16, 8] = transpose(w1, perm=[1, 0])
let %12: f32[8, 16] = abs(w1)
let %13: f32[16] = reduce_max(%12, axes=[0])
const %14: f32[] = [9.313226e-10]
let %15: f32[] = reduce_max(%13, axes=[0])
let %16: f32[] = mul(%15, %14)
let %17: f32[16] = max(%13, %16)
const %18: f32[] = [127]
const %19: f32[] = [1e-30]
let %20: f32[16] = max(%17, %19)
let %21: f32[16] = div(%20, %18)
let %22: f32[8, 16] = fake_quantize(w1, %21, bits=8, axis=1, symmetric=true)
let %23: f32[4, 8] = abs(x)
let %24: f32[] = reduce_max(%23, axes=[0, 1])
const %25: f32[] = [9.313226e-10]
let %26: f32[] = mul(%24, %25)
let %27: f32[] = max(%24, %26)
const %28: f32[] = [127]
const %29: f32[] = [1e-30]
let %30: f32[] = max(%27, %29)
let %31: f32[] = div(%30, %28)
let %32: f32[4, 8] = fake_quantize(x, %31, bits=8, symmetric=true)
let %4: f32[4, 16] = matmul(%32, %22)
let h: f32[4, 16] = layer_norm(%4, axis=-1)
let a: f32[4, 16] = softmax(h, axis=-1)
let %7: f32[4, 16] = mul(a, h)
let %33: f32[16, 3] = abs(w2)
let %34: f32[3] = reduce_max(%33, axes=[0])
const %35: f32[] = [9.313226e-10]
let %36: f32[] = reduce_max(%34, axes=[0])
let %37: f32[] = mul(%36, %35)
let %38: f32[3] = max(%34, %37)
const %39: f32[] = [127]
const %40: f32[] = [1e-30]
let %41: f32[3] = max(%38, %40)
let %42: f32[3] = div(%41, %39)
let %43: f32[16, 3] = fake_quantize(w2, %42, bits=8, axis=1, symmetric=true)
let %44: f32[4, 16] = abs(%7)
let %45: f32[] = reduce_max(%44, axes=[0, 1])
const %46: f32[] = [9.313226e-10]
let %47: f32[] = mul(%45, %46)
let %48: f32[] = max(%45, %47)
const %49: f32[] = [127]
const %50: f32[] = [1e-30]
let %51: f32[] = max(%48, %50)
let %52: f32[] = div(%51, %49)
let %53: f32[4, 16] = fake_quantize(%7, %52, bits=8, symmetric=true)
let logits: f32[4, 3] = matmul(%53, %43)
let loss: f32[] = softmax_cross_entropy(logits, y)
let %54: f32[16, 8] = abs(%9)
let %55: f32[8] = reduce_max(%54, axes=[0])
const %56: f32[] = [9.313226e-10]
let %57: f32[] = reduce_max(%55, axes=[0])
let %58: f32[] = mul(%57, %56)
let %59: f32[8] = max(%55, %58)
const %60: f32[] = [127]
const %61: f32[] = [1e-30]
let %62: f32[8] = max(%59, %61)
let %63: f32[8] = div(%62, %60)
let %64: f32[16, 8] = fake_quantize(%9, %63, bits=8, axis=1, symmetric=true)
let %65: f32[4, 16] = abs(h)
let %66: f32[] = reduce_max(%65, axes=[0, 1])
const %67: f32[] = [9.313226e-10]
let %68: f32[] = mul(%66, %67)
let %69: f32[] = max(%66, %68)
const %70: f32[] = [127]
const %71: f32[] = [1e-30]
let %72: f32[] = max(%69, %71)
let %73: f32[] = div(%72, %70)
let %74: f32[4, 16] = fake_quantize(h, %73, bits=8, symmetric=true)
let again: f32[4, 8] = matmul(%74, %64)
out loss
out again
)")) << got;
}

TEST(QatPass, LsqAddsLearnedScaleParams) {
  auto g = ir::ParseGraph(kBlock);
  ASSERT_TRUE(g.ok()) << g.status();
  v1::QatSpec spec;
  spec.set_lsq(true);
  spec.set_weights_only(true);
  std::vector<LsqScale> lsq;
  auto changed = ApplyQat(**g, spec, &lsq);
  ASSERT_TRUE(changed.ok()) << changed.status();
  const std::string got = ir::PrintGraph(**g);
  EXPECT_EQ(Normalized(got), Normalized(R"(
graph "block"
input x: f32[4, 8]
input y: i64[4]
param w1: f32[8, 16]
param w2: f32[16, 3]
let %9: f32[16, 8] = transpose(w1, perm=[1, 0])
param "w1/lsq_scale": f32[]
let %13: f32[8, 16] = abs(w1)
let %14: f32[] = reduce_mean(%13, axes=[0, 1])
const %15: f32[] = [0.1774713]
let %16: f32[] = mul(%14, %15)
const %17: f32[] = [1e-30]
let %18: f32[] = max(%16, %17)
const %19: f32[] = [0]
let %20: bool[] = gt("w1/lsq_scale", %19)
let %21: f32[] = where(%20, "w1/lsq_scale", %18)
let %22: f32[8, 16] = fake_quantize_lsq(w1, %21, bits=8, symmetric=true)
let %4: f32[4, 16] = matmul(x, %22)
let h: f32[4, 16] = layer_norm(%4, axis=-1)
let a: f32[4, 16] = softmax(h, axis=-1)
let %7: f32[4, 16] = mul(a, h)
param "w2/lsq_scale": f32[]
let %24: f32[16, 3] = abs(w2)
let %25: f32[] = reduce_mean(%24, axes=[0, 1])
const %26: f32[] = [0.1774713]
let %27: f32[] = mul(%25, %26)
const %28: f32[] = [1e-30]
let %29: f32[] = max(%27, %28)
const %30: f32[] = [0]
let %31: bool[] = gt("w2/lsq_scale", %30)
let %32: f32[] = where(%31, "w2/lsq_scale", %29)
let %33: f32[16, 3] = fake_quantize_lsq(w2, %32, bits=8, symmetric=true)
let logits: f32[4, 3] = matmul(%7, %33)
let loss: f32[] = softmax_cross_entropy(logits, y)
param "again/lsq_scale": f32[]
let %35: f32[16, 8] = abs(%9)
let %36: f32[] = reduce_mean(%35, axes=[0, 1])
const %37: f32[] = [0.1774713]
let %38: f32[] = mul(%36, %37)
const %39: f32[] = [1e-30]
let %40: f32[] = max(%38, %39)
const %41: f32[] = [0]
let %42: bool[] = gt("again/lsq_scale", %41)
let %43: f32[] = where(%42, "again/lsq_scale", %40)
let %44: f32[16, 8] = fake_quantize_lsq(%9, %43, bits=8, symmetric=true)
let again: f32[4, 8] = matmul(h, %44)
out loss
out again
)")) << got;
  ASSERT_EQ(lsq.size(), 3u);  // w1, w2 and transpose(w1) (named after its matmul)
  EXPECT_TRUE(IsLsqScaleParam(lsq[0].param)) << lsq[0].param;
}

}  // namespace
}  // namespace kiln::passes
