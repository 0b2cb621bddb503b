// The ONNX importer on hand-built models: opset-versioned attribute moves,
// params, symbolic dims and folded shape subgraphs, unused opset imports, the
// unsupported-node error, and hostile files (truncated bytes, cycles, missing
// initializers, bad and huge dims).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/engine.h"
#include "engine/io/onnx/onnx_import.h"
#include "engine/ir/text.h"
#include "engine/ir/verifier.h"
#include "onnx/onnx_pb.h"
#include "tests/engine/io/onnx_test_model.h"

namespace kiln {
namespace {

using onnx_test::Import;
using onnx_test::MakeEngine;
using onnx_test::Model;
using onnx_test::SubInput;
using onnx_test::SubNode;

HostTensor Iota(Dims dims) {
  auto t = std::move(HostTensor::Create(v1::DTYPE_F32, dims)).value();
  for (int64_t i = 0; i < t.num_elements(); ++i) t.SetFromDouble(i, static_cast<double>(i) - 3);
  return t;
}

// ---- opset moves --------------------------------------------------------------

// Squeeze's axes, ReduceSum's axes and Clip's bounds moved from attributes to
// inputs (opsets 13 and 11); both forms give the same graph results.
TEST(OnnxImport, OpsetMovesGiveTheSameResults) {
  auto engine = MakeEngine();
  std::vector<std::vector<double>> results;
  for (int opset : {11, 13}) {
    Model m(opset);
    m.Input("x", {2, 1, 3});
    if (opset >= 13) {
      m.InitInts("axes", {1});
      m.Node("Squeeze", {"x", "axes"}, {"s"});
      m.InitInts("raxes", {1});
      m.Node("ReduceSum", {"s", "raxes"}, {"r"});
    } else {
      Model::Ints(m.Node("Squeeze", {"x"}, {"s"}), "axes", {1});
      Model::Ints(m.Node("ReduceSum", {"s"}, {"r"}), "axes", {1});
    }
    m.Init("lo", {}, {-1.f});
    m.Init("hi", {}, {2.f});
    m.Node("Clip", {"r", "lo", "hi"}, {"y"});
    m.Output("y");
    auto model = Import(m);
    ASSERT_TRUE(model.ok()) << model.status();
    HostTensor x = Iota({2, 1, 3});
    std::vector<TensorRef> in = {TensorRef::Of("x", x)};
    auto r = engine->RunGraph(model->graph, in, nullptr, {}, {});
    ASSERT_TRUE(r.ok()) << r.status();
    const HostTensor& y = r->outputs[0].second;
    ASSERT_EQ(y.dims(), (Dims{2, 1}));
    results.push_back({y.GetAsDouble(0), y.GetAsDouble(1)});
  }
  // rows sum to -6 and 3, clipped to [-1, 2]
  EXPECT_EQ(results[0], (std::vector<double>{-1, 2}));
  EXPECT_EQ(results[1], results[0]);
}

// GroupNormalization: opset 18's scale and bias are per group, opset 21's per
// channel; with values that make both mean the same affine map, the results
// agree with each other and with an f64 loop.
TEST(OnnxImport, GroupNormalizationPerGroupAndPerChannel) {
  auto engine = MakeEngine();
  const int64_t n = 2, ch = 6, groups = 3, hw = 4;
  HostTensor x = Iota({n, ch, 2, 2});
  for (int64_t i = 0; i < x.num_elements(); ++i) x.SetFromDouble(i, std::sin(0.7 * i) * 3);
  std::vector<std::vector<double>> results;
  for (int opset : {18, 21}) {
    Model m(opset);
    m.Input("x", {n, ch, 2, 2});
    if (opset < 21) {
      m.Init("s", {groups}, {0.5f, 2.f, -1.f});
      m.Init("b", {groups}, {1.f, 0.f, 3.f});
    } else {
      m.Init("s", {ch}, {0.5f, 0.5f, 2.f, 2.f, -1.f, -1.f});
      m.Init("b", {ch}, {1.f, 1.f, 0.f, 0.f, 3.f, 3.f});
    }
    auto* node = m.Node("GroupNormalization", {"x", "s", "b"}, {"y"});
    auto* a = node->add_attribute();
    a->set_name("num_groups");
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(groups);
    Model::Float(node, "epsilon", 1e-3f);
    m.Output("y");
    auto model = Import(m);
    ASSERT_TRUE(model.ok()) << model.status();
    std::vector<TensorRef> in = {TensorRef::Of("x", x)};
    auto r = engine->RunGraph(model->graph, in, nullptr, {}, {});
    ASSERT_TRUE(r.ok()) << r.status();
    const HostTensor& y = r->outputs[0].second;
    std::vector<double> got(y.num_elements());
    for (int64_t i = 0; i < y.num_elements(); ++i) got[i] = y.GetAsDouble(i);
    results.push_back(got);
  }
  const double scale[] = {0.5, 2, -1}, bias[] = {1, 0, 3};
  const int64_t per = ch / groups * hw;
  for (int64_t i = 0; i < n * groups; ++i) {
    double mean = 0, var = 0;
    for (int64_t k = 0; k < per; ++k) mean += x.GetAsDouble(i * per + k) / per;
    for (int64_t k = 0; k < per; ++k) var += std::pow(x.GetAsDouble(i * per + k) - mean, 2) / per;
    for (int64_t k = 0; k < per; ++k) {
      const double want = (x.GetAsDouble(i * per + k) - mean) / std::sqrt(var + 1e-3) * scale[i % groups] +
                          bias[i % groups];
      EXPECT_NEAR(results[0][i * per + k], want, 1e-4);
      EXPECT_NEAR(results[1][i * per + k], want, 1e-4);
    }
  }
  // A channel count the groups do not divide is refused at import.
  Model bad(21);
  bad.Input("x", {1, 5, 2});
  bad.Init("s", {5}, {1, 1, 1, 1, 1});
  bad.Init("b", {5}, {0, 0, 0, 0, 0});
  auto* node = bad.Node("GroupNormalization", {"x", "s", "b"}, {"y"});
  auto* a = node->add_attribute();
  a->set_name("num_groups");
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(2);
  bad.Output("y");
  auto refused = Import(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("not divisible by num_groups=2"), std::string::npos)
      << refused.status();
}

// GlobalAveragePool / GlobalMaxPool over a static plane run as one pooling
// window; over a symbolic plane as a reduce. Both give the plane's mean / max.
TEST(OnnxImport, GlobalPools) {
  auto engine = MakeEngine();
  for (const char* op : {"GlobalAveragePool", "GlobalMaxPool"}) {
    for (bool symbolic : {false, true}) {
      Model m(13);
      m.Input("x", symbolic ? std::vector<int64_t>{2, 3, -2, -2} : std::vector<int64_t>{2, 3, 4, 5});
      m.Node(op, {"x"}, {"y"});
      m.Output("y");
      io::OnnxImportOptions o;
      auto model = Import(m, o);
      ASSERT_TRUE(model.ok()) << model.status();
      HostTensor x = Iota({2, 3, 4, 5});
      std::vector<TensorRef> in = {TensorRef::Of("x", x)};
      auto r = engine->RunGraph(model->graph, in, nullptr, {}, {});
      ASSERT_TRUE(r.ok()) << op << ": " << r.status();
      const HostTensor& y = r->outputs[0].second;
      ASSERT_EQ(y.dims(), (Dims{2, 3, 1, 1})) << op;
      for (int64_t p = 0; p < 6; ++p) {
        // Plane p holds 20p - 3 .. 20p + 16.
        const double want = std::string(op) == "GlobalMaxPool" ? 20.0 * p + 16 : 20.0 * p + 6.5;
        EXPECT_NEAR(y.GetAsDouble(p), want, 1e-5) << op << " plane " << p << " symbolic " << symbolic;
      }
    }
  }
}

// ---- initializers: constants or params ----------------------------------------

Model Linear() {
  Model m(13);
  m.Input("x", {-1, 2});
  m.Init("W", {2, 2}, {1, 2, 3, 4});
  m.Init("b", {2}, {10, 20});
  m.Node("MatMul", {"x", "W"}, {"xw"});
  m.Node("Add", {"xw", "b"}, {"y"});
  m.Output("y");
  return m;
}

TEST(OnnxImport, InitializersAreConstantsOrParams) {
  auto consts = Import(Linear());
  ASSERT_TRUE(consts.ok()) << consts.status();
  EXPECT_TRUE(consts->params.empty());
  io::OnnxImportOptions o;
  o.params = {"W"};
  auto with_param = Import(Linear(), o);
  ASSERT_TRUE(with_param.ok()) << with_param.status();
  ASSERT_EQ(with_param->params.size(), 1u);
  EXPECT_EQ(with_param->params[0].first, "W");
  int params = 0, constants = 0;
  for (const auto& n : with_param->graph.nodes()) {
    params += n.op() == v1::OP_PARAM;
    constants += n.op() == v1::OP_CONSTANT;
  }
  EXPECT_EQ(params, 1);
  EXPECT_EQ(constants, 1);  // b
  // The param graph runs with W uploaded; the constant graph alone; same answer.
  auto engine = MakeEngine();
  HostTensor x = Iota({3, 2});
  std::vector<TensorRef> in = {TensorRef::Of("x", x)};
  auto a = engine->RunGraph(consts->graph, in, nullptr, {}, {});
  ASSERT_TRUE(a.ok()) << a.status();
  std::vector<TensorRef> pr = {TensorRef::Of("W", with_param->params[0].second)};
  auto ps = engine->CreateParams(pr);
  ASSERT_TRUE(ps.ok()) << ps.status();
  auto b = engine->RunGraph(with_param->graph, in, ps->get(), {}, {});
  ASSERT_TRUE(b.ok()) << b.status();
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(a->outputs[0].second.GetAsDouble(i), b->outputs[0].second.GetAsDouble(i));
  }
  o.params = {"nope"};
  auto bad = Import(Linear(), o);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "\"nope\"")) << bad.status();
}

// ---- symbolic dims and folded shape subgraphs --------------------------------

// x.view(x.size(0), -1) as exporters write it.
Model ViewFlatten() {
  Model m(13);
  m.Input("x", {-1, 3, 4});
  m.Node("Shape", {"x"}, {"shape"});
  m.InitInts("zero", {0});
  m.Node("Gather", {"shape", "zero"}, {"b"});
  m.InitInts("minus1", {-1});
  auto* c = m.Node("Concat", {"b", "minus1"}, {"target"});
  auto* a = c->add_attribute();
  a->set_name("axis");
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(0);
  m.Node("Reshape", {"x", "target"}, {"y"});
  m.Output("y");
  return m;
}

TEST(OnnxImport, ShapeSubgraphFoldsWithSymbolicBatch) {
  auto model = Import(ViewFlatten());
  ASSERT_TRUE(model.ok()) << model.status();
  // Only the input and one reshape remain: Shape, Gather and Concat folded.
  int reshapes = 0;
  for (const auto& n : model->graph.nodes()) reshapes += n.op() == v1::OP_RESHAPE;
  EXPECT_EQ(reshapes, 1);
  EXPECT_EQ(model->graph.nodes_size(), 2) << model->graph.DebugString();
  auto engine = MakeEngine();
  for (int64_t batch : {1, 5}) {
    HostTensor x = Iota({batch, 3, 4});
    std::vector<TensorRef> in = {TensorRef::Of("x", x)};
    auto r = engine->RunGraph(model->graph, in, nullptr, {}, {});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->outputs[0].second.dims(), (Dims{batch, 12}));
  }
  io::OnnxImportOptions pinned;
  pinned.input_shapes = {{"x", {2, 3, 4}}};
  auto p = Import(ViewFlatten(), pinned);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->graph.nodes(0).outputs(0).dims(0).size(), 2);
}

TEST(OnnxImport, ImportedGraphPrintsAndParsesBack) {
  auto model = Import(Linear());
  ASSERT_TRUE(model.ok()) << model.status();
  auto g = ir::ImportGraph(model->graph);
  ASSERT_TRUE(g.ok()) << g.status();
  const std::string text = ir::PrintGraph(**g);
  auto back = ir::ParseGraph(text);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << text;
}

// ---- opset imports and unsupported nodes ---------------------------------------

TEST(OnnxImport, UnusedOpsetImportsAreIgnored) {
  Model m = Linear();
  auto* ml = m.m.add_opset_import();
  ml->set_domain("ai.onnx.ml");
  ml->set_version(3);
  auto* ms = m.m.add_opset_import();
  ms->set_domain("com.microsoft");
  ms->set_version(1);
  auto r = Import(m);
  EXPECT_TRUE(r.ok()) << r.status();
}

TEST(OnnxImport, EveryUnsupportedNodeIsNamed) {
  Model m(13);
  m.Input("x", {4, 4});
  m.Node("Unique", {"x"}, {"v"}, "uniq");
  m.Node("Relu", {"v"}, {"r"});
  m.Node("NonZero", {"r"}, {"h"}, "nz");
  auto* custom = m.Node("FusedGelu", {"h"}, {"y"}, "fused");
  custom->set_domain("com.microsoft");
  auto* ms = m.m.add_opset_import();
  ms->set_domain("com.microsoft");
  ms->set_version(1);
  m.Output("y");
  auto r = Import(m);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsUnimplemented(r.status())) << r.status();
  const std::string msg(r.status().message());
  EXPECT_TRUE(absl::StrContains(msg, "3 node(s)")) << msg;
  EXPECT_TRUE(absl::StrContains(msg, "\"uniq\": Unique (domain ai.onnx, opset 13)")) << msg;
  EXPECT_TRUE(absl::StrContains(msg, "\"nz\": NonZero (domain ai.onnx, opset 13)")) << msg;
  EXPECT_TRUE(absl::StrContains(msg, "\"fused\": FusedGelu (domain com.microsoft, opset 1)")) << msg;
}

TEST(OnnxImport, OpsetOutsideTheRangeIsRefused) {
  Model m(8);
  m.Input("x", {2});
  m.Node("Relu", {"x"}, {"y"});
  m.Output("y");
  auto r = Import(m);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "opsets 9 to 21")) << r.status();
}

// ---- hostile files -----------------------------------------------------------------

TEST(OnnxImportHostile, TruncatedProtobuf) {
  Model m = Linear();
  m.g().mutable_initializer(0)->clear_float_data();
  m.g().mutable_initializer(0)->set_raw_data(std::string(16, '\0'));
  const std::string bytes = m.Bytes();
  // Cut inside the initializer's raw_data: the length prefix overruns.
  const size_t at = bytes.find(std::string(16, '\0')) + 8;
  auto r = io::ImportOnnx(bytes.substr(0, at), {});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "truncated")) << r.status();
  // Every prefix is an error or a model, never a crash.
  for (size_t n = 0; n < bytes.size(); n += 3) (void)io::ImportOnnx(bytes.substr(0, n), {});
  EXPECT_FALSE(io::ImportOnnx("", {}).ok());
}

// Dims that claim 2^32 elements with one value present: refused before the
// storage is allocated (the fuzzer's input, 198 bytes, took 6 s zero-filling
// 764 MB; a tensor this size would not fit this test's memory at all).
TEST(OnnxImportHostile, TensorValuesAreCountedBeforeAllocating) {
  for (const auto& [type, field] : std::vector<std::pair<int, std::string>>{
           {onnx::TensorProto::FLOAT, "float_data"},
           {onnx::TensorProto::INT64, "int64_data"},
           {onnx::TensorProto::DOUBLE, "double_data"},
           {onnx::TensorProto::INT32, "int32_data"},
           {onnx::TensorProto::FLOAT16, "int32_data"}}) {
    onnx::TensorProto t;
    t.set_name("huge");
    t.set_data_type(type);
    t.add_dims(int64_t{1} << 32);
    t.add_float_data(1);
    t.add_int64_data(1);
    t.add_double_data(1);
    t.add_int32_data(1);
    auto r = io::ParseOnnxTensor(t.SerializeAsString());
    ASSERT_FALSE(r.ok()) << field;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), field + " has 1 values")) << r.status();
  }
  // The fuzzer's input itself (tests/fuzz/corpus/onnx_import).
  std::ifstream in(std::string(KILN_SOURCE_DIR) +
                       "/tests/fuzz/corpus/onnx_import/tensor_dims_claim_764mb.pb",
                   std::ios::binary);
  ASSERT_TRUE(in);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_FALSE(io::ParseOnnxTensor(bytes).ok());
}

// A Conv whose weight has the wrong rank is refused before its kernel dims
// are read (kiln_fuzz_onnx_import read past a rank-1 W's dims).
TEST(OnnxImportHostile, ConvWeightRankIsChecked) {
  Model m(13);
  m.Input("x", {1, 2, 5, 5});
  m.Init("w", {4}, {1, 2, 3, 4});
  m.Node("Conv", {"x", "w"}, {"y"});
  m.Output("y");
  auto r = Import(m);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "W has rank 1; a 2-D Conv needs rank 4"))
      << r.status();
}

// A Conv whose kernel_shape has more entries than X has spatial dims is
// refused before X's dims are read (kiln_fuzz_onnx_import, CI: a 2-entry
// kernel_shape on a rank-3 X read X's dims past the end).
TEST(OnnxImportHostile, ConvKernelShapeRankIsChecked) {
  Model m(13);
  m.Input("x", {1, 1, 7});
  m.Init("w", {1, 1, 3}, {1, 2, 3});
  Model::Ints(m.Node("Conv", {"x", "w"}, {"y"}), "kernel_shape", {3, 3});
  m.Output("y");
  auto r = Import(m);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "kernel_shape has 2 entries; X of rank 3 needs 1"))
      << r.status();
  // Pooling reads its window the same way.
  Model pool(13);
  pool.Input("x", {1, 1, 7});
  Model::Ints(pool.Node("MaxPool", {"x"}, {"y"}), "kernel_shape", {3, 3});
  pool.Output("y");
  auto p = Import(pool);
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(absl::StrContains(p.status().message(), "kernel_shape has 2 entries; X of rank 3 needs 1"))
      << p.status();
  // The fuzzer's input itself (tests/fuzz/corpus/onnx_import).
  std::ifstream in(std::string(KILN_SOURCE_DIR) +
                       "/tests/fuzz/corpus/onnx_import/conv_kernel_shape_past_x_rank.onnx",
                   std::ios::binary);
  ASSERT_TRUE(in);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_FALSE(io::ImportOnnx(bytes, {}).ok());
}

// A float attribute that becomes an integer constant and fits no int64 is
// refused, never cast (kiln_fuzz_onnx_import: UBSan's float-cast-overflow on
// a Shrink bias of 1.9e21 over an int8 input).
TEST(OnnxImportHostile, IntegerConstantsFromFloatAttributesMustFit) {
  Model m(13);
  m.Input("x", {5}, onnx::TensorProto::INT8);
  Model::Float(m.Node("Shrink", {"x"}, {"y"}), "bias", 1e30f);
  m.Output("y");
  auto r = Import(m);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "does not fit the integer type DTYPE_I8"))
      << r.status();
  std::ifstream in(std::string(KILN_SOURCE_DIR) +
                       "/tests/fuzz/corpus/onnx_import/shrink_bias_past_int64.onnx",
                   std::ios::binary);
  ASSERT_TRUE(in);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_FALSE(io::ImportOnnx(bytes, {}).ok());
}

// A constant-foldable Add with one input: refused, never folded by reading a
// second operand that is not there (kiln_fuzz_onnx_import).
TEST(OnnxImportHostile, FoldedArithmeticChecksItsInputCount) {
  Model m(13);
  m.Input("x", {2});
  m.InitInts("k", {1, 2});
  m.Node("Add", {"k"}, {"s"});
  m.Node("Add", {"x", "x"}, {"y"});
  m.Output("y");
  m.Output("s");
  EXPECT_FALSE(Import(m).ok());
}

// A Softmax with no input: an error naming the missing input, not a read of it
// (kiln_fuzz_onnx_import).
TEST(OnnxImportHostile, SoftmaxWithoutInputIsRefused) {
  Model m(13);
  m.Input("x", {2});
  m.Node("Softmax", {}, {"y"});
  m.Output("y");
  EXPECT_FALSE(Import(m).ok());
}

TEST(OnnxImportHostile, Cycle) {
  Model m(13);
  m.Input("x", {2});
  m.Node("Add", {"x", "b"}, {"a"}, "first");
  m.Node("Relu", {"a"}, {"b"}, "second");
  m.Output("b");
  auto r = Import(m);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "cycle")) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "\"first\"")) << r.status();
}

TEST(OnnxImportHostile, MissingInitializer) {
  Model m(13);
  m.Input("x", {2, 2});
  m.Node("MatMul", {"x", "W"}, {"y"}, "mm");
  m.Output("y");
  auto r = Import(m);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "\"W\"")) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "missing initializer")) << r.status();
}

TEST(OnnxImportHostile, BadDims) {
  {
    Model m(13);
    m.Input("x", {2, 3});
    m.g().mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)
        ->set_dim_value(-5);
    m.Node("Relu", {"x"}, {"y"});
    m.Output("y");
    auto r = Import(m);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(absl::StrContains(r.status().message(), "negative")) << r.status();
  }
  {
    Model m = Linear();
    m.g().mutable_initializer(0)->set_dims(0, -2);
    auto r = Import(m);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(absl::StrContains(r.status().message(), "negative dim")) << r.status();
  }
  {
    // Data that does not fill the dims.
    Model m = Linear();
    m.g().mutable_initializer(0)->set_dims(0, 3);
    auto r = Import(m);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(absl::StrContains(r.status().message(), "float_data has 4 values")) << r.status();
  }
  {
    // Shapes that do not fit the op.
    Model m = Linear();
    m.g().mutable_initializer(0)->set_dims(0, 4);
    m.g().mutable_initializer(0)->set_dims(1, 1);
    auto r = Import(m);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(absl::StrContains(r.status().message(), "MatMul")) << r.status();
  }
}

TEST(OnnxImportHostile, HugeDims) {
  {
    Model m(13);
    m.Input("x", {int64_t{1} << 40, int64_t{1} << 40});
    m.Node("Relu", {"x"}, {"y"});
    m.Output("y");
    auto r = Import(m);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(absl::StrContains(r.status().message(), "overflow") ||
                absl::IsResourceExhausted(r.status()))
        << r.status();
  }
  {
    Model m = Linear();
    auto* t = m.g().mutable_initializer(0);
    t->set_dims(0, int64_t{1} << 62);
    t->set_dims(1, 8);
    auto r = Import(m);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(absl::StrContains(r.status().message(), "overflow")) << r.status();
  }
  {
    // A folded ConstantOfShape that would allocate 2^60 elements.
    Model m(13);
    m.Input("x", {2});
    m.InitInts("shape", {int64_t{1} << 30, int64_t{1} << 30});
    m.Node("ConstantOfShape", {"shape"}, {"c"});
    m.Node("Add", {"x", "c"}, {"y"});
    m.Output("y");
    auto r = Import(m);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(absl::IsResourceExhausted(r.status()) ||
                absl::StrContains(r.status().message(), "limit"))
        << r.status();
  }
  {
    io::OnnxImportOptions o;
    o.max_model_bytes = 10;
    auto r = io::ImportOnnx(Linear().Bytes(), o);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(absl::IsResourceExhausted(r.status())) << r.status();
  }
}

// Tables the importer builds on the host (masks, iotas, index lists) are
// bounded: a huge declared dim fails cleanly instead of allocating.
TEST(OnnxImportHostile, HugeDeclaredDimsDoNotAllocate) {
  for (const char* op : {"Trilu", "EyeLike", "Dropout"}) {
    Model m(13);
    m.Input("x", {int64_t{1} << 16, int64_t{1} << 16});
    if (std::string(op) == "Dropout") {
      m.Node(op, {"x"}, {"y", "mask"});
      m.Output("mask");
    } else {
      m.Node(op, {"x"}, {"y"});
    }
    m.Output("y");
    auto r = Import(m);
    if (std::string(op) == "Dropout") {
      // The mask is a broadcast scalar: nothing is allocated at import.
      EXPECT_TRUE(r.ok()) << r.status();
      continue;
    }
    ASSERT_FALSE(r.ok()) << op;
    EXPECT_TRUE(absl::IsResourceExhausted(r.status())) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "limit")) << r.status();
  }
}

TEST(OnnxImportHostile, DuplicateOutputsAndExternalData) {
  {
    Model m(13);
    m.Input("x", {2});
    m.Node("Relu", {"x"}, {"y"});
    m.Node("Neg", {"x"}, {"y"}, "again");
    m.Output("y");
    auto r = Import(m);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(absl::StrContains(r.status().message(), "already defined")) << r.status();
  }
  {
    Model m = Linear();
    m.g().mutable_initializer(0)->set_data_location(onnx::TensorProto::EXTERNAL);
    auto r = Import(m);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(absl::StrContains(r.status().message(), "external data")) << r.status();
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// ---- control flow: If / Scan / Loop onto If / Scan / While ----

onnx::GraphProto* GraphAttr(onnx::NodeProto* n, const std::string& name) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::GRAPH);
  a->mutable_g()->set_name(name);
  return a->mutable_g();
}

TEST(OnnxImport, ScanReadsOuterValuesAndScansAnyAxis) {
  // state [2] += xs[:, t] * w, over the 3 columns of xs [2, 3]; ys the states.
  Model m(11);
  m.Input("s0", {2});
  m.Input("xs", {2, 3});
  m.Input("w", {2});
  auto* scan = m.Node("Scan", {"s0", "xs"}, {"s", "ys"}, "scan");
  Model::Ints(scan, "scan_input_axes", {1});
  Model::Ints(scan, "scan_output_axes", {1});
  auto* a = scan->add_attribute();
  a->set_name("num_scan_inputs");
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(1);
  onnx::GraphProto& body = *GraphAttr(scan, "body");
  SubInput(body, "st", onnx::TensorProto::FLOAT);
  SubInput(body, "xt", onnx::TensorProto::FLOAT);
  SubNode(body, "Mul", {"xt", "w"}, {"p"});
  SubNode(body, "Add", {"st", "p"}, {"st1"});
  SubNode(body, "Identity", {"st1"}, {"y"});
  body.add_output()->set_name("st1");
  body.add_output()->set_name("y");
  m.Output("s");
  m.Output("ys");
  auto r = Import(m);
  ASSERT_TRUE(r.ok()) << r.status();
  auto engine = MakeEngine();
  const HostTensor s0 = HostTensor::FromVector<float>(v1::DTYPE_F32, {2}, {1, -1});
  const HostTensor xs = HostTensor::FromVector<float>(v1::DTYPE_F32, {2, 3}, {1, 2, 3, 4, 5, 6});
  const HostTensor w = HostTensor::FromVector<float>(v1::DTYPE_F32, {2}, {2, 0.5f});
  const std::vector<TensorRef> in = {TensorRef::Of("s0", s0), TensorRef::Of("xs", xs), TensorRef::Of("w", w)};
  auto out = engine->RunGraph(r->graph, in, nullptr, {}, {});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->outputs.size(), 2u);
  const HostTensor& ys = out->outputs[1].second;
  ASSERT_EQ(ys.dims(), (Dims{2, 3}));
  for (int i = 0; i < 2; ++i) {
    double st = s0.GetAsDouble(i);
    for (int t = 0; t < 3; ++t) {
      st += xs.GetAsDouble(i * 3 + t) * w.GetAsDouble(i);
      EXPECT_EQ(ys.GetAsDouble(i * 3 + t), st) << i << "," << t;
    }
    EXPECT_EQ(out->outputs[0].second.GetAsDouble(i), st);
  }
}

TEST(OnnxImport, LoopWithRunTimeTripCountIsAWhile) {
  // v = v * 2 + b, M times, M and b graph inputs (known only at run time).
  Model m(13);
  m.Input("M", {}, onnx::TensorProto::INT64);
  m.Input("v0", {3});
  m.Input("b", {3});
  m.Node("Constant", {}, {"t"}, "t");
  {
    auto* c = m.g().mutable_node(0);
    auto* a = c->add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    a->mutable_t()->set_data_type(onnx::TensorProto::BOOL);
    a->mutable_t()->add_int32_data(1);
  }
  auto* loop = m.Node("Loop", {"M", "t", "v0"}, {"v"}, "loop");
  onnx::GraphProto& body = *GraphAttr(loop, "body");
  SubInput(body, "i", onnx::TensorProto::INT64);
  SubInput(body, "c", onnx::TensorProto::BOOL);
  SubInput(body, "vi", onnx::TensorProto::FLOAT);
  SubNode(body, "Add", {"vi", "vi"}, {"d"});
  SubNode(body, "Add", {"d", "b"}, {"vo"});
  SubNode(body, "Identity", {"c"}, {"co"});
  body.add_output()->set_name("co");
  body.add_output()->set_name("vo");
  m.Output("v");
  auto r = Import(m);
  ASSERT_TRUE(r.ok()) << r.status();
  bool has_while = false;
  for (const auto& n : r->graph.nodes()) has_while |= n.op() == v1::OP_WHILE;
  EXPECT_TRUE(has_while);
  auto engine = MakeEngine();
  const HostTensor v0 = HostTensor::FromVector<float>(v1::DTYPE_F32, {3}, {1, 0, -2});
  const HostTensor b = HostTensor::FromVector<float>(v1::DTYPE_F32, {3}, {0.5f, 1, 0});
  for (int64_t trips : {0, 1, 4}) {
    const HostTensor mt = HostTensor::FromVector<int64_t>(v1::DTYPE_I64, {}, {trips});
    const std::vector<TensorRef> in = {TensorRef::Of("M", mt), TensorRef::Of("v0", v0), TensorRef::Of("b", b)};
    auto out = engine->RunGraph(r->graph, in, nullptr, {}, {});
    ASSERT_TRUE(out.ok()) << out.status();
    for (int j = 0; j < 3; ++j) {
      double want = v0.GetAsDouble(j);
      for (int64_t k = 0; k < trips; ++k) want = want * 2 + b.GetAsDouble(j);
      EXPECT_EQ(out->outputs[0].second.GetAsDouble(j), want) << "M=" << trips << " j=" << j;
    }
  }
}

TEST(OnnxImportHostile, SubgraphReadingAnUndefinedValueIsRefused) {
  Model m(13);
  m.Input("p", {}, onnx::TensorProto::BOOL);
  auto* n = m.Node("If", {"p"}, {"y"}, "branch");
  SubNode(*GraphAttr(n, "then_branch"), "Relu", {"nope"}, {"a"});
  n->mutable_attribute(0)->mutable_g()->add_output()->set_name("a");
  SubNode(*GraphAttr(n, "else_branch"), "Relu", {"nope"}, {"b"});
  n->mutable_attribute(1)->mutable_g()->add_output()->set_name("b");
  m.Output("y");
  auto r = Import(m);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "\"nope\"")) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "branch")) << r.status();
}

TEST(OnnxImportHostile, UnsupportedNodeInsideASubgraphIsNamed) {
  Model m(13);
  m.Input("p", {}, onnx::TensorProto::BOOL);
  m.Input("x", {4});
  auto* n = m.Node("If", {"p"}, {"y"}, "branch");
  SubNode(*GraphAttr(n, "then_branch"), "NonZero", {"x"}, {"a"});
  n->mutable_attribute(0)->mutable_g()->add_output()->set_name("a");
  SubNode(*GraphAttr(n, "else_branch"), "Relu", {"x"}, {"b"});
  n->mutable_attribute(1)->mutable_g()->add_output()->set_name("b");
  m.Output("y");
  auto r = Import(m);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsUnimplemented(r.status())) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "NonZero")) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "\"branch\"")) << r.status();
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// ONNX's Range function body: a Loop stacking a scan output over the trip
// count Relu(Ceil((limit - start) / delta)). With start, limit and delta known
// at import the float arithmetic folds and the Loop is a Scan of that length;
// with them graph inputs the trip count is a run-time value and the Loop is
// refused with the reason (Kiln's While keeps carry shapes).
Model RangeBodyModel() {
  Model m(11);
  for (const char* name : {"start", "limit", "delta"}) m.Input(name, {});
  m.Node("Sub", {"limit", "start"}, {"diff"});
  m.Node("Div", {"diff", "delta"}, {"q"});
  m.Node("Ceil", {"q"}, {"qc"});
  m.Node("Relu", {"qc"}, {"qr"});
  for (auto [out, to] : {std::pair<const char*, int>{"trips", onnx::TensorProto::INT64},
                         std::pair<const char*, int>{"cond", onnx::TensorProto::BOOL}}) {
    auto* cast = m.Node("Cast", {"qr"}, {out});
    auto* a = cast->add_attribute();
    a->set_name("to");
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(to);
  }
  auto* loop = m.Node("Loop", {"trips", "cond", "start"}, {"last", "range"}, "loop");
  onnx::GraphProto& body = *GraphAttr(loop, "body");
  SubInput(body, "i", onnx::TensorProto::INT64);
  SubInput(body, "c", onnx::TensorProto::BOOL);
  SubInput(body, "prev", onnx::TensorProto::FLOAT);
  SubNode(body, "Identity", {"c"}, {"c_out"});
  SubNode(body, "Add", {"prev", "delta"}, {"cur"});
  SubNode(body, "Identity", {"prev"}, {"r"});
  for (const char* o : {"c_out", "cur", "r"}) body.add_output()->set_name(o);
  m.Output("range");
  return m;
}

TEST(OnnxImport, RangeBodyLoopWithImportTimeBoundsIsAScan) {
  const Model m = RangeBodyModel();
  for (auto [start, limit, delta] : {std::tuple<float, float, float>{1, 5.5f, 1.5f}, {10, 2, -3}, {0, -1, 1}}) {
    const HostTensor ts = HostTensor::FromVector<float>(v1::DTYPE_F32, {}, {start});
    const HostTensor tl = HostTensor::FromVector<float>(v1::DTYPE_F32, {}, {limit});
    const HostTensor td = HostTensor::FromVector<float>(v1::DTYPE_F32, {}, {delta});
    io::OnnxImportOptions o;
    o.input_values = {{"start", &ts}, {"limit", &tl}, {"delta", &td}};
    auto r = Import(m, o);
    ASSERT_TRUE(r.ok()) << r.status();
    auto engine = MakeEngine();
    auto out = engine->RunGraph(r->graph, std::vector<TensorRef>{}, nullptr, {}, {});
    ASSERT_TRUE(out.ok()) << out.status();
    const int64_t n = static_cast<int64_t>(std::max(0.0, std::ceil((double{limit} - start) / delta)));
    const HostTensor& y = out->outputs[0].second;
    ASSERT_EQ(y.dims(), (Dims{n})) << start << " " << limit << " " << delta;
    float want = start;
    for (int64_t i = 0; i < n; ++i, want += delta) EXPECT_EQ(y.GetAsDouble(i), want) << i;
  }
}

TEST(OnnxImport, RangeBodyLoopWithRunTimeBoundsIsRefused) {
  auto r = Import(RangeBodyModel());
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsUnimplemented(r.status())) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "trip count known at import")) << r.status();
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// A while loop (its body computes cond) with scan outputs of three dtypes:
// cur = prev + prev; cond_out = sum(cur) < limit; the body stacks cur (f32),
// the iteration (i64) and cond_out (bool). M and limit are graph inputs.
Model WhileScanModel(bool consume_ys) {
  Model m(13);
  m.Input("M", {}, onnx::TensorProto::INT64);
  m.Input("x", {2});
  m.Input("limit", {});
  auto* loop = m.Node("Loop", {"M", "", "x"}, {"last", "ys", "is", "bs"}, "grow");
  onnx::GraphProto& body = *GraphAttr(loop, "body");
  SubInput(body, "i", onnx::TensorProto::INT64);
  SubInput(body, "c", onnx::TensorProto::BOOL);
  SubInput(body, "prev", onnx::TensorProto::FLOAT);
  SubNode(body, "Add", {"prev", "prev"}, {"cur"});
  auto* sum = SubNode(body, "ReduceSum", {"cur"}, {"s"});
  auto* keep = sum->add_attribute();
  keep->set_name("keepdims");
  keep->set_type(onnx::AttributeProto::INT);
  keep->set_i(0);
  SubNode(body, "Less", {"s", "limit"}, {"co"});
  SubNode(body, "Identity", {"i"}, {"i_out"});
  SubNode(body, "Identity", {"co"}, {"b_out"});
  for (const char* o : {"co", "cur", "cur", "i_out", "b_out"}) body.add_output()->set_name(o);
  if (consume_ys) {
    m.Node("Relu", {"ys"}, {"r"}, "after");
    m.Output("r");
  } else {
    for (const char* o : {"last", "ys", "is", "bs"}) m.Output(o);
  }
  return m;
}

// Import: a While whose stacked outputs come back as buffers of
// max_while_scan_length rows beside kiln.length.<name>; TrimStackedOutputs
// cuts them to the rows written. The loop stops on cond (6 iterations for x
// = [1, 2], limit 100) or on M; past the bound the trim is RESOURCE_EXHAUSTED.
TEST(OnnxImport, WhileLoopWithScanOutputsStacksIntoBoundedBuffers) {
  const Model m = WhileScanModel(false);
  auto r = Import(m);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<std::string> names;
  for (const auto& o : r->graph.outputs()) names.push_back(o.name());
  EXPECT_EQ(names, (std::vector<std::string>{"last", "ys", "is", "bs", "kiln.length.ys",
                                             "kiln.length.is", "kiln.length.bs"}));
  auto engine = MakeEngine();
  const HostTensor x = HostTensor::FromVector<float>(v1::DTYPE_F32, {2}, {1, 2});
  const HostTensor limit = HostTensor::FromVector<float>(v1::DTYPE_F32, {}, {100});
  auto run = [&](const io::OnnxModel& model, int64_t trips)
      -> absl::StatusOr<std::vector<std::pair<std::string, HostTensor>>> {
    const HostTensor mt = HostTensor::FromVector<int64_t>(v1::DTYPE_I64, {}, {trips});
    std::vector<TensorRef> in = {TensorRef::Of("x", x), TensorRef::Of("limit", limit)};
    bool takes_m = false;
    for (const auto& n : model.graph.nodes()) takes_m |= n.op() == v1::OP_INPUT && n.name() == "M";
    if (takes_m) in.push_back(TensorRef::Of("M", mt));
    KILN_ASSIGN_OR_RETURN(RunResult out, engine->RunGraph(model.graph, in, nullptr, {}, {}));
    KILN_RETURN_IF_ERROR(io::TrimStackedOutputs(out.outputs));
    return std::move(out.outputs);
  };
  for (int64_t trips : {100, 3, 0}) {
    SCOPED_TRACE(absl::StrCat("M=", trips));
    auto out = run(*r, trips);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->size(), 4u);
    const int64_t n = std::min<int64_t>(trips, 6);
    const HostTensor& ys = (*out)[1].second;
    const HostTensor& is = (*out)[2].second;
    const HostTensor& bs = (*out)[3].second;
    ASSERT_EQ(ys.dims(), (Dims{n, 2}));
    ASSERT_EQ(is.dims(), (Dims{n}));
    ASSERT_EQ(bs.dims(), (Dims{n}));
    EXPECT_EQ(is.dtype(), v1::DTYPE_I64);
    EXPECT_EQ(bs.dtype(), v1::DTYPE_BOOL);
    double v = 1;
    for (int64_t k = 0; k < n; ++k) {
      v *= 2;
      EXPECT_EQ(ys.GetAsDouble(2 * k), v) << k;
      EXPECT_EQ(ys.GetAsDouble(2 * k + 1), 2 * v) << k;
      EXPECT_EQ(is.GetAsDouble(k), k);
      EXPECT_EQ(bs.GetAsDouble(k), k < 5 ? 1 : 0) << k;
    }
    EXPECT_EQ((*out)[0].second.GetAsDouble(0), n == 0 ? 1 : v);
  }
  // Bounded at 4 rows: 3 iterations fit, 6 do not.
  io::OnnxImportOptions small;
  small.max_while_scan_length = 4;
  auto b = Import(m, small);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(run(*b, 3).ok());
  auto past = run(*b, 100);
  ASSERT_FALSE(past.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(past.status())) << past.status();
  EXPECT_TRUE(absl::StrContains(past.status().message(), "\"ys\"")) << past.status();
  // M known at import and below the bound: the buffers have M rows.
  const HostTensor m3 = HostTensor::FromVector<int64_t>(v1::DTYPE_I64, {}, {3});
  io::OnnxImportOptions fixed;
  fixed.input_values = {{"M", &m3}};
  auto f = Import(m, fixed);
  ASSERT_TRUE(f.ok()) << f.status();
  auto three = run(*f, 3);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ((*three)[1].second.dims(), (Dims{3, 2}));
}

// A node reading a stacked output would see the padded buffer: refused,
// naming the node and the loop.
TEST(OnnxImport, NodeReadingAWhileLoopsStackedOutputIsRefused) {
  auto r = Import(WhileScanModel(true));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsUnimplemented(r.status())) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "\"after\"")) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "stacked output of the while loop")) << r.status();
}

}  // namespace
}  // namespace kiln
