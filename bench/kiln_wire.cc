// kiln_wire: what moving tensors through kilnd costs (issue 12, item 2;
// docs/benchmarks.md).
//
//   (a) y = x * 1 on f32[1 Mi]: 4 MiB in, 4 MiB out, through a kilnd session
//       with the C++ client, next to the same graph run by an Engine in this
//       process, in alternating blocks A B A B. kilnd's dispatch report of
//       each call gives the engine's own time for that very run: "added" is
//       the client's latency minus it (target: <= 2 ms).
//   (b) MLP 784-512-512-10, batch 1: through kilnd with the C++ client vs
//       in-process, plus a bare gRPC round trip (grpc.health Check) measured
//       in the same blocks: added = kilnd - in-process, against the round
//       trip (target: <= the peer's in-process time + 60 us, i.e. added <=
//       round trip + 60 us when the in-process engine matches the peer).
//   (c) with (a), in the same blocks: the floor gRPC itself sets for those
//       bytes. A bare server (this binary re-run with --echo_server, a child
//       process as kilnd is) serves kilnd's Run method on the same raw
//       callback path and answers each request with its own bytes (slices
//       shared, no copy); the client sends the very bytes of the RunRequest
//       kiln::Client sends, with kiln::Client's channel arguments:
//       "bare_grpc" refers to them (no copy on either side), "bare_grpc_copied"
//       copies them into the request and the answer out into aligned memory
//       (the copies kiln::Client makes). kilnd's added time over bare_grpc is
//       what Kiln's own code (both sides) costs beyond gRPC.
//
// The client sends tensors as bytes in the gRPC messages (shared memory
// off: kiln_shm_bench measures that transport) unless --transport says shm
// (shared memory, Run over gRPC) or shm_run (shared memory, Run over kilnd's
// shared-memory socket: docs/server.md "Runs over the socket"). --cases picks (a), (b) or
// both. Starts its own kilnd (temp cache dir, ephemeral ports). Prints one
// JSON object on one line of stdout; progress goes to stderr.
#include <sys/resource.h>
#include <sys/utsname.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/byte_buffer.h>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/openmp_policy.h"
#include "clients/cpp/client.h"
#include "clients/cpp/graph_builder.h"
#include "engine/engine.h"
#include "kiln/v1/service.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/clients/kilnd_child.h"
#include "tests/e2e/models.h"

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double MicrosSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * v.size()));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

json Summary(const std::vector<double>& us) {
  return {{"runs", us.size()},
          {"p10_us", Percentile(us, 0.1)},
          {"p50_us", Percentile(us, 0.5)},
          {"p90_us", Percentile(us, 0.9)}};
}

void Die(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "kiln_wire: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

json Machine() {
  std::string model;
  std::ifstream cpu("/proc/cpuinfo");
  for (std::string line; std::getline(cpu, line);) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) < 0) load[0] = -1;
  return {{"cpu", model},
          {"cores", std::thread::hardware_concurrency()},
          {"load_1min", load[0]},
          {"date", absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone())}};
}

struct Flags {
  std::string kilnd;
  int blocks = 10;
  int runs = 20;  // per block (the first of each block is dropped)
  int warmup = 150;  // kilnd calls before timing
  std::vector<std::string> cases = {"four_mib", "mlp_b1"};
  // bytes: tensors in gRPC messages; shm: shared memory, Run over gRPC;
  // shm_run: shared memory, Run over kilnd's shared-memory socket.
  std::string transport = "bytes";
  bool bare = true;  // (c) beside (a)
  bool unix_socket = false;  // gRPC over a Unix-domain socket instead of TCP
};

// One graph through kilnd and in-process, alternating blocks.
// CPU time and minor page faults of a process: this one (pid 0) or a child.
struct ProcSample {
  int64_t cpu_ns = 0;
  int64_t faults = 0;
};

ProcSample SampleProcess(pid_t pid) {
  ProcSample s;
  clockid_t clock = CLOCK_PROCESS_CPUTIME_ID;
  if (pid != 0 && clock_getcpuclockid(pid, &clock) != 0) return s;
  timespec ts{};
  clock_gettime(clock, &ts);
  s.cpu_ns = int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
  if (pid == 0) {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    s.faults = ru.ru_minflt;
    return s;
  }
  // /proc/<pid>/stat: minflt is the 10th field, the 8th after the command's ')'.
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(f, line);
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos) return s;
  const std::vector<std::string> fields =
      absl::StrSplit(line.substr(paren + 2), ' ', absl::SkipEmpty());
  if (fields.size() > 7) (void)absl::SimpleAtoi(fields[7], &s.faults);
  return s;
}

// The CPU time and page faults of a series of calls, client and server.
struct Costs {
  int64_t calls = 0;
  int64_t client_ns = 0, server_ns = 0, client_faults = 0, server_faults = 0;

  void Add(const ProcSample& client0, const ProcSample& client1, const ProcSample& server0,
           const ProcSample& server1) {
    ++calls;
    client_ns += client1.cpu_ns - client0.cpu_ns;
    server_ns += server1.cpu_ns - server0.cpu_ns;
    client_faults += client1.faults - client0.faults;
    server_faults += server1.faults - server0.faults;
  }
  json Json() const {
    const double n = static_cast<double>(std::max<int64_t>(1, calls));
    return {{"calls", calls},
            {"client_cpu_us_per_call", client_ns / n / 1000},
            {"server_cpu_us_per_call", server_ns / n / 1000},
            {"client_page_faults_per_call", client_faults / n},
            {"server_page_faults_per_call", server_faults / n}};
  }
};

struct Side {
  std::vector<double> kilnd, kilnd_engine, added, in_process, round_trip;
  std::vector<double> bare, bare_copied;  // (c), when measured
  Costs kilnd_costs, bare_costs, bare_copied_costs;
};

// (c): the echo server, run as a child process (--echo_server).
class EchoRun final : public v1::Kiln::WithRawCallbackMethod_Run<v1::Kiln::Service> {
 public:
  grpc::ServerUnaryReactor* Run(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                grpc::ByteBuffer* response) override {
    *response = *request;  // shares the request's slices
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
};

// Takes kilnd's flags (testing::KilndChild starts it as it starts kilnd):
// listens on --listen, writes the port to --port_file, serves until killed.
int EchoServerMain(int argc, char** argv) {
  CLI::App app{"kiln_wire's bare gRPC echo server"};
  app.allow_extras();
  bool echo = false;
  std::string listen, port_file;
  app.add_flag("--echo_server", echo);
  // testing::KilndChild gives --listen=127.0.0.1:0 first; a --listen after it wins.
  app.add_option("--listen", listen)->required()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--port_file", port_file)->required();
  CLI11_PARSE(app, argc, argv);
  // As the client does: freed 4 MiB buffers stay in the heap for the next
  // call instead of being unmapped and faulted in again (each fault is
  // expensive on this VM).
  TuneMallocForLargeTensors();
  // As kilnd does (server/main.cc): Debian's Abseil records every lock in a
  // global graph otherwise.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  EchoRun service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(-1);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  const bool unix_socket = listen.rfind("unix:", 0) == 0;  // no port to report
  if (unix_socket && server != nullptr) port = 1;
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "kiln_wire --echo_server: cannot listen on %s\n", listen.c_str());
    return 1;
  }
  {
    std::ofstream f(port_file + ".tmp");
    f << port << "\n";
  }
  std::rename((port_file + ".tmp").c_str(), port_file.c_str());
  server->Wait();  // until SIGTERM ends the process
  return 0;
}

void NoRelease(void*) {}

// (c)'s client: the RunRequest's bytes through the bare server.
class BareCall {
 public:
  BareCall(std::shared_ptr<grpc::Channel> channel, std::string request, pid_t server)
      : channel_(std::move(channel)), request_(std::move(request)), server_(server) {}
  pid_t pid() const { return server_; }

  // One call; its latency in microseconds. `copied`: the bytes are copied
  // into the request and out of the answer, as kiln::Client copies them.
  double Call(bool copied) const {
    const auto t0 = Clock::now();
    grpc::Slice slice = copied ? grpc::Slice(request_.data(), request_.size())
                               : grpc::Slice(const_cast<char*>(request_.data()), request_.size(),
                                             &NoRelease, nullptr);
    const grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    grpc::ClientContext ctx;
    const grpc::internal::RpcMethod method("/kiln.v1.Kiln/Run", grpc::internal::RpcMethod::NORMAL_RPC,
                                           channel_);
    const grpc::Status s = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
        channel_.get(), method, &ctx, request, &response);
    if (!s.ok() || response.Length() != request_.size()) {
      std::fprintf(stderr, "kiln_wire: the bare call failed: %s (%zu of %zu bytes back)\n",
                   s.error_message().c_str(), response.Length(), request_.size());
      std::exit(1);
    }
    if (copied) {
      absl::StatusOr<HostTensor> out =
          HostTensor::CreateUninitialized(v1::DTYPE_U8, {static_cast<int64_t>(response.Length())});
      Die(out.status(), "bare answer buffer");
      std::vector<grpc::Slice> slices;
      if (!response.Dump(&slices).ok()) Die(absl::DataLossError("unreadable answer"), "bare call");
      char* at = static_cast<char*>(out->data());
      for (const grpc::Slice& s : slices) {
        std::memcpy(at, s.begin(), s.size());
        at += s.size();
      }
    }
    return MicrosSince(t0);
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::string request_;
  pid_t server_;
};

Side Measure(const Client& client, const std::string& session, const TensorMap& inputs,
             Engine& engine, Executable& exe, const ParamSet* params, const Flags& f,
             const HostTensor& expect, const std::string& output, pid_t kilnd_pid,
             const BareCall* bare = nullptr) {
  std::vector<TensorRef> refs;
  for (const auto& [name, t] : inputs) refs.push_back(TensorRef::Of(name, t));
  Client::RunOptions with_report;
  with_report.report = true;
  // Warm-up: kilnd's gRPC threads each grow their malloc arena on their
  // first large requests (page faults for ~100 calls of 4 MiB), then reuse it.
  for (int i = 0; i < f.warmup; ++i) {
    Die(client.Run(session, inputs).status(), "warm-up");
    if (bare != nullptr) {
      bare->Call(false);
      bare->Call(true);
    }
  }
  Side s;
  for (int block = 0; block < f.blocks; ++block) {
    for (const bool inproc : {block % 2 == 0, block % 2 != 0}) {
      for (int i = 0; i <= f.runs; ++i) {
        if (inproc) {
          const auto t0 = Clock::now();
          absl::StatusOr<RunResult> r = engine.Run(exe, refs, params, {});
          const double us = MicrosSince(t0);
          Die(r.status(), "in-process run");
          if (i > 0) s.in_process.push_back(us);
          continue;
        }
        const ProcSample c0 = SampleProcess(0), k0 = SampleProcess(kilnd_pid);
        const auto t0 = Clock::now();
        absl::StatusOr<Client::RunResult> r = client.Run(session, inputs, with_report);
        const double us = MicrosSince(t0);
        const ProcSample c1 = SampleProcess(0), k1 = SampleProcess(kilnd_pid);
        Die(r.status(), "kilnd run");
        if (f.transport != "bytes" && (!r->shared_memory || r->shm_run != (f.transport == "shm_run"))) {
          std::fprintf(stderr, "kiln_wire: the run did not go as --transport=%s says (kilnd %s)\n",
                       f.transport.c_str(), r->shared_memory ? "took no runs on its socket"
                                                             : "gave no shared memory");
          std::exit(1);
        }
        if (i == 0) {
          const HostTensor* y = r->output(output);
          if (y == nullptr || y->bytes() != expect.bytes()) {
            std::fprintf(stderr, "kiln_wire: kilnd's output differs from the expected one\n");
            std::exit(1);
          }
          continue;
        }
        s.kilnd_costs.Add(c0, c1, k0, k1);
        s.kilnd.push_back(us);
        s.kilnd_engine.push_back(r->report.run_micros());
        s.added.push_back(us - r->report.run_micros());
        const auto h0 = Clock::now();
        Die(client.Health().status(), "health");
        s.round_trip.push_back(MicrosSince(h0));
        if (bare != nullptr) {
          for (const bool copied : {false, true}) {
            const ProcSample b0 = SampleProcess(0), e0 = SampleProcess(bare->pid());
            const double bare_us = bare->Call(copied);
            const ProcSample b1 = SampleProcess(0), e1 = SampleProcess(bare->pid());
            (copied ? s.bare_copied : s.bare).push_back(bare_us);
            (copied ? s.bare_copied_costs : s.bare_costs).Add(b0, b1, e0, e1);
          }
        }
      }
    }
  }
  return s;
}

int Main(int argc, char** argv) {
  Flags f;
  CLI::App app{"kiln_wire: tensor bytes through kilnd vs the engine's own time"};
  app.add_option("--kilnd", f.kilnd, "kilnd binary (default: this build's)");
  app.add_option("--blocks", f.blocks, "alternating blocks");
  app.add_option("--runs", f.runs, "timed runs per block");
  app.add_option("--warmup", f.warmup, "untimed kilnd calls first");
  app.add_option("--cases", f.cases, "four_mib, mlp_b1 (default both)")
      ->delimiter(',')
      ->check(CLI::IsMember({"four_mib", "mlp_b1"}));
  app.add_option("--transport", f.transport,
                 "bytes (tensors in the gRPC messages, default), shm (shared memory, Run over "
                 "gRPC) or shm_run (shared memory, Run over kilnd's shared-memory socket)")
      ->check(CLI::IsMember({"bytes", "shm", "shm_run"}));
  app.add_flag("--bare,!--no_bare", f.bare, "skip (c), the bare gRPC echo beside (a)");
  app.add_flag("--unix", f.unix_socket,
               "gRPC over a Unix-domain socket (kilnd's unix: listener and the bare server's) "
               "instead of TCP on 127.0.0.1");
  CLI11_PARSE(app, argc, argv);
  auto wanted = [&](const char* c) {
    return std::find(f.cases.begin(), f.cases.end(), c) != f.cases.end();
  };

  testing::ScratchDir cache, engine_cache;
  // --unix: kilnd and the bare server both on a Unix-domain socket.
  const std::string kilnd_socket = cache.path() + "/kilnd.sock";
  auto kilnd = testing::KilndChild::Start(
      cache.path(), f.kilnd,
      f.unix_socket ? std::vector<std::string>{"--listen=127.0.0.1:0,unix:" + kilnd_socket}
                    : std::vector<std::string>{});
  Die(kilnd.status(), "kilnd");
  // Tensor bytes in the messages by default: what this bench measured first.
  ClientOptions grpc_bytes;
  grpc_bytes.shared_memory = f.transport != "bytes";
  grpc_bytes.shm_runs = f.transport == "shm_run";
  auto client = Client::Create(f.unix_socket ? "unix:" + kilnd_socket : (*kilnd)->addr(), grpc_bytes);
  Die(client.status(), "client");
  EngineOptions eo;
  eo.cache_dir = engine_cache.path();
  auto engine = Engine::Create(eo);
  Die(engine.status(), "engine");
  json out = {{"bench", "kiln_wire"},
              {"machine", Machine()},
              {"transport", f.transport},
              {"grpc_socket", f.unix_socket ? "unix" : "tcp"}};

  // (a) 4 MiB each way.
  if (wanted("four_mib")) {
    constexpr int64_t n = int64_t{1} << 20;
    GraphBuilder g("times_one");
    g.output("y", g.mul(g.input("x", v1::DTYPE_F32, {n}), g.scalar(1.0)));
    const v1::Graph graph = g.Build();
    v1::CompileOptions cpu;
    cpu.set_device("cpu:0");
    auto session = (*client)->CreateSession(GraphFromProto(graph), cpu);
    Die(session.status(), "session");
    CompileOptions co;
    co.device = "cpu:0";
    auto compiled = (*engine)->Compile(graph, co, {});
    Die(compiled.status(), "compile");
    std::mt19937_64 rng(3);
    TensorMap in;
    in.emplace("x", models::RandomF32(rng, {n}, 1.0));
    // (c): the bare server, and the bytes kiln::Client sends for this run.
    testing::ScratchDir echo_dir;
    const std::string echo_socket = echo_dir.path() + "/echo.sock";
    std::unique_ptr<testing::KilndChild> echo;
    std::optional<BareCall> bare;
    if (f.bare && f.transport == "bytes") {
      std::vector<std::string> flags = {"--echo_server"};
      if (f.unix_socket) flags.push_back("--listen=unix:" + echo_socket);
      auto started = testing::KilndChild::Start(
          echo_dir.path(), std::filesystem::read_symlink("/proc/self/exe").string(), flags);
      Die(started.status(), "echo server");
      echo = std::move(started).value();
      v1::RunRequest req;
      req.set_session_id(session->session_id());
      req.set_report(true);
      v1::NamedTensor* x = req.add_inputs();
      x->set_name("x");
      in.at("x").ToProto(x->mutable_tensor());
      grpc::ChannelArguments args;  // kiln::Client's
      args.SetMaxReceiveMessageSize(-1);
      args.SetMaxSendMessageSize(-1);
      bare.emplace(grpc::CreateCustomChannel(f.unix_socket ? "unix:" + echo_socket : echo->addr(),
                                             grpc::InsecureChannelCredentials(), args),
                   req.SerializeAsString(), echo->pid());
    }
    std::fprintf(stderr, "kiln_wire: 4 MiB in / 4 MiB out\n");
    Side s = Measure(**client, session->session_id(), in, **engine, *compiled->executable,
                     nullptr, f, in.at("x"), "y", (*kilnd)->pid(), bare ? &*bare : nullptr);
    const double added = Percentile(s.added, 0.5);
    out["four_mib"] = {{"graph", "y = x * 1, f32[1048576], cpu:0"},
                       {"kilnd_client_latency", Summary(s.kilnd)},
                       {"kilnd_engine_run", Summary(s.kilnd_engine)},
                       {"added_by_grpc_and_kilnd", Summary(s.added)},
                       {"in_process_run", Summary(s.in_process)},
                       {"added_p50_ms", added / 1000},
                       {"target_added_ms", 2.0},
                       {"met", added <= 2000},
                       {"kilnd_costs", s.kilnd_costs.Json()}};
    if (bare) {
      out["four_mib"]["bare_grpc_costs"] = s.bare_costs.Json();
      out["four_mib"]["bare_grpc_copied_costs"] = s.bare_copied_costs.Json();
      const double floor = Percentile(s.bare, 0.5), copied = Percentile(s.bare_copied, 0.5);
      out["four_mib"]["bare_grpc"] = Summary(s.bare);
      out["four_mib"]["bare_grpc_copied"] = Summary(s.bare_copied);
      out["four_mib"]["added_over_bare_grpc_ratio"] = added / floor;
      std::fprintf(stderr,
                   "kiln_wire: 4 MiB each way, p50: kilnd added %.3f ms | bare gRPC %.3f ms "
                   "(kilnd added / bare %.2fx) | bare gRPC + kiln::Client's copies %.3f ms\n",
                   added / 1000, floor / 1000, added / floor, copied / 1000);
    }
    Die((*client)->CloseSession(session->session_id()), "close");
  }

  // (b) MLP batch 1.
  if (wanted("mlp_b1")) {
    models::Model m = models::Mlp();
    v1::CompileOptions cpu;
    cpu.set_device("cpu:0");
    auto session = (*client)->CreateSession(GraphFromProto(m.graph), cpu);
    Die(session.status(), "mlp session");
    Die((*client)->SetParams(session->session_id(), m.params).status(), "mlp params");
    CompileOptions co;
    co.device = "cpu:0";
    auto compiled = (*engine)->Compile(m.graph, co, {{"x", {1, 784}}});
    Die(compiled.status(), "mlp compile");
    const std::vector<TensorRef> param_refs = models::ParamRefs(m);
    auto params = (*engine)->CreateParams(param_refs);
    Die(params.status(), "mlp params in-process");
    std::mt19937_64 rng(4);
    TensorMap in;
    in.emplace("x", models::RandomF32(rng, {1, 784}, 1.0));
    // kilnd's output must be the in-process engine's, bit for bit (same kernels).
    std::vector<TensorRef> refs = {TensorRef::Of("x", in.at("x"))};
    auto local = (*engine)->Run(*compiled->executable, refs, params->get(), {});
    Die(local.status(), "mlp in-process");
    std::fprintf(stderr, "kiln_wire: MLP batch 1\n");
    Side s = Measure(**client, session->session_id(), in, **engine, *compiled->executable,
                     params->get(), f, local->outputs[0].second, local->outputs[0].first,
                     (*kilnd)->pid());
    const double kilnd_p50 = Percentile(s.kilnd, 0.5), local_p50 = Percentile(s.in_process, 0.5);
    const double rtt = Percentile(s.round_trip, 0.5);
    out["mlp_b1"] = {{"model", "MLP 784-512-512-10, f32, batch 1, cpu:0"},
                     {"kilnd_client_latency", Summary(s.kilnd)},
                     {"kilnd_engine_run", Summary(s.kilnd_engine)},
                     {"in_process_run", Summary(s.in_process)},
                     {"bare_grpc_round_trip", Summary(s.round_trip)},
                     {"kilnd_minus_in_process_p50_us", kilnd_p50 - local_p50},
                     {"kilnd_minus_in_process_and_round_trip_p50_us", kilnd_p50 - local_p50 - rtt},
                     {"target_us_over_in_process_plus_round_trip", 60},
                     {"met", kilnd_p50 - local_p50 - rtt <= 60}};
    Die((*client)->CloseSession(session->session_id()), "close");
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--echo_server") return kiln::EchoServerMain(argc, argv);
  }
  // The in-process engine's OpenMP team waits as kilnd's does (base/openmp_policy.h).
  kiln::UseBoundedOpenMpSpin(argv);
  kiln::TuneMallocForLargeTensors();
  return kiln::Main(argc, argv);
}
