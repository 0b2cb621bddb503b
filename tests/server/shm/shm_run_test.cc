// Runs over kilnd's shared-memory socket (ShmClientMessage.run, docs/server.md
// "Runs over the socket") against a real kilnd over a real socket: answers
// identical to Kiln.Run's, every bad message a clear status (and kilnd serving
// on), a client that goes away mid-run cancelled, a deadline honoured,
// another tenant undisturbed, and the C++ client sending runs there by itself.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "clients/cpp/client.h"
#include "clients/cpp/shm.h"
#include "kiln/v1/shm.pb.h"
#include "server/config.h"
#include "tests/server/kilnd_process.h"
#include "tests/server/test_graphs.h"

namespace kiln::shm_run_test {
namespace {

using kiln::testing::Context;
using kiln::testing::KilndProcess;
using kiln::testing::TempDir;

constexpr char kAlice[] = "alice-shmrun-key";
constexpr char kBob[] = "bob-shmrun-key";
constexpr int64_t kMiB = int64_t{1} << 20;
// kilnd's ShmRegistry::kMaxRunMessageBytes.
constexpr int64_t kMaxRunMessage = int64_t{128} << 10;

constexpr char kTwoOutputs[] =
    "graph \"two\"\ninput x: f32[n]\nlet y = x * 2\nlet z = x + 1\nout y\nout z\n";

std::string Config() {
  using server::Sha256Hex;
  return absl::StrCat(R"(
tenants {
  name: "alice"
  api_key_sha256: ")", Sha256Hex(kAlice), R"("
  quota { max_shm_regions: 4 max_shm_bytes: 16777216 }
}
tenants {
  name: "bob"
  api_key_sha256: ")", Sha256Hex(kBob), R"("
}
)");
}

// A connection to kilnd's shared-memory socket with its ticket sent, for
// raw datagrams.
class RawSocket {
 public:
  static std::unique_ptr<RawSocket> Open(const KilndProcess& kilnd, const std::string& key,
                                         v1::ConnectSharedMemoryResponse* ticket_out = nullptr) {
    auto stub = kilnd.Stub();
    auto ctx = Context(key);
    v1::ConnectSharedMemoryResponse ticket;
    grpc::Status s = stub->ConnectSharedMemory(ctx.get(), {}, &ticket);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (!s.ok()) return nullptr;
    if (ticket_out != nullptr) *ticket_out = ticket;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string& name = ticket.socket();
    std::memcpy(addr.sun_path + 1, name.data() + 1, name.size() - 1);
    const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
    auto r = std::unique_ptr<RawSocket>(new RawSocket(::socket(AF_UNIX, SOCK_SEQPACKET, 0)));
    EXPECT_EQ(::connect(r->fd_, reinterpret_cast<sockaddr*>(&addr), len), 0);
    v1::ShmClientMessage hello;
    hello.set_ticket(ticket.ticket());
    v1::ShmServerMessage answer = r->Call(hello.SerializeAsString());
    EXPECT_EQ(answer.code(), 0) << answer.message();
    return r;
  }
  ~RawSocket() {
    if (fd_ >= 0) ::close(fd_);
  }

  bool Send(const std::string& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  // The next answer; code -1 when none came within 60 s or the socket closed.
  v1::ShmServerMessage Receive() {
    v1::ShmServerMessage m;
    m.set_code(-1);
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 60000) != 1) return m;
    std::string buffer(kMaxRunMessage + 1, '\0');
    const ssize_t n = ::recv(fd_, buffer.data(), buffer.size(), 0);
    if (n <= 0) return m;
    EXPECT_TRUE(m.ParseFromArray(buffer.data(), static_cast<int>(n)));
    return m;
  }
  v1::ShmServerMessage Call(const std::string& bytes) {
    if (!Send(bytes)) {
      v1::ShmServerMessage m;
      m.set_code(-1);
      return m;
    }
    return Receive();
  }
  v1::ShmServerMessage TrainStep(const v1::TrainStepRequest& req, const std::string& request_id = "") {
    v1::ShmClientMessage m;
    req.SerializeToString(m.mutable_train_step());
    m.set_run_request_id(request_id);
    return Call(m.SerializeAsString());
  }
  v1::ShmServerMessage Run(const v1::RunRequest& req, int64_t timeout_ms = 0,
                           const std::string& request_id = "") {
    v1::ShmClientMessage m;
    req.SerializeToString(m.mutable_run());
    m.set_run_timeout_ms(timeout_ms);
    m.set_run_request_id(request_id);
    return Call(m.SerializeAsString());
  }
  void Close() {
    ::close(fd_);
    fd_ = -1;
  }

 private:
  explicit RawSocket(int fd) : fd_(fd) {}
  int fd_;
};

class ShmRunTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cache_ = new TempDir();
    std::string error;
    kilnd_ = KilndProcess::Start({.cache_dir = cache_->path(), .config_text = Config()}, &error)
                 .release();
    ASSERT_NE(kilnd_, nullptr) << error;
  }
  static void TearDownTestSuite() {
    delete kilnd_;
    delete cache_;
  }

  static grpc::Status GrpcRun(const v1::RunRequest& req, v1::RunResponse* resp,
                              const std::string& key = kAlice) {
    auto stub = kilnd_->Stub();
    auto ctx = Context(key);
    return stub->Run(ctx.get(), req, resp);
  }

  static std::string CreateSession(const std::string& text, const std::string& key = kAlice) {
    auto stub = kilnd_->Stub();
    auto ctx = Context(key);
    v1::CreateSessionRequest req;
    req.mutable_graph()->set_text(text);
    v1::CreateSessionResponse resp;
    grpc::Status s = stub->CreateSession(ctx.get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.session_id();
  }

  // A session on cpu:0 whose run (x f32[32, 512] through six 512 x 512
  // layers, ~100 MFLOP) is past the engine's 250 us short-run rule, with an
  // output small enough for an answer's bytes; "" when kilnd refused it.
  static std::string CreateWideSession() {
    std::string body = "x";
    for (int layer = 0; layer < 6; ++layer) body = absl::StrCat("relu(", body, " @ w)");
    v1::CreateSessionRequest create;
    create.mutable_graph()->set_text(absl::StrCat("graph \"socket_run_wide\"\ninput x: f32[",
                                                  kWideRows, ", ", kWidth, "]\nparam w: f32[",
                                                  kWidth, ", ", kWidth, "]\nlet y = ", body,
                                                  "\nout y\n"));
    create.mutable_options()->set_device("cpu:0");
    std::vector<double> w(kWidth * kWidth);
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.002 * static_cast<double>(i % 17) - 0.016;
    kiln::testing::AddTensor(create.mutable_params(), "w", v1::DTYPE_F32, {kWidth, kWidth}, w);
    v1::CreateSessionResponse created;
    grpc::Status s = kilnd_->Stub()->CreateSession(Context(kAlice).get(), create, &created);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return created.session_id();
  }
  // Run `i` of that session (its input depends on `i`).
  static v1::RunRequest WideRequest(const std::string& sid, int i) {
    v1::RunRequest req;
    req.set_session_id(sid);
    std::vector<double> x(kWideRows * kWidth);
    for (size_t k = 0; k < x.size(); ++k) x[k] = std::sin(0.011 * static_cast<double>(k + 1) * i);
    kiln::testing::AddTensor(req.mutable_inputs(), "x", v1::DTYPE_F32, {kWideRows, kWidth}, x);
    return req;
  }
  static constexpr int kWideRows = 32;
  static constexpr int kWidth = 512;

  static double Metric(const std::string& name, const std::map<std::string, std::string>& labels) {
    return kiln::testing::MetricValue(kiln::testing::HttpGet(kilnd_->metrics_port(), "/metrics"),
                                      name, labels);
  }

  static TempDir* cache_;
  static KilndProcess* kilnd_;
};

TempDir* ShmRunTest::cache_ = nullptr;
KilndProcess* ShmRunTest::kilnd_ = nullptr;

// The run's outputs (shared-memory refs or bytes) and report, without the
// fields that differ between two runs (request ids, times).
v1::RunResponse Comparable(v1::RunResponse r) {
  r.clear_request_id();
  r.clear_report();
  return r;
}

TEST_F(ShmRunTest, AnswersAreKilnRunsAndTheTicketSaysSo) {
  v1::ConnectSharedMemoryResponse ticket;
  auto sock = RawSocket::Open(*kilnd_, kAlice, &ticket);
  ASSERT_NE(sock, nullptr);
  EXPECT_EQ(ticket.max_run_message_bytes(), kMaxRunMessage);
  const std::string sid = CreateSession(kTwoOutputs);

  // Inline bytes in and out (a small tensor fits the datagram).
  v1::RunRequest req;
  req.set_session_id(sid);
  kiln::testing::AddTensor(req.mutable_inputs(), "x", v1::DTYPE_F32, {5},
                           {1.5, -2, 0, 3.25, 1e6});
  v1::ShmServerMessage a = sock->Run(req, 0, "my-run-1");
  ASSERT_EQ(a.code(), 0) << a.message();
  EXPECT_EQ(a.request_id(), "my-run-1");
  v1::RunResponse over_socket;
  ASSERT_TRUE(over_socket.ParseFromString(a.run_response()));
  EXPECT_EQ(over_socket.request_id(), "my-run-1");
  v1::RunResponse over_grpc;
  ASSERT_TRUE(GrpcRun(req, &over_grpc).ok());
  EXPECT_EQ(Comparable(over_socket).SerializeAsString(), Comparable(over_grpc).SerializeAsString());
  ASSERT_EQ(over_socket.outputs_size(), 2);
  const HostTensor y = kiln::testing::FromProto(over_socket.outputs(0).tensor());
  EXPECT_EQ(y.data_as<float>()[4], 2e6f);

  // One-shot (a graph with params) and a report.
  v1::RunRequest affine = kiln::testing::AffineRequest();
  affine.set_report(true);
  a = sock->Run(affine);
  ASSERT_EQ(a.code(), 0) << a.message();
  EXPECT_FALSE(a.request_id().empty());
  ASSERT_TRUE(over_socket.ParseFromString(a.run_response()));
  EXPECT_TRUE(over_socket.has_report());
  EXPECT_GT(over_socket.report().steps_size(), 0);
  ASSERT_TRUE(GrpcRun(affine, &over_grpc).ok());
  EXPECT_EQ(Comparable(over_socket).SerializeAsString(), Comparable(over_grpc).SerializeAsString());

  // Tensors in shared memory, outputs into its area: the bytes kilnd wrote
  // are the same as gRPC's run wrote.
  auto stub = kilnd_->Stub();
  auto ctx = Context(kAlice);
  auto conn = ShmConnection::Connect(*stub, *ctx);
  ASSERT_TRUE(conn.ok()) << conn.status();
  auto region = (*conn)->CreateRegion("shmrun-io", kMiB);
  ASSERT_TRUE(region.ok()) << region.status();
  float* x = reinterpret_cast<float*>((*region)->data());
  for (int i = 0; i < 10000; ++i) x[i] = static_cast<float>(i) * 0.5f - 3;
  v1::RunRequest shm_req;
  shm_req.set_session_id(sid);
  v1::NamedTensor* in = shm_req.add_inputs();
  in->set_name("x");
  in->mutable_tensor()->set_dtype(v1::DTYPE_F32);
  in->mutable_tensor()->add_dims(10000);
  in->mutable_shm()->set_region_id("shmrun-io");
  in->mutable_shm()->set_bytes(40000);
  auto area = [&](int64_t offset) {
    shm_req.mutable_shm_output_area()->set_region_id("shmrun-io");
    shm_req.mutable_shm_output_area()->set_offset(offset);
    shm_req.mutable_shm_output_area()->set_bytes(200000);
  };
  area(65536);
  std::optional<absl::StatusOr<v1::RunResponse>> r = (*conn)->TryRun(shm_req, absl::InfiniteFuture());
  ASSERT_TRUE(r.has_value());
  ASSERT_TRUE(r->ok()) << r->status();
  area(327680);
  ASSERT_TRUE(GrpcRun(shm_req, &over_grpc).ok());
  ASSERT_EQ((*r)->outputs_size(), 2);
  for (int o = 0; o < 2; ++o) {
    const v1::SharedMemoryRef& s = (**r).outputs(o).shm();
    const v1::SharedMemoryRef& g = over_grpc.outputs(o).shm();
    ASSERT_EQ(s.bytes(), 40000);
    EXPECT_EQ(s.offset() - 65536, g.offset() - 327680);
    EXPECT_EQ(std::memcmp((*region)->data() + s.offset(), (*region)->data() + g.offset(), 40000),
              0);
    const float* v = reinterpret_cast<const float*>((*region)->data() + s.offset());
    EXPECT_EQ(v[9999], o == 0 ? 2 * x[9999] : x[9999] + 1);
  }
  // Counted as their own method.
  EXPECT_GE(Metric("kiln_requests_total", {{"tenant", "alice"}, {"method", "ShmRun"},
                                          {"code", "OK"}}),
            3);
}

TEST_F(ShmRunTest, BadRunsGetAStatusAndKilndServesOn) {
  auto sock = RawSocket::Open(*kilnd_, kAlice);
  ASSERT_NE(sock, nullptr);
  const std::string sid = CreateSession(kTwoOutputs);
  // The same message as Kiln.Run's for each.
  auto same_as_grpc = [&](const v1::RunRequest& req, int code, const char* mentions) {
    v1::ShmServerMessage a = sock->Run(req);
    v1::RunResponse unused;
    grpc::Status g = GrpcRun(req, &unused);
    EXPECT_EQ(a.code(), code) << a.message();
    EXPECT_EQ(static_cast<int>(g.error_code()), code) << g.error_message();
    EXPECT_EQ(a.message(), g.error_message());
    EXPECT_TRUE(absl::StrContains(a.message(), mentions)) << a.message();
    EXPECT_FALSE(a.request_id().empty());
    EXPECT_TRUE(a.run_response().empty());
  };
  v1::RunRequest bad_dtype;
  bad_dtype.set_session_id(sid);
  kiln::testing::AddTensor(bad_dtype.mutable_inputs(), "x", v1::DTYPE_I32, {3}, {1, 2, 3});
  same_as_grpc(bad_dtype, static_cast<int>(grpc::INVALID_ARGUMENT), "x");

  v1::RunRequest short_data;
  short_data.set_session_id(sid);
  kiln::testing::AddTensor(short_data.mutable_inputs(), "x", v1::DTYPE_F32, {3}, {1, 2, 3});
  short_data.mutable_inputs(0)->mutable_tensor()->mutable_data()->resize(5);
  same_as_grpc(short_data, static_cast<int>(grpc::INVALID_ARGUMENT), "x");

  v1::RunRequest unknown;
  unknown.set_session_id("no-such-session");
  kiln::testing::AddTensor(unknown.mutable_inputs(), "x", v1::DTYPE_F32, {3}, {1, 2, 3});
  same_as_grpc(unknown, static_cast<int>(grpc::NOT_FOUND), "no-such-session");

  v1::RunRequest out_of_bounds;
  out_of_bounds.set_session_id(sid);
  v1::NamedTensor* t = out_of_bounds.add_inputs();
  t->set_name("x");
  t->mutable_tensor()->set_dtype(v1::DTYPE_F32);
  t->mutable_tensor()->add_dims(4);
  t->mutable_shm()->set_region_id("nowhere");
  t->mutable_shm()->set_bytes(16);
  same_as_grpc(out_of_bounds, static_cast<int>(grpc::NOT_FOUND), "nowhere");
  {
    auto stub = kilnd_->Stub();
    auto ctx = Context(kAlice);
    auto conn = ShmConnection::Connect(*stub, *ctx);
    ASSERT_TRUE(conn.ok());
    auto region = (*conn)->CreateRegion("shmrun-small", 4096);
    ASSERT_TRUE(region.ok()) << region.status();
    t->mutable_shm()->set_region_id("shmrun-small");
    t->mutable_shm()->set_offset(4090);
    same_as_grpc(out_of_bounds, static_cast<int>(grpc::OUT_OF_RANGE), "shmrun-small");
  }

  // Garbage: not a ShmClientMessage; a `run` that is not a RunRequest; a
  // negative deadline; each answered, the connection kept.
  v1::ShmServerMessage a = sock->Call(std::string("\xff\xff\xff\xff garbage", 12));
  EXPECT_EQ(a.code(), static_cast<int>(grpc::INVALID_ARGUMENT));
  EXPECT_TRUE(absl::StrContains(a.message(), "ShmClientMessage")) << a.message();
  v1::ShmClientMessage m;
  m.set_run(std::string("\x0a\xff\xff\xff\xff\x0f", 6));
  a = sock->Call(m.SerializeAsString());
  EXPECT_EQ(a.code(), static_cast<int>(grpc::INVALID_ARGUMENT));
  EXPECT_TRUE(absl::StrContains(a.message(), "RunRequest")) << a.message();
  EXPECT_FALSE(a.request_id().empty());
  m.Clear();
  kiln::testing::AffineRequest().SerializeToString(m.mutable_run());
  m.set_run_timeout_ms(-5);
  a = sock->Call(m.SerializeAsString());
  EXPECT_EQ(a.code(), static_cast<int>(grpc::INVALID_ARGUMENT));
  EXPECT_TRUE(absl::StrContains(a.message(), "run_timeout_ms")) << a.message();

  // A datagram over max_run_message_bytes: refused unread, named.
  v1::RunRequest big;
  big.set_session_id(sid);
  std::vector<double> values(40000, 1.0);  // 160,000 bytes inline
  kiln::testing::AddTensor(big.mutable_inputs(), "x", v1::DTYPE_F32, {40000}, values);
  a = sock->Run(big);
  EXPECT_EQ(a.code(), static_cast<int>(grpc::INVALID_ARGUMENT));
  EXPECT_TRUE(absl::StrContains(a.message(), "max_run_message_bytes")) << a.message();
  EXPECT_TRUE(absl::StrContains(a.message(), "shared memory")) << a.message();

  // Outputs as bytes over the limit (inline, no area): RESOURCE_EXHAUSTED
  // before the run, naming the way out.
  v1::RunRequest wide;
  wide.set_session_id(sid);
  kiln::testing::AddTensor(wide.mutable_inputs(), "x", v1::DTYPE_F32, {20000},
                           std::vector<double>(20000, 2.0));  // 80,000 bytes in, 160,000 out
  a = sock->Run(wide);
  EXPECT_EQ(a.code(), static_cast<int>(grpc::RESOURCE_EXHAUSTED));
  EXPECT_TRUE(absl::StartsWith(a.message(), "nothing ran: ")) << a.message();
  EXPECT_TRUE(absl::StrContains(a.message(), "shm_output_area")) << a.message();
  EXPECT_FALSE(a.request_id().empty());

  // The connection and kilnd serve on.
  v1::RunRequest ok;
  ok.set_session_id(sid);
  kiln::testing::AddTensor(ok.mutable_inputs(), "x", v1::DTYPE_F32, {2}, {1, 2});
  a = sock->Run(ok);
  EXPECT_EQ(a.code(), 0) << a.message();
}

TEST_F(ShmRunTest, ClosingTheSocketMidRunCancelsIt) {
  auto sock = RawSocket::Open(*kilnd_, kAlice);
  ASSERT_NE(sock, nullptr);
  v1::ShmClientMessage m;
  kiln::testing::SlowRequest(512, 200).SerializeToString(m.mutable_run());
  m.set_run_request_id("to-be-cancelled");
  ASSERT_TRUE(sock->Send(m.SerializeAsString()));
  absl::SleepFor(absl::Milliseconds(100));
  sock->Close();
  // kilnd logs the run CANCELLED (its access log) and serves on: the
  // tenant's in-flight slot is free again.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  bool logged = false;
  while (!logged && absl::Now() < deadline) {
    for (absl::string_view line : absl::StrSplit(kilnd_->Log(), '\n')) {
      if (absl::StrContains(line, "req=to-be-cancelled") && absl::StrContains(line, "rpc=ShmRun")) {
        logged = true;
        EXPECT_TRUE(absl::StrContains(line, "code=CANCELLED")) << line;
      }
    }
    if (!logged) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(logged);
  auto again = RawSocket::Open(*kilnd_, kAlice);
  ASSERT_NE(again, nullptr);
  v1::ShmServerMessage a = again->Run(kiln::testing::AffineRequest());
  EXPECT_EQ(a.code(), 0) << a.message();
}

TEST_F(ShmRunTest, TheDeadlineIsHonoured) {
  auto sock = RawSocket::Open(*kilnd_, kAlice);
  ASSERT_NE(sock, nullptr);
  v1::ShmServerMessage a = sock->Run(kiln::testing::SlowRequest(256, 400), /*timeout_ms=*/30);
  EXPECT_EQ(a.code(), static_cast<int>(grpc::DEADLINE_EXCEEDED)) << a.message();
  a = sock->Run(kiln::testing::AffineRequest(), /*timeout_ms=*/60000);
  EXPECT_EQ(a.code(), 0) << a.message();
}

TEST_F(ShmRunTest, AnotherTenantIsNotHeldUp) {
  // Alice's long run on her socket; Bob's socket answers meanwhile (each
  // connection has a thread of its own: a run waits for the device, never
  // for another connection's run).
  auto alice = RawSocket::Open(*kilnd_, kAlice);
  ASSERT_NE(alice, nullptr);
  auto stub = kilnd_->Stub();
  auto ctx = Context(kBob);
  auto bob = ShmConnection::Connect(*stub, *ctx);
  ASSERT_TRUE(bob.ok()) << bob.status();
  std::atomic<bool> alice_done = false;
  auto long_run = std::async(std::launch::async, [&] {
    v1::ShmServerMessage a = alice->Run(kiln::testing::SlowRequest(256, 800));
    alice_done.store(true);
    return a;
  });
  absl::SleepFor(absl::Milliseconds(50));
  int answered_while_alice_ran = 0;
  for (int i = 0; i < 5; ++i) {
    auto region = (*bob)->CreateRegion(absl::StrCat("bob-", i), 4096);
    EXPECT_TRUE(region.ok()) << region.status();
    region->reset();  // unregistered
    if (!alice_done.load()) ++answered_while_alice_ran;
  }
  // Bob's run is answered too (after Alice's, when the CPU's one run slot
  // is hers).
  auto bob_run = (*bob)->TryRun(kiln::testing::AffineRequest(), absl::InfiniteFuture());
  ASSERT_TRUE(bob_run.has_value());
  EXPECT_TRUE(bob_run->ok()) << bob_run->status();
  v1::ShmServerMessage a = long_run.get();
  EXPECT_EQ(a.code(), 0) << a.message();
  EXPECT_EQ(answered_while_alice_ran, 5);
}

// Training steps over the socket (ShmClientMessage.train_step, docs/
// training.md "Steps over the socket"): the ticket says kilnd takes them;
// each answer is Kiln.TrainStep's (the same losses, lr and step count as a
// twin session stepped over gRPC, bit for bit); bad steps get gRPC's status
// and message; they are counted as ShmTrainStep and in the step metrics; the
// C++ client sends its steps there by itself, and not when told not to.
constexpr char kTrainGraph[] = R"(graph "socket_train"
input x: f32[8, 6]
input y: i64[8]
param w: f32[6, 3]
param b: f32[3]
let loss = softmax_cross_entropy(x @ w + b, y)
out loss
)";

v1::CreateSessionRequest TrainingSessionRequest() {
  v1::CreateSessionRequest req;
  req.mutable_graph()->set_text(kTrainGraph);
  req.mutable_options()->set_device("cpu:0");
  v1::TrainingSpec* t = req.mutable_options()->mutable_transforms()->mutable_training();
  t->set_loss("loss");
  t->mutable_optimizer()->set_kind(v1::OPTIMIZER_ADAMW);
  t->mutable_optimizer()->set_lr(0.05);
  std::vector<double> w(18), b = {0.1, -0.2, 0.05};
  for (int i = 0; i < 18; ++i) w[i] = 0.04 * (i % 7) - 0.1;
  kiln::testing::AddTensor(req.mutable_params(), "w", v1::DTYPE_F32, {6, 3}, w);
  kiln::testing::AddTensor(req.mutable_params(), "b", v1::DTYPE_F32, {3}, b);
  return req;
}

v1::TrainStepRequest TrainBatch(const std::string& sid, int step) {
  v1::TrainStepRequest req;
  req.set_session_id(sid);
  std::vector<double> x(48), y(8);
  for (int i = 0; i < 48; ++i) x[i] = std::sin(0.31 * (i + 1) * step);
  for (int i = 0; i < 8; ++i) y[i] = (i + step) % 3;
  kiln::testing::AddTensor(req.mutable_inputs(), "x", v1::DTYPE_F32, {8, 6}, x);
  kiln::testing::AddTensor(req.mutable_inputs(), "y", v1::DTYPE_I64, {8}, y);
  return req;
}

TEST_F(ShmRunTest, TrainStepsOverTheSocketAreKilnTrainSteps) {
  v1::ConnectSharedMemoryResponse ticket;
  auto sock = RawSocket::Open(*kilnd_, kAlice, &ticket);
  ASSERT_NE(sock, nullptr);
  EXPECT_TRUE(ticket.train_steps());
  auto CreateTrainingSession = [] {
    v1::CreateSessionResponse resp;
    grpc::Status s =
        kilnd_->Stub()->CreateSession(Context(kAlice).get(), TrainingSessionRequest(), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.session_id();
  };
  const std::string over_socket = CreateTrainingSession();
  const std::string over_grpc = CreateTrainingSession();
  const double steps_before =
      Metric("kiln_requests_total", {{"tenant", "alice"}, {"method", "ShmTrainStep"},
                                     {"code", "OK"}});
  auto stub = kilnd_->Stub();
  for (int step = 1; step <= 4; ++step) {
    v1::ShmServerMessage a = sock->TrainStep(TrainBatch(over_socket, step),
                                             absl::StrCat("my-step-", step));
    ASSERT_EQ(a.code(), 0) << a.message();
    EXPECT_EQ(a.request_id(), absl::StrCat("my-step-", step));
    EXPECT_TRUE(a.run_response().empty());
    v1::TrainStepResponse got;
    ASSERT_TRUE(got.ParseFromString(a.train_step_response()));
    v1::TrainStepResponse want;
    grpc::Status g = stub->TrainStep(Context(kAlice).get(), TrainBatch(over_grpc, step), &want);
    ASSERT_TRUE(g.ok()) << g.error_message();
    EXPECT_EQ(got.step(), step);
    EXPECT_EQ(got.step(), want.step());
    EXPECT_EQ(got.loss(), want.loss()) << "step " << step;
    EXPECT_EQ(got.lr(), want.lr()) << "step " << step;
    EXPECT_EQ(got.request_id(), absl::StrCat("my-step-", step));
  }
  EXPECT_EQ(Metric("kiln_requests_total", {{"tenant", "alice"}, {"method", "ShmTrainStep"},
                                           {"code", "OK"}}) - steps_before,
            4);

  // Bad steps: gRPC's status and message, nothing run.
  auto same_as_grpc = [&](const v1::TrainStepRequest& req, grpc::StatusCode code) {
    v1::ShmServerMessage a = sock->TrainStep(req);
    v1::TrainStepResponse unused;
    grpc::Status g = stub->TrainStep(Context(kAlice).get(), req, &unused);
    EXPECT_EQ(a.code(), static_cast<int>(code)) << a.message();
    EXPECT_EQ(g.error_code(), code) << g.error_message();
    EXPECT_EQ(a.message(), g.error_message());
    EXPECT_FALSE(a.request_id().empty());
    EXPECT_TRUE(a.train_step_response().empty());
  };
  same_as_grpc(TrainBatch("no-such-session", 1), grpc::NOT_FOUND);
  v1::TrainStepRequest wrong = TrainBatch(over_socket, 5);
  wrong.mutable_inputs(0)->mutable_tensor()->set_dtype(v1::DTYPE_I32);
  same_as_grpc(wrong, grpc::INVALID_ARGUMENT);
  v1::TrainStepRequest not_training = TrainBatch(CreateSession(kTwoOutputs), 1);
  same_as_grpc(not_training, grpc::FAILED_PRECONDITION);
  // A message that is no TrainStepRequest.
  v1::ShmClientMessage garbage;
  garbage.set_train_step("\xff\xff\xff");
  v1::ShmServerMessage a = sock->Call(garbage.SerializeAsString());
  EXPECT_EQ(a.code(), static_cast<int>(grpc::INVALID_ARGUMENT)) << a.message();
  // Steps that failed did not count: the next one is step 5 on both.
  v1::ShmServerMessage next = sock->TrainStep(TrainBatch(over_socket, 5));
  ASSERT_EQ(next.code(), 0) << next.message();
  v1::TrainStepResponse fifth;
  ASSERT_TRUE(fifth.ParseFromString(next.train_step_response()));
  EXPECT_EQ(fifth.step(), 5);

  // The C++ client: its steps go over the socket with the batch in shared
  // memory, the same losses as over gRPC; off by option and by
  // KILN_SHM_TRAIN_STEP=0.
  ClientOptions options;
  options.api_key = kAlice;
  auto client = Client::Create(kilnd_->address(), options);
  ASSERT_TRUE(client.ok()) << client.status();
  options.shm_train_steps = false;
  auto grpc_client = Client::Create(kilnd_->address(), options);
  ASSERT_TRUE(grpc_client.ok()) << grpc_client.status();
  const std::string by_client = CreateTrainingSession();
  const std::string by_grpc_client = CreateTrainingSession();
  for (int step = 1; step <= 3; ++step) {
    const v1::TrainStepRequest req = TrainBatch("", step);
    TensorMap batch;
    for (const v1::NamedTensor& t : req.inputs()) {
      batch.emplace(t.name(), kiln::testing::FromProto(t.tensor()));
    }
    bool shm = false, socket = false, grpc_shm = false, grpc_socket = true;
    auto r = (*client)->TrainStep(by_client, batch, &shm, &socket);
    auto g = (*grpc_client)->TrainStep(by_grpc_client, batch, &grpc_shm, &grpc_socket);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE(shm);
    EXPECT_TRUE(socket) << "step " << step;
    EXPECT_TRUE(grpc_shm);
    EXPECT_FALSE(grpc_socket);
    EXPECT_EQ(r->step(), step);
    EXPECT_EQ(r->loss(), g->loss()) << "step " << step;
  }
  setenv("KILN_SHM_TRAIN_STEP", "0", 1);
  options.shm_train_steps = true;
  auto env_off = Client::Create(kilnd_->address(), options);
  ASSERT_TRUE(env_off.ok());
  TensorMap batch;
  const v1::TrainStepRequest fourth = TrainBatch("", 4);
  for (const v1::NamedTensor& t : fourth.inputs()) {
    batch.emplace(t.name(), kiln::testing::FromProto(t.tensor()));
  }
  bool socket = true;
  auto r = (*env_off)->TrainStep(by_client, batch, nullptr, &socket);
  unsetenv("KILN_SHM_TRAIN_STEP");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(socket);
  EXPECT_EQ(r->step(), 4);
}

// A training step over the socket runs on the connection's own thread when
// its device is idle (the thread only waits for the answer; server/
// rpc_train.cc, RunOptions::on_caller_when_idle), whatever the cost model
// says of it: no hand-off to the device's thread and back. The same step over
// gRPC, too long for the engine's short-run rule, goes to the device's
// thread. kiln_device_caller_runs_total counts the runs on callers' threads.
// Both give the same losses.
TEST_F(ShmRunTest, TrainStepsOverTheSocketRunOnTheConnectionsThread) {
  // Three 512 x 512 layers of a batch of 16: long enough (by the cost model)
  // that the engine would not run it on a caller's thread by itself.
  constexpr int kWidth = 512;
  constexpr int kBatch = 16;
  const std::string graph = absl::StrCat(
      "graph \"socket_train_wide\"\ninput x: f32[", kBatch, ", ", kWidth, "]\ninput y: i64[",
      kBatch, "]\nparam w1: f32[", kWidth, ", ", kWidth, "]\nparam w2: f32[", kWidth, ", ",
      kWidth, "]\nparam w3: f32[", kWidth, ", ", kWidth,
      "]\nlet loss = softmax_cross_entropy(relu(relu(x @ w1) @ w2) @ w3, y)\nout loss\n");
  auto create = [&] {
    v1::CreateSessionRequest req;
    req.mutable_graph()->set_text(graph);
    req.mutable_options()->set_device("cpu:0");
    v1::TrainingSpec* t = req.mutable_options()->mutable_transforms()->mutable_training();
    t->set_loss("loss");
    t->mutable_optimizer()->set_kind(v1::OPTIMIZER_ADAMW);
    t->mutable_optimizer()->set_lr(0.01);
    std::vector<double> w(kWidth * kWidth);
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.002 * static_cast<double>(i % 17) - 0.016;
    for (const char* name : {"w1", "w2", "w3"}) {
      kiln::testing::AddTensor(req.mutable_params(), name, v1::DTYPE_F32, {kWidth, kWidth}, w);
    }
    v1::CreateSessionResponse resp;
    grpc::Status s = kilnd_->Stub()->CreateSession(Context(kAlice).get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.session_id();
  };
  auto batch = [&](const std::string& sid, int step) {
    v1::TrainStepRequest req;
    req.set_session_id(sid);
    std::vector<double> x(kBatch * kWidth), y(kBatch);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.013 * static_cast<double>(i + 1) * step);
    for (int i = 0; i < kBatch; ++i) y[i] = (i * 7 + step) % kWidth;
    kiln::testing::AddTensor(req.mutable_inputs(), "x", v1::DTYPE_F32, {kBatch, kWidth}, x);
    kiln::testing::AddTensor(req.mutable_inputs(), "y", v1::DTYPE_I64, {kBatch}, y);
    return req;
  };
  const std::string over_socket = create();
  const std::string over_grpc = create();
  auto sock = RawSocket::Open(*kilnd_, kAlice);
  ASSERT_NE(sock, nullptr);
  auto stub = kilnd_->Stub();
  auto caller_runs = [] { return Metric("kiln_device_caller_runs_total", {{"device", "cpu:0"}}); };
  auto socket_step = [&](int step) {
    v1::ShmServerMessage a = sock->TrainStep(batch(over_socket, step));
    EXPECT_EQ(a.code(), 0) << a.message();
    v1::TrainStepResponse r;
    EXPECT_TRUE(r.ParseFromString(a.train_step_response()));
    return r;
  };
  auto grpc_step = [&](int step) {
    v1::TrainStepResponse r;
    grpc::Status g = stub->TrainStep(Context(kAlice).get(), batch(over_grpc, step), &r);
    EXPECT_TRUE(g.ok()) << g.error_message();
    return r;
  };
  // The first step of each prepares the training set on kilnd's work pool.
  // Its report gives the cost model's estimate of the step: a step estimated
  // past kMaxSocketCallOnCallerMicros (server/shm_run.h, 100 ms) goes to the
  // device's thread by design.
  // A sanitizer build's calibration measures its own instrumented probes and
  // can put this step there (make test-asan): the premise is gone, not the
  // behaviour, so the test says so and stops.
  v1::TrainStepRequest first = batch(over_grpc, 1);
  first.set_report(true);
  v1::TrainStepResponse g1;
  {
    grpc::Status g = stub->TrainStep(Context(kAlice).get(), first, &g1);
    ASSERT_TRUE(g.ok()) << g.error_message();
  }
  EXPECT_EQ(socket_step(1).loss(), g1.loss());
  double estimate = 0;
  for (const v1::DeviceEstimate& e : g1.report().placement().estimates()) {
    if (e.device() == g1.report().placement().chosen()) estimate = e.estimate_micros();
  }
  if (estimate <= 0 || estimate > 100'000) {
    GTEST_SKIP() << "the cost model puts this step at " << estimate
                 << " us on this build, not within (0, 100 ms]: it runs on the device's thread";
  }
  double before = caller_runs();
  for (int step = 2; step <= 4; ++step) {
    const v1::TrainStepResponse g = grpc_step(step);
    EXPECT_EQ(g.step(), step);
  }
  ASSERT_EQ(caller_runs() - before, 0)
      << "the step is short enough for the engine's own rule: the premise of this test is gone";
  before = caller_runs();
  for (int step = 2; step <= 4; ++step) {
    const v1::TrainStepResponse r = socket_step(step);
    EXPECT_EQ(r.step(), step);
  }
  EXPECT_EQ(caller_runs() - before, 3);
  // The params the two sessions trained are the same bytes.
  v1::GetParamsRequest get;
  get.add_names("w3");
  auto read = [&](const std::string& sid) {
    get.set_session_id(sid);
    auto ctx = Context(kAlice);
    auto reader = stub->GetParams(ctx.get(), get);
    std::string bytes;
    v1::ParamChunk c;
    while (reader->Read(&c)) bytes += c.data();
    EXPECT_TRUE(reader->Finish().ok());
    return bytes;
  };
  const std::string a = read(over_socket);
  EXPECT_EQ(a.size(), size_t{kWidth * kWidth * 4});
  EXPECT_TRUE(a == read(over_grpc)) << "the socket's steps trained other values";
}

// A session's run over the socket runs on the connection's own thread when
// its device is idle, as a training step does (server/rpc_run.cc,
// RunCall::RunOnCaller): the thread only waits for the answer, so the
// hand-off to the device's thread and the wake back are saved. The same run
// over gRPC, too long for the engine's short-run rule, goes to the device's
// thread. kiln_device_caller_runs_total counts the runs on callers' threads;
// the answers are the same.
TEST_F(ShmRunTest, SessionRunsOverTheSocketRunOnTheConnectionsThread) {
  const std::string sid = CreateWideSession();
  ASSERT_FALSE(sid.empty());
  auto request = [&](int i) { return WideRequest(sid, i); };
  auto caller_runs = [] { return Metric("kiln_device_caller_runs_total", {{"device", "cpu:0"}}); };
  // The first run compiles on kilnd's work pool; its report gives the cost
  // model's estimate. The premise: past the engine's own 250 us rule (gRPC's
  // runs go to the device's thread) and within kMaxSocketCallOnCallerMicros
  // (server/shm_run.h, 100 ms).
  v1::RunRequest first = request(1);
  first.set_report(true);
  v1::RunResponse r1;
  ASSERT_TRUE(GrpcRun(first, &r1).ok());
  double estimate = 0;
  for (const v1::DeviceEstimate& e : r1.report().placement().estimates()) {
    if (e.device() == r1.report().placement().chosen()) estimate = e.estimate_micros();
  }
  if (estimate <= 0 || estimate > 100'000) {
    GTEST_SKIP() << "the cost model puts this run at " << estimate
                 << " us on this build, not within (0, 100 ms]: it runs on the device's thread";
  }
  std::vector<v1::RunResponse> over_grpc;
  double before = caller_runs();
  for (int i = 2; i <= 4; ++i) {
    v1::RunResponse r;
    ASSERT_TRUE(GrpcRun(request(i), &r).ok());
    over_grpc.push_back(Comparable(r));
  }
  ASSERT_EQ(caller_runs() - before, 0)
      << "the run is short enough for the engine's own rule: the premise of this test is gone";
  auto sock = RawSocket::Open(*kilnd_, kAlice);
  ASSERT_NE(sock, nullptr);
  before = caller_runs();
  for (int i = 2; i <= 4; ++i) {
    v1::ShmServerMessage a = sock->Run(request(i));
    ASSERT_EQ(a.code(), 0) << a.message();
    v1::RunResponse r;
    ASSERT_TRUE(r.ParseFromString(a.run_response()));
    EXPECT_TRUE(Comparable(r).SerializeAsString() == over_grpc[i - 2].SerializeAsString())
        << "run " << i << " answered differently over the socket";
  }
  EXPECT_EQ(caller_runs() - before, 3);
}

// Socket runs from two connections at once: one runs on its connection's
// thread while the other waits for the device on the device's thread (the
// inline run holds the device's slot), and every run is answered with what
// gRPC answers.
TEST_F(ShmRunTest, SessionRunsFromTwoConnectionsAtOnceAreAllAnswered) {
  const std::string sid = CreateWideSession();
  ASSERT_FALSE(sid.empty());
  constexpr int kRuns = 16;
  std::vector<std::string> want(kRuns + 1);
  for (int i = 1; i <= kRuns; ++i) {
    v1::RunResponse r;
    ASSERT_TRUE(GrpcRun(WideRequest(sid, i), &r).ok());
    want[i] = Comparable(r).SerializeAsString();
  }
  std::vector<std::string> got(kRuns + 1);
  std::vector<int> codes(kRuns + 1, -2);
  std::vector<std::thread> clients;
  for (int t = 0; t < 2; ++t) {
    clients.emplace_back([&, t] {
      auto sock = RawSocket::Open(*kilnd_, kAlice);
      if (sock == nullptr) return;
      for (int i = 1 + t; i <= kRuns; i += 2) {
        v1::ShmServerMessage a = sock->Run(WideRequest(sid, i));
        codes[i] = a.code();
        v1::RunResponse r;
        if (a.code() == 0 && r.ParseFromString(a.run_response())) {
          got[i] = Comparable(r).SerializeAsString();
        }
      }
    });
  }
  for (std::thread& c : clients) c.join();
  for (int i = 1; i <= kRuns; ++i) {
    EXPECT_EQ(codes[i], 0) << "run " << i;
    EXPECT_TRUE(got[i] == want[i]) << "run " << i << " answered differently over the socket";
  }
}

TEST_F(ShmRunTest, ClientSendsRunsOverTheSocketByItself) {
  ClientOptions options;
  options.api_key = kAlice;
  auto client = Client::Create(kilnd_->address(), options);
  ASSERT_TRUE(client.ok()) << client.status();
  auto session = (*client)->CreateSession(GraphFromText(kTwoOutputs));
  ASSERT_TRUE(session.ok()) << session.status();
  TensorMap in;
  std::vector<float> xs(100000);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(i % 777) * 0.125f;
  in.emplace("x", HostTensor::FromVector(v1::DTYPE_F32, {100000}, xs));
  auto check = [&](const absl::StatusOr<Client::RunResult>& r) {
    ASSERT_TRUE(r.ok()) << r.status();
    const float* y = r->output("y")->data_as<float>();
    const float* z = r->output("z")->data_as<float>();
    for (size_t i = 0; i < xs.size(); i += 331) {
      ASSERT_EQ(y[i], 2 * xs[i]);
      ASSERT_EQ(z[i], xs[i] + 1);
    }
  };
  for (int round = 0; round < 3; ++round) {
    auto r = (*client)->Run(session->session_id(), in);
    check(r);
    EXPECT_TRUE(r->shared_memory);
    // The first region's output area holds one of the two outputs: kilnd
    // refuses the run on the socket before running it (the other would not
    // fit a datagram as bytes), the client sends it over gRPC, and sizes the
    // next region for both.
    EXPECT_EQ(r->shm_run, round > 0) << round;
  }
  // An error over the socket is the client's error as over gRPC.
  TensorMap wrong;
  wrong.emplace("x", HostTensor::FromVector(v1::DTYPE_I32, {3}, std::vector<int32_t>{1, 2, 3}));
  auto bad = (*client)->Run(session->session_id(), wrong);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  // Off by option, and by KILN_SHM_RUN=0: gRPC, same answers.
  options.shm_runs = false;
  auto grpc_runs = Client::Create(kilnd_->address(), options);
  ASSERT_TRUE(grpc_runs.ok());
  auto r = (*grpc_runs)->Run(session->session_id(), in);
  check(r);
  EXPECT_TRUE(r->shared_memory);
  EXPECT_FALSE(r->shm_run);
  options.shm_runs = true;
  setenv("KILN_SHM_RUN", "0", 1);
  auto env_off = Client::Create(kilnd_->address(), options);
  r = (*env_off)->Run(session->session_id(), in);
  unsetenv("KILN_SHM_RUN");
  check(r);
  EXPECT_FALSE(r->shm_run);
  // Threads at once: each gets its own answer (one on the socket at a time,
  // the others over gRPC).
  std::vector<std::thread> threads;
  std::atomic<int> ok = 0;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      TensorMap mine;
      mine.emplace("x", HostTensor::FromVector(v1::DTYPE_F32, {1000},
                                               std::vector<float>(1000, static_cast<float>(t))));
      for (int i = 0; i < 10; ++i) {
        auto got = (*client)->Run(session->session_id(), mine);
        if (got.ok() && got->output("y")->data_as<float>()[999] == 2.0f * t) ++ok;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ok.load(), 40);
}

}  // namespace
}  // namespace kiln::shm_run_test
