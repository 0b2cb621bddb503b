// Dynamic batching over a real kilnd (server/batcher.h): concurrent runs of a
// batching session get exactly their own rows (checked against a session
// without batching on the same params), reports say how each ran, a lone
// request does not wait out max_queue_delay, requests that arrive while a
// batch of their program is in flight go together as the next batch when it
// ends, a request that leaves a batch (deadline, cancellation) fails alone,
// requests that cannot join run alone and say why, sessions of one tenant on
// one repository model batch together, and a bad batching config is named.
//
// The CPU runs one run at a time: a slow one-shot run holding it (HoldCpu)
// keeps a batch "in flight" on its device's queue for as long as a test needs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/io/safetensors.h"
#include "server/batcher.h"
#include "tests/e2e/models.h"
#include "tests/server/kilnd_process.h"
#include "tests/server/test_graphs.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing::Context;
using testing::FromProto;
using testing::KilndProcess;
using testing::MetricValue;
using testing::TempDir;
using testing::ToProto;

const std::vector<int64_t> kMlpWidths = {16, 32, 4};

class ServerBatching : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cache_ = new TempDir();
    repo_ = new TempDir();
    // A repository model whose sessions batch by its config.
    mlp_ = new models::Model(models::Mlp(7, kMlpWidths));
    const fs::path dir = fs::path(repo_->path()) / "mlp" / "1";
    fs::create_directories(dir);
    std::ofstream(dir / "model.pb", std::ios::binary) << mlp_->graph.SerializeAsString();
    std::vector<io::SafetensorsItem> items;
    for (const auto& [name, t] : mlp_->params) items.emplace_back(name, &t);
    ASSERT_TRUE(io::WriteSafetensors((dir / "weights.safetensors").string(), items, {}).ok());
    std::string error;
    kilnd_ =
        KilndProcess::Start(
            {.cache_dir = cache_->path(),
             .config_text = absl::StrCat("model_repository { root: \"", repo_->path(), "\"\n",
                                         "  models { name: \"mlp\" batching { max_batch: 64 "
                                         "max_queue_delay_micros: 1000000 } } }\n"
                                         "default_quota { max_in_flight: 256 max_queue: 256 }\n")},
            &error)
            .release();
    ASSERT_NE(kilnd_, nullptr) << error;
  }
  static void TearDownTestSuite() {
    delete kilnd_;
    delete mlp_;
    delete repo_;
    delete cache_;
  }
  void SetUp() override { stub_ = kilnd_->Stub(); }
  void TearDown() override {
    if (HasFailure()) std::cerr << "kilnd log:\n" << kilnd_->Log();
  }

  std::string Scrape() { return testing::HttpGet(kilnd_->metrics_port(), "/metrics"); }

  // A session of `text` (params w and b of kAffineText when `affine`), with
  // batching when max_batch > 0.
  std::string Session(const std::string& text, int64_t max_batch, int64_t delay_micros,
                      bool affine = true) {
    v1::CreateSessionRequest req;
    req.mutable_graph()->set_text(text);
    if (max_batch > 0) {
      req.mutable_options()->mutable_batching()->set_max_batch(max_batch);
      req.mutable_options()->mutable_batching()->set_max_queue_delay_micros(delay_micros);
    }
    if (affine) {
      testing::AddTensor(req.mutable_params(), "w", v1::DTYPE_F32, {3, 2}, {1, -2, 0.5, 1, 3, -1});
      testing::AddTensor(req.mutable_params(), "b", v1::DTYPE_F32, {2}, {0.25, -0.5});
    }
    v1::CreateSessionResponse resp;
    const grpc::Status s = stub_->CreateSession(Context().get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.session_id();
  }

  static v1::RunRequest RunOf(const std::string& session, const std::string& input,
                              const HostTensor& x) {
    v1::RunRequest req;
    req.set_session_id(session);
    req.set_report(true);
    v1::NamedTensor* t = req.add_inputs();
    t->set_name(input);
    *t->mutable_tensor() = ToProto(x);
    return req;
  }

  static HostTensor Rows(int64_t rows, int64_t cols, std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> v(static_cast<size_t>(rows * cols));
    for (float& f : v) f = u(rng);
    return HostTensor::FromVector(v1::DTYPE_F32, {rows, cols}, v);
  }

  // A run sent asynchronously; `done` gets its status.
  struct AsyncRun {
    v1::RunRequest request;
    v1::RunResponse response;
    std::unique_ptr<grpc::ClientContext> ctx;
    std::promise<grpc::Status> done;
    std::future<grpc::Status> status = done.get_future();
  };
  std::unique_ptr<AsyncRun> Send(v1::RunRequest request,
                                 absl::Duration deadline = absl::Seconds(120)) {
    auto r = std::make_unique<AsyncRun>();
    r->request = std::move(request);
    r->ctx = Context("", deadline);
    AsyncRun* raw = r.get();
    stub_->async()->Run(raw->ctx.get(), &raw->request, &raw->response,
                        [raw](grpc::Status s) { raw->done.set_value(std::move(s)); });
    return r;
  }

  // Polls the tenant's gauge `name` until it is `value`; false if it never is.
  bool WaitForGauge(const std::string& name, double value) {
    for (int i = 0; i < 3000; ++i) {
      if (MetricValue(Scrape(), name, {{"tenant", "default"}}) == value) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  // A slow one-shot run that holds the CPU (one run at a time) until it is
  // cancelled: runs handed to the device meanwhile wait in its queue.
  std::unique_ptr<AsyncRun> HoldCpu() {
    std::unique_ptr<AsyncRun> slow = Send(testing::SlowRequest(1024, 400));
    EXPECT_TRUE(WaitForGauge("kiln_runs_running", 1));
    return slow;
  }
  static void Release(AsyncRun& slow) {
    slow.ctx->TryCancel();
    EXPECT_EQ(slow.status.get().error_code(), grpc::StatusCode::CANCELLED);
  }

  static void ExpectSame(const HostTensor& a, const HostTensor& b) {
    ASSERT_EQ(a.dims(), b.dims());
    for (int64_t i = 0; i < a.num_elements(); ++i) {
      ASSERT_NEAR(a.data_as<float>()[i], b.data_as<float>()[i], 1e-5) << "element " << i;
    }
  }

  static TempDir* cache_;
  static TempDir* repo_;
  static models::Model* mlp_;
  static KilndProcess* kilnd_;
  std::unique_ptr<v1::Kiln::Stub> stub_;
};

TempDir* ServerBatching::cache_ = nullptr;
TempDir* ServerBatching::repo_ = nullptr;
models::Model* ServerBatching::mlp_ = nullptr;
KilndProcess* ServerBatching::kilnd_ = nullptr;

// 16 callers at once, batch 1 and mixed sizes: every answer is exactly the
// caller's rows, equal to the same rows run by a session without batching.
TEST_F(ServerBatching, ConcurrentRequestsGetTheirOwnRows) {
  const std::string batched = Session(testing::kAffineText, 8, 20000);
  const std::string plain = Session(testing::kAffineText, 0, 0);
  constexpr int kThreads = 16, kRounds = 6;
  std::mutex mu;
  int batched_runs = 0, total = 0;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto stub = kilnd_->Stub();
      std::mt19937 rng(t);
      for (int round = 0; round < kRounds; ++round) {
        // Half the callers send one row, the others 1 to 3.
        const int64_t rows = t % 2 == 0 ? 1 : 1 + (round + t) % 3;
        const HostTensor x = Rows(rows, 3, rng);
        v1::RunResponse got, want;
        const grpc::Status s = stub->Run(Context().get(), RunOf(batched, "x", x), &got);
        const grpc::Status r = stub->Run(Context().get(), RunOf(plain, "x", x), &want);
        std::lock_guard<std::mutex> lock(mu);
        ++total;
        if (!s.ok() || !r.ok()) {
          failures.push_back(s.error_message() + " / " + r.error_message());
          continue;
        }
        ExpectSame(FromProto(got.outputs(0).tensor()), FromProto(want.outputs(0).tensor()));
        const v1::BatchInfo& b = got.report().batch();
        EXPECT_EQ(b.rows(), rows);
        EXPECT_TRUE(b.alone_reason().empty()) << b.alone_reason();
        EXPECT_GE(b.batch_rows(), rows);
        EXPECT_LE(b.batch_rows(), 8);
        EXPECT_GE(b.batch_requests(), 1);
        EXPECT_LE(b.row_offset() + rows, b.batch_rows());
        EXPECT_EQ(b.batched(), b.batch_requests() > 1);
        EXPECT_EQ(got.report().request_id(), got.request_id());
        if (b.batched()) ++batched_runs;
        // A request's report is its own, also in GetReport.
        EXPECT_FALSE(want.report().has_batch());
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_TRUE(failures.empty()) << failures.front();
  EXPECT_EQ(total, kThreads * kRounds);
  // 16 callers within a 20 ms window: some runs were batched.
  EXPECT_GT(batched_runs, 0);
  const std::string m = Scrape();
  EXPECT_GT(MetricValue(m, "kiln_batch_rows_count", {{"tenant", "default"}}), 0);
  EXPECT_GE(MetricValue(m, "kiln_batch_queue_seconds_count", {{"tenant", "default"}}),
            kThreads * kRounds);
}

// A lone request of an idle program goes at once: it does not wait out
// max_queue_delay (500 ms here) for company.
TEST_F(ServerBatching, LoneRequestIsNotDelayed) {
  constexpr int64_t kDelayMicros = 500000;
  const std::string batched = Session(testing::kAffineText, 8, kDelayMicros);
  const std::string plain = Session(testing::kAffineText, 0, 0);
  std::mt19937 rng(5);
  for (int i = 0; i < 3; ++i) {
    const HostTensor x = Rows(1, 3, rng);
    v1::RunResponse got, want;
    ASSERT_TRUE(stub_->Run(Context().get(), RunOf(batched, "x", x), &got).ok());
    ASSERT_TRUE(stub_->Run(Context().get(), RunOf(plain, "x", x), &want).ok());
    ExpectSame(FromProto(got.outputs(0).tensor()), FromProto(want.outputs(0).tensor()));
    const v1::BatchInfo& b = got.report().batch();
    EXPECT_TRUE(b.alone_reason().empty()) << b.alone_reason();
    EXPECT_FALSE(b.batched());
    EXPECT_EQ(b.batch_requests(), 1);
    EXPECT_EQ(b.batch_rows(), 1);
    EXPECT_LT(b.queue_wait_micros(), kDelayMicros) << "run " << i;
  }
}

// While a batch of the program is in flight (here: queued behind a slow run),
// requests gather; the moment it ends they go as one batch, without waiting
// out max_queue_delay (1 s), each with its own rows (5 rows, run as a batch
// of 6 whose last row is padding).
TEST_F(ServerBatching, RequestsGatherWhileABatchRunsAndGoWhenItEnds) {
  constexpr int64_t kDelayMicros = 1000000;
  const std::string batched = Session(testing::kAffineText, 64, kDelayMicros);
  const std::string plain = Session(testing::kAffineText, 0, 0);
  std::unique_ptr<AsyncRun> slow = HoldCpu();
  std::mt19937 rng(2);
  // The first request goes at once: it waits on the device, not in the batcher.
  const HostTensor first_x = Rows(1, 3, rng);
  std::unique_ptr<AsyncRun> first = Send(RunOf(batched, "x", first_x));
  ASSERT_TRUE(WaitForGauge("kiln_runs_queued", 1));
  constexpr int kRequests = 4;
  std::vector<HostTensor> xs;
  std::vector<std::unique_ptr<AsyncRun>> runs;
  int64_t rows = 0;
  for (int i = 0; i < kRequests; ++i) {
    xs.push_back(Rows(i == 1 ? 2 : 1, 3, rng));
    rows += xs.back().dims()[0];
    runs.push_back(Send(RunOf(batched, "x", xs.back())));
  }
  ASSERT_EQ(server::BatchBucketRows(rows, 64), rows + 1);
  // All admitted (the slow run, the first, the four): the four wait in the
  // batcher, none on the device.
  ASSERT_TRUE(WaitForGauge("kiln_runs_in_flight", kRequests + 2));
  EXPECT_EQ(MetricValue(Scrape(), "kiln_runs_queued", {{"tenant", "default"}}), 1);
  Release(*slow);

  ASSERT_TRUE(first->status.get().ok());
  EXPECT_EQ(first->response.report().batch().batch_requests(), 1);
  EXPECT_LT(first->response.report().batch().queue_wait_micros(), kDelayMicros);
  for (int i = 0; i < kRequests; ++i) {
    const grpc::Status s = runs[i]->status.get();
    ASSERT_TRUE(s.ok()) << i << ": " << s.error_message();
    v1::RunResponse want;
    ASSERT_TRUE(stub_->Run(Context().get(), RunOf(plain, "x", xs[i]), &want).ok());
    ExpectSame(FromProto(runs[i]->response.outputs(0).tensor()),
               FromProto(want.outputs(0).tensor()));
    const v1::BatchInfo& b = runs[i]->response.report().batch();
    EXPECT_TRUE(b.batched());
    EXPECT_EQ(b.batch_requests(), kRequests);
    EXPECT_EQ(b.batch_rows(), rows);
    EXPECT_EQ(b.rows(), xs[i].dims()[0]);
    // Sent on when the first request's batch ended, not at max_queue_delay.
    EXPECT_GT(b.queue_wait_micros(), 0);
    EXPECT_LT(b.queue_wait_micros(), kDelayMicros);
  }
}

// max_queue_delay sends a batch on while one batch of its program is in
// flight, not while two are (one running, the next waiting on the device):
// a third would only queue behind them. The late request goes when one ends.
TEST_F(ServerBatching, DelayedBatchWaitsWhileTwoAreInFlight) {
  constexpr int64_t kDelayMicros = 100000;
  const std::string batched = Session(testing::kAffineText, 64, kDelayMicros);
  const std::string plain = Session(testing::kAffineText, 0, 0);
  std::unique_ptr<AsyncRun> slow = HoldCpu();
  std::mt19937 rng(3);
  std::vector<HostTensor> xs;
  std::vector<std::unique_ptr<AsyncRun>> runs;
  for (int i = 0; i < 3; ++i) {
    xs.push_back(Rows(1, 3, rng));
    runs.push_back(Send(RunOf(batched, "x", xs.back())));
    if (i < 2) {
      // The first goes at once, the second when its 100 ms delay passed:
      // both on the device, behind the slow run.
      ASSERT_TRUE(WaitForGauge("kiln_runs_queued", i + 1));
    }
  }
  ASSERT_TRUE(WaitForGauge("kiln_runs_in_flight", 4));
  // Five times its delay later, the third still waits in the batcher.
  std::this_thread::sleep_for(std::chrono::microseconds(5 * kDelayMicros));
  EXPECT_EQ(MetricValue(Scrape(), "kiln_runs_queued", {{"tenant", "default"}}), 2);
  Release(*slow);
  for (int i = 0; i < 3; ++i) {
    const grpc::Status s = runs[i]->status.get();
    ASSERT_TRUE(s.ok()) << i << ": " << s.error_message();
    v1::RunResponse want;
    ASSERT_TRUE(stub_->Run(Context().get(), RunOf(plain, "x", xs[i]), &want).ok());
    ExpectSame(FromProto(runs[i]->response.outputs(0).tensor()),
               FromProto(want.outputs(0).tensor()));
    EXPECT_EQ(runs[i]->response.report().batch().batch_requests(), 1) << i;
  }
}

// A slow run holds the CPU while a batch of five requests waits on the
// device behind the first request's. One is cancelled, one's deadline
// passes: only they fail, with their codes; the others get their rows.
TEST_F(ServerBatching, DeadlineAndCancellationFailOnlyTheirRequests) {
  const std::string batched = Session(testing::kAffineText, 64, 300000);
  const std::string plain = Session(testing::kAffineText, 0, 0);
  const double deadline_before = MetricValue(Scrape(), "kiln_requests_total",
                                             {{"method", "Run"}, {"code", "DEADLINE_EXCEEDED"}});
  const double cancelled_before =
      MetricValue(Scrape(), "kiln_requests_total", {{"method", "Run"}, {"code", "CANCELLED"}});

  std::unique_ptr<AsyncRun> slow = HoldCpu();
  std::mt19937 rng(1);
  std::unique_ptr<AsyncRun> first = Send(RunOf(batched, "x", Rows(1, 3, rng)));
  ASSERT_TRUE(WaitForGauge("kiln_runs_queued", 1));

  constexpr int kRequests = 5, kCancelled = 3, kShortDeadline = 4;
  std::vector<HostTensor> xs;
  std::vector<std::unique_ptr<AsyncRun>> runs;
  for (int i = 0; i < kRequests; ++i) {
    xs.push_back(Rows(1 + i % 2, 3, rng));
    runs.push_back(Send(RunOf(batched, "x", xs.back()),
                        i == kShortDeadline ? absl::Seconds(2) : absl::Seconds(120)));
  }
  // The five gather while the first's batch is in flight, and go on when
  // max_queue_delay (300 ms) passes: a second batch (one run) on the device.
  ASSERT_TRUE(WaitForGauge("kiln_runs_queued", 2));
  EXPECT_EQ(MetricValue(Scrape(), "kiln_runs_in_flight", {{"tenant", "default"}}), kRequests + 2);
  runs[kCancelled]->ctx->TryCancel();
  EXPECT_EQ(runs[kCancelled]->status.get().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(runs[kShortDeadline]->status.get().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // kilnd answered both itself (not only the clients' own timers), and
  // released their in-flight slots while the batch still waits.
  std::string m;
  for (int i = 0; i < 500; ++i) {
    m = Scrape();
    // The slot is released before the request is counted: wait for both.
    if (MetricValue(m, "kiln_runs_in_flight", {{"tenant", "default"}}) == kRequests &&
        MetricValue(m, "kiln_requests_total", {{"method", "Run"}, {"code", "CANCELLED"}}) ==
            cancelled_before + 1 &&
        MetricValue(m, "kiln_requests_total", {{"method", "Run"}, {"code", "DEADLINE_EXCEEDED"}}) ==
            deadline_before + 1) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(MetricValue(m, "kiln_runs_in_flight", {{"tenant", "default"}}), kRequests);
  EXPECT_EQ(MetricValue(m, "kiln_requests_total", {{"method", "Run"}, {"code", "CANCELLED"}}),
            cancelled_before + 1);
  EXPECT_EQ(
      MetricValue(m, "kiln_requests_total", {{"method", "Run"}, {"code", "DEADLINE_EXCEEDED"}}),
      deadline_before + 1);

  Release(*slow);  // frees the device: both batches run
  ASSERT_TRUE(first->status.get().ok());
  int64_t rows = 0;
  for (int i = 0; i < kRequests; ++i) rows += xs[i].dims()[0];
  for (int i = 0; i < kRequests; ++i) {
    if (i == kCancelled || i == kShortDeadline) continue;
    const grpc::Status s = runs[i]->status.get();
    ASSERT_TRUE(s.ok()) << i << ": " << s.error_message();
    v1::RunResponse want;
    ASSERT_TRUE(stub_->Run(Context().get(), RunOf(plain, "x", xs[i]), &want).ok());
    ExpectSame(FromProto(runs[i]->response.outputs(0).tensor()),
               FromProto(want.outputs(0).tensor()));
    const v1::BatchInfo& b = runs[i]->response.report().batch();
    EXPECT_TRUE(b.batched());
    EXPECT_EQ(b.batch_requests(), kRequests);
    EXPECT_EQ(b.batch_rows(), rows);
    EXPECT_EQ(b.rows(), xs[i].dims()[0]);
    EXPECT_GT(b.queue_wait_micros(), 0);
  }
}

// Requests that cannot join a batch run alone, correctly, and say why.
TEST_F(ServerBatching, RequestsThatCannotJoinRunAlone) {
  std::mt19937 rng(3);
  // Different non-batch dims: separate queues; every request succeeds.
  const std::string scale =
      Session("graph \"scale\"\ninput x: f32[batch, n]\nlet y = x * 2\nout y\n", 8, 20000, false);
  {
    std::vector<std::thread> threads;
    std::mutex mu;
    std::vector<std::string> failures;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937 r(100 + t);
        const HostTensor x = Rows(1, t % 2 == 0 ? 3 : 5, r);
        v1::RunResponse got;
        const grpc::Status s = kilnd_->Stub()->Run(Context().get(), RunOf(scale, "x", x), &got);
        std::lock_guard<std::mutex> lock(mu);
        if (!s.ok()) {
          failures.push_back(s.error_message());
          return;
        }
        const HostTensor y = FromProto(got.outputs(0).tensor());
        ASSERT_EQ(y.dims(), x.dims());
        for (int64_t i = 0; i < x.num_elements(); ++i) {
          EXPECT_EQ(y.data_as<float>()[i], 2 * x.data_as<float>()[i]);
        }
        // Only requests of the same width share a batch.
        EXPECT_LE(got.report().batch().batch_rows(), 4);
      });
    }
    for (std::thread& th : threads) th.join();
    EXPECT_TRUE(failures.empty()) << failures.front();
  }
  auto alone = [&](const std::string& session, const HostTensor& x, const std::string& why) {
    v1::RunResponse got;
    const grpc::Status s = stub_->Run(Context().get(), RunOf(session, "x", x), &got);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_FALSE(got.report().batch().batched());
    EXPECT_EQ(got.report().batch().batch_requests(), 1);
    EXPECT_TRUE(absl::StrContains(got.report().batch().alone_reason(), why))
        << got.report().batch().alone_reason();
    return got;
  };
  // An output whose leading dim is not the batch.
  const std::string sum =
      Session("graph \"sum\"\ninput x: f32[batch, 3]\nlet y = reduce_sum(x, axes=[0])\nout y\n", 8,
              1000, false);
  const HostTensor x2 =
      HostTensor::FromVector(v1::DTYPE_F32, {2, 3}, std::vector<float>{1, 2, 3, 4, 5, 6});
  v1::RunResponse got = alone(sum, x2, "output \"y\" is [3] for a batch of 1");
  ExpectSame(FromProto(got.outputs(0).tensor()),
             HostTensor::FromVector(v1::DTYPE_F32, {3}, std::vector<float>{5, 7, 9}));
  // A batch dim that is not symbolic.
  const std::string fixed =
      Session("graph \"fixed\"\ninput x: f32[2, 3]\nlet y = x * 2\nout y\n", 8, 1000, false);
  alone(fixed, x2, "input \"x\" has a fixed leading dim (2)");
  // More rows than max_batch.
  const std::string small = Session(testing::kAffineText, 2, 1000);
  alone(small, Rows(3, 3, rng), "its 3 rows exceed max_batch = 2");
  // A deadline the queue's delay would break: a batch of the session is in
  // flight (on the device, behind a slow run), so the request would wait up
  // to 1 s; with 900 ms left it goes to the device alone.
  const std::string slow_queue = Session(testing::kAffineText, 8, 1000000);
  {
    std::unique_ptr<AsyncRun> slow = HoldCpu();
    std::unique_ptr<AsyncRun> first = Send(RunOf(slow_queue, "x", Rows(1, 3, rng)));
    ASSERT_TRUE(WaitForGauge("kiln_runs_queued", 1));
    std::unique_ptr<AsyncRun> hurried =
        Send(RunOf(slow_queue, "x", Rows(1, 3, rng)), absl::Milliseconds(900));
    // Alone, it waits on the device too (not in the batcher).
    ASSERT_TRUE(WaitForGauge("kiln_runs_queued", 2));
    Release(*slow);
    EXPECT_TRUE(first->status.get().ok());
    const grpc::Status s = hurried->status.get();
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(
        absl::StrContains(hurried->response.report().batch().alone_reason(), "its deadline is"))
        << hurried->response.report().batch().alone_reason();
  }
}

// Two sessions of one tenant on one repository model (its config turns
// batching on) share its params, and so its batches.
TEST_F(ServerBatching, SessionsOnOneModelBatchTogether) {
  std::vector<std::string> sessions;
  for (int i = 0; i < 2; ++i) {
    v1::CreateSessionRequest req;
    req.mutable_graph()->mutable_model()->set_name("mlp");
    v1::CreateSessionResponse resp;
    const grpc::Status s = stub_->CreateSession(Context().get(), req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    sessions.push_back(resp.session_id());
  }
  // A first request of the model's program goes to the device (held by a
  // slow run); six callers on both sessions gather behind it.
  std::unique_ptr<AsyncRun> slow = HoldCpu();
  std::mt19937 first_rng(199);
  std::unique_ptr<AsyncRun> first =
      Send(RunOf(sessions[0], "x", Rows(1, kMlpWidths[0], first_rng)));
  ASSERT_TRUE(WaitForGauge("kiln_runs_queued", 1));
  constexpr int kCallers = 6;
  std::vector<HostTensor> xs;
  std::vector<std::unique_ptr<AsyncRun>> runs;
  for (int t = 0; t < kCallers; ++t) {
    std::mt19937 rng(200 + t);
    xs.push_back(Rows(1, kMlpWidths[0], rng));
    runs.push_back(Send(RunOf(sessions[t % 2], "x", xs.back())));
  }
  ASSERT_TRUE(WaitForGauge("kiln_runs_in_flight", kCallers + 2));
  Release(*slow);
  ASSERT_TRUE(first->status.get().ok());
  for (int t = 0; t < kCallers; ++t) {
    const grpc::Status s = runs[t]->status.get();
    ASSERT_TRUE(s.ok()) << s.error_message();
    const HostTensor want = models::MlpReference(*mlp_, xs[t]);
    const HostTensor y = FromProto(runs[t]->response.outputs(0).tensor());
    ASSERT_EQ(y.dims(), want.dims());
    for (int64_t i = 0; i < y.num_elements(); ++i) {
      EXPECT_NEAR(y.data_as<float>()[i], want.data_as<float>()[i], 1e-4);
    }
    // The six, from both sessions, in one run.
    EXPECT_EQ(runs[t]->response.report().batch().batch_requests(), kCallers);
  }
}

TEST_F(ServerBatching, BucketSizesArePowersOfTwoAndOneAndAHalfTimesThem) {
  const std::vector<int64_t> want = {1, 2, 3, 4, 6, 6, 8, 8, 12, 12, 12, 12, 16, 16, 16, 16, 24};
  for (int64_t rows = 1; rows <= static_cast<int64_t>(want.size()); ++rows) {
    EXPECT_EQ(server::BatchBucketRows(rows, 64), want[static_cast<size_t>(rows - 1)]) << rows;
  }
  EXPECT_EQ(server::BatchBucketRows(9, 10), 10);
  EXPECT_EQ(server::BatchBucketRows(10, 10), 10);
  EXPECT_EQ(server::BatchBucketRows(700, 1024), 768);
  EXPECT_EQ(server::BatchBucketRows(1000, 1024), 1024);
  EXPECT_EQ(server::BatchBucketRows(900, 1000), 1000);
  EXPECT_EQ(server::BatchBucketRows(1, 1), 1);
}

TEST_F(ServerBatching, BadConfigIsNamed) {
  auto create = [&](int64_t max_batch, int64_t delay) {
    v1::CreateSessionRequest req;
    req.mutable_graph()->set_text(testing::kAffineText);
    req.mutable_options()->mutable_batching()->set_max_batch(max_batch);
    req.mutable_options()->mutable_batching()->set_max_queue_delay_micros(delay);
    v1::CreateSessionResponse resp;
    return stub_->CreateSession(Context().get(), req, &resp);
  };
  grpc::Status s = create(5000, 0);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "options.batching.max_batch is 5000"))
      << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "1024")) << s.error_message();
  s = create(8, -1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "options.batching.max_queue_delay_micros is -1"))
      << s.error_message();
  s = create(8, int64_t{1} << 62);  // microseconds that overflow a nanosecond count
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "to 1000000 microseconds")) << s.error_message();

  v1::RunRequest run = testing::AffineRequest();
  run.mutable_options()->mutable_batching()->set_max_batch(8);
  v1::RunResponse resp;
  s = stub_->Run(Context().get(), run, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "CreateSession's options")) << s.error_message();

  // A model's config is checked at start: exit code 2 naming the field.
  TempDir cache;
  const std::string config = (fs::path(cache.path()) / "kilnd.textproto").string();
  std::ofstream(config) << "model_repository { root: \"" << repo_->path()
                        << "\" models { name: \"mlp\" batching { max_batch: 2000 } } }\n";
  std::string out;
  EXPECT_EQ(testing::RunKilndToExit({"--config=" + config, "--cache_dir=" + cache.path(),
                                     "--listen=127.0.0.1:0", "--metrics_listen=off"},
                                    &out),
            2);
  EXPECT_TRUE(absl::StrContains(out, "model_repository.models[0].batching.max_batch is 2000"))
      << out;
}

}  // namespace
}  // namespace kiln
