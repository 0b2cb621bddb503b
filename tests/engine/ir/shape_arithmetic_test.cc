// Shape inference on client numbers at the edges of int64: every rule's
// arithmetic on attributes and dims either gives the exact shape or fails with
// INVALID_ARGUMENT naming the node, the attribute and the limit; never a wrapped
// value (a negative dim reads as a symbol, which crashed kilnd in ExportGraph),
// never a wrong shape. Graphs go in through the wire path kilnd uses: a text
// graph that verifies, one attribute edited in its wire form, ImportGraph.
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/ir/text.h"
#include "engine/ir/verifier.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln::ir {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t k2e62 = int64_t{1} << 62;
const std::string kMaxText = "9223372036854775807";  // the limit every overflow message names

using Edit = std::function<void(v1::Attrs&)>;

// `text` (which must verify) as the wire graph, with `edit` applied to the
// attributes of the node whose name is `node`.
v1::Graph Edited(const std::string& text, const std::string& node, const Edit& edit) {
  auto proto = ParseGraphProto(text);
  EXPECT_TRUE(proto.ok()) << proto.status() << "\n" << text;
  if (!proto.ok()) return {};
  bool found = false;
  for (v1::Node& n : *proto->mutable_nodes()) {
    if (n.name() != node) continue;
    edit(*n.mutable_attrs());
    n.clear_outputs();  // the printed type of the unedited node; clients need not declare one
    found = true;
  }
  EXPECT_TRUE(found) << "no node named " << node;
  return *proto;
}

// Imports the edited graph and expects INVALID_ARGUMENT with every needle.
void ExpectInvalid(const std::string& text, const std::string& node, const Edit& edit,
                   const std::vector<std::string>& needles) {
  auto g = ImportGraph(Edited(text, node, edit));
  ASSERT_FALSE(g.ok()) << "accepted; result " << TypeToString((*g)->TypeOf((*g)->outputs()[0].value));
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << g.status();
  for (const std::string& n : needles) EXPECT_THAT(std::string(g.status().message()), HasSubstr(n));
}

// Imports the edited graph and returns its first output's type as text.
std::string ResultType(const std::string& text, const std::string& node, const Edit& edit) {
  auto g = ImportGraph(Edited(text, node, edit));
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return "";
  return TypeToString((*g)->TypeOf((*g)->outputs()[0].value), (*g)->symbols());
}

void SetAll(google::protobuf::RepeatedField<int64_t>* f, std::vector<int64_t> v) {
  f->Assign(v.begin(), v.end());
}

// ------------------------------------------------------------------------ pad

constexpr char kPad[] = "input x: f32[4]\nlet p = pad(x, low=[0], high=[0])\nout p";
constexpr char kPadSymbolic[] = "input x: f32[n]\nlet p = pad(x, low=[0], high=[0])\nout p";

Edit PadBy(int64_t lo, int64_t hi) {
  return [=](v1::Attrs& a) {
    SetAll(a.mutable_pad()->mutable_low(), {lo});
    SetAll(a.mutable_pad()->mutable_high(), {hi});
  };
}

TEST(ShapeArithmeticTest, PadWhoseLowPlusHighOverflowsIsRejected) {
  // low + high wrapped to INT64_MIN; the result dim, negative, read as a symbol
  // that does not exist and ExportGraph indexed past the symbol table (SIGSEGV).
  for (const char* text : {kPad, kPadSymbolic}) {
    ExpectInvalid(text, "p", PadBy(k2e62, k2e62),
                  {"node 1 \"p\" (pad)", "low[0]=4611686018427387904 + high[0]=4611686018427387904",
                   "overflows int64 (max " + kMaxText + ")"});
  }
}

TEST(ShapeArithmeticTest, PadNearInt64MaxIsRejectedOrExactNeverWrapped) {
  // low + high wrapped to -2: the result was silently f32[2].
  ExpectInvalid(kPad, "p", PadBy(kMax, kMax), {"node 1 \"p\" (pad)", "overflows int64"});
  // low + high fits; adding the dim does not.
  ExpectInvalid(kPad, "p", PadBy(kMax - 2, 0),
                {"node 1 \"p\" (pad)", "dim 0 of size 4 + low[0]=9223372036854775805 + high[0]=0",
                 "overflows int64 (max " + kMaxText + ")"});
  // Fits in int64: the exact size, which is then over the tensor limit.
  auto g = ImportGraph(Edited(kPad, "p", PadBy(kMax - 10, 0)));
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kResourceExhausted) << g.status();
  EXPECT_THAT(std::string(g.status().message()),
              AllOf(HasSubstr("node 1 \"p\" (pad)"), HasSubstr("f32[9223372036854775801]")));
  EXPECT_EQ(ResultType(kPad, "p", PadBy(3, 5)), "f32[12]");
}

TEST(ShapeArithmeticTest, NegativePaddingIsRejected) {
  for (int64_t lo : {int64_t{-1}, int64_t{-5}, kMin}) {
    ExpectInvalid(kPad, "p", PadBy(lo, 0),
                  {"node 1 \"p\" (pad)", absl::StrCat("negative padding on dim 0: low[0]=", lo)});
  }
  ExpectInvalid(kPad, "p", PadBy(0, kMin), {"node 1 \"p\" (pad)", "high[0]=" + absl::StrCat(kMin)});
}

// ----------------------------------------------------------------------- conv

constexpr char kConv[] = R"(input x: f32[1, 1, 8]
input w: f32[1, 1, 3]
let c = conv(x, w)
out c)";

Edit ConvWith(std::function<void(v1::ConvAttrs&)> f) {
  return [f](v1::Attrs& a) { f(*a.mutable_conv()); };
}

TEST(ShapeArithmeticTest, ConvWithHugeStrideDilationOrPaddingIsRejectedAtVerify) {
  // Each of these passed the verifier and failed inside oneDNN as INTERNAL.
  ExpectInvalid(kConv, "c", ConvWith([](auto& a) { SetAll(a.mutable_stride(), {int64_t{1} << 31}); }),
                {"node 2 \"c\" (conv)", "attribute stride[0]=2147483648 exceeds the limit 1073741823"});
  ExpectInvalid(kConv, "c", ConvWith([](auto& a) { SetAll(a.mutable_stride(), {kMax}); }),
                {"node 2 \"c\" (conv)", "stride[0]=" + kMaxText, "limit 1073741823"});
  ExpectInvalid(kConv, "c", ConvWith([](auto& a) { SetAll(a.mutable_dilation(), {kMax}); }),
                {"node 2 \"c\" (conv)", "dilation[0]=" + kMaxText, "limit 1073741823"});
  ExpectInvalid(kConv, "c", ConvWith([](auto& a) { SetAll(a.mutable_pad_low(), {k2e62}); }),
                {"node 2 \"c\" (conv)", "pad_low[0]=4611686018427387904", "limit 1073741823"});
  ExpectInvalid(kConv, "c", ConvWith([](auto& a) { SetAll(a.mutable_pad_high(), {kMin}); }),
                {"node 2 \"c\" (conv)", "pad_high[0]=" + absl::StrCat(kMin), "must be >= 0"});
  // Attributes within the limit whose extents are not: padded input, dilated kernel.
  constexpr int64_t kAttrMax = (int64_t{1} << 30) - 1;
  ExpectInvalid(kConv, "c", ConvWith([](auto& a) {
                  SetAll(a.mutable_pad_low(), {kAttrMax});
                  SetAll(a.mutable_pad_high(), {kAttrMax});
                  SetAll(a.mutable_stride(), {kAttrMax});
                }),
                {"node 2 \"c\" (conv)", "8 padded by pad_low[0]=1073741823 and pad_high[0]=1073741823",
                 "is 2147483654, over the limit 2147483647"});
  constexpr char kConvK4[] = R"(input x: f32[1, 1, 8]
input w: f32[1, 1, 4]
let c = conv(x, w)
out c)";
  ExpectInvalid(kConvK4, "c", ConvWith([](auto& a) { SetAll(a.mutable_dilation(), {kAttrMax}); }),
                {"node 2 \"c\" (conv)", "kernel of 4 dilated by dilation[0]=1073741823 spans 3221225470",
                 "over the limit 2147483647"});
  // At the extent limit exactly: checked against the input, not rejected by the limit.
  ExpectInvalid(kConv, "c", ConvWith([](auto& a) { SetAll(a.mutable_dilation(), {kAttrMax}); }),
                {"node 2 \"c\" (conv)", "(8 padded to 8) is smaller than the dilated kernel 2147483647"});
  // Within every limit: the exact size (a stride past the input gives one output).
  EXPECT_EQ(ResultType(kConv, "c", ConvWith([](auto& a) { SetAll(a.mutable_stride(), {kAttrMax}); })),
            "f32[1, 1, 1]");
  EXPECT_EQ(ResultType(kConv, "c", ConvWith([](auto& a) {
              SetAll(a.mutable_pad_low(), {1000});
              SetAll(a.mutable_stride(), {7});
            })),
            "f32[1, 1, 144]");  // (8 + 1000 - 3) / 7 + 1
}

TEST(ShapeArithmeticTest, ConvGroupsThatOverflowTheChannelProductAreRejected) {
  // w [O, C/groups, k]: 4 * 2^62 wrapped to 0 == C, and the conv was accepted.
  // Symbolic channels so the unedited graph verifies; bound to 0 below.
  constexpr char kText[] = R"(input x: f32[1, c, 8]
input w: f32[0, 4, 3]
let c = conv(x, w)
out c)";
  auto g = ImportGraph(Edited(kText, "c", ConvWith([](auto& a) { a.set_groups(k2e62); })));
  ASSERT_TRUE(g.ok()) << g.status();
  const absl::Status s = Specialize(**g, {{"x", {1, 0, 8}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("node 2 \"c\" (conv)"),
                    HasSubstr("w has 4 input channels per group, x has 0 / 4611686018427387904")));
}

TEST(ShapeArithmeticTest, ConvTransposeArithmeticIsChecked) {
  constexpr char kText[] = R"(input x: f32[1, 1, ?, 0]
input w: f32[1, 2, 3, 3]
let t = conv_transpose2d(x, w)
out t)";
  auto edit = [](std::function<void(v1::ConvTranspose2dAttrs&)> f) -> Edit {
    return [f](v1::Attrs& a) { f(*a.mutable_conv_transpose2d()); };
  };
  // Specialized at a huge H: (H - 1) * stride overflows.
  auto g = ImportGraph(Edited(kText, "t", edit([](auto& a) { SetAll(a.mutable_stride(), {1 << 20, 1}); })));
  ASSERT_TRUE(g.ok()) << g.status();
  auto s = Specialize(**g, {{"x", {1, 1, k2e62, 0}}});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("node 2 \"t\" (conv_transpose2d)"), HasSubstr("output spatial dim 0"),
                    HasSubstr("overflows int64 (max " + kMaxText + ")")));
  ExpectInvalid(kText, "t", edit([](auto& a) { SetAll(a.mutable_output_padding(), {kMax, 0}); }),
                {"node 2 \"t\" (conv_transpose2d)", "output_padding[0]=" + kMaxText, "limit"});
  ExpectInvalid(kText, "t", edit([](auto& a) { a.set_groups(kMax); }),
                {"node 2 \"t\" (conv_transpose2d)", "output channels 2 per group * groups=" + kMaxText,
                 "overflows int64"});
  EXPECT_EQ(ResultType(kText, "t", edit([](auto& a) { SetAll(a.mutable_stride(), {2, 2}); })),
            "f32[1, 2, ?, 1]");  // (0 - 1) * 2 + (3 - 1) + 1
}

TEST(ShapeArithmeticTest, PoolGeometryIsBounded) {
  constexpr char kText[] = "input x: f32[1, 1, 8]\nlet m = max_pool(x, window=[2])\nout m";
  auto edit = [](std::function<void(v1::PoolAttrs&)> f) -> Edit {
    return [f](v1::Attrs& a) { f(*a.mutable_pool()); };
  };
  // window - 1 padding each side: in + lo + hi overflowed before.
  ExpectInvalid(kText, "m", edit([](auto& a) {
                  SetAll(a.mutable_window(), {kMax});
                  SetAll(a.mutable_pad_low(), {kMax - 1});
                  SetAll(a.mutable_pad_high(), {kMax - 1});
                }),
                {"node 1 \"m\" (pool)", "window[0]=" + kMaxText, "limit 1073741823"});
  ExpectInvalid(kText, "m", edit([](auto& a) { SetAll(a.mutable_stride(), {0}); }),
                {"node 1 \"m\" (pool)", "stride[0]=0 must be >= 1"});
  EXPECT_EQ(ResultType(kText, "m", edit([](auto& a) { SetAll(a.mutable_stride(), {(1 << 30) - 1}); })),
            "f32[1, 1, 1]");
}

// ---------------------------------------------------------------------- slice

constexpr char kSlice[] = "input x: f32[10]\nlet s = slice(x, start=[0], stop=[10])\nout s";

Edit SliceBy(int64_t start, int64_t stop, int64_t step) {
  return [=](v1::Attrs& a) {
    SetAll(a.mutable_slice()->mutable_start(), {start});
    SetAll(a.mutable_slice()->mutable_stop(), {stop});
    SetAll(a.mutable_slice()->mutable_step(), {step});
  };
}

TEST(ShapeArithmeticTest, SliceWithAHugeStepHasOneElement) {
  // stop - start + step - 1 overflowed to a negative dim: "still symbolic".
  EXPECT_EQ(ResultType(kSlice, "s", SliceBy(0, 10, kMax)), "f32[1]");
  EXPECT_EQ(ResultType(kSlice, "s", SliceBy(3, 10, kMax - 1)), "f32[1]");
  EXPECT_EQ(ResultType(kSlice, "s", SliceBy(kMin, kMax, 3)), "f32[4]");  // clamped to 0..10
  EXPECT_EQ(ResultType(kSlice, "s", SliceBy(kMax, kMin, 1)), "f32[0]");
  EXPECT_EQ(ResultType(kSlice, "s", SliceBy(1, 10, 4)), "f32[3]");  // 1, 5, 9
  // Through specialization, where the report said "still symbolic".
  auto g = ImportGraph(
      Edited("input x: f32[n]\nlet s = slice(x, start=[0], stop=[10])\nout s", "s", SliceBy(0, 10, kMax)));
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(Specialize(**g, {{"x", {10}}}).ok());
  EXPECT_EQ(TypeToString((*g)->TypeOf((*g)->outputs()[0].value)), "f32[1]");
}

TEST(ShapeArithmeticTest, SliceStepOfZeroOrBelowIsRejected) {
  for (int64_t step : {int64_t{0}, int64_t{-1}, kMin}) {
    ExpectInvalid(kSlice, "s", SliceBy(0, 10, step),
                  {"node 1 \"s\" (slice)", absl::StrCat("attribute step[0]=", step, " must be >= 1")});
  }
}

// ---------------------------------------------------- reshape, expand, concat

TEST(ShapeArithmeticTest, ReshapeAndExpandProductsThatOverflowAreRejected) {
  constexpr char kReshape[] = "input x: f32[0]\nlet r = reshape(x, shape=[0])\nout r";
  for (std::vector<int64_t> shape : {std::vector<int64_t>{int64_t{1} << 32, int64_t{1} << 32},
                                     std::vector<int64_t>{-1, k2e62, 4}}) {
    ExpectInvalid(kReshape, "r",
                  [&](v1::Attrs& a) { SetAll(a.mutable_reshape()->mutable_shape(), shape); },
                  {"node 1 \"r\" (reshape)", "attribute shape [", "overflows int64 (max " + kMaxText});
  }
  // [0, 2^62] has no elements: exact, accepted.
  EXPECT_EQ(ResultType(kReshape, "r",
                       [](v1::Attrs& a) { SetAll(a.mutable_reshape()->mutable_shape(), {0, k2e62}); }),
            "f32[0, 4611686018427387904]");
  constexpr char kExpand[] = "input x: f32[1]\nlet e = expand(x, shape=[1])\nout e";
  ExpectInvalid(kExpand, "e",
                [](v1::Attrs& a) { SetAll(a.mutable_expand()->mutable_shape(), {k2e62, 2, 1}); },
                {"node 1 \"e\" (expand)", "attribute shape [4611686018427387904, 2, 1] overflows int64"});
}

TEST(ShapeArithmeticTest, ConcatWhoseSizesSumPastInt64IsRejected) {
  // The sum wrapped negative, read as a symbol (ExportGraph crashed on it).
  const std::string big = absl::StrCat(k2e62 + (k2e62 >> 1));  // 0.75 * 2^63
  const std::string text = absl::StrCat("input x: f32[?, ", big, "]\nlet c = concat(x, x, axis=1)\nout c");
  auto g = ParseGraphProto(absl::StrCat("input x: f32[?, ", big, "]\nlet c = relu(x)\nout c"));
  ASSERT_TRUE(g.ok()) << g.status();
  // Build concat(x, x) in the wire form: the text parser would reject it too.
  v1::Node& c = *g->mutable_nodes(1);
  c.set_op(v1::OP_CONCAT);
  c.set_name("c");
  c.clear_attrs();
  c.clear_outputs();
  c.mutable_attrs()->mutable_concat()->set_axis(1);
  const v1::ValueRef x = c.operands(0);
  *c.add_operands() = x;
  auto r = ImportGraph(*g);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              AllOf(HasSubstr("node 1 \"c\" (concat)"),
                    HasSubstr(absl::StrCat("concatenated dim 1: ", big, " (operands 0..0) + ", big)),
                    HasSubstr("overflows int64 (max " + kMaxText + ")")));
  // The text form goes through the same rule.
  auto parsed = ParseGraph(text);
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("overflows int64"));
}

// --------------------------------------------------------------- other rules

TEST(ShapeArithmeticTest, IrfftOfAnEmptyAxisIsRejectedNotASymbol) {
  // 2 * (0 - 1) = -2 is SymbolDim(0): a symbol the graph does not have.
  auto g = ParseGraph("input x: f32[3, 0, 2]\nlet f = irfft(x)\nout f");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(g.status().message()),
              AllOf(HasSubstr("(irfft)"), HasSubstr("irfft of an empty axis needs attribute n")));
  auto ok = ParseGraph("input x: f32[3, 0, 2]\nlet f = irfft(x, n=6)\nout f");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(TypeToString((*ok)->TypeOf((*ok)->outputs()[0].value)), "f32[3, 6]");
}

TEST(ShapeArithmeticTest, AllGatherOverflowIsRejected) {
  // Axis 0 is symbolic (no product); gathering along axis 1 doubles 2^62.
  constexpr char kText[] = "input x: f32[?, 4611686018427387904]\nlet g = all_gather(x, axis=0, group=[0, 1])\nout g";
  EXPECT_EQ(ResultType(kText, "g", [](v1::Attrs&) {}), "f32[?, 4611686018427387904]");
  ExpectInvalid(kText, "g", [](v1::Attrs& a) { a.mutable_all_gather()->set_axis(1); },
                {"node 1 \"g\" (all_gather)", "dim 1 of 4611686018427387904 * group size 2",
                 "overflows int64 (max " + kMaxText + ")"});
}

TEST(ShapeArithmeticTest, RopePositionOffsetPastInt64IsRejected) {
  constexpr char kText[] = "input q: f32[1, 1, 4, 2]\nlet r = rope(q)\nout r";
  ExpectInvalid(kText, "r", [](v1::Attrs& a) { a.mutable_rope()->set_position_offset(kMax - 1); },
                {"node 1 \"r\" (rope)", "position_offset=9223372036854775806 + 3",
                 "overflows int64"});
  EXPECT_EQ(ResultType(kText, "r", [](v1::Attrs& a) { a.mutable_rope()->set_position_offset(kMax - 3); }),
            "f32[1, 1, 4, 2]");
}

TEST(ShapeArithmeticTest, SubgraphSymbolsDoNotLeakIntoTheCallersGraph) {
  // A custom op in a branch declares a symbol of the branch's own table; the
  // if's result carried that index into a graph with no symbols.
  auto g = ParseGraph(R"(input p: bool[]
input x: f32[2]
let r = if(p, x, then_branch=graph "then" {
  input t: f32[2]
  let c: f32[foo] = custom(t, name="k")
  out o = c
}, else_branch=graph "else" {
  input e: f32[2]
  let c: f32[foo] = custom(e, name="k")
  out o = c
})
out r)");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE((*g)->symbols().empty());
  EXPECT_EQ(TypeToString((*g)->TypeOf((*g)->outputs()[0].value), (*g)->symbols()), "f32[?]");
  v1::Graph proto;
  ExportGraph(**g, &proto);
  EXPECT_EQ(proto.nodes(2).outputs(0).dims(0).symbol(), "?");
}

// Defence in depth: a dim that names no symbol never leaves InferNode, and the
// printers and ExportGraph never read out of the symbol table for one.
TEST(ShapeArithmeticTest, DimsNamingNoSymbolAreRejectedAndNeverReadOutOfRange) {
  Graph g;
  auto x = std::make_unique<Node>();
  x->id = 0;
  x->name = "x";
  x->op = v1::OP_INPUT;
  x->outputs.push_back(TensorType(v1::DTYPE_F32, {2}));
  g.AddNode(std::move(x));
  auto c = std::make_unique<Node>();
  c->id = 1;
  c->name = "c";
  c->op = v1::OP_CUSTOM;
  c->operands.push_back(ValueRef{0, 0});
  c->attrs.mutable_custom()->set_name("k");
  c->outputs.push_back(TensorType(v1::DTYPE_F32, {SymbolDim(5), kMin + 4}));
  Node* cp = g.AddNode(std::move(c));
  g.outputs().push_back(GraphOutput{"c", cp->out()});

  const absl::Status s = InferNode(g, *cp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("node 1 \"c\" (custom)"), HasSubstr("result dim 0 is -7"),
                    HasSubstr("neither a size nor a symbol")));

  EXPECT_EQ(TypeToString(cp->type(), g.symbols()), "f32[$5, $9223372036854775802]");
  v1::Graph proto;
  ExportGraph(g, &proto);
  EXPECT_EQ(proto.nodes(1).outputs(0).dims(0).symbol(), "?");
  EXPECT_EQ(proto.nodes(1).outputs(0).dims(1).symbol(), "?");
  EXPECT_THAT(PrintGraph(g), HasSubstr("f32[?, ?]"));
}

}  // namespace
}  // namespace kiln::ir

namespace kiln::ir {
namespace {

// DenseSolve solves one system per batch element: A's and b's batch dims must
// agree (it used to take b's type whatever A's batch was).
TEST(ShapeArithmeticTest, DenseSolveBatchDimsMustAgree) {
  auto bad = ParseGraph("graph \"s\"\ninput a: f32[2, 3, 3]\ninput b: f32[5, 3]\nlet x = dense_solve(a, b)\nout x\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("batch dims of A f32[2, 3, 3] and b f32[5, 3] differ at dim 0"));
  auto good = ParseGraph("graph \"s\"\ninput a: f32[2, 3, 3]\ninput b: f32[2, 3, 4]\nlet x = dense_solve(a, b)\nout x\n");
  EXPECT_TRUE(good.ok()) << good.status();
}

}  // namespace
}  // namespace kiln::ir
