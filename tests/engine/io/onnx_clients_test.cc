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
