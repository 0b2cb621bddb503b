// kiln::Client against a real kilnd: the MLP and the BERT encoder layer
// (one-shot and through sessions) match the f64 references of
// tests/e2e/models.h; params stream in chunks and come back intact; server
// errors arrive with their codes and messages; reports and the disk cache
// survive a restart.
#include "clients/cpp/client.h"

#include <filesystem>
#include <memory>
#include <random>
#include <tuple>

#include "base/sanitizer.h"
#include "clients/cpp/graph_builder.h"
#include "clients/cpp/graph_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/clients/kilnd_child.h"
#include "tests/e2e/models.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;
using testing::KilndChild;
using testing::ScratchDir;
using testing::SharedKilnd;

std::unique_ptr<Client> Connect(const std::string& addr, const ClientOptions& options = {}) {
  auto c = Client::Create(addr, options);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(*c);
}

std::string ExampleText(const std::string& name) {
  return testing::ReadFileOrDie(std::string(KILN_SOURCE_DIR) + "/examples/" + name);
}

TensorMap Inputs(HostTensor x) {
  TensorMap m;
  m.emplace("x", std::move(x));
  return m;
}

TensorMap Clone(const TensorMap& m) {
  TensorMap out;
  for (const auto& [name, t] : m) out.emplace(name, t.Clone());
  return out;
}

TEST(ClientTest, HealthDevicesAndServerInfo) {
  auto c = Connect(SharedKilnd().addr());
  auto health = c->Health();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, grpc::health::v1::HealthCheckResponse::SERVING);

  auto devices = c->ListDevices();
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_GE(devices->devices_size(), 1);
  EXPECT_EQ(devices->devices(0).id(), "cpu:0");

  auto info = c->ServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->version().empty());
  EXPECT_FALSE(info->cache().dir().empty());
}

TEST(ClientTest, MlpOneShotMatchesReference) {
  auto c = Connect(SharedKilnd().addr());
  models::Model m = models::Mlp();
  std::mt19937_64 rng(7);
  HostTensor x = models::RandomF32(rng, {3, 784}, 1.0);
  const HostTensor want = models::MlpReference(m, x);
  Client::RunOptions options;
  options.report = true;
  auto r = c->Run(GraphFromProto(m.graph), Inputs(std::move(x)), m.params, options);
  ASSERT_TRUE(r.ok()) << r.status();
  const HostTensor* logits = r->output("logits");
  ASSERT_NE(logits, nullptr);
  EXPECT_EQ(logits->dims(), (Dims{3, 10}));
  EXPECT_LE(models::WorstError(*logits, want, 1e-4, 1e-4), 1.0);
  EXPECT_FALSE(r->request_id.empty());
  EXPECT_GT(r->report.steps_size(), 0);
  EXPECT_GT(r->report.run_micros(), 0);

  // The report is kept by the server, findable by request id.
  auto kept = c->GetReport(r->request_id);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->steps_size(), r->report.steps_size());
}

TEST(ClientTest, MlpSessionStreamsParamsInChunks) {
  // 64 KiB chunks: w1 alone (784 x 512 f32, 1.5 MiB) takes 25 of them.
  ClientOptions options;
  options.chunk_bytes = 64 << 10;
  auto c = Connect(SharedKilnd().addr(), options);
  models::Model m = models::Mlp();
  auto session = c->CreateSession(GraphFromProto(m.graph));
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ(session->signature().params_size(), 6);

  int64_t total_bytes = 0, calls = 0, last = 0;
  bool monotonic = true;
  for (const auto& [name, t] : m.params) total_bytes += t.num_bytes();
  auto set = c->SetParams(session->session_id(), m.params, [&](int64_t done, int64_t total) {
    monotonic &= done > last && total == total_bytes;
    last = done;
    ++calls;
  });
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->params(), 6);
  EXPECT_EQ(set->bytes(), total_bytes);
  EXPECT_TRUE(monotonic);
  EXPECT_EQ(last, total_bytes);
  EXPECT_GT(calls, 25);

  // GetParams reassembles what was uploaded, byte for byte.
  auto back = c->GetParams(session->session_id());
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), m.params.size());
  for (const auto& [name, t] : m.params) {
    ASSERT_TRUE(back->contains(name)) << name;
    EXPECT_EQ(back->at(name).dims(), t.dims()) << name;
    EXPECT_EQ(back->at(name).bytes(), t.bytes()) << name;
  }
  auto some = c->GetParams(session->session_id(), {"b2"});
  ASSERT_TRUE(some.ok()) << some.status();
  EXPECT_EQ(some->size(), 1u);

  std::mt19937_64 rng(8);
  for (int64_t batch : {1, 5}) {
    HostTensor x = models::RandomF32(rng, {batch, 784}, 1.0);
    const HostTensor want = models::MlpReference(m, x);
    auto r = c->Run(session->session_id(), Inputs(std::move(x)));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_LE(models::WorstError(r->outputs.at(0).second, want, 1e-4, 1e-4), 1.0);
  }

  ASSERT_TRUE(c->CloseSession(session->session_id()).ok());
  auto closed = c->Run(session->session_id(), Inputs(models::RandomF32(rng, {1, 784}, 1.0)));
  EXPECT_EQ(closed.status().code(), absl::StatusCode::kNotFound) << closed.status();
}

TEST(ClientTest, EncoderLayerSessionMatchesReference) {
  auto c = Connect(SharedKilnd().addr());
  const models::EncoderConfig config;
  models::Model m = models::EncoderLayer(config);
  auto session = c->CreateSession(GraphFromProto(m.graph));
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE(c->SetParams(session->session_id(), m.params).ok());
  std::mt19937_64 rng(9);
  HostTensor x = models::RandomF32(rng, {2, config.seq, config.hidden}, 1.0);
  const HostTensor want = models::EncoderLayerReference(m, config, x);
  auto r = c->Run(session->session_id(), Inputs(std::move(x)));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outputs.at(0).first, "y");
  EXPECT_EQ(r->outputs.at(0).second.dims(), (Dims{2, config.seq, config.hidden}));
  EXPECT_LE(models::WorstError(r->outputs.at(0).second, want, 2e-4, 2e-4), 1.0);
  EXPECT_TRUE(c->CloseSession(session->session_id()).ok());
}

// With malloc tuned as kilnctl tunes it, large tensors still round-trip
// (the setting changes where buffers come from, never their contents).
TEST(ClientTest, TunedMallocRunsLargeTensors) {
  // glibc takes the setting; ASan's allocator has no such knobs and the
  // function says so (base/sanitizer.h).
  EXPECT_EQ(TuneMallocForLargeTensors(), !kAddressSanitizer);
  auto c = Connect(SharedKilnd().addr());
  GraphBuilder g("plus_one_big");
  g.output("y", g.add(g.input("x", v1::DTYPE_F32, {int64_t{1}, int64_t{128}, int64_t{768}}),
                      g.scalar(1.0)));
  auto session = c->CreateSession(GraphFromProto(g.Build()));
  ASSERT_TRUE(session.ok()) << session.status();
  std::mt19937_64 rng(3);
  for (int i = 0; i < 3; ++i) {
    HostTensor x = models::RandomF32(rng, {1, 128, 768}, 1.0);
    const float first = x.data_as<float>()[0], last = x.data_as<float>()[128 * 768 - 1];
    auto r = c->Run(session->session_id(), Inputs(std::move(x)));
    ASSERT_TRUE(r.ok()) << r.status();
    const HostTensor& y = r->outputs.at(0).second;
    EXPECT_FLOAT_EQ(y.data_as<float>()[0], first + 1.0f);
    EXPECT_FLOAT_EQ(y.data_as<float>()[128 * 768 - 1], last + 1.0f);
  }
  EXPECT_TRUE(c->CloseSession(session->session_id()).ok());
}

// Run's tensors go from the caller's buffers into gRPC's slices and from the
// response's slices into the outputs (base/tensor_wire.h): every output, large
// or small, of any dtype and rank, arrives with its name, dtype, dims and
// bytes, in the graph's order; large one-shot params go the same way.
TEST(ClientTest, RunTensorsCrossTheWireIntact) {
  auto c = Connect(SharedKilnd().addr());
  GraphBuilder g("wire");
  auto x = g.input("x", v1::DTYPE_F32, {int64_t{3}, int64_t{70000}});
  auto w = g.param("w", v1::DTYPE_F32, {int64_t{3}, int64_t{70000}});
  auto k = g.input("k", v1::DTYPE_I32, {int64_t{5}});
  g.output("big", g.add(x, w));
  g.output("small", g.add(k, k));
  g.output("scalar", g.scalar(2.5));
  TensorMap inputs, params;
  std::mt19937_64 rng(12);
  inputs.emplace("x", models::RandomF32(rng, {3, 70000}, 1.0));
  inputs.emplace("k", HostTensor::FromVector<int32_t>(v1::DTYPE_I32, {5}, {1, -2, 3, -4, 5}));
  params.emplace("w", models::RandomF32(rng, {3, 70000}, 1.0));
  v1::CompileOptions cpu;
  cpu.set_device("cpu:0");
  Client::RunOptions options;
  options.compile = cpu;
  options.report = true;
  auto r = c->Run(GraphFromProto(g.Build()), inputs, params, options);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->outputs.size(), 3u);
  EXPECT_EQ(r->outputs[0].first, "big");
  EXPECT_EQ(r->outputs[1].first, "small");
  EXPECT_EQ(r->outputs[2].first, "scalar");
  const HostTensor& big = r->outputs[0].second;
  ASSERT_EQ(big.dtype(), v1::DTYPE_F32);
  ASSERT_EQ(big.dims(), (Dims{3, 70000}));
  const float* xs = inputs.at("x").data_as<float>();
  const float* ws = params.at("w").data_as<float>();
  for (int64_t i = 0; i < big.num_elements(); ++i) {
    ASSERT_EQ(big.data_as<float>()[i], xs[i] + ws[i]) << i;
  }
  const HostTensor& small = r->outputs[1].second;
  ASSERT_EQ(small.dtype(), v1::DTYPE_I32);
  ASSERT_EQ(small.dims(), (Dims{5}));
  EXPECT_EQ(small.data_as<int32_t>()[3], -8);
  EXPECT_EQ(r->outputs[2].second.dims(), Dims{});
  EXPECT_EQ(r->outputs[2].second.data_as<float>()[0], 2.5f);
  EXPECT_FALSE(r->request_id.empty());
  EXPECT_EQ(r->report.request_id(), r->request_id);
}

// With shared memory off every tensor is bytes in the messages: large inputs
// go out as slices over the caller's buffers (no copy) and small ones copied,
// outputs are copied once out of the response. Both directions keep every
// byte of every plain dtype: y = reshape(x) returns x's bytes as they are.
TEST(ClientTest, BytesOnTheWireKeepEveryDtype) {
  ClientOptions bytes_only;
  bytes_only.shared_memory = false;
  auto c = Connect(SharedKilnd().addr(), bytes_only);
  for (const DType dtype : {v1::DTYPE_F32, v1::DTYPE_F16, v1::DTYPE_BF16, v1::DTYPE_F64,
                            v1::DTYPE_I8, v1::DTYPE_U8, v1::DTYPE_I16, v1::DTYPE_I32,
                            v1::DTYPE_I64, v1::DTYPE_BOOL}) {
    SCOPED_TRACE(v1::DType_Name(dtype));
    constexpr int64_t kBig = 70000;  // at least 64 KiB for every dtype: sent in place
    GraphBuilder g("reshape_all");
    g.output("big", g.reshape(g.input("big_in", dtype, {kBig}), {2, kBig / 2}));
    g.output("small", g.reshape(g.input("small_in", dtype, {int64_t{6}}), {3, 2}));
    auto session = c->CreateSession(GraphFromProto(g.Build()));
    ASSERT_TRUE(session.ok()) << session.status();
    TensorMap in;
    for (const auto& [name, n] : {std::pair{"big_in", kBig}, std::pair{"small_in", int64_t{6}}}) {
      HostTensor t = std::move(HostTensor::Create(dtype, {n})).value();
      auto* bytes = static_cast<uint8_t*>(t.data());
      for (int64_t i = 0; i < t.num_bytes(); ++i) {
        // Finite floats of every width (no exponent of all ones); 0 / 1 for bool.
        bytes[i] = dtype == v1::DTYPE_BOOL ? static_cast<uint8_t>(i & 1)
                                           : static_cast<uint8_t>((i * 37 + 11) & 0x3f);
      }
      in.emplace(name, std::move(t));
    }
    for (int round = 0; round < 2; ++round) {  // the second reuses kilnd's and gRPC's buffers
      auto r = c->Run(session->session_id(), in);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_FALSE(r->shared_memory);
      ASSERT_EQ(r->outputs.size(), 2u);
      for (const auto& [name, want_dims, from] :
           {std::tuple{"big", Dims{2, kBig / 2}, "big_in"}, std::tuple{"small", Dims{3, 2}, "small_in"}}) {
        const HostTensor* y = r->output(name);
        ASSERT_NE(y, nullptr) << name;
        EXPECT_EQ(y->dtype(), dtype);
        EXPECT_EQ(y->dims(), want_dims);
        EXPECT_TRUE(y->bytes() == in.at(from).bytes()) << name << " changed on the way";
      }
    }
    EXPECT_TRUE(c->CloseSession(session->session_id()).ok());
  }
}

// A call that fails while its large input is in flight (a deadline that ends
// it mid-send, a refused input) returns only once gRPC has let go of the
// caller's buffers, which the caller then frees; the client goes on working.
TEST(ClientTest, FailedBytesRunsLetGoOfTheCallersBuffers) {
  ClientOptions hurried;
  hurried.shared_memory = false;
  hurried.timeout = absl::Microseconds(200);
  auto fast = Connect(SharedKilnd().addr(), hurried);
  ClientOptions bytes_only;
  bytes_only.shared_memory = false;
  auto c = Connect(SharedKilnd().addr(), bytes_only);
  GraphBuilder g("plus_one_wide");
  g.output("y", g.add(g.input("x", v1::DTYPE_F32, {int64_t{1} << 22}), g.scalar(1.0)));
  auto session = c->CreateSession(GraphFromProto(g.Build()));
  ASSERT_TRUE(session.ok()) << session.status();
  std::mt19937_64 rng(5);
  for (int i = 0; i < 4; ++i) {
    // 16 MiB each: the deadline passes long before gRPC has sent it.
    auto x = std::make_unique<TensorMap>(Inputs(models::RandomF32(rng, {int64_t{1} << 22}, 1.0)));
    auto late = fast->Run(session->session_id(), *x);
    ASSERT_FALSE(late.ok());
    EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
    x.reset();
    TensorMap wrong;
    wrong.emplace("not_x", models::RandomF32(rng, {int64_t{1} << 22}, 1.0));
    auto refused = c->Run(session->session_id(), wrong);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  }
  HostTensor x = models::RandomF32(rng, {int64_t{1} << 22}, 1.0);
  const float last = x.data_as<float>()[(int64_t{1} << 22) - 1];
  auto r = c->Run(session->session_id(), Inputs(std::move(x)));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FLOAT_EQ(r->outputs.at(0).second.data_as<float>()[(int64_t{1} << 22) - 1], last + 1.0f);
  EXPECT_TRUE(c->CloseSession(session->session_id()).ok());
}

TEST(ClientTest, TextGraphsCompileAndRun) {
  auto c = Connect(SharedKilnd().addr());
  const v1::GraphSource mlp = GraphFromText(ExampleText("mlp.kiln"));

  // Verify only (a symbolic batch and no shapes), then compile for batch 4.
  auto verified = c->Compile(mlp);
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_TRUE(verified->executable_key().empty());
  ASSERT_EQ(verified->signature().inputs_size(), 1);
  EXPECT_EQ(verified->signature().inputs(0).name(), "x");
  EXPECT_EQ(verified->signature().params_size(), 6);
  auto compiled = c->Compile(mlp, {}, {{"x", {4, 784}}});
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  EXPECT_FALSE(compiled->executable_key().empty());
  EXPECT_GT(compiled->report().kernels(), 0);

  // examples/mlp.kiln has the param names of models::Mlp.
  models::Model m = models::Mlp();
  std::mt19937_64 rng(10);
  HostTensor x = models::RandomF32(rng, {4, 784}, 1.0);
  const HostTensor want = models::MlpReference(m, x);
  auto r = c->Run(mlp, Inputs(std::move(x)), m.params);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LE(models::WorstError(r->outputs.at(0).second, want, 1e-4, 1e-4), 1.0);

  // A graph file loads as text by its extension.
  auto loaded = LoadGraphFile(std::string(KILN_SOURCE_DIR) + "/examples/mlp.kiln");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->has_text());
}

TEST(ClientTest, ErrorsCarryServerCodesAndMessages) {
  auto c = Connect(SharedKilnd().addr());

  // A parse error names the line.
  auto bad_text =
      c->Compile(GraphFromText("graph \"g\"\ninput x: f32[4]\nlet y = frobnicate(x)\nout y\n"));
  EXPECT_EQ(bad_text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_text.status().message()), HasSubstr("frobnicate"));

  // Unknown session.
  auto unknown = c->Run("no-such-session", {});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound) << unknown.status();
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("no-such-session"));

  // Wrong input name and wrong input shape, named in the message.
  models::Model m = models::Mlp();
  std::mt19937_64 rng(11);
  TensorMap wrong_name;
  wrong_name.emplace("y", models::RandomF32(rng, {1, 784}, 1.0));
  auto r1 = c->Run(GraphFromProto(m.graph), wrong_name, m.params);
  EXPECT_EQ(r1.status().code(), absl::StatusCode::kInvalidArgument) << r1.status();
  EXPECT_THAT(std::string(r1.status().message()), HasSubstr("x"));
  auto r2 =
      c->Run(GraphFromProto(m.graph), Inputs(models::RandomF32(rng, {1, 783}, 1.0)), m.params);
  EXPECT_EQ(r2.status().code(), absl::StatusCode::kInvalidArgument) << r2.status();
  EXPECT_THAT(std::string(r2.status().message()), HasSubstr("783"));

  // A missing param.
  TensorMap partial = Clone(m.params);
  partial.erase("w3");
  auto r3 = c->Run(GraphFromProto(m.graph), Inputs(models::RandomF32(rng, {1, 784}, 1.0)), partial);
  EXPECT_FALSE(r3.ok());
  EXPECT_THAT(std::string(r3.status().message()), HasSubstr("w3"));

  // No server at all: UNAVAILABLE, with a deadline honoured.
  ClientOptions quick;
  quick.timeout = absl::Seconds(2);
  auto nowhere = Connect("127.0.0.1:1", quick);
  auto h = nowhere->Health();
  EXPECT_TRUE(h.status().code() == absl::StatusCode::kUnavailable ||
              h.status().code() == absl::StatusCode::kDeadlineExceeded)
      << h.status();
}

TEST(ClientTest, ReportsListTheLastRuns) {
  auto c = Connect(SharedKilnd().addr());
  const v1::GraphSource g =
      GraphFromText("graph \"plus_one\"\ninput x: f32[4]\nlet y = x + 1.0\nout y\n");
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    HostTensor x = HostTensor::FromVector<float>(v1::DTYPE_F32, {4}, {1, 2, 3, float(i)});
    Client::RunOptions options;
    options.report = true;
    auto r = c->Run(g, Inputs(std::move(x)), {}, options);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FLOAT_EQ(r->outputs.at(0).second.data_as<float>()[3], i + 1.0f);
    ids.push_back(r->request_id);
  }
  auto last = c->GetReports(2);
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_EQ(last->size(), 2u);
  EXPECT_EQ(last->at(0).request_id(), ids[1]);  // oldest first
  EXPECT_EQ(last->at(1).request_id(), ids[2]);
}

TEST(ClientRestartTest, ReportSaysCacheHitDiskAfterRestart) {
  ScratchDir cache;
  models::Model m = models::Mlp(3);
  std::mt19937_64 rng(12);
  Client::RunOptions options;
  options.report = true;
  for (int round = 0; round < 2; ++round) {
    auto kilnd = KilndChild::Start(cache.path());
    ASSERT_TRUE(kilnd.ok()) << kilnd.status();
    auto c = Connect((*kilnd)->addr());
    auto r = c->Run(GraphFromProto(m.graph), Inputs(models::RandomF32(rng, {2, 784}, 1.0)),
                    m.params, options);
    ASSERT_TRUE(r.ok()) << r.status();
    const v1::CacheOutcome outcome = r->report.compile().executable_cache();
    if (round == 0) {
      EXPECT_EQ(outcome, v1::CACHE_MISS) << v1::CacheOutcome_Name(outcome);
    } else {
      EXPECT_EQ(outcome, v1::CACHE_HIT_DISK) << v1::CacheOutcome_Name(outcome);
    }
    EXPECT_EQ((*kilnd)->Stop(), 0) << (*kilnd)->Log();
  }
}

}  // namespace
}  // namespace kiln
