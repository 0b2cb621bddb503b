// Training through a real kilnd (real gRPC over loopback) with the C++
// client: an MLP's training session matches the same model trained in
// PyTorch (tests/engine/train/torch_reference.py) with the same initial
// weights and batches, loss curve within 1e-4 relative over 100 steps (f32,
// CPU); GetParams returns the trained weights and the optimizer state; bad
// training requests get statuses that name what is wrong; checkpoints resume
// a run bit for bit (kilnctl and the C++ client) and bad ones are refused.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <regex>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "base/sanitizer.h"
#include "clients/cpp/checkpoint.h"
#include "clients/cpp/client.h"
#include "engine/io/npy.h"
#include "engine/io/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/clients/kilnd_child.h"

namespace kiln {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using testing::SharedKilnd;

json Reference(const json& request) {
  std::string quoted = "'";
  for (char c : request.dump()) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  const std::string cmd = absl::StrCat("/usr/bin/python3 ", KILN_SOURCE_DIR,
                                       "/tests/engine/train/torch_reference.py ", quoted);
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return json();
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << "torch_reference.py failed";
  return out.empty() ? json() : json::parse(out);
}

constexpr char kMlp[] = R"(graph "train_mlp"
input x: f32[32, 10]
input y: i64[32]
param w1: f32[10, 24]
param b1: f32[24]
param w2: f32[24, 3]
param b2: f32[3]
let h = tanh(x @ w1 + b1)
let logits = h @ w2 + b2
let loss = softmax_cross_entropy(logits, y)
out logits
out loss
)";

v1::GraphSource Source(const std::string& text) {
  v1::GraphSource g;
  g.set_text(text);
  return g;
}

v1::CompileOptions Training(v1::OptimizerKind kind, double lr) {
  v1::CompileOptions o;
  o.set_device("cpu:0");
  v1::TrainingSpec* t = o.mutable_transforms()->mutable_training();
  t->set_loss("loss");
  t->mutable_optimizer()->set_kind(kind);
  t->mutable_optimizer()->set_lr(lr);
  return o;
}

HostTensor F32(const Dims& dims, const json& v) {
  return HostTensor::FromVector<float>(v1::DTYPE_F32, dims, v.get<std::vector<float>>());
}

TEST(TrainClientTest, MlpTrainedThroughKilndMatchesPyTorch) {
  const json ref = Reference({{"mode", "mlp"},
                              {"kind", "adamw"},
                              {"lr", 0.01},
                              {"weight_decay", 0.01},
                              {"steps", 100},
                              {"batch", 32},
                              {"sizes", {10, 24, 3}},
                              {"seed", 11}});
  ASSERT_FALSE(ref.is_null());
  auto client = Client::Create(SharedKilnd().addr());
  ASSERT_TRUE(client.ok()) << client.status();
  const std::map<std::string, Dims> dims = {
      {"w1", {10, 24}}, {"b1", {24}}, {"w2", {24, 3}}, {"b2", {3}}};
  TensorMap init;
  for (const auto& [name, d] : dims) init.emplace(name, F32(d, ref["init"][name]));
  v1::CompileOptions options = Training(v1::OPTIMIZER_ADAMW, 0.01);
  options.mutable_transforms()->mutable_training()->mutable_optimizer()->set_weight_decay(0.01);
  auto session = (*client)->CreateSession(Source(kMlp), options, init);
  ASSERT_TRUE(session.ok()) << session.status();
  const std::string id = session->session_id();

  for (size_t step = 0; step < ref["losses"].size(); ++step) {
    TensorMap batch;
    batch.emplace("x", F32({32, 10}, ref["batches"][step]["x"]));
    batch.emplace("y",
                  HostTensor::FromVector<int64_t>(
                      v1::DTYPE_I64, {32}, ref["batches"][step]["y"].get<std::vector<int64_t>>()));
    auto r = (*client)->TrainStep(id, batch);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->step(), static_cast<int64_t>(step + 1));
    EXPECT_DOUBLE_EQ(r->lr(), static_cast<float>(0.01));
    const double want = ref["losses"][step].get<double>();
    ASSERT_NEAR(r->loss(), want, 1e-4 * std::abs(want)) << "loss of step " << step + 1;
  }

  // The trained weights and the optimizer state come back through GetParams.
  auto params = (*client)->GetParams(id);
  ASSERT_TRUE(params.ok()) << params.status();
  for (const auto& [name, d] : dims) {
    ASSERT_TRUE(params->contains(name)) << name;
    const HostTensor& got = params->at(name);
    for (int64_t k = 0; k < got.num_elements(); ++k) {
      const double w = ref["final"][name][k].get<double>();
      ASSERT_NEAR(got.GetAsDouble(k), w, 1e-4 * std::max(1.0, std::abs(w)))
          << name << "[" << k << "]";
    }
    EXPECT_TRUE(params->contains("opt/" + name + "/m")) << name;
    EXPECT_TRUE(params->contains("opt/" + name + "/v")) << name;
  }
  ASSERT_TRUE(params->contains("opt/step"));
  EXPECT_EQ(params->at("opt/step").GetAsDouble(0), 100.0);

  // The forward graph runs over the trained params in the same session.
  TensorMap batch;
  batch.emplace("x", F32({32, 10}, ref["batches"][0]["x"]));
  batch.emplace("y", HostTensor::FromVector<int64_t>(
                         v1::DTYPE_I64, {32}, ref["batches"][0]["y"].get<std::vector<int64_t>>()));
  auto run = (*client)->Run(id, batch);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_NE(run->output("logits"), nullptr);
  EXPECT_TRUE((*client)->CloseSession(id).ok());
}

TEST(TrainClientTest, BadTrainingRequestsAreNamed) {
  auto client = Client::Create(SharedKilnd().addr());
  ASSERT_TRUE(client.ok());
  auto expect = [&](const v1::CompileOptions& o, absl::StatusCode code, const std::string& needle,
                    const std::string& text = kMlp) {
    auto s = (*client)->CreateSession(Source(text), o);
    EXPECT_EQ(s.status().code(), code) << s.status();
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(needle));
  };
  v1::CompileOptions o = Training(v1::OPTIMIZER_ADAM, 0.01);
  o.mutable_transforms()->mutable_training()->add_params("w7");
  expect(o, absl::StatusCode::kInvalidArgument, "param \"w7\"");
  o = Training(v1::OPTIMIZER_ADAM, -0.5);
  expect(o, absl::StatusCode::kInvalidArgument, "optimizer lr = -0.5");
  o = Training(v1::OPTIMIZER_SGD, 0.1);
  o.mutable_transforms()->mutable_training()->set_loss("logits");
  expect(o, absl::StatusCode::kInvalidArgument, "must be a scalar");
  o = Training(v1::OPTIMIZER_SGD, 0.1);
  o.mutable_transforms()->mutable_training()->set_loss("nope");
  expect(o, absl::StatusCode::kInvalidArgument, "\"nope\" is no output");
  o = v1::CompileOptions();
  o.mutable_transforms()->mutable_vmap()->set_size(4);
  expect(o, absl::StatusCode::kInvalidArgument, "vmap is for one-shot runs and Compile");
  // A non-differentiable node on the path: CreateSession verifies only (the
  // batch dim is symbolic), the first step's compile names the node.
  o = Training(v1::OPTIMIZER_SGD, 0.1);
  {
    TensorMap w;
    w.emplace("w", HostTensor::Create(v1::DTYPE_F32, {4}).value());
    auto s = (*client)->CreateSession(
        Source("graph \"p\"\ninput x: f32[b, 4]\nparam w: f32[4]\n"
               "let (v, i) = topk(x * w, k=2)\nlet loss = reduce_sum(v)\nout loss\n"),
        o, w);
    ASSERT_TRUE(s.ok()) << s.status();
    TensorMap b;
    b.emplace("x", HostTensor::Create(v1::DTYPE_F32, {2, 4}).value());
    auto r = (*client)->TrainStep(s->session_id(), b);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("(topk) is not differentiable"));
  }

  // TrainStep on an inference session, and on a session that does not exist.
  auto plain = (*client)->CreateSession(Source(kMlp), {});
  ASSERT_TRUE(plain.ok()) << plain.status();
  TensorMap batch;
  batch.emplace("x", HostTensor::Create(v1::DTYPE_F32, {32, 10}).value());
  batch.emplace("y", HostTensor::Create(v1::DTYPE_I64, {32}).value());
  auto r = (*client)->TrainStep(plain->session_id(), batch);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("not a training session"));
  r = (*client)->TrainStep("no-such-session", batch);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();

  // A training session without its params bound says which one is missing.
  auto unbound = (*client)->CreateSession(Source(kMlp), Training(v1::OPTIMIZER_SGD, 0.1));
  ASSERT_TRUE(unbound.ok()) << unbound.status();
  r = (*client)->TrainStep(unbound->session_id(), batch);
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("param \"w1\" (f32[10, 24]) of the training step is not given"));
  // A batch that misses an input is named.
  batch.erase("y");
  r = (*client)->TrainStep(unbound->session_id(), batch);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("\"y\""));
}

// 512 rows of a learnable problem in dir/x.npy and dir/y.npy, and the MLP
// with a symbolic batch in dir/mlp.kiln (returned).
std::string WriteNpyProblem(const std::string& dir) {
  std::mt19937 rng(4);
  std::normal_distribution<float> normal;
  std::vector<float> x(512 * 10);
  std::vector<int64_t> y(512);
  for (float& v : x) v = normal(rng);
  for (int i = 0; i < 512; ++i) {
    const float* row = &x[i * 10];
    y[i] = std::max_element(row, row + 3) - row;  // the class is the largest of the first 3
  }
  EXPECT_TRUE(
      WriteNpy(dir + "/x.npy", HostTensor::FromVector<float>(v1::DTYPE_F32, {512, 10}, x)).ok());
  EXPECT_TRUE(
      WriteNpy(dir + "/y.npy", HostTensor::FromVector<int64_t>(v1::DTYPE_I64, {512}, y)).ok());
  const std::string graph = dir + "/mlp.kiln";
  std::ofstream(graph) << absl::StrReplaceAll(
      kMlp, {{"f32[32, 10]", "f32[batch, 10]"}, {"i64[32]", "i64[batch]"}});
  return graph;
}

// kilnctl train: .npy data through a training session; the trained params
// come back as .npy files and the loss goes down on a learnable problem.
TEST(TrainClientTest, KilnctlTrainsOnNpyData) {
  testing::ScratchDir dir;
  const std::string graph = WriteNpyProblem(dir.path());
  const std::string out = dir.path() + "/trained";
  testing::ProcessResult r =
      testing::RunProcess({KILNCTL_PATH,     "--addr=" + SharedKilnd().addr(),
                           "train",          graph,
                           "--data",         "x=" + dir.path() + "/x.npy",
                           "--data",         "y=" + dir.path() + "/y.npy",
                           "--optimizer",    "adamw",
                           "--lr",           "0.01",
                           "--batch",        "32",
                           "--epochs",       "6",
                           "--shuffle-seed", "9",
                           "--schedule",     "cosine",
                           "--warmup",       "10",
                           "--out",          out,
                           "--save-state"});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  std::vector<double> epoch_loss;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    double loss = 0;
    if (std::sscanf(line.c_str(), "epoch %*d: mean loss %lf", &loss) == 1)
      epoch_loss.push_back(loss);
  }
  ASSERT_EQ(epoch_loss.size(), 6u) << r.out;
  EXPECT_LT(epoch_loss.back(), 0.6 * epoch_loss.front()) << r.out;
  EXPECT_THAT(r.out, HasSubstr("trained 96 steps"));
  auto w1 = ReadNpy(out + "/w1.npy");
  ASSERT_TRUE(w1.ok()) << w1.status();
  EXPECT_EQ(w1->dims(), (Dims{10, 24}));
  auto step = ReadNpy(out + "/opt/step.npy");
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->GetAsDouble(0), 96.0);

  r = testing::RunProcess({KILNCTL_PATH, "--addr=" + SharedKilnd().addr(), "train", graph, "--data",
                           "x=" + dir.path() + "/x.npy", "--batch", "0"});
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("--batch 0 must be in [1, 512]"));
  r = testing::RunProcess({KILNCTL_PATH, "--addr=" + SharedKilnd().addr(), "train", graph, "--data",
                           "x=" + dir.path() + "/x.npy", "--optimizer", "adagrad"});
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("--optimizer 'adagrad' is unknown"));
}

// The same training session on the Vulkan device (lavapipe in CI, in its
// device worker process) and on the CPU: the param updates stay on each
// device, and the loss curves agree within 1e-4 relative over 20 steps.
TEST(TrainClientTest, VulkanTrainsLikeTheCpu) {
  auto client = Client::Create(SharedKilnd().addr());
  ASSERT_TRUE(client.ok());
  auto devices = (*client)->ListDevices();
  ASSERT_TRUE(devices.ok()) << devices.status();
  bool vulkan = false;
  for (const auto& d : devices->devices()) vulkan = vulkan || d.id() == "vulkan:0";
  if (!vulkan) GTEST_SKIP() << "kilnd lists no vulkan:0 device";
  std::mt19937 rng(8);
  std::normal_distribution<float> normal;
  auto random = [&](const Dims& d, float scale) {
    HostTensor t = HostTensor::Create(v1::DTYPE_F32, d).value();
    for (int64_t i = 0; i < t.num_elements(); ++i) t.SetFromDouble(i, scale * normal(rng));
    return t;
  };
  TensorMap init;
  init.emplace("w1", random({10, 24}, 0.3f));
  init.emplace("b1", random({24}, 0.1f));
  init.emplace("w2", random({24, 3}, 0.3f));
  init.emplace("b2", random({3}, 0.1f));
  // One batch, 20 times: the loss must fall as the MLP fits it.
  TensorMap batch;
  batch.emplace("x", random({32, 10}, 1.0f));
  HostTensor labels = HostTensor::Create(v1::DTYPE_I64, {32}).value();
  for (int64_t i = 0; i < 32; ++i) labels.SetFromDouble(i, static_cast<double>(rng() % 3));
  batch.emplace("y", std::move(labels));
  const std::vector<const TensorMap*> batches(20, &batch);
  auto train = [&](const std::string& device) {
    v1::CompileOptions o = Training(v1::OPTIMIZER_ADAM, 0.02);
    o.set_device(device);
    TensorMap params;
    for (const auto& [n, t] : init) params.emplace(n, t.Clone());
    auto s = (*client)->CreateSession(Source(kMlp), o, params);
    EXPECT_TRUE(s.ok()) << s.status();
    std::vector<double> losses;
    if (!s.ok()) return losses;
    for (const TensorMap* b : batches) {
      auto r = (*client)->TrainStep(s->session_id(), *b);
      EXPECT_TRUE(r.ok()) << device << ": " << r.status();
      if (!r.ok()) break;
      losses.push_back(r->loss());
    }
    EXPECT_TRUE((*client)->CloseSession(s->session_id()).ok());
    return losses;
  };
  const std::vector<double> cpu = train("cpu:0"), vk = train("vulkan:0");
  ASSERT_EQ(cpu.size(), batches.size());
  ASSERT_EQ(vk.size(), batches.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_NEAR(vk[i], cpu[i], 1e-4 * std::abs(cpu[i])) << "step " << i + 1;
  }
  EXPECT_LT(cpu.back(), 0.8 * cpu.front());
}

// The issue's acceptance run: examples/fashion_mlp.kiln trained through kilnd
// on Debian's dataset-fashion-mnist for 3 epochs reaches >= 88% test accuracy.
TEST(TrainClientTest, FashionMnistMlpReaches88Percent) {
  if (kAddressSanitizer) {
    // Epochs over 60,000 images take more than the suite's 5 minutes under
    // ASan; the cases above run the same training paths on small data there.
    GTEST_SKIP() << "the full Fashion-MNIST training run is too slow under ASan";
  }
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  ASSERT_TRUE(std::ifstream(dir + "/train-images-idx3-ubyte.gz").good())
      << "this test needs Debian's dataset-fashion-mnist (scripts/install-deps.sh)";
  testing::ProcessResult r = testing::RunProcess(
      {KILNCTL_PATH,     "--addr=" + SharedKilnd().addr(),
       "train",          std::string(KILN_SOURCE_DIR) + "/examples/fashion_mlp.kiln",
       "--data",         "fashion-mnist",
       "--optimizer",    "adamw",
       "--lr",           "2e-3",
       "--schedule",     "cosine",
       "--warmup",       "100",
       "--batch",        "128",
       "--epochs",       "3",
       "--shuffle-seed", "1"});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  double accuracy = 0;
  const size_t at = r.out.find("test accuracy ");
  ASSERT_NE(at, std::string::npos) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + at, "test accuracy %lf%%", &accuracy), 1) << r.out;
  EXPECT_GE(accuracy, 88.0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("trained 1404 steps"));
}

// kilnctl train on Fashion-MNIST for one epoch with the given extra flags;
// the process's stdout.
std::string TrainFashionOneEpoch(const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {
      KILNCTL_PATH,     "--addr=" + SharedKilnd().addr(),
      "train",          std::string(KILN_SOURCE_DIR) + "/examples/fashion_mlp.kiln",
      "--data",         "fashion-mnist",
      "--optimizer",    "adamw",
      "--lr",           "2e-3",
      "--schedule",     "cosine",
      "--warmup",       "100",
      "--batch",        "128",
      "--epochs",       "1",
      "--shuffle-seed", "1",
      "--device",       "cpu:0"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  testing::ProcessResult r = testing::RunProcess(argv);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  return r.out;
}

double AccuracyIn(const std::string& out, const char* format) {
  double accuracy = -1;
  const size_t at = out.find(std::string(format).substr(0, std::string(format).find('%')));
  EXPECT_NE(at, std::string::npos) << out;
  if (at == std::string::npos) return -1;
  EXPECT_EQ(std::sscanf(out.c_str() + at, format, &accuracy), 1) << out;
  return accuracy;
}

// Issue 9 item 5: an MLP trained with int8 QAT (per-channel weights) and
// exported to the int8 inference form (oneDNN's int8 matmul) keeps its
// accuracy within 1 point of the same trained weights in plain f32.
TEST(TrainClientTest, FashionMnistQatInt8ExportWithinOnePoint) {
  if (kAddressSanitizer) GTEST_SKIP() << "the Fashion-MNIST epoch is too slow under ASan";
  if (!std::ifstream("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").good()) {
    FAIL() << "this test needs Debian's dataset-fashion-mnist (scripts/install-deps.sh)";
  }
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "kiln_int8_export";
  std::filesystem::remove_all(dir);
  const std::string out =
      TrainFashionOneEpoch({"--qat", "int8", "--qat-per-channel", "--export-int8", dir.string()});
  double int8 = -1, f32 = -1;
  const size_t at = out.find("int8 test accuracy ");
  ASSERT_NE(at, std::string::npos) << out;
  ASSERT_EQ(std::sscanf(out.c_str() + at,
                        "int8 test accuracy %lf%% (the trained weights in f32: %lf%%", &int8, &f32),
            2)
      << out;
  EXPECT_GE(f32, 84.0) << out;
  EXPECT_LE(std::abs(f32 - int8), 1.0) << out;
  EXPECT_THAT(out, HasSubstr("integer product (i8 x i8 -> i32)"));
  EXPECT_TRUE(std::filesystem::exists(dir / "model.kiln"));
  EXPECT_TRUE(std::filesystem::exists(dir / "w1.npy"));
  EXPECT_TRUE(std::filesystem::exists(dir / "w1" / "scale.npy"));
  auto w1 = ReadNpy((dir / "w1.npy").string());
  ASSERT_TRUE(w1.ok()) << w1.status();
  EXPECT_EQ(w1->dtype(), v1::DTYPE_I8);
}

// bf16 AMP trains the Fashion-MNIST MLP as well as f32 does: one epoch each
// from the same initial weights and batches, test accuracies within 1.5 points.
TEST(TrainClientTest, FashionMnistBf16AmpCloseToF32) {
  if (kAddressSanitizer) GTEST_SKIP() << "the Fashion-MNIST epochs are too slow under ASan";
  if (!std::ifstream("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").good()) {
    FAIL() << "this test needs Debian's dataset-fashion-mnist (scripts/install-deps.sh)";
  }
  const double f32 = AccuracyIn(TrainFashionOneEpoch({}), "test accuracy %lf%%");
  const double bf16 = AccuracyIn(TrainFashionOneEpoch({"--amp", "bf16"}), "test accuracy %lf%%");
  EXPECT_GE(f32, 84.0);
  EXPECT_NEAR(bf16, f32, 1.5);
}

// Issue 9 item 7: examples/fashion_cnn.kiln (two conv + relu + max-pool
// stages, then linear) trained through kilnctl and kilnd: 300 steps of batch
// 64 take the loss from ~ln(10) to a mean below 0.75 over the run and reach
// >= 80% test accuracy (docs/training.md gives the full run's figures).
TEST(TrainClientTest, FashionMnistCnnLossFalls) {
  if (kAddressSanitizer) GTEST_SKIP() << "the Fashion-MNIST CNN is too slow under ASan";
  if (!std::ifstream("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").good()) {
    FAIL() << "this test needs Debian's dataset-fashion-mnist (scripts/install-deps.sh)";
  }
  testing::ProcessResult r = testing::RunProcess(
      {KILNCTL_PATH,     "--addr=" + SharedKilnd().addr(),
       "train",          std::string(KILN_SOURCE_DIR) + "/examples/fashion_cnn.kiln",
       "--data",         "fashion-mnist",
       "--optimizer",    "adamw",
       "--lr",           "2e-3",
       "--schedule",     "cosine",
       "--warmup",       "30",
       "--batch",        "64",
       "--epochs",       "1",
       "--steps",        "300",
       "--shuffle-seed", "1",
       "--device",       "cpu:0"});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  double first = 0, last = 0, mean = 0;
  const size_t trained = r.out.find("trained 300 steps: ");
  ASSERT_NE(trained, std::string::npos) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + trained, "trained 300 steps: first loss %lf, last loss %lf",
                        &first, &last),
            2)
      << r.out;
  const size_t epoch = r.out.find("epoch 1: mean loss ");
  ASSERT_NE(epoch, std::string::npos) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + epoch, "epoch 1: mean loss %lf", &mean), 1) << r.out;
  EXPECT_NEAR(first, std::log(10.0), 0.5) << r.out;
  EXPECT_LT(mean, 0.75) << r.out;
  EXPECT_LT(last, 0.75) << r.out;
  EXPECT_GE(AccuracyIn(r.out, "test accuracy %lf%%"), 80.0);
}

// TrainSteps (one stream of batches) trains exactly as TrainStep calls do;
// a bad batch ends the stream naming its step, the steps before it applied.
TEST(TrainClientTest, StreamedStepsEqualSingleSteps) {
  auto client = Client::Create(SharedKilnd().addr());
  ASSERT_TRUE(client.ok());
  std::mt19937 rng(13);
  std::normal_distribution<float> normal;
  auto random = [&](const Dims& d) {
    HostTensor t = HostTensor::Create(v1::DTYPE_F32, d).value();
    for (int64_t i = 0; i < t.num_elements(); ++i) t.SetFromDouble(i, 0.3 * normal(rng));
    return t;
  };
  TensorMap init;
  for (const auto& [n, d] :
       std::map<std::string, Dims>{{"w1", {10, 24}}, {"b1", {24}}, {"w2", {24, 3}}, {"b2", {3}}}) {
    init.emplace(n, random(d));
  }
  std::vector<TensorMap> batches(8);
  for (TensorMap& b : batches) {
    b.emplace("x", random({32, 10}));
    HostTensor y = HostTensor::Create(v1::DTYPE_I64, {32}).value();
    for (int64_t i = 0; i < 32; ++i) y.SetFromDouble(i, static_cast<double>(rng() % 3));
    b.emplace("y", std::move(y));
  }
  auto session = [&] {
    TensorMap p;
    for (const auto& [n, t] : init) p.emplace(n, t.Clone());
    auto s = (*client)->CreateSession(Source(kMlp), Training(v1::OPTIMIZER_ADAMW, 0.01), p);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? s->session_id() : std::string();
  };
  const std::string single = session(), streamed = session();
  std::vector<double> want;
  for (const TensorMap& b : batches) {
    auto r = (*client)->TrainStep(single, b);
    ASSERT_TRUE(r.ok()) << r.status();
    want.push_back(r->loss());
  }
  int seen = 0;
  auto answers =
      (*client)->TrainSteps(streamed, batches, [&](const v1::TrainStepResponse&) { ++seen; });
  ASSERT_TRUE(answers.ok()) << answers.status();
  ASSERT_EQ(answers->size(), batches.size());
  EXPECT_EQ(seen, 8);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ((*answers)[i].loss(), want[i]) << "step " << i + 1;
    EXPECT_EQ((*answers)[i].step(), static_cast<int64_t>(i + 1));
  }
  auto a = (*client)->GetParams(single, {"w1"});
  auto b = (*client)->GetParams(streamed, {"w1"});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->at("w1").bytes(), b->at("w1").bytes());

  // The third batch misses an input: two steps applied, the call fails there.
  std::vector<TensorMap> bad;
  for (int i = 0; i < 4; ++i) {
    TensorMap m;
    for (const auto& [n, t] : batches[i]) m.emplace(n, t.Clone());
    bad.push_back(std::move(m));
  }
  bad[2].erase("y");
  auto failed = (*client)->TrainSteps(streamed, bad);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument) << failed.status();
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr("at step 3 of the stream"));
  auto step = (*client)->GetParams(streamed, {"opt/step"});
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(step->at("opt/step").GetAsDouble(0), 10.0);

  // kilnd reads and checks the next batch while a step runs: a bad second
  // batch, refused while the first step runs, still lets the first step be
  // answered and applied before the call fails at step 2.
  std::vector<TensorMap> early;
  for (int i = 0; i < 3; ++i) {
    TensorMap m;
    for (const auto& [n, t] : batches[i]) m.emplace(n, t.Clone());
    early.push_back(std::move(m));
  }
  early[1].erase("x");
  int answered = 0;
  auto early_failed = (*client)->TrainSteps(streamed, early, [&](const v1::TrainStepResponse& r) {
    ++answered;
    EXPECT_EQ(r.step(), 11);
  });
  EXPECT_EQ(early_failed.status().code(), absl::StatusCode::kInvalidArgument)
      << early_failed.status();
  EXPECT_THAT(std::string(early_failed.status().message()), HasSubstr("at step 2 of the stream"));
  EXPECT_EQ(answered, 1);
  step = (*client)->GetParams(streamed, {"opt/step"});
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(step->at("opt/step").GetAsDouble(0), 11.0);
}

// A step long enough to run on its device's thread (over the engine's inline
// bound): kilnd refuses the next message while the step runs, and still
// answers the step (applied) before the call fails at the refused message.
TEST(TrainClientTest, StreamRefusalWhileAStepRunsAnswersThatStepFirst) {
  constexpr char kWide[] = R"(graph "train_wide"
input x: f32[256, 512]
input y: i64[256]
param w: f32[512, 512]
let loss = softmax_cross_entropy(x @ w, y)
out loss
)";
  auto client = Client::Create(SharedKilnd().addr());
  ASSERT_TRUE(client.ok());
  TensorMap init;
  HostTensor w = HostTensor::Create(v1::DTYPE_F32, {512, 512}).value();
  for (int64_t i = 0; i < w.num_elements(); ++i) w.SetFromDouble(i, 0.001 * static_cast<double>(i % 17));
  init.emplace("w", std::move(w));
  auto session = (*client)->CreateSession(Source(kWide), Training(v1::OPTIMIZER_ADAM, 0.01), init);
  ASSERT_TRUE(session.ok()) << session.status();
  auto batch = [](bool with_x) {
    TensorMap b;
    HostTensor x = HostTensor::Create(v1::DTYPE_F32, {256, 512}).value();
    for (int64_t i = 0; i < x.num_elements(); ++i) x.SetFromDouble(i, std::cos(0.01 * static_cast<double>(i)));
    HostTensor y = HostTensor::Create(v1::DTYPE_I64, {256}).value();
    for (int64_t i = 0; i < 256; ++i) y.SetFromDouble(i, static_cast<double>(i * 7 % 512));
    if (with_x) b.emplace("x", std::move(x));
    b.emplace("y", std::move(y));
    return b;
  };
  for (int round = 1; round <= 3; ++round) {
    std::vector<TensorMap> batches;
    batches.push_back(batch(true));
    batches.push_back(batch(false));
    batches.push_back(batch(true));
    int answered = 0;
    auto r = (*client)->TrainSteps(session->session_id(), batches,
                                   [&](const v1::TrainStepResponse& a) {
                                     ++answered;
                                     EXPECT_EQ(a.step(), round);
                                   });
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("at step 2 of the stream"));
    EXPECT_EQ(answered, 1) << "round " << round;
    auto step = (*client)->GetParams(session->session_id(), {"opt/step"});
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_EQ(step->at("opt/step").GetAsDouble(0), static_cast<double>(round));
  }
  EXPECT_TRUE((*client)->CloseSession(session->session_id()).ok());
}

// A client that goes away in the middle of a TrainSteps stream (batches sent
// ahead, a step running, its answer unread): kilnd ends the call once the
// running step is done and keeps serving; the session's step count is every
// step that ran, and the next step continues from it.
TEST(TrainClientTest, StreamCancelledMidwayLeavesTheSessionConsistent) {
  auto client = Client::Create(SharedKilnd().addr());
  ASSERT_TRUE(client.ok());
  TensorMap init;
  for (const auto& [n, d] :
       std::map<std::string, Dims>{{"w1", {10, 24}}, {"b1", {24}}, {"w2", {24, 3}}, {"b2", {3}}}) {
    HostTensor t = HostTensor::Create(v1::DTYPE_F32, d).value();
    for (int64_t i = 0; i < t.num_elements(); ++i) t.SetFromDouble(i, 0.01 * static_cast<double>(i % 13));
    init.emplace(n, std::move(t));
  }
  auto session = (*client)->CreateSession(Source(kMlp), Training(v1::OPTIMIZER_ADAM, 0.01), init);
  ASSERT_TRUE(session.ok()) << session.status();
  const std::string id = session->session_id();
  HostTensor x = HostTensor::Create(v1::DTYPE_F32, {32, 10}).value();
  for (int64_t i = 0; i < x.num_elements(); ++i) x.SetFromDouble(i, std::sin(0.1 * static_cast<double>(i)));
  HostTensor y = HostTensor::Create(v1::DTYPE_I64, {32}).value();
  for (int64_t i = 0; i < 32; ++i) y.SetFromDouble(i, static_cast<double>(i % 3));
  int64_t answered = 0;
  for (int round = 0; round < 6; ++round) {
    auto ctx = (*client)->NewContext();
    auto stream = (*client)->stub().TrainSteps(ctx.get());
    for (int i = 0; i < 3; ++i) {
      v1::TrainStepRequest req;
      if (i == 0) req.set_session_id(id);
      for (const auto& [name, t] : {std::pair<const char*, const HostTensor*>{"x", &x}, {"y", &y}}) {
        v1::NamedTensor* nt = req.add_inputs();
        nt->set_name(name);
        t->ToProto(nt->mutable_tensor());
      }
      ASSERT_TRUE(stream->Write(req)) << "round " << round << " batch " << i;
    }
    v1::TrainStepResponse first;
    ASSERT_TRUE(stream->Read(&first)) << "round " << round;
    ++answered;
    ctx->TryCancel();
    (void)stream->Finish();  // CANCELLED, or OK when every step was answered first
  }
  // The steps that ran are at least the answered ones and at most all sent;
  // the session goes on from there.
  TensorMap batch;
  batch.emplace("x", x.Clone());
  batch.emplace("y", y.Clone());
  auto next = (*client)->TrainStep(id, batch);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_GT(next->step(), answered);
  EXPECT_LE(next->step(), 6 * 3 + 1);
  auto step = (*client)->GetParams(id, {"opt/step"});
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->at("opt/step").GetAsDouble(0), static_cast<double>(next->step()));
  EXPECT_TRUE((*client)->CloseSession(id).ok());
}

// The plain progress lines of a kilnctl run (stdout is a pipe here), keyed by
// step: "<step> e<epoch> loss <loss> lr <lr>", without the run's end and the
// timing fields (steps/s, eta), which differ from run to run.
std::map<int64_t, std::string> StepLines(const std::string& out) {
  static const std::regex kLine(
      R"(^step (\d+)/(\d+)  epoch (\d+)  loss (\S+)  lr (\S+)  [0-9.]+ steps/s  eta (\d+ s|\?)$)");
  std::map<int64_t, std::string> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (!absl::StartsWith(line, "step ")) continue;
    EXPECT_TRUE(std::regex_match(line, m, kLine)) << "not a progress line: " << line;
    if (m.empty()) continue;
    lines[std::stoll(m[1])] =
        absl::StrCat(m[1].str(), " e", m[3].str(), " loss ", m[4].str(), " lr ", m[5].str());
  }
  return lines;
}

std::string FileBytes(const std::string& path) { return testing::ReadFileOrDie(path); }

// The acceptance test of issue 9 item 4 through kilnd and kilnctl: a run of
// 48 steps equals a run of 20 steps, checkpointed, then resumed for 28 (mid
// epoch 2, with per-epoch shuffling and a cosine schedule): the same loss at
// every step, and the same params, optimizer state and checkpoint file, byte
// for byte.
TEST(TrainClientTest, KilnctlResumesBitExactly) {
  testing::ScratchDir dir;
  const std::string graph = WriteNpyProblem(dir.path());
  // kilnctl train with these flags, `changed` replacing or adding some.
  auto kilnctl = [&](const std::map<std::string, std::string>& changed) {
    std::map<std::string, std::string> flags = {{"--optimizer", "adamw"}, {"--lr", "0.01"},
                                                {"--batch", "32"},        {"--epochs", "3"},
                                                {"--shuffle-seed", "9"},  {"--schedule", "cosine"},
                                                {"--warmup", "5"},        {"--log-every", "1"}};
    for (const auto& [k, v] : changed) flags[k] = v;
    std::vector<std::string> argv = {
        KILNCTL_PATH,  "--addr=" + SharedKilnd().addr(), "train",  graph,
        "--data",      "x=" + dir.path() + "/x.npy",     "--data", "y=" + dir.path() + "/y.npy",
        "--save-state"};
    for (const auto& [k, v] : flags) {
      argv.push_back(k);
      argv.push_back(v);
    }
    return testing::RunProcess(argv);
  };
  const std::string full = dir.path() + "/full.safetensors", cut = dir.path() + "/cut.safetensors";
  testing::ProcessResult a = kilnctl({{"--checkpoint", full}, {"--out", dir.path() + "/a"}});
  ASSERT_EQ(a.status, 0) << a.out << a.err;
  testing::ProcessResult b1 = kilnctl({{"--checkpoint", cut}, {"--steps", "20"}});
  ASSERT_EQ(b1.status, 0) << b1.out << b1.err;
  EXPECT_THAT(b1.out, HasSubstr("checkpoint at step 20"));
  testing::ProcessResult b2 =
      kilnctl({{"--resume", cut}, {"--checkpoint", cut}, {"--out", dir.path() + "/b"}});
  ASSERT_EQ(b2.status, 0) << b2.out << b2.err;
  EXPECT_THAT(b2.out, HasSubstr("resumed from " + cut + " at step 20"));
  EXPECT_THAT(b2.out, HasSubstr("trained 28 steps"));

  const std::map<int64_t, std::string> want = StepLines(a.out), first = StepLines(b1.out),
                                       rest = StepLines(b2.out);
  ASSERT_EQ(want.size(), 48u) << a.out;
  ASSERT_EQ(first.size(), 20u) << b1.out;
  ASSERT_EQ(rest.size(), 28u) << b2.out;
  for (const auto& [step, line] : first) EXPECT_EQ(line, want.at(step)) << "step " << step;
  for (const auto& [step, line] : rest) EXPECT_EQ(line, want.at(step)) << "step " << step;
  EXPECT_EQ(rest.begin()->first, 21);

  // The checkpoints at step 48, and every param and state tensor, byte for byte.
  EXPECT_TRUE(FileBytes(full) == FileBytes(cut)) << "the checkpoints differ";
  int compared = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path() + "/a")) {
    if (!e.is_regular_file()) continue;
    const std::string rel = std::filesystem::relative(e.path(), dir.path() + "/a").string();
    EXPECT_TRUE(FileBytes(e.path().string()) == FileBytes(dir.path() + "/b/" + rel)) << rel;
    ++compared;
  }
  EXPECT_EQ(compared, 4 + 8 + 1);  // params, m and v of each, opt/step
  auto file = io::SafetensorsFile::Open(full);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().at("step"), "48");
  EXPECT_EQ(file->metadata().at("kilnctl.epoch"), "4");  // the next step's: past the last
  EXPECT_EQ(file->metadata().at("kilnctl.shuffle_seed"), "9");
  ASSERT_NE(file->Find("opt/w1/m"), nullptr);

  // A resume with another data order or optimizer is refused, naming it.
  testing::ProcessResult bad = kilnctl({{"--resume", cut}, {"--shuffle-seed", "7"}});
  EXPECT_EQ(bad.status, 1);
  EXPECT_THAT(bad.err, HasSubstr("saved with kilnctl.shuffle_seed 9, this run has 7"));
  bad = kilnctl({{"--resume", cut}, {"--epochs", "4"}, {"--lr", "0.02"}});
  EXPECT_EQ(bad.status, 1);
  EXPECT_THAT(bad.err, HasSubstr("optimizer.lr"));
  bad = kilnctl({{"--resume", cut}});  // at step 48 of 48
  EXPECT_EQ(bad.status, 1);
  EXPECT_THAT(bad.err, HasSubstr("nothing to train"));
}

// QAT with learned weight scales (--qat-lsq): the scales ("<w>/lsq_scale")
// and their Adam state ride in the checkpoint, and kilnctl's resume continues
// bit for bit (the clients and kilnd refused those tensors before).
TEST(TrainClientTest, KilnctlResumesQatLsqBitExactly) {
  testing::ScratchDir dir;
  const std::string graph = WriteNpyProblem(dir.path());
  auto kilnctl = [&](std::vector<std::string> more) {
    std::vector<std::string> argv = {
        KILNCTL_PATH, "--addr=" + SharedKilnd().addr(), "train", graph,
        "--data", "x=" + dir.path() + "/x.npy", "--data", "y=" + dir.path() + "/y.npy",
        "--optimizer", "adam", "--lr", "0.01", "--batch", "32", "--epochs", "2",
        "--shuffle-seed", "3", "--device", "cpu:0", "--qat", "int8", "--qat-per-channel",
        "--qat-lsq", "--log-every", "1"};
    argv.insert(argv.end(), more.begin(), more.end());
    return testing::RunProcess(argv);
  };
  const std::string full = dir.path() + "/full.safetensors", cut = dir.path() + "/cut.safetensors";
  testing::ProcessResult a = kilnctl({"--checkpoint", full});
  ASSERT_EQ(a.status, 0) << a.out << a.err;
  testing::ProcessResult b1 = kilnctl({"--checkpoint", cut, "--steps", "7"});
  ASSERT_EQ(b1.status, 0) << b1.out << b1.err;
  auto file = io::SafetensorsFile::Open(cut);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_NE(file->Find("w1/lsq_scale"), nullptr);
  ASSERT_NE(file->Find("opt/w1/lsq_scale/m"), nullptr);
  testing::ProcessResult b2 = kilnctl({"--resume", cut, "--checkpoint", cut});
  ASSERT_EQ(b2.status, 0) << b2.out << b2.err;
  EXPECT_THAT(b2.out, HasSubstr("resumed from " + cut + " at step 7"));
  const std::map<int64_t, std::string> want = StepLines(a.out), rest = StepLines(b2.out);
  ASSERT_FALSE(rest.empty()) << b2.out;
  for (const auto& [step, line] : rest) EXPECT_EQ(line, want.at(step)) << "step " << step;
  EXPECT_TRUE(FileBytes(full) == FileBytes(cut)) << "the checkpoints differ";
}

// kilnctl's progress without a terminal: plain lines, about 20 over the run
// (every 2nd of 48 steps) plus the last, each with every field.
TEST(TrainClientTest, KilnctlProgressIsPlainLinesWithoutATerminal) {
  testing::ScratchDir dir;
  const std::string graph = WriteNpyProblem(dir.path());
  testing::ProcessResult r =
      testing::RunProcess({KILNCTL_PATH, "--addr=" + SharedKilnd().addr(), "train", graph, "--data",
                           "x=" + dir.path() + "/x.npy", "--data", "y=" + dir.path() + "/y.npy",
                           "--batch", "32", "--epochs", "3", "--steps", "47", "--checkpoint",
                           dir.path() + "/c.safetensors", "--checkpoint-every", "10"});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const std::map<int64_t, std::string> lines = StepLines(r.out);
  std::vector<int64_t> steps;
  for (const auto& [step, line] : lines) steps.push_back(step);
  std::vector<int64_t> want;
  for (int64_t s = 2; s <= 46; s += 2) want.push_back(s);
  want.push_back(47);
  EXPECT_EQ(steps, want) << r.out;
  EXPECT_THAT(lines.at(2), HasSubstr("2 e1 loss "));
  EXPECT_THAT(lines.at(18), HasSubstr("18 e2 loss "));
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << "a bar was drawn without a terminal";
  EXPECT_EQ(r.err.find("\033["), std::string::npos);
  auto file = io::SafetensorsFile::Open(dir.path() + "/c.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().at("step"), "47");
}

// The C++ client's checkpoints: a session restored from one continues the
// saved session bit for bit; files that do not fit the session, or are
// damaged, are refused with errors that name what is wrong, before anything
// is sent (or, for optimizer state, by kilnd).
TEST(TrainClientTest, CheckpointsRestoreExactlyAndRefuseWhatDoesNotFit) {
  testing::ScratchDir dir;
  auto client = Client::Create(SharedKilnd().addr());
  ASSERT_TRUE(client.ok());
  std::mt19937 rng(21);
  std::normal_distribution<float> normal;
  auto random = [&](const Dims& d) {
    HostTensor t = HostTensor::Create(v1::DTYPE_F32, d).value();
    for (int64_t i = 0; i < t.num_elements(); ++i) t.SetFromDouble(i, 0.3 * normal(rng));
    return t;
  };
  TensorMap init;
  for (const auto& [n, d] :
       std::map<std::string, Dims>{{"w1", {10, 24}}, {"b1", {24}}, {"w2", {24, 3}}, {"b2", {3}}}) {
    init.emplace(n, random(d));
  }
  std::vector<TensorMap> batches(6);
  for (TensorMap& b : batches) {
    b.emplace("x", random({32, 10}));
    HostTensor y = HostTensor::Create(v1::DTYPE_I64, {32}).value();
    for (int64_t i = 0; i < 32; ++i) y.SetFromDouble(i, static_cast<double>(rng() % 3));
    b.emplace("y", std::move(y));
  }
  v1::CompileOptions options = Training(v1::OPTIMIZER_ADAM, 0.01);
  options.mutable_transforms()->mutable_training()->mutable_optimizer()->set_max_grad_norm(1.0);
  CheckpointInfo info;
  info.training = options.transforms().training();
  info.graph_sha256 = GraphIdentity(Source(kMlp));
  info.extra["note"] = "mine";
  auto open = [&](const TensorMap* params) {
    TensorMap p;
    if (params != nullptr) {
      for (const auto& [n, t] : *params) p.emplace(n, t.Clone());
    }
    auto s = (*client)->CreateSession(Source(kMlp), options, p);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : v1::CreateSessionResponse();
  };
  const v1::CreateSessionResponse original = open(&init);
  std::vector<double> losses;
  for (const TensorMap& b : batches) {
    auto r = (*client)->TrainStep(original.session_id(), b);
    ASSERT_TRUE(r.ok()) << r.status();
    losses.push_back(r->loss());
    if (losses.size() == 3) {
      auto saved =
          SaveCheckpoint(**client, original.session_id(), dir.path() + "/c.safetensors", info);
      ASSERT_TRUE(saved.ok()) << saved.status();
      EXPECT_EQ(*saved, 3);
    }
  }
  const std::string path = dir.path() + "/c.safetensors";
  const v1::CreateSessionResponse resumed = open(nullptr);
  auto restored =
      RestoreCheckpoint(**client, resumed.session_id(), resumed.signature(), path, info);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->step, 3);
  EXPECT_EQ(restored->metadata.at("note"), "mine");
  for (size_t i = 3; i < batches.size(); ++i) {
    auto r = (*client)->TrainStep(resumed.session_id(), batches[i]);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->step(), static_cast<int64_t>(i + 1));
    EXPECT_EQ(r->loss(), losses[i]) << "step " << i + 1;  // bit for bit
  }
  auto a = (*client)->GetParams(original.session_id());
  auto b = (*client)->GetParams(resumed.session_id());
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), b->size());
  for (const auto& [name, t] : *a) EXPECT_EQ(t.bytes(), b->at(name).bytes()) << name;

  // Variants of the good file, each with the part named by the test changed.
  auto good = io::SafetensorsFile::Open(path);
  ASSERT_TRUE(good.ok()) << good.status();
  std::map<std::string, HostTensor> tensors;
  for (const io::SafetensorsEntry& e : good->tensors())
    tensors.emplace(e.name, *good->Read(e.name));
  auto variant = [&](const std::string& name,
                     const std::function<void(std::map<std::string, HostTensor>&,
                                              std::map<std::string, std::string>&)>& change) {
    std::map<std::string, HostTensor> t;
    for (const auto& [n, v] : tensors) t.emplace(n, v.Clone());
    std::map<std::string, std::string> meta = good->metadata();
    change(t, meta);
    std::vector<io::SafetensorsItem> items;
    for (const auto& [n, v] : t) items.emplace_back(n, &v);
    const std::string out = dir.path() + "/" + name + ".safetensors";
    EXPECT_TRUE(io::WriteSafetensors(out, items, meta).ok());
    return out;
  };
  auto refused = [&](const std::string& file, const std::string& needle,
                     const CheckpointInfo& expect) {
    const v1::CreateSessionResponse s = open(&init);
    auto r = RestoreCheckpoint(**client, s.session_id(), s.signature(), file, expect);
    EXPECT_FALSE(r.ok()) << file;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(needle)) << file;
    // Nothing was sent: the session still trains from its own params.
    auto step = (*client)->TrainStep(s.session_id(), batches[0]);
    EXPECT_TRUE(step.ok()) << step.status();
    if (step.ok()) {
      EXPECT_EQ(step->step(), 1);
    }
    EXPECT_TRUE((*client)->CloseSession(s.session_id()).ok());
  };
  CheckpointInfo other = info;
  other.training.mutable_optimizer()->set_lr(0.02);
  refused(path, "modified: optimizer.lr: 0.01 -> 0.02", other);
  other = info;
  other.training.mutable_optimizer()->set_kind(v1::OPTIMIZER_SGD);
  refused(path, "optimizer.kind", other);
  other = info;
  other.training.mutable_optimizer()->mutable_schedule()->set_warmup_steps(10);
  refused(path, "optimizer.schedule", other);
  other = info;
  other.graph_sha256 = GraphIdentity(Source(absl::StrReplaceAll(kMlp, {{"tanh", "relu"}})));
  refused(path, "saved from another graph", other);
  refused(variant("no_b2", [](auto& t, auto&) { t.erase("b2"); }), "no tensor for param 'b2'",
          info);
  refused(variant("w1_shape",
                  [](auto& t, auto&) {
                    t.erase("w1");
                    t.emplace("w1", HostTensor::Create(v1::DTYPE_F32, {24, 10}).value());
                  }),
          "param 'w1' is f32[24, 10] in the file, f32[10, 24] in the graph", info);
  refused(variant("w1_dtype",
                  [](auto& t, auto&) {
                    t.erase("w1");
                    t.emplace("w1", HostTensor::Create(v1::DTYPE_F64, {10, 24}).value());
                  }),
          "param 'w1' is f64[10, 24] in the file", info);
  refused(variant("extra",
                  [](auto& t, auto&) {
                    t.emplace("zz", HostTensor::Create(v1::DTYPE_F32, {1}).value());
                  }),
          "tensor 'zz' is neither a param of the graph nor optimizer state", info);
  refused(variant("step_mismatch", [](auto&, auto& m) { m["step"] = "4"; }),
          "opt/step holds 3 but the metadata's step is 4", info);
  refused(variant("no_step", [](auto& t, auto&) { t.erase("opt/step"); }), "no opt/step tensor",
          info);
  refused(variant("newer", [](auto&, auto& m) { m["format_version"] = "2"; }),
          "format_version 2 is newer than this client reads (1)", info);
  refused(variant("not_kiln", [](auto&, auto& m) { m.erase("training_spec"); }),
          "the metadata has no \"training_spec\"", info);
  refused(variant("bad_spec", [](auto&, auto& m) { m["training_spec"] = "{\"loss\": 3"; }),
          "training_spec is not a kiln.v1.TrainingSpec in JSON", info);
  // Optimizer state of the wrong type: kilnd's SetParams names it.
  refused(variant("state_shape",
                  [](auto& t, auto&) {
                    t.erase("opt/w1/m");
                    t.emplace("opt/w1/m", HostTensor::Create(v1::DTYPE_F32, {3}).value());
                  }),
          "optimizer state \"opt/w1/m\" must have the type of param \"w1\" (f32[10, 24])", info);
  refused(variant("state_unknown",
                  [](auto& t, auto&) {
                    t.emplace("opt/w9/m", HostTensor::Create(v1::DTYPE_F32, {3}).value());
                  }),
          "optimizer state \"opt/w9/m\" names no param of the graph", info);
  // Damaged files: the reader's statuses, never a crash.
  const std::string bytes = FileBytes(path);
  auto raw = [&](const std::string& name, const std::string& content) {
    const std::string out = dir.path() + "/" + name;
    std::ofstream(out, std::ios::binary) << content;
    return out;
  };
  refused(raw("truncated", bytes.substr(0, bytes.size() - 5)), "runs past the data buffer", info);
  refused(raw("trailing", bytes + "xyz"), "belong to no tensor", info);
  refused(raw("header_len", std::string("\xff\xff\xff\xff\x00\x00\x00\x00", 8) + bytes.substr(8)),
          "over the limit", info);
  refused(raw("empty", ""), "shorter than the 8-byte header length", info);
  refused(dir.path() + "/absent.safetensors", "absent.safetensors", info);

  // kilnd's checks of optimizer state set directly: the step's type, the
  // state's names; and an inference session takes no state at all.
  {
    const v1::CreateSessionResponse t = open(&init);
    auto set = [&](const std::string& name, HostTensor v, const std::string& session) {
      TensorMap m;
      m.emplace(name, std::move(v));
      return (*client)->SetParams(session, m).status();
    };
    absl::Status st =
        set("opt/step", HostTensor::FromVector<float>(v1::DTYPE_F32, {}, {1}), t.session_id());
    EXPECT_THAT(std::string(st.message()), HasSubstr("\"opt/step\" is i64[] (the steps taken)"));
    st = set("opt/w1/zz", HostTensor::Create(v1::DTYPE_F32, {10, 24}).value(), t.session_id());
    EXPECT_THAT(std::string(st.message()), HasSubstr("\"opt/w1/zz\" is no optimizer state"));
    auto plain = (*client)->CreateSession(Source(kMlp), {});
    ASSERT_TRUE(plain.ok()) << plain.status();
    st = set("opt/w1/m", HostTensor::Create(v1::DTYPE_F32, {10, 24}).value(), plain->session_id());
    EXPECT_THAT(std::string(st.message()), HasSubstr("\"opt/w1/m\" is not a param of the graph"));
    EXPECT_TRUE((*client)->CloseSession(plain->session_id()).ok());
    EXPECT_TRUE((*client)->CloseSession(t.session_id()).ok());
  }

  // State missing from a continued run: SetParams takes the file, the next
  // step refuses to continue from zero moments.
  const std::string partial = variant("no_v", [](auto& t, auto&) { t.erase("opt/w1/v"); });
  const v1::CreateSessionResponse s = open(nullptr);
  ASSERT_TRUE(RestoreCheckpoint(**client, s.session_id(), s.signature(), partial, info).ok());
  auto step = (*client)->TrainStep(s.session_id(), batches[3]);
  EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument) << step.status();
  EXPECT_THAT(std::string(step.status().message()),
              HasSubstr("optimizer state \"opt/w1/v\" (f32[10, 24]) is not given"));
  for (const auto& id : {original.session_id(), resumed.session_id(), s.session_id()}) {
    EXPECT_TRUE((*client)->CloseSession(id).ok());
  }
}

}  // namespace
}  // namespace kiln
