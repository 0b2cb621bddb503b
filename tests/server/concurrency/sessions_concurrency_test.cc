// kilnd's session store, dynamic batcher and stateful sessions driven from
// many threads at once, in-process (a real Engine on the CPU, kilnd's
// WorkPool, Batcher, SessionStore and tenant accounting; no gRPC, whose
// uninstrumented threads ThreadSanitizer cannot order). Built into
// kiln_server_concurrency_test (make test, the ASan build) and into
// kiln_tsan_server_test (make test-tsan), where OMP_NUM_THREADS=1 keeps the
// CPU kernels on the threads TSan sees (docs/development.md, "ThreadSanitizer").
//
// What runs at once, as kilnd's RPC handlers would do it: client threads each
// open sessions (quota, params, batching), send batched runs of several row
// counts from several threads (the batcher's queue, timer thread, work-pool
// compiles and device threads), look sessions up from a prober thread and
// close them while runs of other sessions go on; and threads running one
// stateful session, whose first runs race to convert its params to a state set.
#include <atomic>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "engine/engine.h"
#include "engine/ir/text.h"
#include "gtest/gtest.h"
#include "server/batcher.h"
#include "server/config.h"
#include "server/rpc_common.h"
#include "server/sessions.h"
#include "server/tenants.h"
#include "server/work_pool.h"

namespace kiln::server {
namespace {

// y = x @ w + b for x f32[batch, 4], w f32[4, 3], b f32[3].
constexpr char kLinear[] = R"(graph "linear"
input x: f32[batch, 4]
param w: f32[4, 3]
param b: f32[3]
let y = x @ w + b
out y
)";

// t = s + x, with t bound back to the param s: each run adds x to the state.
constexpr char kAccumulate[] = R"(graph "accumulate"
input x: f32[4]
param s: f32[4]
let t = s + x
out t
)";

std::unique_ptr<Engine> MakeEngine() {
  EngineOptions o;
  o.cpu_threads = 1;
  o.calibration = EngineOptions::Calibration::kNever;
  o.device_isolation = EngineOptions::DeviceIsolation::kThread;
  o.inline_run_micros = 0;  // every run through the device's worker thread
  auto engine = Engine::Create(o);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

std::unique_ptr<TenantRegistry> OpenTenants() {
  v1::ServerConfig config;
  ApplyDefaults(config);
  auto tenants = TenantRegistry::Create(config);
  EXPECT_TRUE(tenants.ok()) << tenants.status();
  return tenants.ok() ? *std::move(tenants) : nullptr;
}

v1::Graph GraphOf(const char* text) {
  auto g = ir::ParseGraphProto(text);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : v1::Graph();
}

// Session `k`'s params: w[i][j] = k + i - j, b[j] = 0.5 * j - k.
double W(int k, int i, int j) { return k + i - j; }
double B(int k, int j) { return 0.5 * j - k; }

// Row r of request `q` of session `k`: x[r][i] = q - r + 0.25 * i.
double X(int q, int r, int i) { return q - r + 0.25 * i; }

TEST(ServerConcurrency, SessionsRunBatchedAndCloseFromManyThreads) {
  auto engine = MakeEngine();
  auto tenants = OpenTenants();
  ASSERT_TRUE(engine && tenants);
  Tenant& tenant = *tenants->tenants().front();
  WorkPool pool(2);
  std::unique_ptr<Batcher> batcher = Batcher::Create(*engine, pool);
  SessionStore store;
  const v1::Graph graph = GraphOf(kLinear);
  auto signature = engine->Inspect(graph);
  ASSERT_TRUE(signature.ok()) << signature.status();
  v1::DynamicBatching batching_proto;
  batching_proto.set_max_batch(8);
  batching_proto.set_max_queue_delay_micros(2000);
  auto batching = ToBatchingConfig(batching_proto, "options.batching");
  ASSERT_TRUE(batching.ok()) << batching.status();
  ASSERT_EQ(InputsBatchReason(*signature), "");

  constexpr int kClients = 4, kSessionsPerClient = 3, kRunsPerSession = 6;
  std::atomic<int> answered{0}, batched{0}, alone{0}, failures{0};
  std::atomic<bool> clients_done{false};
  std::vector<std::string> ids(kClients * kSessionsPerClient);
  absl::Mutex ids_mu;

  // Looks every session up, reads its executables and charge, while the
  // clients open, run and close them.
  std::thread prober([&] {
    while (!clients_done.load()) {
      std::vector<std::string> snapshot;
      {
        absl::MutexLock lock(&ids_mu);
        snapshot = ids;
      }
      for (const std::string& id : snapshot) {
        if (id.empty()) continue;
        auto s = store.Find(tenant, id);
        if (!s.ok()) continue;  // closed meanwhile
        (void)(*s)->FindExecutable("x:[2,4];");
        (void)(*s)->charge();
        (void)(*s)->params();
      }
      (void)store.CountByTenant();
      (void)tenant.usage();
      (void)engine->DeviceStatistics();
    }
  });

  auto client = [&](int c) {
    for (int n = 0; n < kSessionsPerClient; ++n) {
      const int k = c * kSessionsPerClient + n;
      ASSERT_TRUE(tenant.AcquireSession().ok());
      auto session = std::make_shared<Session>(SessionStore::NewId(), tenant, graph, *signature,
                                               CompileOptions{});
      session->SetBatching(*batching, InputsBatchReason(*signature));
      std::vector<double> w, b;
      for (int i = 0; i < 4; ++i) {
        for (int j = 0; j < 3; ++j) w.push_back(W(k, i, j));
      }
      for (int j = 0; j < 3; ++j) b.push_back(B(k, j));
      const HostTensor wt = HostTensor::FromVector(v1::DTYPE_F32, {4, 3}, w);
      const HostTensor bt = HostTensor::FromVector(v1::DTYPE_F32, {3}, b);
      const std::vector<TensorRef> params = {TensorRef::Of("w", wt), TensorRef::Of("b", bt)};
      const int64_t param_bytes = wt.num_bytes() + bt.num_bytes();
      ASSERT_TRUE(tenant.AcquireBytes(param_bytes, param_bytes).ok());
      ASSERT_TRUE(BindParams(*engine, *session, params).ok());
      store.Add(session);
      {
        absl::MutexLock lock(&ids_mu);
        ids[k] = session->id();
      }

      // The program, as kilnd's Run handler builds it (server/rpc_run.cc).
      auto program = std::make_shared<Batcher::Program>();
      program->config = session->batching();
      program->tenant = tenant.name();
      program->params = session->params();
      program->key = absl::StrCat(tenant.name(), "|session ", session->id());
      program->run.tenant = tenant.name();
      program->max_batch_bytes = int64_t{1} << 30;
      program->ready = [session](const std::vector<TensorRef>& in,
                                 v1::CompileReport* report) -> std::shared_ptr<Executable> {
        std::optional<Session::Compiled> found = session->FindExecutable(ShapeKey(in));
        if (!found) return nullptr;
        *report = found->report;
        return found->executable;
      };
      Engine& e = *engine;
      program->compile = [&e, session](const std::vector<TensorRef>& in, v1::CompileReport* report)
          -> absl::StatusOr<std::shared_ptr<Executable>> {
        std::vector<std::pair<std::string, Dims>> shapes;
        for (const TensorRef& t : in) shapes.emplace_back(t.name, t.dims);
        KILN_ASSIGN_OR_RETURN(CompileResult r, e.Compile(session->graph(), session->options(), shapes));
        *report = r.report;
        session->AddExecutable(ShapeKey(in), Session::Compiled{r.executable, r.report, 0});
        return r.executable;
      };
      program->compile_account = absl::StrCat(tenant.name(), "/compile");

      // Runs of 1, 2 and 3 rows from as many threads, all at once.
      std::vector<std::thread> runs;
      for (int q = 0; q < kRunsPerSession; ++q) {
        runs.emplace_back([&, q, k] {
          const int rows = 1 + q % 3;
          std::vector<double> x;
          for (int r = 0; r < rows; ++r) {
            for (int i = 0; i < 4; ++i) x.push_back(X(q, r, i));
          }
          auto xt = std::make_shared<HostTensor>(HostTensor::FromVector(v1::DTYPE_F32, {rows, 4}, x));
          ASSERT_TRUE(tenant.AcquireRun().ok());
          Batcher::Request request;
          request.inputs = {TensorRef::Of("x", *xt)};
          request.keep_alive = xt;
          request.rows = rows;
          request.request_id = absl::StrCat("s", k, "q", q);
          absl::Notification done;
          absl::StatusOr<RunResult> result = absl::UnknownError("not answered");
          std::string alone_reason;
          Batcher::Ticket ticket = batcher->Submit(
              program, std::move(request),
              [&](absl::StatusOr<Batcher::Outcome> outcome) {
                if (outcome.ok()) {
                  const v1::BatchInfo& info = outcome->result.report.batch();
                  if (info.batch_rows() < rows || info.row_offset() < 0 ||
                      info.row_offset() + rows > info.batch_rows()) {
                    failures.fetch_add(1);
                  }
                  result = std::move(outcome->result);
                } else {
                  result = outcome.status();
                }
                done.Notify();
              },
              &alone_reason);
          if (ticket) {
            done.WaitForNotification();
            batched.fetch_add(1);
          } else {  // it could not join a batch: alone, as kilnd runs it
            alone.fetch_add(1);
            v1::CompileReport report;
            auto exe = program->compile(std::vector<TensorRef>{TensorRef::Of("x", *xt)}, &report);
            if (exe.ok()) {
              const TensorRef in = TensorRef::Of("x", *xt);
              result = engine->Run(**exe, {&in, 1}, program->params.get(), RunOptions{});
            } else {
              result = exe.status();
            }
          }
          tenant.ReleaseRun();
          answered.fetch_add(1);
          ASSERT_TRUE(result.ok()) << result.status();
          ASSERT_EQ(result->outputs.size(), 1u);
          const HostTensor& y = result->outputs[0].second;
          ASSERT_EQ(y.dims(), (Dims{rows, 3}));
          for (int r = 0; r < rows; ++r) {
            for (int j = 0; j < 3; ++j) {
              double want = B(k, j);
              for (int i = 0; i < 4; ++i) want += X(q, r, i) * W(k, i, j);
              EXPECT_NEAR(y.GetAsDouble(r * 3 + j), want, 1e-4 * (1 + std::abs(want)))
                  << "session " << k << " request " << q << " row " << r << " column " << j;
            }
          }
        });
      }
      for (std::thread& t : runs) t.join();
      // Closed while the other clients' sessions run.
      ASSERT_TRUE(store.Remove(tenant, session->id()).ok());
      EXPECT_TRUE(session->closed());
      EXPECT_FALSE(store.Find(tenant, session->id()).ok());
    }
  };
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) clients.emplace_back(client, c);
  for (std::thread& t : clients) t.join();
  clients_done.store(true);
  prober.join();
  batcher.reset();

  EXPECT_EQ(answered.load(), kClients * kSessionsPerClient * kRunsPerSession);
  EXPECT_EQ(batched.load() + alone.load(), answered.load());
  EXPECT_GT(batched.load(), 0);
  EXPECT_EQ(failures.load(), 0);
  const Tenant::Usage usage = tenant.usage();
  EXPECT_EQ(usage.sessions, 0);
  EXPECT_EQ(usage.runs_in_flight, 0);
  EXPECT_EQ(usage.param_bytes, 0);
  EXPECT_EQ(usage.device_bytes, 0);
  EXPECT_TRUE(store.CountByTenant().empty());
}

TEST(ServerConcurrency, StatefulSessionRunsFromManyThreadsAddUp) {
  auto engine = MakeEngine();
  auto tenants = OpenTenants();
  ASSERT_TRUE(engine && tenants);
  Tenant& tenant = *tenants->tenants().front();
  const v1::Graph graph = GraphOf(kAccumulate);
  auto signature = engine->Inspect(graph);
  ASSERT_TRUE(signature.ok()) << signature.status();
  google::protobuf::RepeatedPtrField<v1::StateBinding> state;
  v1::StateBinding* binding = state.Add();
  binding->set_output("t");
  binding->set_param("s");
  CompileOptions options;
  ASSERT_TRUE(ApplyStateBindings(state, *signature, options).ok());
  ASSERT_TRUE(signature->outputs.empty());

  ASSERT_TRUE(tenant.AcquireSession().ok());
  auto session = std::make_shared<Session>(SessionStore::NewId(), tenant, graph, *signature, options);
  ASSERT_TRUE(session->stateful());
  const HostTensor zeros = HostTensor::FromVector(v1::DTYPE_F32, {4}, std::vector<double>(4, 0));
  const std::vector<TensorRef> params = {TensorRef::Of("s", zeros)};
  ASSERT_TRUE(tenant.AcquireBytes(zeros.num_bytes(), zeros.num_bytes()).ok());
  ASSERT_TRUE(BindParams(*engine, *session, params).ok());
  SessionStore store;
  store.Add(session);
  auto compiled = engine->Compile(session->graph(), session->options(), {});
  ASSERT_TRUE(compiled.ok()) << compiled.status();

  // Every thread's first run finds the plain set and races the others to
  // convert it (StateParams); all runs must land on the one state set.
  constexpr int kThreads = 4, kRunsPerThread = 10;
  std::vector<std::thread> threads;
  std::atomic<int> ok_runs{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const HostTensor x =
          HostTensor::FromVector(v1::DTYPE_F32, {4}, std::vector<double>{1.0 + t, 2.0 * t, 0.5, -1});
      const TensorRef in = TensorRef::Of("x", x);
      for (int i = 0; i < kRunsPerThread; ++i) {
        auto found = store.Find(tenant, session->id());
        ASSERT_TRUE(found.ok()) << found.status();
        auto set = StateParams(*engine, **found, *compiled->executable);
        ASSERT_TRUE(set.ok()) << set.status();
        auto result = engine->Run(*compiled->executable, {&in, 1}, set->get(), RunOptions{});
        ASSERT_TRUE(result.ok()) << result.status();
        EXPECT_TRUE(result->outputs.empty());
        ok_runs.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(ok_runs.load(), kThreads * kRunsPerThread);

  // Sum over threads of kRunsPerThread * x_t: exact in f32.
  std::vector<double> want(4, 0);
  for (int t = 0; t < kThreads; ++t) {
    want[0] += kRunsPerThread * (1.0 + t);
    want[1] += kRunsPerThread * (2.0 * t);
    want[2] += kRunsPerThread * 0.5;
    want[3] += kRunsPerThread * -1.0;
  }
  auto s = session->params()->Read("s");
  ASSERT_TRUE(s.ok()) << s.status();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(s->GetAsDouble(i), want[i]) << "element " << i;

  ASSERT_TRUE(store.Remove(tenant, session->id()).ok());
  const Tenant::Usage usage = tenant.usage();
  EXPECT_EQ(usage.sessions, 0);
  EXPECT_EQ(usage.param_bytes, 0);
  EXPECT_EQ(usage.device_bytes, 0);
}

}  // namespace
}  // namespace kiln::server
