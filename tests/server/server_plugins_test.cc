// Custom ops from kernel plugins through a real kilnd (--plugin_dir): the
// example plugin's ops run and give the right numbers; a graph naming an op no
// plugin provides, and shape functions that return nonsense, get
// INVALID_ARGUMENT naming the node; bad plugins are refused in the log while
// kilnd starts and serves the good ones; a changed plugin changes the
// executable key.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "clients/cpp/graph_builder.h"
#include "tests/server/kilnd_process.h"
#include "tests/server/test_graphs.h"

namespace kiln {
namespace {

using testing::AddTensor;
using testing::Context;
using testing::KilndProcess;
using testing::TempDir;

std::string TestPlugin(const std::string& variant) {
  return absl::StrCat(KILN_TEST_PLUGIN_DIR, "/libkiln_test_plugin_", variant, ".so");
}

std::string Payload(float alpha) {
  std::string p(sizeof(float), '\0');
  std::memcpy(p.data(), &alpha, sizeof(float));
  return p;
}

// x f32[dims] (and y, for two operands) -> custom op `op` named "c".
v1::Graph CustomGraph(const std::string& op, std::vector<int64_t> dims, int operands,
                      const std::string& payload = "") {
  GraphBuilder b("custom");
  const std::vector<GraphBuilder::DimSpec> spec(dims.begin(), dims.end());
  std::vector<GraphBuilder::Value> ins;
  ins.push_back(b.input("x", v1::DTYPE_F32, spec));
  if (operands > 1) ins.push_back(b.input("y", v1::DTYPE_F32, spec));
  v1::Attrs attrs;
  attrs.mutable_custom()->set_name(op);
  attrs.mutable_custom()->set_payload(payload);
  auto c = b.node(v1::OP_CUSTOM, ins, attrs, "c");
  b.output("out", c);
  return b.Build();
}

class ServerPlugins : public ::testing::Test {
 protected:
  // Starts kilnd with a plugin directory holding copies of `plugins`.
  void Start(const std::vector<std::string>& plugins) {
    for (const std::string& p : plugins) {
      std::filesystem::copy_file(p, absl::StrCat(plugin_dir_.path(), "/",
                                                 std::filesystem::path(p).filename().string()));
    }
    std::string error;
    kilnd_ = KilndProcess::Start(
        {.cache_dir = cache_.path(), .extra_flags = {"--plugin_dir=" + plugin_dir_.path()}}, &error);
    ASSERT_NE(kilnd_, nullptr) << error;
    stub_ = kilnd_->Stub();
  }

  grpc::Status Run(const v1::Graph& g, const std::vector<std::vector<double>>& inputs,
                   const std::vector<int64_t>& dims, v1::RunResponse* resp) {
    v1::RunRequest req;
    *req.mutable_graph()->mutable_graph() = g;
    const char* names[] = {"x", "y"};
    for (size_t i = 0; i < inputs.size(); ++i) {
      AddTensor(req.mutable_inputs(), names[i], v1::DTYPE_F32, Dims(dims.begin(), dims.end()),
                inputs[i]);
    }
    return stub_->Run(Context().get(), req, resp);
  }

  grpc::Status Compile(const v1::Graph& g, v1::CompileResponse* resp) {
    v1::CompileRequest req;
    *req.mutable_graph()->mutable_graph() = g;
    return stub_->Compile(Context().get(), req, resp);
  }

  void ExpectRejected(const v1::Graph& g, const std::vector<int64_t>& dims,
                      const std::vector<std::string>& needles) {
    v1::CompileResponse resp;
    const grpc::Status s = Compile(g, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    for (const std::string& n : needles) {
      EXPECT_NE(s.error_message().find(n), std::string::npos)
          << "\"" << n << "\" not in: " << s.error_message();
    }
    ExpectStillServing();
  }

  void ExpectStillServing() {
    v1::RunResponse resp;
    const grpc::Status s = stub_->Run(Context().get(), testing::AffineRequest(), &resp);
    ASSERT_TRUE(s.ok()) << "kilnd stopped serving: " << s.error_message() << "\nkilnd log:\n"
                        << kilnd_->Log();
  }

  TempDir cache_;
  TempDir plugin_dir_;
  std::unique_ptr<KilndProcess> kilnd_;
  std::unique_ptr<v1::Kiln::Stub> stub_;
};

TEST_F(ServerPlugins, ExampleOpsRunAndAreCorrect) {
  Start({KILN_EXAMPLE_PLUGIN_PATH});
  EXPECT_NE(kilnd_->Log().find("example.add_scaled, example.row_sum"), std::string::npos)
      << kilnd_->Log();

  v1::RunResponse resp;
  grpc::Status s = Run(CustomGraph("example.add_scaled", {2, 3}, 2, Payload(2.5f)),
                       {{1, 2, 3, 4, 5, 6}, {10, 20, 30, 40, 50, 60}}, {2, 3}, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message() << "\n" << kilnd_->Log();
  ASSERT_EQ(resp.outputs_size(), 1);
  HostTensor y = testing::FromProto(resp.outputs(0).tensor());
  ASSERT_EQ(y.dims(), (Dims{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(y.data_as<float>()[i], (i + 1) + 2.5f * 10 * (i + 1));

  // A shape-changing op, inside a graph with built-in ops around it.
  GraphBuilder b("row_sum");
  auto x = b.input("x", v1::DTYPE_F32, {2, 3});
  v1::Attrs attrs;
  attrs.mutable_custom()->set_name("example.row_sum");
  auto r = b.node(v1::OP_CUSTOM, {b.mul(x, b.scalar(2.0))}, attrs, "rs");
  b.output("out", b.add(r, b.scalar(1.0)));
  s = Run(b.Build(), {{1, 2, 3, 4, 5, 6}}, {2, 3}, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  y = testing::FromProto(resp.outputs(0).tensor());
  ASSERT_EQ(y.dims(), (Dims{2}));
  EXPECT_FLOAT_EQ(y.data_as<float>()[0], 13.0f);
  EXPECT_FLOAT_EQ(y.data_as<float>()[1], 31.0f);

  // The payload is the plugin's to check: a 3-byte alpha is its error.
  ExpectRejected(CustomGraph("example.add_scaled", {2, 3}, 2, "abc"), {2, 3},
                 {"node 2 \"c\" (custom)", "payload must be empty or alpha"});
}

TEST_F(ServerPlugins, UnknownCustomOpNamesTheNode) {
  Start({KILN_EXAMPLE_PLUGIN_PATH});
  ExpectRejected(CustomGraph("example.nope\n", {4}, 1), {4},
                 {"node 1 \"c\" (custom)", "\"example.nope\\n\"",
                  "not provided by any plugin kilnd loaded"});
  // Declared result types do not make it runnable: no device claims it.
  v1::Graph g = CustomGraph("example.nope", {4}, 1);
  v1::TensorType* t = g.mutable_nodes(1)->add_outputs();
  t->set_dtype(v1::DTYPE_F32);
  t->add_dims()->set_size(4);
  v1::CompileResponse resp;
  const grpc::Status s = Compile(g, &resp);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.error_message().find("\"c\""), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("no plugin loaded by kilnd provides custom op \"example.nope\""),
            std::string::npos)
      << s.error_message();
  ExpectStillServing();
}

TEST_F(ServerPlugins, BadPluginsAreRefusedAndKilndStarts) {
  // Not a shared object at all, beside the bad ones and the example.
  {
    std::FILE* f = std::fopen(absl::StrCat(plugin_dir_.path(), "/libjunk.so").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("not an ELF file", f);
    std::fclose(f);
  }
  Start({KILN_EXAMPLE_PLUGIN_PATH, TestPlugin("wrong_abi"), TestPlugin("duplicate"),
         TestPlugin("no_symbol"), TestPlugin("no_kernel")});
  const std::string log = kilnd_->Log();
  for (const char* needle :
       {"libkiln_test_plugin_wrong_abi.so\": plugin ABI version 99, but kilnd loads version 1",
        "libkiln_test_plugin_duplicate.so\": op example.add_scaled is already provided by plugin "
        "kiln_example_ops",
        "libkiln_test_plugin_no_symbol.so\": no symbol kiln_plugin_v1",
        "libkiln_test_plugin_no_kernel.so\": op test.no_kernel has no CPU kernel",
        "libjunk.so\": cannot load"}) {
    EXPECT_NE(log.find(needle), std::string::npos) << needle << "\nkilnd log:\n" << log;
  }
  // The refused plugins' other ops are not half-registered.
  ExpectRejected(CustomGraph("test.dup_own", {4}, 1), {4}, {"not provided by any plugin"});
  // The good plugin still serves.
  v1::RunResponse resp;
  const grpc::Status s = Run(CustomGraph("example.add_scaled", {2}, 2), {{1, 2}, {3, 4}}, {2}, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const HostTensor y = testing::FromProto(resp.outputs(0).tensor());
  EXPECT_FLOAT_EQ(y.data_as<float>()[0], 4.0f);
  EXPECT_FLOAT_EQ(y.data_as<float>()[1], 6.0f);
}

TEST_F(ServerPlugins, ShapeFunctionErrorsAreInvalidArgumentNamingTheNode) {
  Start({KILN_EXAMPLE_PLUGIN_PATH, TestPlugin("good")});
  // The plugin's own refusal.
  ExpectRejected(CustomGraph("example.row_sum", {}, 1), {},
                 {"node 1 \"c\" (custom)", "shape function failed", "row_sum needs rank >= 1"});
  // What the engine checks of a shape function's answer.
  ExpectRejected(CustomGraph("test.negative_dim", {4}, 1), {4},
                 {"node 1 \"c\" (custom)", "dim 0 is -5"});
  ExpectRejected(CustomGraph("test.huge", {4}, 1), {4}, {"node 1 \"c\" (custom)", "overflows int64"});
  ExpectRejected(CustomGraph("test.rank9", {4}, 1), {4}, {"node 1 \"c\" (custom)", "rank 9"});
  ExpectRejected(CustomGraph("test.many_results", {4}, 1), {4},
                 {"node 1 \"c\" (custom)", "returned 1000 results"});
  // A kernel's failure comes back escaped (no forged log line) and kilnd serves on.
  v1::RunResponse resp;
  const grpc::Status s = Run(CustomGraph("test.failing", {4}, 1), {{1, 2, 3, 4}}, {4}, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("the input was rejected\\nFORGED"), std::string::npos)
      << s.error_message();
  EXPECT_EQ(s.error_message().find('\n'), std::string::npos) << s.error_message();
  ExpectStillServing();
  const grpc::Status copied = Run(CustomGraph("test.copy", {3}, 1), {{7, 8, 9}}, {3}, &resp);
  ASSERT_TRUE(copied.ok()) << copied.error_message();
  EXPECT_FLOAT_EQ(testing::FromProto(resp.outputs(0).tensor()).data_as<float>()[2], 9.0f);
}

TEST_F(ServerPlugins, ChangedPluginChangesTheExecutableKey) {
  const v1::Graph g = CustomGraph("test.copy", {3}, 1);
  std::string key_v1;
  {
    Start({TestPlugin("good")});
    v1::CompileResponse resp;
    ASSERT_TRUE(Compile(g, &resp).ok());
    key_v1 = resp.executable_key();
    ASSERT_TRUE(Compile(g, &resp).ok());
    EXPECT_EQ(resp.executable_key(), key_v1);  // stable while the plugin is
    kilnd_.reset();
  }
  // The same op from version 2 of the plugin, same cache directory.
  std::filesystem::remove(absl::StrCat(plugin_dir_.path(), "/libkiln_test_plugin_good.so"));
  Start({TestPlugin("good_v2")});
  v1::CompileResponse resp;
  ASSERT_TRUE(Compile(g, &resp).ok());
  EXPECT_NE(resp.executable_key(), key_v1);
  bool named = false;
  for (const v1::KeyComponent& c : resp.report().key_components()) named |= c.name() == "custom_ops";
  EXPECT_TRUE(named);
}

TEST_F(ServerPlugins, UnreadablePluginDirStopsKilndAtStart) {
  std::string output;
  const int code = testing::RunKilndToExit(
      {"--cache_dir=" + cache_.path(), "--plugin_dir=" + plugin_dir_.path() + "/missing",
       "--listen=127.0.0.1:0", "--metrics_listen=off"},
      &output);
  EXPECT_EQ(code, 1) << output;
  EXPECT_NE(output.find("plugin_dir"), std::string::npos) << output;
  EXPECT_NE(output.find("cannot be read"), std::string::npos) << output;
}

}  // namespace
}  // namespace kiln
