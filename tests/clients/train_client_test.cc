// Training through a real kilnd (real gRPC over loopback) with the C++
// client: an MLP's training session matches the same model trained in
// PyTorch (tests/engine/train/torch_reference.py) with the same initial
// weights and batches, loss curve within 1e-4 relative over 100 steps (f32,
// CPU); GetParams returns the trained weights and the optimizer state; bad
// training requests get statuses that name what is wrong.
#include <cstdio>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "base/sanitizer.h"
#include "clients/cpp/client.h"
#include "engine/io/npy.h"
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

// kilnctl train: .npy data through a training session; the trained params
// come back as .npy files and the loss goes down on a learnable problem.
TEST(TrainClientTest, KilnctlTrainsOnNpyData) {
  testing::ScratchDir dir;
  std::mt19937 rng(4);
  std::normal_distribution<float> normal;
  std::vector<float> x(512 * 10);
  std::vector<int64_t> y(512);
  for (float& v : x) v = normal(rng);
  for (int i = 0; i < 512; ++i) {
    const float* row = &x[i * 10];
    y[i] = std::max_element(row, row + 3) - row;  // the class is the largest of the first 3
  }
  ASSERT_TRUE(
      WriteNpy(dir.path() + "/x.npy", HostTensor::FromVector<float>(v1::DTYPE_F32, {512, 10}, x))
          .ok());
  ASSERT_TRUE(
      WriteNpy(dir.path() + "/y.npy", HostTensor::FromVector<int64_t>(v1::DTYPE_I64, {512}, y))
          .ok());
  const std::string graph = dir.path() + "/mlp.kiln";
  std::ofstream(graph) << absl::StrReplaceAll(
      kMlp, {{"f32[32, 10]", "f32[batch, 10]"}, {"i64[32]", "i64[batch]"}});
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
}

}  // namespace
}  // namespace kiln
