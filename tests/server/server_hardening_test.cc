// Defects an outside probe of a real kilnd found (issue 11, "Hardening"), each
// against a real kilnd process: memory before limits (a deeply nested .kiln
// text, a SetParams stream that declares far more than it sends), client
// strings in logs and statuses, a FIFO planted in the compile cache, idle
// connections to /metrics, cache outcomes that told one tenant about
// another's graphs, and health Watch streams that held up SIGTERM.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <grpcpp/generic/generic_stub.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/config.h"
#include "server/reports.h"
#include "tests/server/kilnd_process.h"
#include "tests/server/test_graphs.h"

namespace kiln {
namespace {

using testing::Context;
using testing::KilndProcess;
using testing::TempDir;

// A field of /proc/<pid>/status in KiB ("VmRSS", "VmHWM"); -1 when missing.
int64_t ProcStatusKiB(pid_t pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with(field + ":")) continue;
    std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t kib = -1;
    if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &kib)) return kib;
  }
  return -1;
}

// Resets the process's peak RSS (VmHWM) to its current RSS.
void ResetPeakRss(pid_t pid) { std::ofstream(absl::StrCat("/proc/", pid, "/clear_refs")) << "5"; }

std::unique_ptr<KilndProcess> Start(const std::string& cache, const std::string& config = "") {
  std::string error;
  auto kilnd = KilndProcess::Start(
      {.cache_dir = cache, .config_text = config, .extra_flags = {"--calibration=never"}}, &error);
  EXPECT_NE(kilnd, nullptr) << error;
  return kilnd;
}

// Far below the 1-2 GiB the probe saw; far above anything kilnd needs here.
constexpr int64_t kPeakGrowthLimitKiB = 256 << 10;

TEST(ServerHardening, DeeplyNestedTextIsRefusedBeforeMemoryGrows) {
  TempDir cache;
  auto kilnd = Start(cache.path());
  ASSERT_NE(kilnd, nullptr);
  v1::CompileRequest req;
  std::string text = "graph \"deep\"\ninput x: f32[1]\nlet y = ";
  text.append(16 << 20, '(');  // 16 MiB of brackets
  req.mutable_graph()->set_text(std::move(text));
  ResetPeakRss(kilnd->pid());
  const int64_t before = ProcStatusKiB(kilnd->pid(), "VmHWM");
  v1::CompileResponse resp;
  grpc::Status s = kilnd->Stub()->Compile(Context().get(), req, &resp);
  const int64_t peak = ProcStatusKiB(kilnd->pid(), "VmHWM");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("nesting deeper than"), std::string::npos) << s.error_message();
  ASSERT_GT(before, 0);
  EXPECT_LT(peak - before, kPeakGrowthLimitKiB) << "peak RSS grew from " << before << " to "
                                                 << peak << " KiB";
}

TEST(ServerHardening, SetParamsCommitsMemoryAsBytesArrive) {
  TempDir cache;
  auto kilnd = Start(cache.path());
  ASSERT_NE(kilnd, nullptr);
  auto stub = kilnd->Stub();
  // A 1 GiB param (the default limits allow it); symbolic input: no compile yet.
  v1::CreateSessionRequest create;
  create.mutable_graph()->set_text(
      "graph \"bigparam\"\ninput x: f32[n]\nparam w: f32[268435456]\n"
      "let y = x + reduce_sum(w, axes=[0])\nout y\n");
  v1::CreateSessionResponse session;
  grpc::Status s = stub->CreateSession(Context().get(), create, &session);
  ASSERT_TRUE(s.ok()) << s.error_message();

  ResetPeakRss(kilnd->pid());
  const int64_t before = ProcStatusKiB(kilnd->pid(), "VmHWM");
  auto ctx = Context();
  v1::SetParamsResponse resp;
  auto writer = stub->SetParams(ctx.get(), &resp);
  v1::SetParamsChunk first;
  first.set_session_id(session.session_id());
  first.set_name("w");
  first.set_dtype(v1::DTYPE_F32);
  first.add_dims(268435456);
  first.set_data(std::string(64, '\1'));
  ASSERT_TRUE(writer->Write(first));
  // A second chunk with a gap ends the stream once the first was taken in.
  v1::SetParamsChunk gap;
  gap.set_offset(1 << 20);
  gap.set_data(std::string(64, '\1'));
  writer->Write(gap);
  writer->WritesDone();
  s = writer->Finish();
  const int64_t peak = ProcStatusKiB(kilnd->pid(), "VmHWM");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("expected 64"), std::string::npos) << s.error_message();
  ASSERT_GT(before, 0);
  EXPECT_LT(peak - before, kPeakGrowthLimitKiB) << "peak RSS grew from " << before << " to "
                                                 << peak << " KiB for 128 bytes sent";
}

TEST(ServerHardening, ClientStringsCannotForgeLogLinesOrOverflowStatuses) {
  TempDir cache;
  auto kilnd = Start(cache.path());
  ASSERT_NE(kilnd, nullptr);
  auto stub = kilnd->Stub();
  const std::string forged =
      "2026-12-01T00:00:00.000 info req=forged tenant=admin rpc=Run code=OK ms=1.000";
  v1::CloseSessionRequest close;
  close.set_session_id(std::string("s-1\n") + forged + std::string("\0tail", 5));
  v1::CloseSessionResponse closed;
  grpc::Status s = stub->CloseSession(Context().get(), close, &closed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message().find('\n'), std::string::npos) << s.error_message();

  // A graph whose node name carries the same line, through the verifier's messages.
  v1::CompileRequest compile;
  compile.mutable_graph()->set_text(absl::StrCat("graph \"g\\n", forged, "\"\ninput x: f32[1]\n",
                                                 "let y = nosuchop(x)\nout y\n"));
  v1::CompileResponse compiled;
  EXPECT_FALSE(stub->Compile(Context().get(), compile, &compiled).ok());

  // A 1 MiB session id: the status stays far below gRPC's 8 KiB metadata
  // limit (the client would otherwise see a transport error, not NOT_FOUND).
  close.set_session_id(std::string(1 << 20, 'a'));
  s = stub->CloseSession(Context().get(), close, &closed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message().substr(0, 200);
  EXPECT_LT(s.error_message().size(), 4096u);
  EXPECT_NE(s.error_message().find("bytes)"), std::string::npos) << s.error_message();

  const std::string log = kilnd->Log();
  EXPECT_EQ(log.find('\0'), std::string::npos);
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    EXPECT_FALSE(absl::StartsWith(line, forged)) << "forged log line: " << line;
    EXPECT_LT(line.size(), 8192u) << line.substr(0, 200);
  }
}

TEST(ServerHardening, FifoInPlaceOfACacheEntryIsNotOpenedBlocking) {
  TempDir cache;
  v1::CompileRequest req;
  req.mutable_graph()->set_text(testing::kAffineText);
  v1::InputShape* shape = req.add_input_shapes();
  shape->set_name("x");
  shape->add_dims(2);
  shape->add_dims(3);
  std::string key;
  {
    auto kilnd = Start(cache.path());
    ASSERT_NE(kilnd, nullptr);
    v1::CompileResponse resp;
    grpc::Status s = kilnd->Stub()->Compile(Context().get(), req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    key = resp.executable_key();
    kilnd->Signal(SIGTERM);
    ASSERT_EQ(kilnd->WaitExit(absl::Seconds(60)), 0);
  }
  std::string entry;
  for (const auto& f : std::filesystem::recursive_directory_iterator(cache.path())) {
    if (f.path().filename() == key) entry = f.path().string();
  }
  ASSERT_FALSE(entry.empty()) << "no cache entry named " << key << " under " << cache.path();
  ASSERT_EQ(std::filesystem::remove(entry), true);
  ASSERT_EQ(mkfifo(entry.c_str(), 0644), 0);

  auto kilnd = Start(cache.path());
  ASSERT_NE(kilnd, nullptr);
  v1::CompileResponse resp;
  // Before the fix open() waited for a writer forever: this deadline passed.
  grpc::Status s = kilnd->Stub()->Compile(Context("", absl::Seconds(60)).get(), req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.executable_key(), key);
  EXPECT_NE(resp.report().executable_cache(), v1::CACHE_HIT_DISK);
}

TEST(ServerHardening, MetricsAnswerWhileIdleConnectionsAreOpen) {
  TempDir cache;
  auto kilnd = Start(cache.path());
  ASSERT_NE(kilnd, nullptr);
  auto connect = [&] {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(kilnd->metrics_port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    return fd;
  };
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(connect());  // connected, silent
  // The scrape must not wait for the idle ones: civetweb held each for 30 s.
  const int fd = connect();
  timeval tv{.tv_sec = 15, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  ASSERT_EQ(send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  std::string all;
  char buf[8192];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) all.append(buf, n);
  close(fd);
  for (int f : idle) close(f);
  EXPECT_NE(all.find("kiln_uptime_seconds"), std::string::npos)
      << "no /metrics answer within 15 s with 4 idle connections open: " << all.substr(0, 200);
}

// A health Watch stream (a load balancer's, a probe's) never ends by itself:
// it sees NOT_SERVING at the signal, and is cancelled by the gRPC server's
// shutdown after the drain (1 s after it; it was 5 s: how long that takes is
// in docs/benchmarks.md, "kilnd exit"), and kilnd exits 0.
TEST(ServerHardening, SigtermWithAHealthWatcherExitsZero) {
  TempDir cache;
  std::string error;
  auto kilnd = KilndProcess::Start(
      {.cache_dir = cache.path(), .extra_flags = {"--calibration=never", "--drain_timeout=1s"}},
      &error);
  ASSERT_NE(kilnd, nullptr) << error;
  grpc::GenericStub stub(kilnd->channel());
  auto ctx = Context("", absl::Seconds(60));
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(ctx.get(), "/grpc.health.v1.Health/Watch", &cq);
  void* tag = nullptr;
  bool ok = false;
  auto step = [&](intptr_t want) {
    return cq.Next(&tag, &ok) && tag == reinterpret_cast<void*>(want) && ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(step(1));
  grpc::Slice empty("");  // HealthCheckRequest{service: ""}
  grpc::ByteBuffer request(&empty, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(step(2));
  call->WritesDone(reinterpret_cast<void*>(3));
  ASSERT_TRUE(step(3));
  grpc::ByteBuffer reply;
  call->Read(&reply, reinterpret_cast<void*>(4));
  ASSERT_TRUE(step(4));  // SERVING
  kilnd->Signal(SIGTERM);
  int updates = 0;
  for (;;) {
    call->Read(&reply, reinterpret_cast<void*>(5));
    if (!step(5)) break;
    ++updates;  // NOT_SERVING
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(6));
  step(6);
  EXPECT_GE(updates, 1) << "the watcher never saw NOT_SERVING";
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(kilnd->WaitExit(absl::Seconds(60)), 0) << kilnd->Log();
}

TEST(ServerHardening, CacheOutcomesAndServerInfoAreScopedToTheTenant) {
  TempDir cache;
  const std::string config = absl::StrCat(
      "tenants { name: \"alice\" admin: true api_key_sha256: \"", server::Sha256Hex("alice-k"),
      "\" }\ntenants { name: \"bob\" api_key_sha256: \"", server::Sha256Hex("bob-k"), "\" }\n");
  auto kilnd = Start(cache.path(), config);
  ASSERT_NE(kilnd, nullptr);
  auto stub = kilnd->Stub();
  v1::CompileRequest req;
  req.mutable_graph()->set_text(testing::kAffineText);
  v1::InputShape* shape = req.add_input_shapes();
  shape->set_name("x");
  shape->add_dims(4);
  shape->add_dims(3);
  auto compile = [&](const std::string& key) {
    v1::CompileResponse resp;
    grpc::Status s = stub->Compile(Context(key).get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.report();
  };
  EXPECT_EQ(compile("alice-k").executable_cache(), v1::CACHE_MISS);
  // Only alice compiled it: bob's report must not confirm that it exists.
  const v1::CompileReport bob_first = compile("bob-k");
  EXPECT_EQ(bob_first.executable_cache(), v1::CACHE_MISS);
  EXPECT_EQ(bob_first.kernel_cache_hits(), 0);
  // Bob's own second compile is his hit.
  EXPECT_EQ(compile("bob-k").executable_cache(), v1::CACHE_HIT_MEMORY);

  v1::ServerInfoResponse bob_info, alice_info;
  ASSERT_TRUE(stub->ServerInfo(Context("bob-k").get(), {}, &bob_info).ok());
  EXPECT_FALSE(bob_info.cache().server_wide());
  EXPECT_EQ(bob_info.cache().dir(), "");
  EXPECT_EQ(bob_info.cache().misses(), 1);
  EXPECT_EQ(bob_info.cache().memory_hits(), 1);
  EXPECT_EQ(bob_info.cache().disk_entries(), 0);
  ASSERT_TRUE(stub->ServerInfo(Context("alice-k").get(), {}, &alice_info).ok());
  EXPECT_TRUE(alice_info.cache().server_wide());
  EXPECT_EQ(alice_info.cache().dir(), cache.path());
  EXPECT_EQ(alice_info.cache().misses(), 1);      // the server compiled once
  EXPECT_EQ(alice_info.cache().memory_hits(), 2);  // bob's two compiles
}

// Kept reports are counted in bytes as well as in number, per tenant: the
// oldest go once a tenant's budget is full, and another tenant's are untouched.
TEST(ServerHardening, KeptReportsAreCountedAgainstAByteBudget) {
  server::ReportStore store(/*per_tenant=*/64, /*max_bytes_per_tenant=*/64 << 10);
  v1::DispatchReport big;
  big.set_tenant("a");
  for (int i = 0; i < 200; ++i) big.add_steps()->set_kernel(std::string(80, 'k'));
  const int64_t one = static_cast<int64_t>(big.ByteSizeLong());
  ASSERT_GT(one, 8 << 10);
  for (int i = 0; i < 64; ++i) {
    big.set_request_id(absl::StrCat("r", i));
    store.Add("a", big);
  }
  const int64_t b_bytes = static_cast<int64_t>(big.ByteSizeLong());  // with its request id
  store.Add("b", big);
  EXPECT_LE(store.Bytes("a"), 64 << 10);
  EXPECT_EQ(store.Bytes("b"), b_bytes);
  const std::vector<v1::DispatchReport> kept = store.Last("a", 0);
  ASSERT_FALSE(kept.empty());
  EXPECT_EQ(static_cast<int64_t>(kept.size()), (64 << 10) / one);
  EXPECT_EQ(kept.back().request_id(), "r63");  // the newest stay
  EXPECT_FALSE(store.Find("a", "r0").has_value());
  ASSERT_TRUE(store.Find("a", "r63").has_value());
  EXPECT_EQ(store.Find("a", "r63")->steps_size(), 200);
}

}  // namespace
}  // namespace kiln
