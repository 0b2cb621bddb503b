// ONNX through the client side: LoadGraphFile on a .onnx file (imported on the
// client) and `kilnctl import` (offline) to .kiln text and to a binary graph
// with params written as .npy files.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "clients/cpp/graph_file.h"
#include "engine/io/npy.h"
#include "engine/ir/text.h"
#include "onnx/onnx_pb.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// y = relu(x @ W + b), x [batch, 2].
std::string LinearModel() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  auto* g = m.mutable_graph();
  g->set_name("linear");
  auto* in = g->add_input();
  in->set_name("x");
  auto* tt = in->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  tt->mutable_shape()->add_dim()->set_dim_param("batch");
  tt->mutable_shape()->add_dim()->set_dim_value(2);
  for (const char* name : {"W", "b"}) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    if (std::string(name) == "W") t->add_dims(2);
    t->add_dims(2);
    for (int i = 0; i < (std::string(name) == "W" ? 4 : 2); ++i) t->add_float_data(i + 1.f);
  }
  auto node = [&](const char* op, std::vector<std::string> ins, const char* out) {
    auto* n = g->add_node();
    n->set_op_type(op);
    for (auto& s : ins) n->add_input(s);
    n->add_output(out);
  };
  node("MatMul", {"x", "W"}, "xw");
  node("Add", {"xw", "b"}, "s");
  node("Relu", {"s"}, "y");
  g->add_output()->set_name("y");
  return m.SerializeAsString();
}

// ys[k] = x + k + 1 for k < M (a Loop with a scan output), M an input.
std::string LoopModel() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  auto* g = m.mutable_graph();
  g->set_name("loop");
  auto input = [](onnx::GraphProto* g, const char* name, int type, bool scalar) {
    auto* in = g->add_input();
    in->set_name(name);
    auto* tt = in->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(type);
    auto* shape = tt->mutable_shape();
    if (!scalar) shape->add_dim()->set_dim_value(2);
  };
  input(g, "M", onnx::TensorProto::INT64, true);
  input(g, "x", onnx::TensorProto::FLOAT, false);
  auto* loop = g->add_node();
  loop->set_op_type("Loop");
  for (const char* i : {"M", "", "x"}) loop->add_input(i);
  for (const char* o : {"last", "ys"}) loop->add_output(o);
  auto* a = loop->add_attribute();
  a->set_name("body");
  a->set_type(onnx::AttributeProto::GRAPH);
  onnx::GraphProto* body = a->mutable_g();
  body->set_name("body");
  input(body, "i", onnx::TensorProto::INT64, true);
  input(body, "c", onnx::TensorProto::BOOL, true);
  input(body, "v", onnx::TensorProto::FLOAT, false);
  auto* one = body->add_initializer();
  one->set_name("one");
  one->set_data_type(onnx::TensorProto::FLOAT);
  one->add_float_data(1);
  auto node = [&](const char* op, std::vector<std::string> ins, const char* out) {
    auto* n = body->add_node();
    n->set_op_type(op);
    for (auto& s : ins) n->add_input(s);
    n->add_output(out);
  };
  node("Identity", {"c"}, "c_out");
  node("Add", {"v", "one"}, "v_out");
  node("Identity", {"v_out"}, "y");
  for (const char* o : {"c_out", "v_out", "y"}) body->add_output()->set_name(o);
  g->add_output()->set_name("ys");
  return m.SerializeAsString();
}

class OnnxClientsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / absl::StrCat("kiln_onnx_clients_", ::getpid());
    fs::create_directories(dir_);
    std::ofstream(dir_ / "m.onnx", std::ios::binary) << LinearModel();
    std::ofstream(dir_ / "bad.onnx", std::ios::binary) << "not a model";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  int Kilnctl(const std::string& args) {
    const std::string cmd = absl::StrCat(KILNCTL_PATH, " ", args, " > ", (dir_ / "out.txt").string(),
                                         " 2>&1");
    return WEXITSTATUS(std::system(cmd.c_str()));
  }
  std::string Output() {
    std::ifstream f(dir_ / "out.txt");
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  fs::path dir_;
};

TEST_F(OnnxClientsTest, GraphFileLoadsOnnx) {
  auto src = LoadGraphFile((dir_ / "m.onnx").string());
  ASSERT_TRUE(src.ok()) << src.status();
  ASSERT_TRUE(src->has_graph());
  EXPECT_GT(src->graph().nodes_size(), 3);
  auto bad = LoadGraphFile((dir_ / "bad.onnx").string());
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StartsWith(bad.status().message(), (dir_ / "bad.onnx").string()))
      << bad.status();
}

TEST_F(OnnxClientsTest, GraphFileForInputsSpecialisesALoopOnItsTripCount) {
  const std::string path = (dir_ / "loop.onnx").string();
  std::ofstream(path, std::ios::binary) << LoopModel();
  auto plain = LoadGraphFile(path);
  ASSERT_FALSE(plain.ok());
  EXPECT_TRUE(absl::IsUnimplemented(plain.status())) << plain.status();
  std::map<std::string, HostTensor> inputs;
  inputs.emplace("M", HostTensor::FromVector<int64_t>(v1::DTYPE_I64, {}, {3}));
  inputs.emplace("x", HostTensor::FromVector<float>(v1::DTYPE_F32, {2}, {0, 1}));
  std::vector<std::string> fixed;
  auto src = LoadGraphFileForInputs(path, inputs, &fixed);
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ(fixed, (std::vector<std::string>{"M"}));
  bool scan = false;
  std::vector<std::string> graph_inputs;
  for (const auto& n : src->graph().nodes()) {
    scan |= n.op() == v1::OP_SCAN && n.attrs().scan().length() == 3;
    if (n.op() == v1::OP_INPUT) graph_inputs.push_back(n.name());
  }
  EXPECT_TRUE(scan) << "a Scan of M = 3 steps";
  EXPECT_EQ(graph_inputs, (std::vector<std::string>{"x"}));
  // Without M the error names it.
  inputs.erase("M");
  auto missing = LoadGraphFileForInputs(path, inputs, &fixed);
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "\"M\"")) << missing.status();
}

TEST_F(OnnxClientsTest, KilnctlImportToTextAndToBinaryWithParams) {
  const std::string model = (dir_ / "m.onnx").string();
  ASSERT_EQ(Kilnctl(absl::StrCat("import ", model, " -o ", (dir_ / "m.kiln").string())), 0)
      << Output();
  std::ifstream text_file(dir_ / "m.kiln");
  const std::string text(std::istreambuf_iterator<char>(text_file), {});
  EXPECT_TRUE(absl::StrContains(text, "input x: f32[batch, 2]")) << text;
  auto parsed = ir::ParseGraph(text);
  EXPECT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;

  const std::string pb = (dir_ / "m.pb").string(), params = (dir_ / "params").string();
  ASSERT_EQ(Kilnctl(absl::StrCat("import ", model, " -o ", pb, " --param W --params-dir ", params)),
            0)
      << Output();
  EXPECT_TRUE(absl::StrContains(Output(), "1 params")) << Output();
  auto w = ReadNpy(params + "/W.npy");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->dims(), (Dims{2, 2}));
  EXPECT_EQ(w->GetAsDouble(3), 4.0);
  auto src = LoadGraphFile(pb);
  ASSERT_TRUE(src.ok()) << src.status();
  int param_nodes = 0;
  for (const auto& n : src->graph().nodes()) param_nodes += n.op() == v1::OP_PARAM;
  EXPECT_EQ(param_nodes, 1);

  // Params without a place to write them, and a broken model: clear errors.
  EXPECT_EQ(Kilnctl(absl::StrCat("import ", model, " -o ", pb, " --all-params")), 1);
  EXPECT_TRUE(absl::StrContains(Output(), "--params-dir")) << Output();
  EXPECT_EQ(Kilnctl(absl::StrCat("import ", (dir_ / "bad.onnx").string(), " -o ", pb)), 1);
  EXPECT_TRUE(absl::StrContains(Output(), "not an ONNX model")) << Output();
}

}  // namespace
}  // namespace kiln
