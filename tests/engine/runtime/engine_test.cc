// The Engine's contract: caching (memory, disk across engines, corrupt
// entries), statuses for bad runs, dispatch reports and their trace export,
// and KILN_DUMP.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "clients/cpp/graph_builder.h"
#include "engine/compile/disk_cache.h"
#include "engine/runtime/trace.h"
#include "nlohmann/json.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("kiln_engine_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

// y = relu(x @ w + b) * 2 with x f32[batch, 8].
v1::Graph SmallGraph() {
  GraphBuilder g("small");
  auto x = g.input("x", v1::DTYPE_F32, {std::string("batch"), int64_t{8}});
  auto w = g.param("w", v1::DTYPE_F32, {8, 4});
  auto b = g.param("b", v1::DTYPE_F32, {4});
  auto y = g.mul(g.relu(g.add(g.matmul(x, w), b)), g.scalar(2.0));
  g.named("y");
  g.output("y", y);
  return g.Build();
}

struct Fixture {
  HostTensor w =
      HostTensor::FromVector<float>(v1::DTYPE_F32, {8, 4}, std::vector<float>(32, 0.25f));
  HostTensor b = HostTensor::FromVector<float>(v1::DTYPE_F32, {4}, {1, -100, 0, 2});
  HostTensor x = HostTensor::FromVector<float>(v1::DTYPE_F32, {2, 8}, std::vector<float>(16, 1.0f));
  std::vector<TensorRef> params() const { return {TensorRef::Of("w", w), TensorRef::Of("b", b)}; }
  std::vector<TensorRef> inputs() const { return {TensorRef::Of("x", x)}; }
};

std::unique_ptr<Engine> MakeEngine(const std::string& cache_dir = "") {
  EngineOptions o;
  o.cache_dir = cache_dir;
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(e).value();
}

TEST(Engine, RunsAndReports) {
  auto engine = MakeEngine();
  Fixture f;
  auto params = engine->CreateParams(f.params());
  ASSERT_TRUE(params.ok()) << params.status();
  RunOptions ro;
  ro.report = true;
  ro.request_id = "req-1";
  ro.tenant = "t";
  auto r = engine->RunGraph(SmallGraph(), f.inputs(), params->get(), {}, ro);
  ASSERT_TRUE(r.ok()) << r.status();
  const HostTensor& y = r->outputs[0].second;
  ASSERT_EQ(y.dims(), (Dims{2, 4}));
  const float want[4] = {(2 + 1) * 2.f, 0.f, 2 * 2.f, 4 * 2.f};
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(y.data_as<float>()[i], want[i % 4]) << i;
  const v1::DispatchReport& rep = r->report;
  EXPECT_EQ(rep.request_id(), "req-1");
  EXPECT_EQ(rep.tenant(), "t");
  EXPECT_EQ(rep.placement().chosen(), "cpu:0");
  EXPECT_FALSE(rep.compile().executable_key().empty());
  ASSERT_GE(rep.compile().stages_size(), 8);
  EXPECT_EQ(rep.compile().stages(0).stage(), "hir");
  ASSERT_GE(rep.steps_size(), 1);
  // matmul + bias + relu fused; the scale by 2 is its own elementwise kernel.
  const v1::DispatchStep& mm = rep.steps(0);
  EXPECT_NE(mm.implementation().find("matmul"), std::string::npos) << mm.implementation();
  EXPECT_GT(mm.flops(), 0);
  EXPECT_GT(mm.bytes(), 0);
  EXPECT_FALSE(mm.node_ids().empty());

  const std::string trace = runtime::ToChromeTrace(rep);
  auto json = nlohmann::json::parse(trace);
  int complete = 0;
  for (const auto& e : json["traceEvents"]) complete += e["ph"] == "X";
  EXPECT_EQ(complete, rep.steps_size());
}

// CompileOptions.allow_tf32 is its own executable (the key's options
// component) and marks the f32 product for the devices; off (the default),
// the key and the product are as before, so results match f32 references.
TEST(Engine, AllowTf32IsInTheKeyAndReachesTheMatMul) {
  TempDir dir;
  auto engine = MakeEngine(dir.str());
  CompileOptions tf32;
  tf32.allow_tf32 = true;
  auto exact = engine->Compile(SmallGraph(), {}, {{"x", {2, 8}}});
  auto fast = engine->Compile(SmallGraph(), tf32, {{"x", {2, 8}}});
  ASSERT_TRUE(exact.ok()) << exact.status();
  ASSERT_TRUE(fast.ok()) << fast.status();
  EXPECT_NE(fast->report.executable_key(), exact->report.executable_key());
  EXPECT_EQ(fast->report.executable_cache(), v1::CACHE_MISS);
  auto allows = [](const v1::Executable& lir) {
    int products = 0, allowed = 0;
    for (const v1::LirStep& s : lir.steps()) {
      const v1::Node& n = s.kernel().node();
      if (n.op() == v1::OP_MATMUL || n.op() == v1::OP_FUSED_MATMUL) {
        ++products;
        allowed += n.attrs().matmul().allow_tf32() || n.attrs().fused_matmul().allow_tf32();
      }
    }
    return std::make_pair(products, allowed);
  };
  const auto [p0, a0] = allows(exact->executable->lir());
  const auto [p1, a1] = allows(fast->executable->lir());
  EXPECT_GE(p0, 1);
  EXPECT_EQ(a0, 0);
  EXPECT_EQ(p1, p0);
  EXPECT_EQ(a1, p1);
}

TEST(Engine, MemoryThenDiskCache) {
  TempDir dir;
  Fixture f;
  std::string key;
  {
    auto engine = MakeEngine(dir.str());
    auto c1 = engine->Compile(SmallGraph(), {}, {{"x", {2, 8}}});
    ASSERT_TRUE(c1.ok()) << c1.status();
    EXPECT_EQ(c1->report.executable_cache(), v1::CACHE_MISS);
    key = c1->report.executable_key();
    auto c2 = engine->Compile(SmallGraph(), {}, {{"x", {2, 8}}});
    ASSERT_TRUE(c2.ok());
    EXPECT_EQ(c2->report.executable_cache(), v1::CACHE_HIT_MEMORY);
    EXPECT_EQ(c2->executable.get(), c1->executable.get());
    // Another batch size is another executable.
    auto c3 = engine->Compile(SmallGraph(), {}, {{"x", {3, 8}}});
    ASSERT_TRUE(c3.ok());
    EXPECT_NE(c3->report.executable_key(), key);
  }
  auto engine = MakeEngine(dir.str());
  auto c = engine->Compile(SmallGraph(), {}, {{"x", {2, 8}}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->report.executable_cache(), v1::CACHE_HIT_DISK);
  EXPECT_EQ(c->report.executable_key(), key);
  auto params = engine->CreateParams(f.params());
  auto r = engine->Run(*c->executable, f.inputs(), params->get(), {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FLOAT_EQ(r->outputs[0].second.data_as<float>()[0], 6.f);
  EXPECT_EQ(engine->cache_stats().disk_hits, 1);
}

TEST(Engine, CorruptCacheEntryIsRecompiled) {
  TempDir dir;
  std::string key;
  {
    auto engine = MakeEngine(dir.str());
    auto c = engine->Compile(SmallGraph(), {}, {{"x", {2, 8}}});
    ASSERT_TRUE(c.ok());
    key = c->report.executable_key();
  }
  // Flip bytes in the middle of every executable entry.
  int touched = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir.str())) {
    if (!e.is_regular_file() || e.path().filename().string() != key) continue;
    std::fstream io(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(e.file_size() / 2));
    io.write("\xde\xad\xbe\xef", 4);
    ++touched;
  }
  ASSERT_EQ(touched, 1);
  auto engine = MakeEngine(dir.str());
  auto c = engine->Compile(SmallGraph(), {}, {{"x", {2, 8}}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->report.executable_cache(), v1::CACHE_CORRUPT);
  EXPECT_EQ(engine->cache_stats().corrupt, 1);
  auto again = MakeEngine(dir.str())->Compile(SmallGraph(), {}, {{"x", {2, 8}}});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->report.executable_cache(), v1::CACHE_HIT_DISK);
}

TEST(Engine, KeyComponentsAreNamed) {
  auto engine = MakeEngine();
  auto c = engine->Compile(SmallGraph(), {}, {{"x", {2, 8}}});
  ASSERT_TRUE(c.ok());
  std::vector<std::string> names;
  for (const auto& k : c->report.key_components()) names.push_back(k.name());
  EXPECT_EQ(names, (std::vector<std::string>{"kiln_version", "lir_format", "graph", "options",
                                             "devices", "input_shapes"}));
}

TEST(Engine, RunErrorsNameTheProblem) {
  auto engine = MakeEngine();
  Fixture f;
  auto params = engine->CreateParams(f.params());
  auto c = engine->Compile(SmallGraph(), {}, {{"x", {2, 8}}});
  ASSERT_TRUE(c.ok());
  Executable& exe = *c->executable;
  auto expect = [&](absl::StatusCode code, const std::string& needle, std::vector<TensorRef> inputs,
                    const ParamSet* p) {
    auto r = engine->Run(exe, inputs, p, {});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_NE(std::string(r.status().message()).find(needle), std::string::npos) << r.status();
  };
  expect(absl::StatusCode::kInvalidArgument, "missing input \"x\"", {}, params->get());
  HostTensor wrong = HostTensor::FromVector<float>(v1::DTYPE_F32, {3, 8}, std::vector<float>(24));
  expect(absl::StatusCode::kInvalidArgument, "must be f32[2, 8]", {TensorRef::Of("x", wrong)},
         params->get());
  HostTensor ints =
      HostTensor::FromVector<int32_t>(v1::DTYPE_I32, {2, 8}, std::vector<int32_t>(16));
  expect(absl::StatusCode::kInvalidArgument, "got i32", {TensorRef::Of("x", ints)}, params->get());
  expect(absl::StatusCode::kInvalidArgument, "unknown input \"z\"",
         {TensorRef::Of("x", f.x), TensorRef::Of("z", f.x)}, params->get());
  TensorRef short_data = TensorRef::Of("x", f.x);
  short_data.bytes -= 4;
  expect(absl::StatusCode::kInvalidArgument, "needs 64 bytes", {short_data}, params->get());
  expect(absl::StatusCode::kFailedPrecondition, "param \"w\" (f32[8, 4]) is not set", f.inputs(),
         nullptr);
  const std::vector<TensorRef> mismatched = {TensorRef::Of("w", f.w), TensorRef::Of("b", f.x)};
  auto bad_params = engine->CreateParams(mismatched);
  ASSERT_TRUE(bad_params.ok());
  expect(absl::StatusCode::kInvalidArgument, "param \"b\" must be f32[4]", f.inputs(),
         bad_params->get());
}

TEST(Engine, CompileErrors) {
  auto engine = MakeEngine();
  CompileOptions pinned;
  pinned.device = "tpu:7";
  auto c = engine->Compile(SmallGraph(), pinned, {{"x", {2, 8}}});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("tpu:7"), std::string::npos);
  auto missing_shape = engine->Compile(SmallGraph(), {}, {});
  ASSERT_FALSE(missing_shape.ok());
  EXPECT_NE(std::string(missing_shape.status().message()).find("input \"x\""), std::string::npos);
  // An op no device claims (a collective: no multi-device job here) fails as
  // UNIMPLEMENTED naming the node.
  GraphBuilder g("reduce");
  auto a = g.input("a", v1::DTYPE_F32, {int64_t{3}, int64_t{3}});
  v1::Attrs attrs;
  attrs.mutable_all_reduce()->set_kind(v1::REDUCE_SUM);
  g.output("x", g.node(v1::OP_ALL_REDUCE, {a}, attrs, "allsum"));
  auto s = engine->Compile(g.Build(), {}, {});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(std::string(s.status().message()).find("\"allsum\" (all_reduce)"), std::string::npos)
      << s.status();
}

TEST(Engine, DumpWritesEveryStage) {
  TempDir dir;
  auto engine = MakeEngine();
  CompileOptions o;
  o.dump_dir = dir.str();
  ASSERT_TRUE(engine->Compile(SmallGraph(), o, {{"x", {2, 8}}}).ok());
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir.str()))
    files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"small.0_hir.kiln", "small.1_transforms.kiln",
                                             "small.2_legalize.kiln", "small.3_canonicalize.kiln",
                                             "small.4_fuse.kiln", "small.5_place.kiln",
                                             "small.6_plan_memory.kiln"}));
  std::ifstream in(fs::path(dir.str()) / "small.4_fuse.kiln");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("fused_matmul"), std::string::npos) << text;
}

TEST(Engine, ConcurrentRunsOfOneExecutable) {
  auto engine = MakeEngine();
  Fixture f;
  auto params = engine->CreateParams(f.params());
  auto c = engine->Compile(SmallGraph(), {}, {{"x", {2, 8}}});
  ASSERT_TRUE(c.ok());
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        auto r = engine->Run(*c->executable, f.inputs(), params->get(), {});
        if (r.ok() && r->outputs[0].second.data_as<float>()[0] == 6.f) ++ok;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 200);
  // Every run is counted, inline or queued, and the lane ends idle.
  for (const DeviceStats& s : engine->DeviceStatistics()) {
    if (s.device != "cpu:0") continue;
    EXPECT_EQ(s.runs, 200);
    EXPECT_EQ(s.queued, 0);
  }
}

// Outputs written straight into the result tensors (no copy-out) stay
// correct when an output also feeds later kernels and across repeated runs
// (each run returns its own tensors).
TEST(Engine, OutputsThatFeedLaterKernels) {
  GraphBuilder g("two_outputs");
  auto x = g.input("x", v1::DTYPE_F32, {int64_t{4}, int64_t{8}});
  auto w = g.input("w", v1::DTYPE_F32, {int64_t{8}, int64_t{8}});
  auto h = g.matmul(x, w);
  g.output("h", h);
  g.output("z", g.matmul(h, w));
  auto engine = MakeEngine();
  auto c = engine->Compile(g.Build(), {}, {});
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<float> xs(32), ws(64);
  for (int i = 0; i < 32; ++i) xs[i] = 0.25f * (i % 5) - 0.5f;
  for (int i = 0; i < 64; ++i) ws[i] = (i % 9 == 0) ? 1.0f : 0.125f * (i % 3);
  HostTensor xt = HostTensor::FromVector<float>(v1::DTYPE_F32, {4, 8}, xs);
  HostTensor wt = HostTensor::FromVector<float>(v1::DTYPE_F32, {8, 8}, ws);
  std::vector<TensorRef> in = {TensorRef::Of("x", xt), TensorRef::Of("w", wt)};
  auto first = engine->Run(*c->executable, in, nullptr, {});
  auto second = engine->Run(*c->executable, in, nullptr, {});
  ASSERT_TRUE(first.ok() && second.ok());
  for (const RunResult* r : {&*first, &*second}) {
    ASSERT_EQ(r->outputs.size(), 2u);
    const float* hv = r->outputs[0].second.data_as<float>();
    const float* zv = r->outputs[1].second.data_as<float>();
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 8; ++j) {
        double hr = 0;
        for (int k = 0; k < 8; ++k) hr += double(xs[i * 8 + k]) * ws[k * 8 + j];
        EXPECT_NEAR(hv[i * 8 + j], hr, 1e-5);
        double zr = 0;
        for (int k = 0; k < 8; ++k) zr += double(hv[i * 8 + k]) * ws[k * 8 + j];
        EXPECT_NEAR(zv[i * 8 + j], zr, 1e-4);
      }
    }
  }
  EXPECT_NE(first->outputs[0].second.data(), second->outputs[0].second.data());
}

// A graph the cost model rates small runs on the caller's thread when the
// device is idle; inline_run_micros = 0 hands every run to the worker.
TEST(Engine, SmallRunsRunOnTheCallersThread) {
  for (const double limit : {250.0, 0.0}) {
    EngineOptions o;
    o.inline_run_micros = limit;
    auto engine = Engine::Create(o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    Fixture f;
    auto params = (*engine)->CreateParams(f.params());
    ASSERT_TRUE(params.ok());
    auto c = (*engine)->Compile(SmallGraph(), {}, {{"x", {2, 8}}});
    ASSERT_TRUE(c.ok()) << c.status();
    for (int i = 0; i < 3; ++i) {
      auto r = (*engine)->Run(*c->executable, f.inputs(), params->get(), {});
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->outputs[0].second.data_as<float>()[0], 6.f);
    }
    for (const DeviceStats& s : (*engine)->DeviceStatistics()) {
      if (s.device != "cpu:0") continue;
      EXPECT_EQ(s.runs, 3);
      EXPECT_EQ(s.inline_runs, limit > 0 ? 3 : 0) << "inline_run_micros = " << limit;
    }
  }
}

}  // namespace
}  // namespace kiln
