// The .kiln text form: parse(print(parse(t))) == parse(t) over every op with
// inference, constants of every dtype, subgraphs and annotations; parse
// errors name line:col and what was expected.
#include "engine/ir/text.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "clients/cpp/graph_builder.h"
#include "engine/ir/verifier.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace kiln::ir {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// Structural equality: the wire form (ids, names, ops, operands, attrs, types,
// constant bytes, outputs) plus the compiler annotations it does not carry.
void ExpectSameGraph(const Graph& a, const Graph& b) {
  v1::Graph pa, pb;
  ExportGraph(a, &pa);
  ExportGraph(b, &pb);
  google::protobuf::util::MessageDifferencer diff;
  std::string report;
  diff.ReportDifferencesToString(&report);
  EXPECT_TRUE(diff.Compare(pa, pb)) << report;
  ASSERT_EQ(a.nodes().size(), b.nodes().size());
  for (size_t i = 0; i < a.nodes().size(); ++i) {
    const Node& x = *a.nodes()[i];
    const Node& y = *b.nodes()[i];
    EXPECT_EQ(x.path, y.path) << NodeLabel(x);
    EXPECT_EQ(x.device, y.device) << NodeLabel(x);
    EXPECT_EQ(x.offset, y.offset) << NodeLabel(x);
  }
}

ParseOptions Internal() {
  ParseOptions o;
  o.allow_internal_ops = true;
  return o;
}

// Parses `text`, prints it (with annotations), parses the print, and checks
// both graphs are the same and the print is a fixed point. Returns the print.
std::string RoundTrip(const std::string& text, const ParseOptions& options = {}) {
  auto first = ParseGraph(text, options);
  EXPECT_TRUE(first.ok()) << first.status() << "\n" << text;
  if (!first.ok()) return "";
  PrintOptions print;
  print.annotations = true;
  const std::string printed = PrintGraph(**first, print);
  auto second = ParseGraph(printed, options);
  EXPECT_TRUE(second.ok()) << second.status() << "\n" << printed;
  if (!second.ok()) return printed;
  ExpectSameGraph(**first, **second);
  EXPECT_EQ(PrintGraph(**second, print), printed);
  return printed;
}

constexpr char kDesignExample[] = R"(graph "attn_out"
input q: f32[?, 12, 128, 64]
input k: f32[?, 4, 128, 64]
input v: f32[?, 4, 128, 64]
param w_o: f32[768, 768]
param b_o: f32[768]
let a = attention(q, k, v, heads=12, kv_heads=4, mask=causal)
let y = reshape(transpose(a, perm=[0, 2, 1, 3]), shape=[-1, 128, 768]) @ w_o + b_o
out y
)";

TEST(TextTest, DesignExampleParsesAndPrints) {
  auto g = ParseGraph(kDesignExample);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->name(), "attn_out");
  // Nested expressions become one node each, in post-order.
  EXPECT_EQ(PrintGraph(**g), R"(graph "attn_out"
input q: f32[?, 12, 128, 64]
input k: f32[?, 4, 128, 64]
input v: f32[?, 4, 128, 64]
param w_o: f32[768, 768]
param b_o: f32[768]
let a: f32[?, 12, 128, 64] = attention(q, k, v, mask=causal, heads=12, kv_heads=4)
let %6: f32[?, 128, 12, 64] = transpose(a, perm=[0, 2, 1, 3])
let %7: f32[?, 128, 768] = reshape(%6, shape=[-1, 128, 768])
let %8: f32[?, 128, 768] = matmul(%7, w_o)
let y: f32[?, 128, 768] = add(%8, b_o)
out y
)");
  RoundTrip(kDesignExample);
}

TEST(TextTest, TaskGrammarExample) {
  const std::string text = R"(graph "attn_out"
input q: f32[?, 12, 128, 64]
input k: f32[batch, 4, 128, 64]
input v: f32[batch, 4, 128, 64]
param w_o: f32[768, 768]
param b_o: f32[768]
param w_frozen: f32[3] frozen
const c: f32[3] = [1, 2, 3]
let a = attention(q, k, v, heads=12, kv_heads=4, mask=causal)
let y = reshape(transpose(a, perm=[0, 2, 1, 3]), shape=[-1, 128, 768]) @ w_o + b_o
let (vals, idx) = topk(y, k=5)
out y
out logits = vals
out indices = idx
)";
  auto g = ParseGraph(text);
  ASSERT_TRUE(g.ok()) << g.status();
  const Node* topk = (*g)->FindNode((*g)->outputs()[1].value.node);
  EXPECT_EQ(topk->name, "vals");
  EXPECT_EQ(topk->op, v1::OP_TOPK);
  EXPECT_EQ((*g)->outputs()[2].value.output, 1);
  EXPECT_TRUE((*g)->Params()[2]->attrs.param().frozen());
  const std::string printed = RoundTrip(text);
  EXPECT_THAT(printed,
              HasSubstr("let (vals: f32[?, 128, 5], vals#1: i64[?, 128, 5]) = topk(y, k=5)"));
  EXPECT_THAT(printed, HasSubstr("param w_frozen: f32[3] frozen\n"));
  EXPECT_THAT(printed, HasSubstr("out indices = vals#1\n"));
}

TEST(TextTest, InfixPrecedenceAndLiterals) {
  auto g = ParseGraph(R"(
input x: f16[4]
input w: f16[4, 4]
let y = -x * 0.5 + x @ w / 2   # Python precedence: ((-x) * 0.5) + ((x @ w) / 2)
out y
)");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(PrintGraph(**g), R"(input x: f16[4]
input w: f16[4, 4]
let %2: f16[4] = neg(x)
const %3: f16[] = [0.5]
let %4: f16[4] = mul(%2, %3)
let %5: f16[4] = matmul(x, w)
const %6: f16[] = [2]
let %7: f16[4] = div(%5, %6)
let y: f16[4] = add(%4, %7)
out y
)");
}

TEST(TextTest, LiteralTakesThePartnersDtype) {
  auto g = ParseGraph(R"(
input i: i32[3]
input c: bool[3]
input x: f64[3]
let a = 2 * i
let b = where(c, 1.5, x)
let d = max(x, -inf)
let e = i >= 0
out a
out b
out d
out e
)");
  ASSERT_TRUE(g.ok()) << g.status();
  for (const auto& n : (*g)->nodes()) {
    if (n->op != v1::OP_CONSTANT) continue;
    EXPECT_EQ(n->type().rank(), 0);
    EXPECT_TRUE(n->type().dtype == v1::DTYPE_I32 || n->type().dtype == v1::DTYPE_F64)
        << DTypeName(n->type().dtype);
  }
}

// One line per unary, binary, compare, reduce and pool kind: every family
// spelling resolves and prints back.
TEST(TextTest, EveryFamilySpelling) {
  std::vector<std::string> lines = {"input x: f32[2, 4, 6, 6]", "input y: f32[2, 4, 6, 6]"};
  int n = 0;
  auto add = [&](const std::string& call) {
    lines.push_back(absl::StrCat("let v", n++, " = ", call));
  };
  for (const auto* e :
       {v1::UnaryKind_descriptor(), v1::BinaryKind_descriptor(), v1::CompareKind_descriptor(),
        v1::ReduceKind_descriptor(), v1::PoolKind_descriptor()}) {
    for (int i = 1; i < e->value_count(); ++i) {
      std::string name = absl::AsciiStrToLower(e->value(i)->name());
      name = name.substr(name.find('_') + 1);
      if (e == v1::UnaryKind_descriptor()) add(absl::StrCat(name, "(x)"));
      if (e == v1::BinaryKind_descriptor() || e == v1::CompareKind_descriptor()) {
        add(absl::StrCat(name, "(x, y)"));
      }
      if (e == v1::ReduceKind_descriptor()) add(absl::StrCat("reduce_", name, "(x, axes=[1, -1])"));
      if (e == v1::PoolKind_descriptor()) add(absl::StrCat(name, "_pool(x, window=[2, 2])"));
    }
  }
  // The generic spelling names the kind as an attribute.
  add("unary(x, kind=relu)");
  lines.push_back(absl::StrCat("out o = v", n - 1));
  const std::string printed = RoundTrip(absl::StrJoin(lines, "\n"));
  EXPECT_THAT(printed, HasSubstr("= gelu_tanh(x)"));
  EXPECT_THAT(printed, HasSubstr("= reduce_prod(x, axes=[1, -1])"));
  EXPECT_THAT(printed, HasSubstr("= avg_pool(x, window=[2, 2])"));
  EXPECT_THAT(printed, HasSubstr("= ge(x, y)"));
  EXPECT_THAT(printed, HasSubstr(absl::StrCat("let v", n - 1, ": f32[2, 4, 6, 6] = relu(x)")));
}

TEST(TextTest, RoundTripsEveryOpWithInference) {
  RoundTrip(R"(graph "every_op"
input x: f32[2, 3]
input y: f32[2, 3]
input c: bool[2, 3]
input i: i32[2]
input a: f32[4, 2, 3]
param b: f32[3, 5]
input sa: f64[3, 3]
input sb: f64[3]
input h: f32[2, 8]
param g8: f32[8]
param b8: f32[8]
input img: f32[2, 4, 8, 8]
param s4: f32[4]
input q: f32[1, 4, 4, 8]
input k: f32[1, 2, 4, 8]
input v: f32[1, 2, 4, 8]
input m: bool[1, 4]
input bias: f32[1, 4, 4, 4]
input pos: i32[4]
input sig: f32[1, 2, 16]
param w1: f32[4, 2, 3]
param w2: f32[6, 2, 3, 3]
param bw2: f32[6]
param wt: f32[4, 3, 3, 3]
input cx: f32[4, 8, 2]
input re: f32[4, 8]
input s: f32[]
input s3: f32[3]
input q8: i8[2, 3]
param wq: q4_0[64, 32]
input a64: f32[2, 64]
input logits: f32[4, 10]
input labels: i64[4]
input upd: f32[2, 2]
let w = where(c, x, y)
let ca = cast(x, to=f16)
let cl = clamp(x, min=-1, max=1.5)
let cl2 = clamp(x, max=6)
let mm = matmul(a, b)
let mt = matmul(a, a, transpose_b=true)
let dg = dot_general(a, a, lhs_contracting=[2], rhs_contracting=[2], lhs_batch=[0], rhs_batch=[0])
let ds = dense_solve(sa, sb)
let sm = softmax(x, axis=0)
let lsm = log_softmax(x)
let ln = layer_norm(h, g8, b8, axis=-1, epsilon=1e-05)
let rn = rms_norm(h, g8, epsilon=1e-06)
let gn = group_norm(img, s4, s4, groups=2, epsilon=0.001)
let ro = rope(q, theta=500000, rotary_dim=4, interleaved=true)
let ro2 = rope(q, pos, position_offset=3)
let at1 = attention(q, k, v, mask=sliding_window, window=2, softcap=30, scale=0.125)
let at2 = attention(q, k, v, m, mask=custom)
let at3 = attention(q, k, v, bias, mask=bias)
let at4 = attention(q, k, v, mask=prefix, prefix=1)
let rs = reshape(x, shape=[3, 2])
let tr = transpose(x, perm=[1, 0])
let sl = slice(x, start=[0], stop=[-1], step=[2], axes=[1])
let cc = concat(x, y, x, axis=0)
let ex = expand(s3, shape=[2, 3])
let pd = pad(x, low=[0, 1], high=[1, 0], value=0.5, mode=reflect)
let ga = gather(x, i, axis=1)
let sc = scatter_add(x, i, upd, axis=1)
let rd = reduce_sum(x, axes=[1], keepdims=true)
let am = argmax(x, axis=1, index_dtype=i32)
let cs = cumsum(x, axis=1, exclusive=true, reverse=true)
let (tv, ti) = topk(x, k=2, axis=1, smallest=true, index_dtype=i32)
let cv1 = conv(sig, w1)
let cv2 = conv(img, w2, bw2, stride=[2, 2], dilation=[1, 1], pad_low=[1, 1], pad_high=[1, 1], groups=2)
let ct = conv_transpose2d(img, wt, stride=[2, 2], output_padding=[1, 1])
let mp = max_pool(img, window=[2, 2])
let ap = avg_pool(img, window=[3, 3], stride=[1, 1], pad_low=[1, 1], pad_high=[1, 1], count_include_pad=true)
let ff = fft(cx, inverse=true, normalize=true)
let rf = rfft(re, n=8)
let irf = irfft(cx)
let qz = quantize(x, s, bits=8, symmetric=true, to=i8)
let dq = dequantize(q8, s, to=f32)
let dqb = dequantize(wq, to=f16)
let fq = fake_quantize(x, s3, bits=4, axis=1)
let fql = fake_quantize_lsq(x, s, bits=8)
let dmm = dequant_matmul(a64, wq)
let ce = softmax_cross_entropy(logits, labels, reduction=sum, label_smoothing=0.1, ignore_index=-100)
let mse = mean_squared_error(x, y, reduction=none)
let ar = all_reduce(x, kind=sum, group=[0, 1])
let ag = all_gather(x, axis=0, group=[0, 1])
let rsc = reduce_scatter(x, kind=max, axis=0, group=[0, 1])
let cu: f32[2, 3] = custom(x, name="my_op", payload=hex"00ff10")
let (cu2: f32[2], cu3: i32[]) = custom(x, y, name="pair")
out w
)");
}

TEST(TextTest, RoundTripsControlFlowSubgraphs) {
  const std::string printed = RoundTrip(R"(graph "loops"
input c0: f32[3]
input xs: f32[5, 3]
input p: bool[]
input i0: i32[]
let (cf, ys) = scan(c0, xs, body=graph "step" {
  input c: f32[3]
  input xt: f32[3]
  let s = c + xt
  out carry = s
  out y = s * 2.0
}, num_carries=1, length=5)
let r = if(p, c0, then_branch=graph "then" {
  input t: f32[3]
  out o = relu(t)
}, else_branch=graph "else" {
  input e: f32[3]
  out o = -e
})
let (n, acc) = while(i0, c0, cond=graph "cond" {
  input i: i32[]
  input a: f32[3]
  out more = i < 10
}, body=graph "body" {
  input i: i32[]
  input a: f32[3]
  out i1 = i + 1
  out a1 = scan(a, body=graph "inner" {
      input z: f32[3]
      out z1 = z
    }, num_carries=1, length=3)
}, max_iterations=100)
out ys
out r
out acc
)");
  EXPECT_THAT(printed, HasSubstr("body=graph \"step\" {\n  input c: f32[3]\n"));
  EXPECT_THAT(printed, HasSubstr("scan(a, body=graph \"inner\" {\n    input z: f32[3]\n"));
}

TEST(TextTest, RoundTripsInternalOps) {
  const std::string text = R"(
input x: f32[2, 3]
input y: f32[2, 3]
input a: f32[2, 3]
param b: f32[3, 5]
param bias: f32[5]
param g: f32[3]
let (fe, fe_mask) = fused_elementwise(x, y, instrs=[{op=binary, binary={kind=add}, args=[0, 1], dtype=f32, origin_node=7}, {op=unary, unary={kind=relu}, args=[2], dtype=f32}, {op=constant, dtype=f32, scalar=0.25}, {op=compare, compare={kind=gt}, args=[3, 4], dtype=bool}], results=[1, 3])
let fm = fused_matmul(a, b, bias, has_bias=true, activation=gelu)
let (rn, sum) = fused_residual_norm(x, y, g, g, axis=-1, epsilon=1e-05, emit_sum=true, has_scale=true, has_bias=true)
let cp = copy(x, from_device="cpu:0", to_device="cuda:0") {device="cuda:0"}
out fe
out fe_mask
out fm
out rn
out sum
out cp
)";
  const std::string printed = RoundTrip(text, Internal());
  EXPECT_THAT(printed, HasSubstr("(fe: f32[2, 3], fe#1: bool[2, 3]) = fused_elementwise(x, y, "
                                 "instrs=[{op=binary, args=[0, 1], dtype=f32, origin_node=7, "
                                 "binary={kind=add}}, "));
  auto client = ParseGraph(text);
  ASSERT_FALSE(client.ok());
  EXPECT_THAT(client.status().message(), HasSubstr("internal op"));
}

TEST(TextTest, ConstantsOfEveryDtypeRoundTripExactly) {
  std::string big;
  for (int i = 0; i < 100; ++i) absl::StrAppend(&big, i == 0 ? "" : ", ", i * 0.1);
  const std::string printed = RoundTrip(absl::StrCat(R"(
const cf32: f32[2, 2] = [0.1, -2.5e-8, 3.4028235e+38, -0]
const cf16: f16[4] = [1, 0.333, 65504, -inf]
const cbf16: bf16[2] = [3.14159, 1e-30]
const cf64: f64[3] = [0.1, 1e300, 5e-324]
const ci8: i8[2] = [-128, 127]
const cu8: u8[2] = [0, 255]
const ci16: i16[2] = [-32768, 32767]
const ci32: i32[2] = [-2147483648, 2147483647]
const ci64: i64[3] = [-9223372036854775808, 9223372036854775807, 9007199254740993]
const cb: bool[3] = [true, false, 1]
const scalar: f32[] = 0.5
const empty: f32[0, 3] = []
const nans: f32[2] = hex"0000c07f0100c0ff"
const q: q8_0[32] = hex"0000)",
                                                     std::string(64, 'a'), R"("
const big: f32[100] = [)",
                                                     big, R"(]
out o = cf32
)"));
  EXPECT_THAT(printed, HasSubstr("const cf32: f32[2, 2] = [0.1, -2.5e-08, 3.4028235e+38, -0]\n"));
  EXPECT_THAT(printed, HasSubstr("const cf16: f16[4] = [1, 0.3330078, 65504, -inf]\n"));
  EXPECT_THAT(printed, HasSubstr("const ci64: i64[3] = [-9223372036854775808, 9223372036854775807, "
                                 "9007199254740993]\n"));
  EXPECT_THAT(printed, HasSubstr("const cb: bool[3] = [true, false, true]\n"));
  EXPECT_THAT(printed, HasSubstr("const scalar: f32[] = [0.5]\n"));
  EXPECT_THAT(printed, HasSubstr("const empty: f32[0, 3] = []\n"));
  // NaN payloads, quantized blocks and long tensors print as hex bytes.
  EXPECT_THAT(printed, HasSubstr("const nans: f32[2] = hex\"0000c07f0100c0ff\"\n"));
  EXPECT_THAT(printed, HasSubstr("const big: f32[100] = hex\"00000000cdcccc3d"));
}

TEST(TextTest, SymbolicDimsAndQuotedNames) {
  const std::string printed = RoundTrip(R"(
input x: f32[batch, ?, 8]
input "weird name": f32[8, 4]
input "let": f32[4]
let "y 1" = x @ "weird name" + "let"
let "n.o.t-ident" = relu("y 1")
let layer.0.out = softmax("n.o.t-ident")
out "out" = layer.0.out
out layer.0.out
)");
  EXPECT_THAT(printed, HasSubstr("let \"y 1\": f32[batch, ?, 4] = add(%3, \"let\")\n"));
  EXPECT_THAT(printed, HasSubstr("let layer.0.out: f32[batch, ?, 4] = softmax(\"n.o.t-ident\")\n"));
  EXPECT_THAT(printed, HasSubstr("out \"out\" = layer.0.out\nout layer.0.out\n"));
}

TEST(TextTest, UnderscoreDiscardsOnlyLaterTupleResults) {
  // `_` after the first tuple target drops a result; as a plain name it is a name.
  const std::string printed = RoundTrip(R"(
input x: f32[5]
let (v, _) = topk(x, k=2)
let _ = relu(v)
out y = _
)");
  EXPECT_THAT(printed, HasSubstr("let _: f32[2] = relu(v)\nout y = _\n"));
}

TEST(TextTest, AnnotationsPrintOnlyWhenAsked) {
  const std::string text = R"(
input x: f32[4] {device="cpu:0", offset=0}
let y = relu(x) {path=native, device="cpu:0", offset=4096}
let z = exp(y) {path=common_ir}
out z
)";
  auto g = ParseGraph(text);
  ASSERT_TRUE(g.ok()) << g.status();
  const Node& y = *(*g)->nodes()[1];
  EXPECT_EQ(y.path, v1::PATH_NATIVE);
  EXPECT_EQ(y.device, "cpu:0");
  EXPECT_EQ(y.offset, 4096);
  EXPECT_THAT(PrintGraph(**g), Not(HasSubstr("{")));
  const std::string printed = RoundTrip(text);
  EXPECT_THAT(printed, HasSubstr("input x: f32[4] {device=\"cpu:0\", offset=0}\n"));
  EXPECT_THAT(printed, HasSubstr("= relu(x) {path=native, device=\"cpu:0\", offset=4096}\n"));
}

TEST(TextTest, NodesWithoutUniqueNamesPrintById) {
  GraphBuilder b("dups");
  auto x = b.input("x", v1::DTYPE_F32, {int64_t{4}});
  auto r1 = b.relu(x);
  b.named("h");
  auto r2 = b.relu(r1);
  b.named("h");
  auto r3 = b.exp(r2);
  b.named("x");  // collides with the input: the input keeps its name
  b.output("out", r3);
  auto g = ImportGraph(b.Build());
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(PrintGraph(**g), R"(graph "dups"
input x: f32[4]
let %1: f32[4] = relu(x)
let %2: f32[4] = relu(%1)
let %3: f32[4] = exp(%2)
out "out" = %3
)");
}

TEST(TextTest, ParseGraphProtoExportsTheWireForm) {
  auto proto = ParseGraphProto(kDesignExample);
  ASSERT_TRUE(proto.ok()) << proto.status();
  EXPECT_EQ(proto->name(), "attn_out");
  EXPECT_EQ(proto->nodes_size(), 10);
  EXPECT_EQ(proto->nodes(6).op(), v1::OP_TRANSPOSE);
  EXPECT_EQ(proto->nodes(6).operands(0).node(), 5);
  auto again = ImportGraph(*proto);
  ASSERT_TRUE(again.ok()) << again.status();
  auto parsed = ParseGraph(kDesignExample);
  ASSERT_TRUE(parsed.ok());
  ExpectSameGraph(**parsed, **again);
}

TEST(TextTest, TypeAnnotationsAreChecked) {
  EXPECT_TRUE(ParseGraph("input x: f32[b, 3]\nlet y: f32[?, 3] = relu(x)\nout y").ok());
  EXPECT_TRUE(ParseGraph("input x: f32[b, 3]\nlet y: f32[b, 3] = relu(x)\nout y").ok());
  auto bad = ParseGraph("input x: f32[2, 3]\nlet y: f32[3, 2] = relu(x)\nout y");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "2:5: declared f32[3, 2] but inferred f32[2, 3]");
}

struct ErrorCase {
  const char* text;
  const char* message;  // "line:col: " then text the message contains
};

TEST(TextTest, ParseErrorsSayWhereAndWhat) {
  const ErrorCase cases[] = {
      {"input x: f32[2]\nlet y = foo(x)\nout y", "2:9: unknown op `foo`"},
      {"input x: f32[2]\nlet y = relu(z)\nout y", "2:14: unknown value `z`"},
      {"input x: f32[2]\nlet y = relu(x\nout y", "3:1: expected `,`, got `out`"},
      {"input x: f32[2\nout x", "2:1: expected `,`, got `out`"},
      {"input x: g32[2]\nout x", "1:10: unknown dtype `g32`"},
      {"input x: f32[2]\nlet y = x +\nout y", "3:1: expected a value, got `out`"},
      {"input x: f32[2]\ninput x: f32[3]\nout x", "2:7: `x` is already defined at 1:7"},
      {"input x: f32[2]\nlet y = relu(x, axis=1)\nout y",
       "2:17: `relu` has no attribute `axis` (it has: kind)"},
      {"input x: f32[2]\nlet y = relu(x, kind=gelu)\nout y", "2:17: `relu` already says the kind"},
      {"input x: f32[2, 3]\ninput z: f32[4]\nlet y = x + z\nout y",
       "3:11: node 2 (add): operands do not broadcast: f32[2, 3] and f32[4]"},
      {"input x: f32[2]\nlet y = 0.5\nout y", "2:9: a literal alone has no dtype"},
      {"input x: f32[2]\nlet y = topk(x, k=1)\nout y", "2:1: topk has 2 results"},
      {"input x: f32[2]\nlet y = relu(topk(x, k=1))\nout y", "2:14: this call has 2 results"},
      {"input x: f32[2]\nlet y = x#3\nout y", "2:9: `x#3`: node 0 \"x\" (input) has 1 result(s)"},
      {"input x: f32[2]\nlet y = softmax(x, axis=true)\nout y",
       "2:25: expected an integer for axis, got `true`"},
      {"input x: f32[2]\nlet y = attention(x, x, x, mask=causl)\nout y",
       "2:33: unknown mask `causl`"},
      {"input x: f32[2]\nconst c: f32[3] = [1, 2]\nout x", "2:19: expected 3 values, got 2"},
      {"input x: f32[2]\nconst c: u8[1] = [256]\nout x", "2:19: 256 does not fit u8"},
      {"input x: f32[2]\nconst c: f32[2] = hex\"00\"\nout x",
       "2:19: needs 8 bytes, got 1"},
      {"input x: f32[2]\nlet y = \"unterminated\nout y", "2:9: unterminated string"},
      {"input x: f32[2]\nlet y = x $ 2\nout y", "2:11: unexpected character `$`"},
      {"input x: f32[2]\nlet y = fused_matmul(x, x)\nout y",
       "2:9: `fused_matmul` is an internal op"},
      {"input x: f32[2]\nlet y = relu(x)", "2:16: graph \"\" has no outputs"},
      {"input x: f32[2]\nout y = x\nout y = x", "3:5: duplicate output \"y\""},
      {"input x: f32[2]\nlet y = relu(x) {colour=red}\nout y", "2:18: expected an annotation"},
      {"input x: f32[2]\nlet y = x {device=\"cpu:0\"}\nout y", "2:11: annotations need a node"},
      {"input x: f32[2]\nlet y: f32[2] = custom(x, name=\"a\") * 2\nout y",
       "2:17: node 1 (custom): custom op \"a\" is not provided by any plugin kilnd loaded "
       "(--plugin_dir)"},
      {"input x: f32[2]\nlet (a, b) = relu(x)\nout a", "2:1: binds 2 names to one value"},
      {"input x: f32[2]\nlet y = exp(x)\ngraph \"late\"\nout y",
       "3:1: `graph \"name\"` must be the first line"},
      {"input x: f32[2]\nlet y = scan(x, body=graph \"b\" {\n  input c: f32[2]\n})\nout y",
       "2:22: graph \"b\" has no outputs"},
  };
  for (const ErrorCase& c : cases) {
    auto g = ParseGraph(c.text);
    ASSERT_FALSE(g.ok()) << c.text;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << g.status();
    const std::string want = c.message;
    const size_t at = want.find(": ") + 2;
    EXPECT_THAT(std::string(g.status().message()),
                AllOf(StartsWith(want.substr(0, at)), HasSubstr(want.substr(at))))
        << c.text;
  }
}

TEST(TextTest, HostileNestingIsBounded) {
  const std::string deep = absl::StrCat("input x: f32[2]\nlet y = ", std::string(100000, '('), "x",
                                        std::string(100000, ')'), "\nout y");
  auto g = ParseGraph(deep);
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(), HasSubstr("nesting deeper than"));
  auto huge = ParseGraph("const c: f32[1000000000000] = []\nout c");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(TextTest, CommentsAndOutputSuffixesShareTheHash) {
  auto g = ParseGraph(R"(# a graph
input x: f32[5]   # the input
let (v, i) = topk(x, k=2)  #no space needed either
let w = v#0 + v  # v#0 is v
out i2 = v#1
out w
)");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->outputs()[0].value.output, 1);
}

}  // namespace
}  // namespace kiln::ir
