// Models exported from PyTorch (Debian's python3-torch, torch.onnx.export at
// test time by export_torch_models.py) imported and run on the CPU: outputs
// equal PyTorch's. The batch dim is dynamic in every export; each model runs
// with it symbolic (imported once, compiled per batch) and pinned.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "base/status.h"
#include "engine/io/onnx/onnx_import.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class OnnxTorchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() /
                        absl::StrCat("kiln_onnx_torch_", ::getpid()));
    const std::string cmd = absl::StrCat("/usr/bin/python3 ", KILN_SOURCE_DIR,
                                         "/tests/engine/io/export_torch_models.py --out ",
                                         dir_->string(), " > ", dir_->string(), ".log 2>&1");
    export_status_ = std::system(cmd.c_str());
    EngineOptions o;
    o.calibration = EngineOptions::Calibration::kNever;
    o.disabled_backends = {"vulkan", "cuda"};
    auto e = Engine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(e).value().release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    fs::remove(dir_->string() + ".log", ec);
    delete dir_;
  }

  void CheckModel(const std::string& name, bool pin) {
    ASSERT_EQ(export_status_, 0) << "export_torch_models.py failed (needs /usr/bin/python3 with "
                                    "python3-torch and python3-onnx): "
                                 << ReadFile(dir_->string() + ".log");
    const std::string bytes = ReadFile(*dir_ / (name + ".onnx"));
    auto x = io::ParseOnnxTensor(ReadFile(*dir_ / (name + ".input.pb")));
    auto want = io::ParseOnnxTensor(ReadFile(*dir_ / (name + ".output.pb")));
    ASSERT_TRUE(x.ok()) << x.status();
    ASSERT_TRUE(want.ok()) << want.status();
    io::OnnxImportOptions options;
    if (pin) options.input_shapes.emplace_back("x", x->dims());
    auto model = io::ImportOnnxModel(bytes, options);
    ASSERT_TRUE(model.ok()) << model.status();
    if (!pin) {
      // The batch stays a named symbol in the imported graph.
      const auto& dims = model->graph.nodes(0).outputs(0).dims();
      ASSERT_GT(dims.size(), 0);
      EXPECT_EQ(dims[0].symbol(), "batch") << model->graph.nodes(0).DebugString();
    }
    std::vector<TensorRef> inputs = {TensorRef::Of("x", *x)};
    // A second input, n (a loop's trip count), when the export wrote one.
    absl::StatusOr<HostTensor> n = absl::NotFoundError("no n");
    if (fs::exists(*dir_ / (name + ".n.pb"))) {
      n = io::ParseOnnxTensor(ReadFile(*dir_ / (name + ".n.pb")));
      ASSERT_TRUE(n.ok()) << n.status();
      inputs.push_back(TensorRef::Of("n", *n));
    }
    auto r = engine_->RunGraph(model->graph, inputs, nullptr, {}, {});
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->outputs.size(), 1u);
    const HostTensor& got = r->outputs[0].second;
    ASSERT_EQ(got.dims(), want->dims());
    double worst = 0;
    for (int64_t i = 0; i < got.num_elements(); ++i) {
      const double g = got.GetAsDouble(i), w = want->GetAsDouble(i);
      worst = std::max(worst, std::fabs(g - w) / (1e-4 + 1e-4 * std::fabs(w)));
    }
    EXPECT_LE(worst, 1.0) << name << ": worst error / budget (1e-4 + 1e-4 |want|)";
  }

  // The largest |got - want| / (1e-4 + 1e-4 |want|); shapes must match.
  static double WorstError(const HostTensor& got, const HostTensor& want) {
    EXPECT_EQ(got.dims(), want.dims());
    if (got.dims() != want.dims()) return INFINITY;
    double worst = 0;
    for (int64_t i = 0; i < got.num_elements(); ++i) {
      const double g = got.GetAsDouble(i), w = want.GetAsDouble(i);
      worst = std::max(worst, std::fabs(g - w) / (1e-4 + 1e-4 * std::fabs(w)));
    }
    return worst;
  }
  static HostTensor Tensor(const std::string& file) {
    auto t = io::ParseOnnxTensor(ReadFile(*dir_ / file));
    EXPECT_TRUE(t.ok()) << file << ": " << t.status();
    return t.ok() ? *std::move(t) : HostTensor();
  }
  // The while_scan model run on x, its outputs trimmed (TrimStackedOutputs).
  absl::StatusOr<std::vector<std::pair<std::string, HostTensor>>> RunWhileScan(
      const v1::Graph& graph, const HostTensor& x) {
    const std::vector<TensorRef> in = {TensorRef::Of("x", x)};
    KILN_ASSIGN_OR_RETURN(RunResult r, engine_->RunGraph(graph, in, nullptr, {}, {}));
    KILN_RETURN_IF_ERROR(io::TrimStackedOutputs(r.outputs));
    return std::move(r.outputs);
  }

  static fs::path* dir_;
  static int export_status_;
  static Engine* engine_;
};

fs::path* OnnxTorchTest::dir_ = nullptr;
int OnnxTorchTest::export_status_ = -1;
Engine* OnnxTorchTest::engine_ = nullptr;

TEST_F(OnnxTorchTest, MlpSymbolicBatch) { CheckModel("mlp", false); }
TEST_F(OnnxTorchTest, MlpPinnedBatch) { CheckModel("mlp", true); }
TEST_F(OnnxTorchTest, CnnWithBatchNormSymbolicBatch) { CheckModel("cnn", false); }
TEST_F(OnnxTorchTest, CnnWithBatchNormPinnedBatch) { CheckModel("cnn", true); }
// x.view(x.size(0), -1): the Shape -> Gather -> Concat -> Reshape subgraph is
// solved with the batch symbolic, and folded outright when it is pinned.
TEST_F(OnnxTorchTest, CnnViewFlattenSymbolicBatch) { CheckModel("cnn_view", false); }
TEST_F(OnnxTorchTest, CnnViewFlattenPinnedBatch) { CheckModel("cnn_view", true); }
// nn.LSTM / nn.GRU (batch_first) onto a Scan of the recurrent step.
TEST_F(OnnxTorchTest, LstmPinnedBatch) { CheckModel("lstm", true); }
TEST_F(OnnxTorchTest, GruPinnedBatch) { CheckModel("gru", true); }
// nn.LSTM / nn.GRU(bidirectional=True): one scan per direction, Y and the
// final states concatenated along the direction axis.
TEST_F(OnnxTorchTest, BidirectionalLstmPinnedBatch) { CheckModel("bilstm", true); }
TEST_F(OnnxTorchTest, BidirectionalGruPinnedBatch) { CheckModel("bigru", true); }
// Scripted control flow: ONNX Loop (a data-dependent trip count, an If in its
// body reading the body's values and the outer graph's) onto While, and If.
// Each model is exported once per input: the x the loop must grow for many
// iterations, and one it leaves at once; the if's input takes either branch.
TEST_F(OnnxTorchTest, ScriptedWhileLoopRunsManyIterations) { CheckModel("while_small", true); }
TEST_F(OnnxTorchTest, ScriptedWhileLoopRunsNone) { CheckModel("while_large", true); }
// A scripted while loop appending to a list, stacked: at opset 11 the list
// is the Loop's scan output, its cond computed by the body and M INT64_MAX,
// so the length of ys is known only at run time. Imported as a While that
// writes iteration i's x into row i of a buffer of max_while_scan_length
// rows, returned with the rows written (kiln.length.ys) and cut to them by
// TrimStackedOutputs: equal to PyTorch's y and ys for 11 and 22 iterations;
// a loop that leaves at once gives ys [0, 2, 3]; past the bound the run's
// outputs are RESOURCE_EXHAUSTED, never a truncated ys.
TEST_F(OnnxTorchTest, ScriptedWhileLoopStackingAList) {
  ASSERT_EQ(export_status_, 0) << ReadFile(dir_->string() + ".log");
  const std::string bytes = ReadFile(*dir_ / "while_scan.onnx");
  auto model = io::ImportOnnxModel(bytes, {});
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ(model->graph.outputs_size(), 3);
  EXPECT_EQ(model->graph.outputs(0).name(), "y");
  EXPECT_EQ(model->graph.outputs(1).name(), "ys");
  EXPECT_EQ(model->graph.outputs(2).name(), "kiln.length.ys");
  for (const char* c : {"few", "many"}) {
    SCOPED_TRACE(c);
    const HostTensor x = Tensor(absl::StrCat("while_scan.", c, ".x.pb"));
    auto out = RunWhileScan(model->graph, x);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->size(), 2u);
    EXPECT_EQ((*out)[0].first, "y");
    EXPECT_EQ((*out)[1].first, "ys");
    EXPECT_LE(WorstError((*out)[0].second, Tensor(absl::StrCat("while_scan.", c, ".y.pb"))), 1.0);
    const HostTensor want_ys = Tensor(absl::StrCat("while_scan.", c, ".ys.pb"));
    EXPECT_EQ(want_ys.dims()[0], std::string(c) == "few" ? 11 : 22);
    EXPECT_LE(WorstError((*out)[1].second, want_ys), 1.0);
  }
  // cond false before the first iteration: no rows (PyTorch's stack of an
  // empty list would raise; ONNX gives [0, ...]).
  HostTensor big = HostTensor::FromVector<float>(v1::DTYPE_F32, {2, 3}, {50, -50, 1, 2, 3, 4});
  auto none = RunWhileScan(model->graph, big);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ((*none)[1].second.dims(), (Dims{0, 2, 3}));
  EXPECT_LE(WorstError((*none)[0].second, big), 1.0);
  // A bound of 16 rows: 11 iterations fit, 22 do not.
  io::OnnxImportOptions small;
  small.max_while_scan_length = 16;
  auto bounded = io::ImportOnnxModel(bytes, small);
  ASSERT_TRUE(bounded.ok()) << bounded.status();
  auto fits = RunWhileScan(bounded->graph, Tensor("while_scan.few.x.pb"));
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_LE(WorstError((*fits)[1].second, Tensor("while_scan.few.ys.pb")), 1.0);
  auto past = RunWhileScan(bounded->graph, Tensor("while_scan.many.x.pb"));
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), absl::StatusCode::kResourceExhausted) << past.status();
  EXPECT_NE(past.status().message().find("max_while_scan_length"), std::string::npos) << past.status();
}

TEST_F(OnnxTorchTest, ScriptedIfThenBranch) { CheckModel("if_pos", true); }
TEST_F(OnnxTorchTest, ScriptedIfElseBranch) { CheckModel("if_neg", true); }
// nn.TransformerEncoderLayer (post-norm, GELU, 4 heads): traced at opset 13
// (LayerNorm and GELU decomposed into elementwise ops and reductions) and 17
// (LayerNormalization), the batch symbolic and pinned; then looped by a
// script, 3 times (Loop with a constant trip count) and n times with n an
// input (a Loop whose trip count is known only at run time: a While).
TEST_F(OnnxTorchTest, TransformerEncoderSymbolicBatch) { CheckModel("encoder", false); }
TEST_F(OnnxTorchTest, TransformerEncoderPinnedBatch) { CheckModel("encoder", true); }
TEST_F(OnnxTorchTest, TransformerEncoderOpset17SymbolicBatch) { CheckModel("encoder17", false); }
TEST_F(OnnxTorchTest, TransformerEncoderOpset17PinnedBatch) { CheckModel("encoder17", true); }
// The opset-13 export's decomposed LayerNorm (ReduceMean, Sub, Pow, ReduceMean,
// Add, Sqrt, Div, Mul, Add) and exact GELU (Div, Erf, Add, Mul, Mul) import as
// Kiln's LayerNorm and GELU (onnx_patterns.cc), so the engine's residual-norm
// and matmul-epilogue fusions see them; opset 17's GELU too.
TEST_F(OnnxTorchTest, TransformerEncoderDecomposedNormAndGeluImportAsKilnOps) {
  ASSERT_EQ(export_status_, 0) << ReadFile(dir_->string() + ".log");
  for (const char* name : {"encoder", "encoder17"}) {
    auto model = io::ImportOnnxModel(ReadFile(*dir_ / (std::string(name) + ".onnx")), {});
    ASSERT_TRUE(model.ok()) << model.status();
    int norms = 0, gelus = 0, erfs = 0, pows = 0, reduces = 0;
    for (const auto& n : model->graph.nodes()) {
      norms += n.op() == v1::OP_LAYER_NORM;
      reduces += n.op() == v1::OP_REDUCE;
      gelus += n.op() == v1::OP_UNARY && n.attrs().unary().kind() == v1::UNARY_GELU;
      erfs += n.op() == v1::OP_UNARY && n.attrs().unary().kind() == v1::UNARY_ERF;
      pows += n.op() == v1::OP_BINARY && n.attrs().binary().kind() == v1::BINARY_POW;
    }
    EXPECT_EQ(norms, 2) << name;
    EXPECT_EQ(gelus, 1) << name;
    EXPECT_EQ(erfs + pows + reduces, 0) << name << ": the decomposed ops are left in the graph";
  }
}
TEST_F(OnnxTorchTest, TransformerEncoderScriptedLoop) { CheckModel("encoder_loop", true); }
TEST_F(OnnxTorchTest, TransformerEncoderLoopWithTripCountInput) { CheckModel("encoder_loop_n", true); }

}  // namespace
}  // namespace kiln
