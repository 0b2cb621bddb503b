// The verifier: one test per class of bad graph. Each asserts the status code
// and that the message names the offending node by id, name and op (or the
// graph, for graph-level limits). Plus Specialize.
#include "engine/ir/verifier.h"

#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "clients/cpp/graph_builder.h"
#include "engine/ir/text.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln::ir {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr DType kF32 = v1::DTYPE_F32;
using V = GraphBuilder::Value;

void ExpectRejected(const v1::Graph& g, absl::StatusCode code, const std::string& label,
                    const std::string& reason, const VerifyOptions& options = {}) {
  auto r = ImportGraph(g, options);
  ASSERT_FALSE(r.ok()) << "accepted: " << g.DebugString();
  EXPECT_EQ(r.status().code(), code) << r.status();
  EXPECT_THAT(std::string(r.status().message()), AllOf(HasSubstr(label), HasSubstr(reason)));
}

void ExpectInvalid(const v1::Graph& g, const std::string& label, const std::string& reason,
                   const VerifyOptions& options = {}) {
  ExpectRejected(g, absl::StatusCode::kInvalidArgument, label, reason, options);
}

// x: f32[2, 3] -> y = relu(operand) -> output y; `operand` may be anything.
v1::Graph ReluOf(V operand) {
  GraphBuilder b("g");
  b.input("x", kF32, {int64_t{2}, int64_t{3}});
  const V y = b.relu(operand);
  b.named("y");
  b.output("y", y);
  return b.Build();
}

TEST(VerifierTest, AcceptsAWellFormedGraph) { EXPECT_TRUE(ImportGraph(ReluOf(V{0, 0})).ok()); }

TEST(VerifierTest, Cycle) {
  GraphBuilder b("g");
  b.input("x", kF32, {int64_t{2}});
  b.relu(V{2, 0});  // uses b, defined next
  b.named("a");
  const V bb = b.relu(V{1, 0});
  b.named("b");
  b.output("y", bb);
  ExpectInvalid(b.Build(), "node 1 \"a\" (relu) uses node 2 \"b\" (relu)", "cycle");
}

TEST(VerifierTest, DanglingOperand) {
  ExpectInvalid(ReluOf(V{99, 0}), "node 1 \"y\" (relu)",
                "operand 0 names node 99, which does not exist");
}

TEST(VerifierTest, OperandOutputIndexOutOfRange) {
  ExpectInvalid(ReluOf(V{0, 2}), "node 1 \"y\" (relu)", "reads output 2 of node 0 \"x\" (input)");
  ExpectInvalid(ReluOf(V{0, -1}), "node 1 \"y\" (relu)", "reads output -1");
}

TEST(VerifierTest, WrongOperandCount) {
  GraphBuilder b("g");
  const V x = b.input("x", kF32, {int64_t{2}});
  v1::Attrs attrs;
  attrs.mutable_binary()->set_kind(v1::BINARY_ADD);
  b.output("s", b.node(v1::OP_BINARY, {x, x, x}, attrs, "s"));
  ExpectInvalid(b.Build(), "node 1 \"s\" (add)", "expects 2 operand(s), got 3");
}

TEST(VerifierTest, DtypeMismatch) {
  GraphBuilder b("g");
  const V x = b.input("x", kF32, {int64_t{2}});
  const V h = b.input("h", v1::DTYPE_F16, {int64_t{2}});
  b.output("s", b.add(x, h));
  b.named("s");
  ExpectInvalid(b.Build(), "node 2 \"s\" (add)",
                "dtype mismatch: operand 0 is f32[2], operand 1 is f16[2]");
}

TEST(VerifierTest, ShapeMismatch) {
  {
    GraphBuilder b("g");
    const V a = b.input("a", kF32, {int64_t{2}, int64_t{3}});
    const V w = b.param("w", kF32, {4, 5});
    b.output("y", b.matmul(a, w));
    b.named("mm");
    ExpectInvalid(b.Build(), "node 2 \"mm\" (matmul)",
                  "contracting dims differ: f32[2, 3] @ f32[4, 5]");
  }
  {
    GraphBuilder b("g");
    const V a = b.input("a", kF32, {int64_t{2}, int64_t{3}});
    const V c = b.input("c", kF32, {int64_t{4}});
    b.output("y", b.add(a, c));
    b.named("sum");
    ExpectInvalid(b.Build(), "node 2 \"sum\" (add)",
                  "operands do not broadcast: f32[2, 3] and f32[4]");
  }
}

TEST(VerifierTest, UnknownOpEnum) {
  v1::Graph g = ReluOf(V{0, 0});
  g.mutable_nodes(1)->set_op(static_cast<v1::OpKind>(999));
  ExpectInvalid(g, "node 1 \"y\"", "unknown op 999");
  g.mutable_nodes(1)->set_op(v1::OP_KIND_UNSPECIFIED);
  ExpectInvalid(g, "node 1 \"y\"", "unknown op 0");
}

TEST(VerifierTest, UnknownEnumInAttrs) {
  v1::Graph g = ReluOf(V{0, 0});
  g.mutable_nodes(1)->mutable_attrs()->mutable_unary()->set_kind(static_cast<v1::UnaryKind>(999));
  ExpectInvalid(g, "node 1 \"y\" (unary)", "unknown unary kind 999");

  auto node = [](const std::string& text) { return ParseGraphProto(text).value(); };
  v1::Graph cast = node("input x: f32[2]\nlet c = cast(x, to=f16)\nout c");
  cast.mutable_nodes(1)->mutable_attrs()->mutable_cast()->set_to(static_cast<DType>(999));
  ExpectInvalid(cast, "node 1 \"c\" (cast)", "attribute to=999 is not a dense dtype");
  // The text form writes unnamed enum numbers as digits, so bad graphs are easy to state.
  v1::Graph pad = node("input x: f32[2, 3]\nlet p = pad(x, low=[0, 0], high=[0, 0])\nout p");
  pad.mutable_nodes(1)->mutable_attrs()->mutable_pad()->set_mode(static_cast<v1::PadMode>(7));
  ExpectInvalid(pad, "node 1 \"p\" (pad)", "unknown pad mode 7");
  v1::Graph att = node(R"(input q: f32[1, 2, 4, 8]
let a = attention(q, q, q)
out a)");
  att.mutable_nodes(1)->mutable_attrs()->mutable_attention()->set_mask(
      static_cast<v1::MaskKind>(42));
  ExpectInvalid(att, "node 1 \"a\" (attention)", "unknown mask kind 42");
  auto reduce = ParseGraph("input x: f32[2, 3]\nlet r = reduce(x, kind=9)\nout r");
  ASSERT_FALSE(reduce.ok());
  EXPECT_THAT(reduce.status().message(), HasSubstr("node 1 (reduce): unknown reduce kind 9"));
}

TEST(VerifierTest, BadAttributeValues) {
  auto fails = [](const std::string& text, const std::string& label, const std::string& reason) {
    auto g = ParseGraph(text);
    ASSERT_FALSE(g.ok()) << text;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(g.status().message()), AllOf(HasSubstr(label), HasSubstr(reason)));
  };
  // The text parser names the node as it creates it; ImportGraph does the same
  // for the wire form (checked below for one case).
  fails("input x: f32[2, 3]\nlet t = transpose(x, perm=[0, 0])\nout t", "node 1 (transpose)",
        "attribute perm is not a permutation");
  fails("input x: f32[2, 3]\nlet r = reshape(x, shape=[5])\nout r", "node 1 (reshape)",
        "cannot reshape f32[2, 3] (6 elements) into 5 elements");
  fails("input x: f32[2, 3]\nlet s = softmax(x, axis=2)\nout s", "node 1 (softmax)",
        "attribute axis=2 is out of range for rank 2");
  fails("input x: f32[2, 3]\nlet n = layer_norm(x, epsilon=-1)\nout n", "node 1 (layer_norm)",
        "epsilon=-1 must be positive");

  GraphBuilder b("g");
  const V x = b.input("x", kF32, {int64_t{2}, int64_t{3}});
  b.output("t", b.transpose(x, {1, 1}));
  b.named("t");
  ExpectInvalid(b.Build(), "node 1 \"t\" (transpose)", "attribute perm is not a permutation");
}

TEST(VerifierTest, AttrsOfTheWrongOpKind) {
  v1::Graph g = ReluOf(V{0, 0});
  g.mutable_nodes(1)->mutable_attrs()->mutable_matmul();
  ExpectInvalid(g, "node 1 \"y\" (unary)", "attrs carry `matmul` but the op needs `unary`");
}

TEST(VerifierTest, ShapeArithmeticOverflowingInt64) {
  constexpr int64_t kHuge = int64_t{1} << 40;
  {
    GraphBuilder b("g");
    const V x = b.input("x", kF32, {int64_t{2}, int64_t{3}});
    b.output("r", b.reshape(x, {int64_t{1} << 62, 8}));
    b.named("r");
    ExpectInvalid(b.Build(), "node 1 \"r\" (reshape)",
                  "attribute shape [4611686018427387904, 8] overflows int64");
  }
  {
    GraphBuilder b("g");
    const V x = b.input("x", kF32, {int64_t{1}});
    b.output("e", b.expand(x, {kHuge, kHuge}));
    b.named("e");
    ExpectInvalid(b.Build(), "node 1 \"e\" (expand)", "overflows int64");
  }
  for (DType dt : {kF32, v1::DTYPE_Q4_0}) {
    GraphBuilder b("g");
    b.output("w", b.param("w", dt, {kHuge, kHuge}));
    ExpectInvalid(b.Build(), "node 0 \"w\" (param)", "overflows int64");
  }
  {
    // Symbolic until specialization; the bound sizes overflow.
    auto g = ParseGraph("input x: f32[a, b]\nlet y = relu(x)\nout y");
    ASSERT_TRUE(g.ok());
    auto s = Specialize(**g, {{"x", {kHuge, kHuge}}});
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()),
                AllOf(HasSubstr("node 0 \"x\" (input)"), HasSubstr("overflows")));
  }
}

TEST(VerifierTest, OverLimitSizes) {
  VerifyOptions small;
  small.limits.max_tensor_elements = 1000;
  small.limits.max_tensor_bytes = 100;
  small.max_nodes = 2;
  {
    GraphBuilder b("g");
    b.output("w", b.param("w", kF32, {100, 100}));
    ExpectRejected(b.Build(), absl::StatusCode::kResourceExhausted, "node 0 \"w\" (param)",
                   "10000 elements, over the limit of 1000", small);
  }
  {
    GraphBuilder b("g");
    b.output("w", b.param("w", kF32, {30}));
    ExpectRejected(b.Build(), absl::StatusCode::kResourceExhausted, "node 0 \"w\" (param)",
                   "takes 120 bytes, over the limit of 100", small);
  }
  {
    GraphBuilder b("g");
    const V x = b.input("x", kF32, {int64_t{10}});
    b.output("e", b.expand(x, {200, 10}));
    b.named("e");
    ExpectRejected(b.Build(), absl::StatusCode::kResourceExhausted, "node 1 \"e\" (expand)",
                   "2000 elements, over the limit of 1000", small);
  }
  {
    GraphBuilder b("big");
    const V x = b.input("x", kF32, {int64_t{2}});
    b.output("y", b.exp(b.relu(x)));
    ExpectRejected(b.Build(), absl::StatusCode::kResourceExhausted, "graph \"big\"",
                   "has 3 nodes, over the limit of 2", small);
  }
  {
    GraphBuilder b("g");
    auto c = HostTensor::Create(kF32, {40, 40});
    b.output("c", b.constant(*c, "c"));
    ExpectRejected(b.Build(), absl::StatusCode::kResourceExhausted, "node 0 \"c\" (constant)",
                   "1600 elements, over the limit", small);
  }
}

TEST(VerifierTest, InternalOpSentByAClient) {
  GraphBuilder b("g");
  const V x = b.input("x", kF32, {int64_t{2}, int64_t{3}});
  const V w = b.param("w", kF32, {3, 4});
  v1::Attrs attrs;
  attrs.mutable_fused_matmul();
  b.output("y", b.node(v1::OP_FUSED_MATMUL, {x, w}, attrs, "fm"));
  ExpectInvalid(b.Build(), "node 2 \"fm\" (fused_matmul)", "internal op; clients cannot send it");
  VerifyOptions internal;
  internal.allow_internal_ops = true;
  EXPECT_TRUE(ImportGraph(b.Build(), internal).ok());
}

TEST(VerifierTest, DuplicateNodeIds) {
  v1::Graph g = ReluOf(V{0, 0});
  g.mutable_nodes(1)->set_id(0);
  ExpectInvalid(g, "node 0 \"y\" (relu)", "duplicate node id");
  g.mutable_nodes(1)->set_id(-3);
  ExpectInvalid(g, "node -3 \"y\" (relu)", "node ids must be >= 0");
}

TEST(VerifierTest, DuplicateInputNames) {
  GraphBuilder b("g");
  b.input("x", kF32, {int64_t{2}});
  const V x2 = b.input("x", kF32, {int64_t{2}});
  b.output("y", x2);
  ExpectInvalid(b.Build(), "node 1 \"x\" (input)", "another input or param has the same name");
  GraphBuilder p("g");
  p.input("w", kF32, {int64_t{2}});
  p.output("y", p.param("w", kF32, {2}));
  ExpectInvalid(p.Build(), "node 1 \"w\" (param)", "another input or param has the same name");
}

TEST(VerifierTest, IrVersionTooNew) {
  v1::Graph g = ReluOf(V{0, 0});
  g.set_ir_version(kIrVersion + 1);
  ExpectInvalid(g, "graph \"g\"", "has ir_version 2; this kilnd reads up to 1");
  g.set_ir_version(0);  // 0 = current
  EXPECT_TRUE(ImportGraph(g).ok());
}

TEST(VerifierTest, SubgraphDepthOverTheLimit) {
  // Three nested scan bodies; each scan carries x through unchanged.
  auto g = ParseGraphProto(R"(
input x: f32[2]
let s1 = scan(x, body=graph "l1" {
  input a: f32[2]
  let s2 = scan(a, body=graph "l2" {
    input b: f32[2]
    let s3 = scan(b, body=graph "l3" {
      input c: f32[2]
      out c
    }, num_carries=1, length=1)
    out s3
  }, num_carries=1, length=1)
  out s2
}, num_carries=1, length=1)
out s1
)");
  ASSERT_TRUE(g.ok()) << g.status();
  VerifyOptions shallow;
  shallow.limits.max_subgraph_depth = 2;
  ExpectRejected(*g, absl::StatusCode::kResourceExhausted, "node 1 \"s1\" (scan): in scan body",
                 "node 1 \"s3\" (scan): subgraph nesting exceeds the limit of 2", shallow);
  shallow.limits.max_subgraph_depth = 3;
  EXPECT_TRUE(ImportGraph(*g, shallow).ok());
}

TEST(VerifierTest, ConstantWithTheWrongByteLength) {
  GraphBuilder b("g");
  auto t = HostTensor::Create(kF32, {3});
  b.output("c", b.constant(*t, "c"));
  v1::Graph g = b.Build();
  g.mutable_nodes(0)->mutable_attrs()->mutable_constant()->mutable_value()->set_data("abcd");
  ExpectInvalid(g, "node 0 \"c\" (constant)", "tensor f32[3] needs 12 bytes, got 4");
  g.mutable_nodes(0)->mutable_attrs()->mutable_constant()->mutable_value()->set_dtype(
      static_cast<DType>(77));
  ExpectInvalid(g, "node 0 \"c\" (constant)", "unknown dtype");
}

TEST(VerifierTest, DeclaredResultTypeDisagreesWithInference) {
  v1::Graph g = ReluOf(V{0, 0});
  v1::TensorType* t = g.mutable_nodes(1)->add_outputs();
  t->set_dtype(kF32);
  t->add_dims()->set_size(3);
  t->add_dims()->set_size(2);
  ExpectInvalid(g, "node 1 \"y\" (relu)",
                "declared result f32[3, 2] differs from the inferred f32[2, 3]");
}

TEST(VerifierTest, GraphOutputs) {
  v1::Graph g = ReluOf(V{0, 0});
  g.clear_outputs();
  ExpectInvalid(g, "graph \"g\"", "has no outputs");
  g = ReluOf(V{0, 0});
  g.mutable_outputs(0)->mutable_value()->set_node(7);
  ExpectInvalid(g, "output \"y\"", "names node 7, which does not exist");
}

// ---- Specialize ----

constexpr char kBatched[] = R"(
input x: f32[batch, 4]
input y: f32[batch, 4]
param w: f32[4, 2]
let z = reshape((x + y) @ w, shape=[-1])
out z
)";

TEST(SpecializeTest, BindsSymbolsAndReinfers) {
  auto g = ParseGraph(kBatched);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(TypeToString((*g)->TypeOf((*g)->outputs()[0].value), (*g)->symbols()), "f32[?]");
  ASSERT_TRUE(Specialize(**g, {{"x", {3, 4}}, {"y", {3, 4}}}).ok());
  EXPECT_EQ(TypeToString((*g)->TypeOf((*g)->outputs()[0].value)), "f32[6]");
  for (const auto& n : (*g)->nodes()) EXPECT_TRUE(n->type().is_static()) << NodeLabel(*n);
}

TEST(SpecializeTest, ConflictingSymbolSizes) {
  auto g = ParseGraph(kBatched);
  ASSERT_TRUE(g.ok());
  auto s = Specialize(**g, {{"x", {3, 4}}, {"y", {5, 4}}});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "symbol \"batch\" is 3 in one input and 5 in input \"y\"");
}

TEST(SpecializeTest, AnonymousDimsAreCheckedByReinference) {
  auto g = ParseGraph("input a: f32[?, 4]\ninput b: f32[?, 4]\nlet s = a + b\nout s");
  ASSERT_TRUE(g.ok());
  auto s = Specialize(**g, {{"a", {3, 4}}, {"b", {5, 4}}});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("node 2 \"s\" (add)"), HasSubstr("do not broadcast")));
}

TEST(SpecializeTest, RejectsMissingWrongRankAndWrongSizeInputs) {
  auto g = ParseGraph(kBatched);
  ASSERT_TRUE(g.ok());
  EXPECT_THAT(std::string(Specialize(**g, {{"x", {3, 4}}}).message()),
              HasSubstr("input \"y\" has symbolic shape f32[batch, 4] and no concrete shape"));
  EXPECT_THAT(std::string(Specialize(**g, {{"x", {3, 4, 1}}, {"y", {3, 4}}}).message()),
              HasSubstr("input \"x\" expects f32[batch, 4], got shape [3, 4, 1]"));
  EXPECT_THAT(std::string(Specialize(**g, {{"x", {3, 5}}, {"y", {3, 5}}}).message()),
              HasSubstr("input \"x\" expects f32[batch, 4], got shape [3, 5]"));
  // Rejected shape lists leave the graph as it was.
  EXPECT_EQ(TypeToString((*g)->Inputs()[0]->type(), (*g)->symbols()), "f32[batch, 4]");
  EXPECT_TRUE(Specialize(**g, {{"x", {2, 4}}, {"y", {2, 4}}}).ok());
}

}  // namespace
}  // namespace kiln::ir

namespace kiln::ir {
namespace {

// A block-quantized weight whose rows are not whole blocks is rejected at
// inference, naming the node (its total, 96 = 3 q8_0 blocks, would pass the
// param's own check): kernels and GGUF decode row by row.
TEST(VerifierTest, QuantizedRowsMustBeWholeBlocks) {
  auto fails = [](const std::string& text, const std::string& label, const std::string& reason) {
    auto g = ParseGraph(text);
    ASSERT_FALSE(g.ok()) << text;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(g.status().message()), AllOf(HasSubstr(label), HasSubstr(reason)));
  };
  fails("input x: f32[1, 48]\nparam w: q8_0[2, 48]\n"
        "let y = dequant_matmul(x, w, transpose_b=true)\nout y",
        "node 2 (dequant_matmul)",
        "operand 1 q8_0[2, 48]: rows of 48 elements are not whole 32-element q8_0 blocks");
  fails("input x: f32[1, 3]\nparam w: q4_k[2, 256]\nlet y = dequant_matmul(x, w)\nout y",
        "node 2 (dequant_matmul)", "K differs");
  fails("param w: q4_0[2, 48]\nlet y = dequantize(w)\nout y", "node 1 (dequantize)",
        "rows of 48 elements are not whole 32-element q4_0 blocks");
  EXPECT_TRUE(ParseGraph("input x: f32[3, 64]\nparam w: q4_0[5, 64]\n"
                         "let y = dequant_matmul(x, w, transpose_b=true)\nout y")
                  .ok());
}

// A node id near INT32_MAX is refused: the compiler numbers the nodes it adds
// after the largest id (kiln_fuzz_graph_ingest: UBSan's signed overflow in
// Graph::AddNode on id 2147483647).
TEST(VerifierTest, NodeIdsLeaveRoomForTheCompilersNodes) {
  for (const int32_t id : {kMaxClientNodeId + 1, std::numeric_limits<int32_t>::max()}) {
    v1::Graph g = ReluOf(V{0, 0});
    g.mutable_nodes(1)->set_id(id);
    g.mutable_outputs(0)->mutable_value()->set_node(id);
    ExpectInvalid(g, "(relu)", absl::StrCat("node id ", id, " is over the limit of ", kMaxClientNodeId));
  }
  v1::Graph g = ReluOf(V{0, 0});
  g.mutable_nodes(1)->set_id(kMaxClientNodeId);
  g.mutable_outputs(0)->mutable_value()->set_node(kMaxClientNodeId);
  EXPECT_TRUE(ImportGraph(g).ok());
}

// Every op's operand count is checked before an operand is read
// (kiln_fuzz_graph_ingest: a dequantize with no operands read operand 0).
TEST(VerifierTest, OperandlessNodesAreRefusedBeforeTheirOperandsAreRead) {
  for (const v1::OpKind op : {v1::OP_DEQUANTIZE, v1::OP_QUANTIZE, v1::OP_FAKE_QUANTIZE}) {
    GraphBuilder b("g");
    b.input("x", kF32, {int64_t{2}});
    v1::Attrs attrs;
    if (op == v1::OP_DEQUANTIZE) attrs.mutable_dequantize();
    if (op == v1::OP_QUANTIZE) attrs.mutable_quantize()->set_bits(8);
    if (op == v1::OP_FAKE_QUANTIZE) attrs.mutable_fake_quantize()->set_bits(8);
    b.output("y", b.node(op, {}, attrs, "y"));
    ExpectInvalid(b.Build(), "node 1 \"y\"", "operands, got 0");
  }
}

}  // namespace
}  // namespace kiln::ir
