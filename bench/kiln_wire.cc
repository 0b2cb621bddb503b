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
//
// The client sends tensors as bytes in the gRPC messages (shared memory
// off: kiln_shm_bench measures that transport) unless --transport says shm
// (shared memory, Run over gRPC) or shm_run (shared memory, Run over kilnd's
// shared-memory socket: docs/server.md "Runs over the socket"). --cases picks (a), (b) or
// both. Starts its own kilnd (temp cache dir, ephemeral ports). Prints one
// JSON object on one line of stdout; progress goes to stderr.
#include <sys/utsname.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/openmp_policy.h"
#include "clients/cpp/client.h"
#include "clients/cpp/graph_builder.h"
#include "engine/engine.h"
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
};

// One graph through kilnd and in-process, alternating blocks.
struct Side {
  std::vector<double> kilnd, kilnd_engine, added, in_process, round_trip;
};

Side Measure(const Client& client, const std::string& session, const TensorMap& inputs,
             Engine& engine, Executable& exe, const ParamSet* params, const Flags& f,
             const HostTensor& expect, const std::string& output) {
  std::vector<TensorRef> refs;
  for (const auto& [name, t] : inputs) refs.push_back(TensorRef::Of(name, t));
  Client::RunOptions with_report;
  with_report.report = true;
  // Warm-up: kilnd's gRPC threads each grow their malloc arena on their
  // first large requests (page faults for ~100 calls of 4 MiB), then reuse it.
  for (int i = 0; i < f.warmup; ++i) Die(client.Run(session, inputs).status(), "warm-up");
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
        const auto t0 = Clock::now();
        absl::StatusOr<Client::RunResult> r = client.Run(session, inputs, with_report);
        const double us = MicrosSince(t0);
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
        s.kilnd.push_back(us);
        s.kilnd_engine.push_back(r->report.run_micros());
        s.added.push_back(us - r->report.run_micros());
        const auto h0 = Clock::now();
        Die(client.Health().status(), "health");
        s.round_trip.push_back(MicrosSince(h0));
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
  CLI11_PARSE(app, argc, argv);
  auto wanted = [&](const char* c) {
    return std::find(f.cases.begin(), f.cases.end(), c) != f.cases.end();
  };

  testing::ScratchDir cache, engine_cache;
  auto kilnd = testing::KilndChild::Start(cache.path(), f.kilnd);
  Die(kilnd.status(), "kilnd");
  // Tensor bytes in the messages by default: what this bench measured first.
  ClientOptions grpc_bytes;
  grpc_bytes.shared_memory = f.transport != "bytes";
  grpc_bytes.shm_runs = f.transport == "shm_run";
  auto client = Client::Create((*kilnd)->addr(), grpc_bytes);
  Die(client.status(), "client");
  EngineOptions eo;
  eo.cache_dir = engine_cache.path();
  auto engine = Engine::Create(eo);
  Die(engine.status(), "engine");
  json out = {{"bench", "kiln_wire"}, {"machine", Machine()}, {"transport", f.transport}};

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
    std::fprintf(stderr, "kiln_wire: 4 MiB in / 4 MiB out\n");
    Side s = Measure(**client, session->session_id(), in, **engine, *compiled->executable,
                     nullptr, f, in.at("x"), "y");
    const double added = Percentile(s.added, 0.5);
    out["four_mib"] = {{"graph", "y = x * 1, f32[1048576], cpu:0"},
                       {"kilnd_client_latency", Summary(s.kilnd)},
                       {"kilnd_engine_run", Summary(s.kilnd_engine)},
                       {"added_by_grpc_and_kilnd", Summary(s.added)},
                       {"in_process_run", Summary(s.in_process)},
                       {"added_p50_ms", added / 1000},
                       {"target_added_ms", 2.0},
                       {"met", added <= 2000}};
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
                     params->get(), f, local->outputs[0].second, local->outputs[0].first);
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
  // The in-process engine's OpenMP team waits as kilnd's does (base/openmp_policy.h).
  kiln::UseBoundedOpenMpSpin(argv);
  kiln::TuneMallocForLargeTensors();
  return kiln::Main(argc, argv);
}
