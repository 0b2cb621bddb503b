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
#include "engine/engine.h"
#include "engine/io/onnx/onnx_import.h"
#include "engine/ir/text.h"
#include "engine/ir/verifier.h"
#include "onnx/onnx_pb.h"

namespace kiln {
namespace {

// A small ONNX model builder.
struct Model {
  onnx::ModelProto m;
  explicit Model(int opset) {
    m.set_ir_version(8);
    auto* o = m.add_opset_import();
    o->set_domain("");
    o->set_version(opset);
    m.mutable_graph()->set_name("test");
  }
  onnx::GraphProto& g() { return *m.mutable_graph(); }
  // dims: >= 0 sizes; -1 a dim_param "batch"; -2 no dim at all.
  void Input(const std::string& name, std::vector<int64_t> dims, int type = onnx::TensorProto::FLOAT) {
    auto* vi = g().add_input();
    vi->set_name(name);
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(type);
    auto* shape = tt->mutable_shape();
    for (int64_t d : dims) {
      auto* dim = shape->add_dim();
      if (d >= 0) dim->set_dim_value(d);
      if (d == -1) dim->set_dim_param("batch");
    }
  }
  void Output(const std::string& name) { g().add_output()->set_name(name); }
  onnx::TensorProto* Init(const std::string& name, std::vector<int64_t> dims,
                          std::vector<float> values) {
    auto* t = g().add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) t->add_dims(d);
    for (float v : values) t->add_float_data(v);
    return t;
  }
  void InitInts(const std::string& name, std::vector<int64_t> values) {
    auto* t = g().add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(static_cast<int64_t>(values.size()));
    for (int64_t v : values) t->add_int64_data(v);
  }
  onnx::NodeProto* Node(const std::string& op, std::vector<std::string> in,
                        std::vector<std::string> out, const std::string& name = "") {
    auto* n = g().add_node();
    n->set_op_type(op);
    n->set_name(name.empty() ? out[0] : name);
    for (auto& s : in) n->add_input(s);
    for (auto& s : out) n->add_output(s);
    return n;
  }
  static void Ints(onnx::NodeProto* n, const std::string& name, std::vector<int64_t> v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t x : v) a->add_ints(x);
  }
  static void Float(onnx::NodeProto* n, const std::string& name, float v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(v);
  }
  std::string Bytes() const { return m.SerializeAsString(); }
};

absl::StatusOr<io::OnnxModel> Import(const Model& m, const io::OnnxImportOptions& o = {}) {
  return io::ImportOnnxModel(m.Bytes(), o);
}

std::unique_ptr<Engine> MakeEngine() {
  EngineOptions o;
  o.calibration = EngineOptions::Calibration::kNever;
  o.disabled_backends = {"vulkan", "cuda"};
  return std::move(Engine::Create(o)).value();
}

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

onnx::NodeProto* SubNode(onnx::GraphProto& g, const std::string& op, std::vector<std::string> in,
                         std::vector<std::string> out) {
  auto* n = g.add_node();
  n->set_op_type(op);
  n->set_name(out[0]);
  for (auto& s : in) n->add_input(s);
  for (auto& s : out) n->add_output(s);
  return n;
}

void SubInput(onnx::GraphProto& g, const std::string& name, int type) {
  auto* vi = g.add_input();
  vi->set_name(name);
  vi->mutable_type()->mutable_tensor_type()->set_elem_type(type);
}

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

// LSTM direction=reverse over X equals direction=forward over X reversed in
// time (the node tests cover forward only): Y_h alike, Y[t] = Y_fwd[T-1-t].
TEST(OnnxImport, ReverseLstmIsForwardOverReversedTime) {
  constexpr int64_t kT = 4, kB = 2, kIn = 3, kH = 5;
  auto model = [&](const std::string& direction) {
    Model m(14);
    m.Input("X", {kT, kB, kIn});
    std::vector<float> w(4 * kH * kIn), r(4 * kH * kH), b(8 * kH);
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.3f * std::sin(0.7f * i);
    for (size_t i = 0; i < r.size(); ++i) r[i] = 0.2f * std::cos(1.3f * i);
    for (size_t i = 0; i < b.size(); ++i) b[i] = 0.1f * std::sin(2.1f * i);
    m.Init("W", {1, 4 * kH, kIn}, w);
    m.Init("R", {1, 4 * kH, kH}, r);
    m.Init("B", {1, 8 * kH}, b);
    auto* n = m.Node("LSTM", {"X", "W", "R", "B"}, {"Y", "Y_h", "Y_c"}, "lstm");
    auto* hs = n->add_attribute();
    hs->set_name("hidden_size");
    hs->set_type(onnx::AttributeProto::INT);
    hs->set_i(kH);
    auto* d = n->add_attribute();
    d->set_name("direction");
    d->set_type(onnx::AttributeProto::STRING);
    d->set_s(direction);
    m.Output("Y");
    m.Output("Y_h");
    return m;
  };
  auto fwd = Import(model("forward"));
  auto rev = Import(model("reverse"));
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  ASSERT_TRUE(rev.ok()) << rev.status();
  HostTensor x = *HostTensor::Create(v1::DTYPE_F32, {kT, kB, kIn});
  HostTensor xr = *HostTensor::Create(v1::DTYPE_F32, {kT, kB, kIn});
  const int64_t step = kB * kIn;
  for (int64_t i = 0; i < kT * step; ++i) x.SetFromDouble(i, std::sin(0.37 * i));
  for (int64_t t = 0; t < kT; ++t) {
    for (int64_t k = 0; k < step; ++k) xr.SetFromDouble(t * step + k, x.GetAsDouble((kT - 1 - t) * step + k));
  }
  auto engine = MakeEngine();
  auto a = engine->RunGraph(rev->graph, std::vector<TensorRef>{TensorRef::Of("X", x)}, nullptr, {}, {});
  auto f = engine->RunGraph(fwd->graph, std::vector<TensorRef>{TensorRef::Of("X", xr)}, nullptr, {}, {});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(f.ok()) << f.status();
  const HostTensor& ya = a->outputs[0].second;
  const HostTensor& yf = f->outputs[0].second;
  ASSERT_EQ(ya.dims(), (Dims{kT, 1, kB, kH}));
  const int64_t ystep = kB * kH;
  for (int64_t t = 0; t < kT; ++t) {
    for (int64_t k = 0; k < ystep; ++k) {
      EXPECT_NEAR(ya.GetAsDouble(t * ystep + k), yf.GetAsDouble((kT - 1 - t) * ystep + k), 1e-5) << t;
    }
  }
  for (int64_t k = 0; k < ystep; ++k) {
    EXPECT_NEAR(a->outputs[1].second.GetAsDouble(k), f->outputs[1].second.GetAsDouble(k), 1e-5);
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// A bidirectional LSTM / GRU equals two one-direction nodes over each
// direction's slice of W, R, B, the initial states (and LSTM peepholes):
// Y[.., 0, ..] is the forward node's Y, Y[.., 1, ..] the reverse node's, Y_h
// and Y_c alike. Layout 1 (batch first), with initial states, peepholes and
// GRU's linear_before_reset, none of which the PyTorch exports use.
void CheckBidirectional(bool lstm) {
  constexpr int64_t kT = 4, kB = 2, kIn = 3, kH = 5;
  const int64_t g = lstm ? 4 : 3;
  // dirs: {0, 1} for the bidirectional node, {d} for one direction.
  auto model = [&](const std::vector<int64_t>& dirs, const std::string& direction) {
    const int64_t nd = static_cast<int64_t>(dirs.size());
    Model m(14);
    m.Input("X", {kB, kT, kIn});
    auto fill = [&](int64_t per_dir, double a, double f) {
      std::vector<float> v;
      for (int64_t d : dirs) {
        for (int64_t i = 0; i < per_dir; ++i) v.push_back(static_cast<float>(a * std::sin(f * i + d)));
      }
      return v;
    };
    m.Init("W", {nd, g * kH, kIn}, fill(g * kH * kIn, 0.3, 0.7));
    m.Init("R", {nd, g * kH, kH}, fill(g * kH * kH, 0.2, 1.3));
    m.Init("B", {nd, 2 * g * kH}, fill(2 * g * kH, 0.1, 2.1));
    // Initial states [batch, dirs, H] (layout 1).
    auto states = [&](double phase) {
      std::vector<float> v;
      for (int64_t b = 0; b < kB; ++b) {
        for (int64_t d : dirs) {
          for (int64_t k = 0; k < kH; ++k) v.push_back(static_cast<float>(0.5 * std::sin(0.3 * (b * 7 + d * 13 + k) + phase)));
        }
      }
      return v;
    };
    m.Init("H0", {kB, nd, kH}, states(0.0));
    std::vector<std::string> in = {"X", "W", "R", "B", "", "H0"};
    std::vector<std::string> out = {"Y", "Y_h"};
    if (lstm) {
      m.Init("C0", {kB, nd, kH}, states(1.0));
      m.Init("P", {nd, 3 * kH}, fill(3 * kH, 0.2, 0.9));
      in.insert(in.end(), {"C0", "P"});
      out.push_back("Y_c");
    }
    auto* n = m.Node(lstm ? "LSTM" : "GRU", in, out, "rnn");
    auto* hs = n->add_attribute();
    hs->set_name("hidden_size");
    hs->set_type(onnx::AttributeProto::INT);
    hs->set_i(kH);
    auto* layout = n->add_attribute();
    layout->set_name("layout");
    layout->set_type(onnx::AttributeProto::INT);
    layout->set_i(1);
    if (!lstm) {
      auto* lbr = n->add_attribute();
      lbr->set_name("linear_before_reset");
      lbr->set_type(onnx::AttributeProto::INT);
      lbr->set_i(1);
    }
    auto* d = n->add_attribute();
    d->set_name("direction");
    d->set_type(onnx::AttributeProto::STRING);
    d->set_s(direction);
    for (const auto& o : out) m.Output(o);
    return m;
  };
  HostTensor x = *HostTensor::Create(v1::DTYPE_F32, {kB, kT, kIn});
  for (int64_t i = 0; i < x.num_elements(); ++i) x.SetFromDouble(i, std::sin(0.37 * i));
  auto engine = MakeEngine();
  auto run = [&](const Model& m) {
    std::vector<HostTensor> outs;
    auto imported = Import(m);
    EXPECT_TRUE(imported.ok()) << imported.status();
    if (!imported.ok()) return outs;
    auto r = engine->RunGraph(imported->graph, std::vector<TensorRef>{TensorRef::Of("X", x)}, nullptr, {}, {});
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return outs;
    for (auto& [name, t] : r->outputs) outs.push_back(std::move(t));
    return outs;
  };
  const std::vector<HostTensor> bi = run(model({0, 1}, "bidirectional"));
  const std::vector<HostTensor> fwd = run(model({0}, "forward"));
  const std::vector<HostTensor> rev = run(model({1}, "reverse"));
  const size_t n_out = lstm ? 3 : 2;
  ASSERT_EQ(bi.size(), n_out);
  ASSERT_EQ(fwd.size(), n_out);
  ASSERT_EQ(rev.size(), n_out);
  ASSERT_EQ(bi[0].dims(), (Dims{kB, kT, 2, kH}));
  ASSERT_EQ(bi[1].dims(), (Dims{kB, 2, kH}));
  // Every output is [..., dirs, H] with the direction axis second to last.
  for (size_t o = 0; o < n_out; ++o) {
    const int64_t rows = bi[o].num_elements() / (2 * kH);
    ASSERT_EQ(fwd[o].num_elements(), rows * kH) << o;
    for (int64_t row = 0; row < rows; ++row) {
      for (int64_t k = 0; k < kH; ++k) {
        EXPECT_NEAR(bi[o].GetAsDouble((row * 2 + 0) * kH + k), fwd[o].GetAsDouble(row * kH + k), 1e-5)
            << "output " << o << " row " << row;
        EXPECT_NEAR(bi[o].GetAsDouble((row * 2 + 1) * kH + k), rev[o].GetAsDouble(row * kH + k), 1e-5)
            << "output " << o << " row " << row;
      }
    }
  }
}

TEST(OnnxImport, BidirectionalLstmIsForwardAndReverse) { CheckBidirectional(true); }
TEST(OnnxImport, BidirectionalGruIsForwardAndReverse) { CheckBidirectional(false); }

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

// ONNX's RNN activation functions, in f64 (alpha / beta as given).
double RefAct(const std::string& n, double a, double b, double x) {
  if (n == "Sigmoid") return 1 / (1 + std::exp(-x));
  if (n == "Tanh") return std::tanh(x);
  if (n == "Relu") return std::max(x, 0.0);
  if (n == "Affine") return a * x + b;
  if (n == "LeakyRelu") return x >= 0 ? x : a * x;
  if (n == "ScaledTanh") return a * std::tanh(b * x);
  if (n == "HardSigmoid") return std::clamp(a * x + b, 0.0, 1.0);
  if (n == "Elu") return x >= 0 ? x : a * (std::exp(x) - 1);
  if (n == "Softsign") return x / (1 + std::fabs(x));
  if (n == "Softplus") return std::log1p(std::exp(x));
  if (n == "ThresholdedRelu") return x >= a ? x : 0;
  ADD_FAILURE() << n;
  return 0;
}

struct ActCase {
  bool lstm;
  std::vector<std::string> names;
  std::vector<float> alpha, beta;
  // The (alpha, beta) each function gets: consumed in order by the functions
  // that take them.
  std::vector<std::pair<double, double>> expect;
  double clip = 0;           // > 0: the clip attribute
  bool write_names = true;   // false: the node has no activations attribute (the defaults)
  bool input_forget = false;  // LSTM: f = 1 - i
};

// A one-direction LSTM / GRU with custom activations against an f64
// reference of the ONNX equations (layout 0, biases, zero initial states).
void CheckActivations(const ActCase& k) {
  constexpr int64_t kT = 3, kB = 2, kIn = 3, kH = 4;
  const int64_t g = k.lstm ? 4 : 3;
  std::vector<float> w(g * kH * kIn), r(g * kH * kH), b(2 * g * kH);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.4f * std::sin(0.7f * i + 0.2f);
  for (size_t i = 0; i < r.size(); ++i) r[i] = 0.3f * std::cos(1.3f * i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = 0.2f * std::sin(2.1f * i);
  Model m(14);
  m.Input("X", {kT, kB, kIn});
  m.Init("W", {1, g * kH, kIn}, w);
  m.Init("R", {1, g * kH, kH}, r);
  m.Init("B", {1, 2 * g * kH}, b);
  auto* n = m.Node(k.lstm ? "LSTM" : "GRU", {"X", "W", "R", "B"}, {"Y"}, "rnn");
  auto* hs = n->add_attribute();
  hs->set_name("hidden_size");
  hs->set_type(onnx::AttributeProto::INT);
  hs->set_i(kH);
  if (k.write_names) {
    auto* acts = n->add_attribute();
    acts->set_name("activations");
    acts->set_type(onnx::AttributeProto::STRINGS);
    for (const auto& s : k.names) acts->add_strings(s);
  }
  if (k.clip > 0) Model::Float(n, "clip", static_cast<float>(k.clip));
  if (k.input_forget) {
    auto* a = n->add_attribute();
    a->set_name("input_forget");
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(1);
  }
  for (auto [name, v] : {std::pair{"activation_alpha", &k.alpha}, std::pair{"activation_beta", &k.beta}}) {
    if (v->empty()) continue;
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::FLOATS);
    for (float f : *v) a->add_floats(f);
  }
  m.Output("Y");
  auto imported = Import(m);
  ASSERT_TRUE(imported.ok()) << imported.status();
  HostTensor x = *HostTensor::Create(v1::DTYPE_F32, {kT, kB, kIn});
  for (int64_t i = 0; i < x.num_elements(); ++i) x.SetFromDouble(i, 1.5 * std::sin(0.37 * i + 0.1));
  auto engine = MakeEngine();
  auto out = engine->RunGraph(imported->graph, std::vector<TensorRef>{TensorRef::Of("X", x)}, nullptr, {}, {});
  ASSERT_TRUE(out.ok()) << out.status();
  const HostTensor& y = out->outputs[0].second;
  ASSERT_EQ(y.dims(), (Dims{kT, 1, kB, kH}));
  // clip: every activation's input clamped (ONNX: "applied to the input of
  // activations"; LSTM's cell state itself stays unclipped).
  auto act = [&](int j, double v) {
    if (k.clip > 0) v = std::clamp(v, -k.clip, k.clip);
    return RefAct(k.names[j], k.expect[j].first, k.expect[j].second, v);
  };
  for (int64_t bb = 0; bb < kB; ++bb) {
    std::vector<double> h(kH, 0.0), cs(kH, 0.0);
    for (int64_t t = 0; t < kT; ++t) {
      // pre[gate][j] = x W^T + Wb (+ h R^T + Rb, except GRU's hidden gate).
      std::vector<std::vector<double>> xw(g, std::vector<double>(kH)), hr = xw;
      for (int64_t q = 0; q < g; ++q) {
        for (int64_t j = 0; j < kH; ++j) {
          const int64_t row = q * kH + j;
          double sx = b[row], sh = b[g * kH + row];
          for (int64_t i = 0; i < kIn; ++i) sx += double{w[row * kIn + i]} * x.GetAsDouble((t * kB + bb) * kIn + i);
          for (int64_t i = 0; i < kH; ++i) sh += double{r[row * kH + i]} * h[i];
          xw[q][j] = sx;
          hr[q][j] = sh;
        }
      }
      std::vector<double> h1(kH);
      if (k.lstm) {  // gates i, o, f, c
        for (int64_t j = 0; j < kH; ++j) {
          const double gi = act(0, xw[0][j] + hr[0][j]), go = act(0, xw[1][j] + hr[1][j]);
          const double gf = k.input_forget ? 1 - gi : act(0, xw[2][j] + hr[2][j]);
          const double gc = act(1, xw[3][j] + hr[3][j]);
          cs[j] = gf * cs[j] + gi * gc;
          h1[j] = go * act(2, cs[j]);
        }
      } else {  // gates z, r, h; linear_before_reset = 0
        std::vector<double> z(kH), rg(kH);
        for (int64_t j = 0; j < kH; ++j) {
          z[j] = act(0, xw[0][j] + hr[0][j]);
          rg[j] = act(0, xw[1][j] + hr[1][j]);
        }
        for (int64_t j = 0; j < kH; ++j) {
          const int64_t row = 2 * kH + j;
          double s = b[g * kH + row];
          for (int64_t i = 0; i < kH; ++i) s += double{r[row * kH + i]} * rg[i] * h[i];
          const double nn = act(1, xw[2][j] + s);
          h1[j] = (1 - z[j]) * nn + z[j] * h[j];
        }
      }
      h = h1;
      for (int64_t j = 0; j < kH; ++j) {
        EXPECT_NEAR(y.GetAsDouble((t * kB + bb) * kH + j), h[j], 1e-5 + 1e-5 * std::fabs(h[j]))
            << "t " << t << " batch " << bb << " j " << j;
      }
    }
  }
}

TEST(OnnxImport, LstmCustomActivationsMatchF64Reference) {
  CheckActivations({true, {"HardSigmoid", "LeakyRelu", "Softsign"}, {0.3f, 0.1f}, {0.4f},
                    {{0.3f, 0.4f}, {0.1f, 0}, {0, 0}}});
  CheckActivations({true, {"Sigmoid", "ScaledTanh", "Elu"}, {}, {}, {{0, 0}, {1, 1}, {1, 0}}});
}

TEST(OnnxImport, GruCustomActivationsMatchF64Reference) {
  CheckActivations({false, {"Affine", "Elu"}, {0.25f, 0.7f}, {0.5f}, {{0.25f, 0.5f}, {0.7f, 0}}});
  CheckActivations({false, {"Softplus", "Relu"}, {}, {}, {{0, 0}, {0, 0}}});
  CheckActivations({false, {"Sigmoid", "ThresholdedRelu"}, {0.2f}, {}, {{0, 0}, {0.2f, 0}}});
}

TEST(OnnxImport, RnnClipMatchesF64Reference) {
  const float clip = 0.5f;  // the inputs drive the gates and LSTM's cell state past it
  CheckActivations({true, {"Sigmoid", "Tanh", "Tanh"}, {}, {}, {{0, 0}, {0, 0}, {0, 0}}, clip, false});
  CheckActivations({false, {"Sigmoid", "Tanh"}, {}, {}, {{0, 0}, {0, 0}}, clip, false});
  CheckActivations({false, {"HardSigmoid", "Softsign"}, {0.5f}, {0.25f}, {{0.5f, 0.25f}, {0, 0}}, clip, true});
}

TEST(OnnxImport, LstmInputForgetMatchesF64Reference) {
  CheckActivations({true, {"Sigmoid", "Tanh", "Tanh"}, {}, {}, {{0, 0}, {0, 0}, {0, 0}}, 0, false, true});
}

TEST(OnnxImport, RnnActivationListOfTheWrongLengthIsRefused) {
  Model m(14);
  m.Input("X", {2, 1, 3});
  m.Init("W", {1, 12, 3}, std::vector<float>(36, 0.1f));
  m.Init("R", {1, 12, 4}, std::vector<float>(48, 0.1f));
  auto* n = m.Node("GRU", {"X", "W", "R"}, {"Y"}, "gru");
  auto* hs = n->add_attribute();
  hs->set_name("hidden_size");
  hs->set_type(onnx::AttributeProto::INT);
  hs->set_i(4);
  auto* acts = n->add_attribute();
  acts->set_name("activations");
  acts->set_type(onnx::AttributeProto::STRINGS);
  acts->add_strings("Sigmoid");
  m.Output("Y");
  auto r = Import(m);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "2 per direction")) << r.status();
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// sequence_lens shorter than the sequence: each row of a batched LSTM / GRU
// equals the same node run on that row alone, cut to its length (Y zero past
// it, Y_h / Y_c the state at its last step), in every direction.
void CheckSequenceLens(bool lstm, const std::string& direction) {
  constexpr int64_t kT = 4, kIn = 3, kH = 3;
  const std::vector<int32_t> lens = {4, 1, 3};
  const int64_t kB = static_cast<int64_t>(lens.size());
  const int64_t g = lstm ? 4 : 3, nd = direction == "bidirectional" ? 2 : 1;
  auto model = [&](int64_t t_len, int64_t batch, const std::vector<int32_t>* seq_lens) {
    Model m(14);
    m.Input("X", {t_len, batch, kIn});
    std::vector<float> w(nd * g * kH * kIn), r(nd * g * kH * kH), b(nd * 2 * g * kH);
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.4f * std::sin(0.7f * i + 0.2f);
    for (size_t i = 0; i < r.size(); ++i) r[i] = 0.3f * std::cos(1.3f * i);
    for (size_t i = 0; i < b.size(); ++i) b[i] = 0.2f * std::sin(2.1f * i);
    m.Init("W", {nd, g * kH, kIn}, w);
    m.Init("R", {nd, g * kH, kH}, r);
    m.Init("B", {nd, 2 * g * kH}, b);
    std::vector<std::string> in = {"X", "W", "R", "B"};
    if (seq_lens != nullptr) {
      auto* t = m.g().add_initializer();
      t->set_name("L");
      t->set_data_type(onnx::TensorProto::INT32);
      t->add_dims(static_cast<int64_t>(seq_lens->size()));
      for (int32_t v : *seq_lens) t->add_int32_data(v);
      in.push_back("L");
    }
    std::vector<std::string> out = {"Y", "Y_h"};
    if (lstm) out.push_back("Y_c");
    auto* n = m.Node(lstm ? "LSTM" : "GRU", in, out, "rnn");
    auto* hs = n->add_attribute();
    hs->set_name("hidden_size");
    hs->set_type(onnx::AttributeProto::INT);
    hs->set_i(kH);
    auto* d = n->add_attribute();
    d->set_name("direction");
    d->set_type(onnx::AttributeProto::STRING);
    d->set_s(direction);
    for (const auto& o : out) m.Output(o);
    return m;
  };
  auto engine = MakeEngine();
  auto run = [&](const Model& m, const HostTensor& x) {
    std::vector<HostTensor> outs;
    auto imported = Import(m);
    EXPECT_TRUE(imported.ok()) << imported.status();
    if (!imported.ok()) return outs;
    auto r = engine->RunGraph(imported->graph, std::vector<TensorRef>{TensorRef::Of("X", x)}, nullptr, {}, {});
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return outs;
    for (auto& [name, t] : r->outputs) outs.push_back(std::move(t));
    return outs;
  };
  HostTensor x = *HostTensor::Create(v1::DTYPE_F32, {kT, kB, kIn});
  for (int64_t i = 0; i < x.num_elements(); ++i) x.SetFromDouble(i, 1.2 * std::sin(0.37 * i + 0.1));
  const std::vector<HostTensor> all = run(model(kT, kB, &lens), x);
  const size_t n_out = lstm ? 3 : 2;
  ASSERT_EQ(all.size(), n_out);
  for (int64_t b = 0; b < kB; ++b) {
    const int64_t len = lens[b];
    HostTensor xb = *HostTensor::Create(v1::DTYPE_F32, {len, 1, kIn});
    for (int64_t t = 0; t < len; ++t) {
      for (int64_t i = 0; i < kIn; ++i) xb.SetFromDouble(t * kIn + i, x.GetAsDouble((t * kB + b) * kIn + i));
    }
    const std::vector<HostTensor> one = run(model(len, 1, nullptr), xb);
    ASSERT_EQ(one.size(), n_out);
    // Y [T, dirs, B, H]
    for (int64_t t = 0; t < kT; ++t) {
      for (int64_t d = 0; d < nd; ++d) {
        for (int64_t k = 0; k < kH; ++k) {
          const double got = all[0].GetAsDouble(((t * nd + d) * kB + b) * kH + k);
          const double want = t < len ? one[0].GetAsDouble((t * nd + d) * kH + k) : 0.0;
          EXPECT_NEAR(got, want, 1e-5) << direction << " Y b " << b << " t " << t << " d " << d;
        }
      }
    }
    // Y_h, Y_c [dirs, B, H]
    for (size_t o = 1; o < n_out; ++o) {
      for (int64_t d = 0; d < nd; ++d) {
        for (int64_t k = 0; k < kH; ++k) {
          EXPECT_NEAR(all[o].GetAsDouble((d * kB + b) * kH + k), one[o].GetAsDouble(d * kH + k), 1e-5)
              << direction << " output " << o << " b " << b << " d " << d;
        }
      }
    }
  }
}

TEST(OnnxImportHostile, RnnSequenceLensOutOfRangeIsRefused) {
  for (std::vector<int64_t> lens : {std::vector<int64_t>{2, 5}, {2}, {-1, 1}}) {
    Model m(14);
    m.Input("X", {3, 2, 3});
    m.Init("W", {1, 12, 3}, std::vector<float>(36, 0.1f));
    m.Init("R", {1, 12, 4}, std::vector<float>(48, 0.1f));
    m.InitInts("L", lens);
    auto* n = m.Node("GRU", {"X", "W", "R", "", "L"}, {"Y"}, "gru");
    auto* hs = n->add_attribute();
    hs->set_name("hidden_size");
    hs->set_type(onnx::AttributeProto::INT);
    hs->set_i(4);
    m.Output("Y");
    auto r = Import(m);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "sequence_lens")) << r.status();
  }
}

TEST(OnnxImport, LstmSequenceLensEachRowAsAlone) {
  for (const char* dir : {"forward", "reverse", "bidirectional"}) CheckSequenceLens(true, dir);
}
TEST(OnnxImport, GruSequenceLensEachRowAsAlone) {
  for (const char* dir : {"forward", "reverse", "bidirectional"}) CheckSequenceLens(false, dir);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// The simple RNN, bidirectional with a custom activation per direction,
// against an f64 reference: H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb).
TEST(OnnxImport, BidirectionalRnnMatchesF64Reference) {
  constexpr int64_t kT = 3, kB = 2, kIn = 3, kH = 4;
  const std::vector<std::string> acts = {"Tanh", "LeakyRelu"};
  const double alpha = 0.2;  // LeakyRelu's
  std::vector<float> w(2 * kH * kIn), r(2 * kH * kH), b(2 * 2 * kH);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5f * std::sin(0.7f * i + 0.2f);
  for (size_t i = 0; i < r.size(); ++i) r[i] = 0.3f * std::cos(1.3f * i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = 0.2f * std::sin(2.1f * i);
  Model m(14);
  m.Input("X", {kT, kB, kIn});
  m.Init("W", {2, kH, kIn}, w);
  m.Init("R", {2, kH, kH}, r);
  m.Init("B", {2, 2 * kH}, b);
  auto* n = m.Node("RNN", {"X", "W", "R", "B"}, {"Y", "Y_h"}, "rnn");
  auto* hs = n->add_attribute();
  hs->set_name("hidden_size");
  hs->set_type(onnx::AttributeProto::INT);
  hs->set_i(kH);
  auto* d = n->add_attribute();
  d->set_name("direction");
  d->set_type(onnx::AttributeProto::STRING);
  d->set_s("bidirectional");
  auto* a = n->add_attribute();
  a->set_name("activations");
  a->set_type(onnx::AttributeProto::STRINGS);
  for (const auto& s : acts) a->add_strings(s);
  auto* al = n->add_attribute();
  al->set_name("activation_alpha");
  al->set_type(onnx::AttributeProto::FLOATS);
  al->add_floats(static_cast<float>(alpha));
  m.Output("Y");
  m.Output("Y_h");
  auto imported = Import(m);
  ASSERT_TRUE(imported.ok()) << imported.status();
  HostTensor x = *HostTensor::Create(v1::DTYPE_F32, {kT, kB, kIn});
  for (int64_t i = 0; i < x.num_elements(); ++i) x.SetFromDouble(i, 1.3 * std::sin(0.37 * i + 0.1));
  auto engine = MakeEngine();
  auto out = engine->RunGraph(imported->graph, std::vector<TensorRef>{TensorRef::Of("X", x)}, nullptr, {}, {});
  ASSERT_TRUE(out.ok()) << out.status();
  const HostTensor& y = out->outputs[0].second;
  const HostTensor& yh = out->outputs[1].second;
  ASSERT_EQ(y.dims(), (Dims{kT, 2, kB, kH}));
  ASSERT_EQ(yh.dims(), (Dims{2, kB, kH}));
  for (int64_t dir = 0; dir < 2; ++dir) {
    for (int64_t bb = 0; bb < kB; ++bb) {
      std::vector<double> h(kH, 0.0);
      for (int64_t s = 0; s < kT; ++s) {
        const int64_t t = dir == 0 ? s : kT - 1 - s;
        std::vector<double> h1(kH);
        for (int64_t j = 0; j < kH; ++j) {
          double v = double{b[dir * 2 * kH + j]} + b[dir * 2 * kH + kH + j];
          for (int64_t i = 0; i < kIn; ++i) v += double{w[(dir * kH + j) * kIn + i]} * x.GetAsDouble((t * kB + bb) * kIn + i);
          for (int64_t i = 0; i < kH; ++i) v += double{r[(dir * kH + j) * kH + i]} * h[i];
          h1[j] = dir == 0 ? std::tanh(v) : (v >= 0 ? v : alpha * v);
        }
        h = h1;
        for (int64_t j = 0; j < kH; ++j) {
          EXPECT_NEAR(y.GetAsDouble(((t * 2 + dir) * kB + bb) * kH + j), h[j], 1e-5 + 1e-5 * std::fabs(h[j]))
              << "dir " << dir << " t " << t << " batch " << bb;
        }
      }
      for (int64_t j = 0; j < kH; ++j) {
        EXPECT_NEAR(yh.GetAsDouble((dir * kB + bb) * kH + j), h[j], 1e-5 + 1e-5 * std::fabs(h[j])) << dir;
      }
    }
  }
}

}  // namespace
}  // namespace kiln
