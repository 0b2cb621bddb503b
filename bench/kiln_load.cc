// kiln_load: what kilnd costs over loopback gRPC (issue 3's benchmarks).
//
//   (a) overhead: a 1-element graph (x + 1) at concurrency 1, through a
//       session and one-shot (graph inline); p50/p99 client-observed latency,
//       next to a grpc.health Check as the floor of one gRPC round trip;
//   (b) throughput at concurrency 1..64 (closed loop, one thread per
//       outstanding call) for the tiny graph and the BERT-base encoder layer
//       (session with params, batch 1, seq 128);
//   (c) the encoder layer through kilnd vs the in-process Engine in this
//       process, alternating blocks of runs A B A B; overhead of the medians;
//   (d) with --batching, only: batch-1 requests from 16 callers with dynamic
//       batching on vs off, alternating blocks; the ratio. --batching-model
//       picks the model: the BERT-base encoder layer (each batch-1 request is
//       already 128 rows) or the MLP 784-512-512-10 (one row per request).
//
// Starts its own kilnd (temp cache dir, ephemeral ports, a queue quota that
// admits the highest concurrency) unless --addr is given. Prints one JSON object on one line of
// stdout (bench/run_all.sh collects one per line); progress goes to stderr.
#include <sys/resource.h>
#include <time.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/openmp_policy.h"
#include "clients/cpp/client.h"
#include "clients/cpp/graph_builder.h"
#include "engine/engine.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"
#include "tests/clients/kilnd_child.h"
#include "tests/e2e/models.h"

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double MicrosSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// Nearest-rank percentile; `v` is sorted in place.
double Percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * v.size()));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

double Median(std::vector<double> v) { return Percentile(v, 0.5); }

json Summary(std::vector<double> us) {
  double sum = 0;
  for (double u : us) sum += u;
  const size_t n = us.size();
  return {{"runs", n},
          {"mean_us", n ? sum / n : 0},
          {"p50_us", Percentile(us, 0.5)},
          {"p90_us", Percentile(us, 0.9)},
          {"p99_us", Percentile(us, 0.99)},
          {"max_us", n ? us.back() : 0}};
}

void Die(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "kiln_load: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

std::string Trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

json Machine() {
  std::string model;
  std::ifstream cpu("/proc/cpuinfo");
  for (std::string line; std::getline(cpu, line);) {
    if (line.rfind("model name", 0) == 0) {
      model = Trim(line.substr(line.find(':') + 2));
      break;
    }
  }
  utsname u{};
  uname(&u);
  return {{"cpu", model},
          {"cores", std::thread::hardware_concurrency()},
          {"kernel", std::string(u.release)},
          {"date", absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone())}};
}

// CPU seconds (user + system) used so far by this process and by `pid`
// (kilnd; -1: none, e.g. --addr), so a block's CPU per run can be compared
// across modes: unlike runs/s it does not depend on what else the host runs.
double CpuSeconds(pid_t pid) {
  rusage self{};
  getrusage(RUSAGE_SELF, &self);
  double s = self.ru_utime.tv_sec + self.ru_stime.tv_sec +
             1e-6 * (self.ru_utime.tv_usec + self.ru_stime.tv_usec);
  if (pid <= 0) return s;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  // Fields 14 and 15 (utime, stime, in clock ticks) follow the ")" of the name.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i >= 14) ticks += std::stod(field);
  }
  return s + ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// What a process has used so far: its CPU time to the nanosecond (its
// process CPU clock, clock_getcpuclockid: cheap, unlike reading every
// thread's /proc file, which a block's figure would count) and its minor page
// faults (/proc/PID/stat, field 10). Per run, around blocks of runs, it says
// where a run's CPU goes (this process or kilnd) and whether a side faults per
// run; clock ticks (CpuSeconds) are too coarse for one block.
struct ProcUse {
  double cpu_us = 0;
  double minflt = 0;
};

ProcUse ReadProcUse(pid_t pid) {
  ProcUse u;
  clockid_t clock = CLOCK_PROCESS_CPUTIME_ID;
  if (pid > 0 && clock_getcpuclockid(pid, &clock) != 0) return u;
  timespec ts{};
  if (clock_gettime(clock, &ts) == 0) u.cpu_us = ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
  std::ifstream stat(pid > 0 ? "/proc/" + std::to_string(pid) + "/stat" : "/proc/self/stat");
  std::string line;
  std::getline(stat, line);
  std::istringstream rest(line.substr(line.rfind(')') + 2));  // field 3 onwards
  std::string field;
  for (int i = 3; i <= 10 && rest >> field; ++i) {
    if (i == 10) u.minflt = std::stod(field);
  }
  return u;
}

// One closed loop per thread for `seconds`: each thread issues its next call
// when the previous one returns.
template <typename Call>
json Throughput(int concurrency, double seconds, const Call& call) {
  std::vector<std::vector<double>> lat(concurrency);
  std::atomic<bool> go{false};
  std::atomic<int> errors{0};
  absl::Mutex first_error_mu;
  absl::Status first_error;  // guarded by first_error_mu
  std::vector<std::thread> threads;
  threads.reserve(concurrency);
  Clock::time_point start;
  const auto duration = std::chrono::duration<double>(seconds);
  for (int t = 0; t < concurrency; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      while (Clock::now() - start < duration) {
        const auto t0 = Clock::now();
        if (absl::Status s = call(); !s.ok()) {
          errors.fetch_add(1);
          absl::MutexLock lock(&first_error_mu);
          if (first_error.ok()) first_error = s;
          continue;
        }
        lat[t].push_back(MicrosSince(t0));
      }
    });
  }
  start = Clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : threads) th.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  json j = Summary(all);  // successful runs only
  j["concurrency"] = concurrency;
  j["runs_per_s"] = all.size() / elapsed;
  j["errors"] = errors.load();
  if (!first_error.ok()) j["first_error"] = first_error.ToString();
  return j;
}

struct Flags {
  std::string addr;
  std::string kilnd;
  int tiny_rounds = 5;
  int tiny_runs = 2000;
  double tiny_seconds = 1.5;
  double encoder_seconds = 3.0;
  int encoder_blocks = 20;
  int block_runs = 4;
  int payload_runs = 200;
  std::vector<int> concurrency = {1, 2, 4, 8, 16, 32, 64};
  bool skip_encoder = false;
  // --batching: only (d), dynamic batching on vs off.
  bool batching = false;
  int callers = 16;
  int max_batch = 16;
  int64_t delay_us = 2000;
  double batching_seconds = 4.0;
  int batching_blocks = 3;
  std::string batching_model = "encoder";  // or "mlp"
  std::string device;                      // (d) the sessions' CompileOptions.device ("": kilnd's)
  // --encoder-overhead: only (c).
  bool encoder_overhead = false;
};

// (d) Batch-1 requests of the encoder layer or the MLP from `callers`
// closed-loop callers through two sessions of one kilnd, dynamic batching on
// (max_batch, delay_us) and off, in alternating blocks A B A B after a
// warm-up that compiles the batch sizes. Prints one JSON line.
int Batching(const Client& client, const Flags& f, pid_t kilnd_pid, json out) {
  const bool mlp = f.batching_model == "mlp";
  const models::EncoderConfig config;
  models::Model m = mlp ? models::Mlp() : models::EncoderLayer(config);
  std::mt19937_64 rng(5);
  std::vector<TensorMap> inputs(static_cast<size_t>(f.callers));
  for (TensorMap& in : inputs) {
    in.emplace("x", mlp ? models::RandomF32(rng, {1, 784}, 1.0)
                        : models::RandomF32(rng, {1, config.seq, config.hidden}, 1.0));
  }
  std::string ids[2];  // 0: batching off, 1: on
  for (int on = 0; on < 2; ++on) {
    v1::CompileOptions options;
    options.set_device(f.device);
    if (on) {
      options.mutable_batching()->set_max_batch(f.max_batch);
      options.mutable_batching()->set_max_queue_delay_micros(f.delay_us);
    }
    auto session = client.CreateSession(GraphFromProto(m.graph), options);
    Die(session.status(), "encoder session");
    ids[on] = session->session_id();
    Die(client.SetParams(ids[on], m.params).status(), "encoder params");
  }
  // Each caller sends its own input (and checks nothing: the tests do). The
  // report (asked for in both modes alike) says how many rows each run's
  // batch had.
  std::atomic<int> next{0};
  std::atomic<int64_t> batch_rows{0}, batched_runs{0};
  Client::RunOptions with_report;
  with_report.report = true;
  auto caller_call = [&](int on) {
    thread_local int me = -1;
    if (me < 0) me = next.fetch_add(1) % f.callers;
    absl::StatusOr<Client::RunResult> r =
        client.Run(ids[on], inputs[static_cast<size_t>(me)], with_report);
    if (r.ok() && on) {
      batch_rows.fetch_add(std::max<int64_t>(1, r->report.batch().batch_rows()));
      batched_runs.fetch_add(1);
    }
    return r.status();
  };
  std::fprintf(stderr, "kiln_load: batching warm-up (compiles each batch size)\n");
  for (int on = 0; on < 2; ++on) {
    Throughput(f.callers, on ? 3 * f.batching_seconds : 1.0, [&] { return caller_call(on); });
  }
  std::vector<json> blocks[2];
  std::vector<double> rates[2], cpu_per_run[2];
  for (int b = 0; b < f.batching_blocks; ++b) {
    for (int on = 0; on < 2; ++on) {
      std::fprintf(stderr, "kiln_load: batching %s, block %d\n", on ? "on" : "off", b);
      batch_rows.store(0);
      batched_runs.store(0);
      const double cpu0 = CpuSeconds(kilnd_pid);
      json j = Throughput(f.callers, f.batching_seconds, [&] { return caller_call(on); });
      const double cpu = CpuSeconds(kilnd_pid) - cpu0;
      const double runs = j["runs"].get<double>();
      j["cpu_us_per_run"] = runs > 0 ? 1e6 * cpu / runs : 0;
      cpu_per_run[on].push_back(j["cpu_us_per_run"].get<double>());
      if (on && batched_runs.load() > 0) {
        j["mean_batch_rows"] = static_cast<double>(batch_rows.load()) / batched_runs.load();
      }
      rates[on].push_back(j["runs_per_s"].get<double>());
      blocks[on].push_back(std::move(j));
    }
  }
  std::vector<double> ratio;
  for (int b = 0; b < f.batching_blocks; ++b) ratio.push_back(rates[1][b] / rates[0][b]);
  out["batching"] = {{"model", mlp ? "MLP 784-512-512-10, f32, batch 1"
                                   : "BERT-base encoder layer, f32, batch 1, seq 128"},
                     {"callers", f.callers},
                     {"device", f.device.empty() ? "default" : f.device},
                     {"max_batch", f.max_batch},
                     {"max_queue_delay_us", f.delay_us},
                     {"seconds_per_block", f.batching_seconds},
                     {"off_blocks", blocks[0]},
                     {"on_blocks", blocks[1]},
                     {"off_runs_per_s_median", Median(rates[0])},
                     {"on_runs_per_s_median", Median(rates[1])},
                     {"ratio_median_of_blocks", Median(ratio)},
                     // client + kilnd CPU per run: what throughput on an
                     // otherwise idle host follows
                     {"off_cpu_us_per_run_median", Median(cpu_per_run[0])},
                     {"on_cpu_us_per_run_median", Median(cpu_per_run[1])},
                     {"cpu_per_run_off_over_on", Median(cpu_per_run[0]) / Median(cpu_per_run[1])},
                     {"target_ratio", 2.0}};
  std::printf("%s\n", out.dump().c_str());
  for (const std::string& id : ids) Die(client.CloseSession(id), "close");
  return 0;
}

// (c) The encoder layer `m` through kilnd's session `enc_id` vs the same
// layer in this process, alternating blocks A B A B; sets out["encoder_overhead"].
// `kilnd_pid` (-1: not known, --addr) adds kilnd's CPU time and page faults
// per run to this process's, for each side.
void EncoderOverhead(const Client& client, const models::Model& m, const std::string& enc_id,
                     const TensorMap& enc_in, const Flags& f, pid_t kilnd_pid, json& out) {
  const models::EncoderConfig config;
  auto run_encoder = [&] { return client.Run(enc_id, enc_in).status(); };
  std::fprintf(stderr, "kiln_load: encoder layer, in-process vs kilnd\n");
  testing::ScratchDir engine_cache;
  EngineOptions eo;
  eo.cache_dir = engine_cache.path();
  auto engine = Engine::Create(eo);
  Die(engine.status(), "engine");
  auto compiled = (*engine)->Compile(m.graph, {}, {{"x", {1, config.seq, config.hidden}}});
  Die(compiled.status(), "in-process compile");
  const std::vector<TensorRef> param_refs = models::ParamRefs(m);
  auto params = (*engine)->CreateParams(param_refs);
  Die(params.status(), "in-process params");
  const std::vector<TensorRef> in_refs = {TensorRef::Of("x", enc_in.at("x"))};
  auto run_inproc = [&] {
    return (*engine)->Run(*compiled->executable, in_refs, params->get(), {}).status();
  };
  for (int i = 0; i < 5; ++i) Die(run_inproc(), "in-process warm-up");
  // Blocks alternate A B A B; the first run of each block is dropped, so the
  // other side's spinning OpenMP threads and cold caches do not count.
  // kilnd's own report of each timed run splits its latency into the engine
  // run inside kilnd and the rest (gRPC, copies, request handling).
  std::vector<double> a, b, ratio, served_engine, served_rest;
  // Per run of each block's timed runs: CPU and minor faults of this process
  // and of kilnd, [0] in-process blocks, [1] kilnd blocks.
  std::vector<double> self_cpu[2], kilnd_cpu[2], self_flt[2], kilnd_flt[2];
  for (int block = 0; block < f.encoder_blocks; ++block) {
    for (const bool inproc : {block % 2 == 0, block % 2 != 0}) {
      std::vector<double> kept;
      ProcUse self0, kilnd0;
      for (int i = 0; i <= f.block_runs; ++i) {
        if (i == 1) {
          self0 = ReadProcUse(-1);
          if (kilnd_pid > 0) kilnd0 = ReadProcUse(kilnd_pid);
        }
        const auto t0 = Clock::now();
        Die(inproc ? run_inproc() : run_encoder(), "encoder A/B");
        if (i > 0) kept.push_back(MicrosSince(t0));
      }
      const int side = inproc ? 0 : 1;
      const double n = static_cast<double>(f.block_runs);
      const ProcUse self1 = ReadProcUse(-1);
      self_cpu[side].push_back((self1.cpu_us - self0.cpu_us) / n);
      self_flt[side].push_back((self1.minflt - self0.minflt) / n);
      if (kilnd_pid > 0) {
        const ProcUse kilnd1 = ReadProcUse(kilnd_pid);
        kilnd_cpu[side].push_back((kilnd1.cpu_us - kilnd0.cpu_us) / n);
        kilnd_flt[side].push_back((kilnd1.minflt - kilnd0.minflt) / n);
      }
      (inproc ? a : b).insert((inproc ? a : b).end(), kept.begin(), kept.end());
      if (inproc) continue;
      auto reports = client.GetReports(f.block_runs);  // this block's timed runs, oldest first
      Die(reports.status(), "reports");
      for (size_t i = 0; i < reports->size() && i < kept.size(); ++i) {
        served_engine.push_back((*reports)[i].run_micros());
        served_rest.push_back(kept[i] - (*reports)[i].run_micros());
      }
    }
    // Ratio of this block pair's medians.
    const size_t n = static_cast<size_t>(f.block_runs);
    ratio.push_back(Median({b.end() - n, b.end()}) / Median({a.end() - n, a.end()}));
  }
  const double ma = Median(a), mb = Median(b);
  const absl::StatusOr<Client::RunResult> last = client.Run(enc_id, enc_in);
  Die(last.status(), "encoder run");
  out["encoder_overhead"] = {{"model", "BERT-base encoder layer, f32, batch 1, seq 128"},
                             {"blocks", f.encoder_blocks},
                             {"runs_per_block", f.block_runs},
                             {"in_process", Summary(a)},
                             {"kilnd", Summary(b)},
                             {"overhead_pct_of_medians", 100.0 * (mb - ma) / ma},
                             {"overhead_pct_median_of_block_ratios", 100.0 * (Median(ratio) - 1.0)},
                             {"kilnd_engine_run_p50_us", Median(served_engine)},
                             {"kilnd_non_engine_p50_us", Median(served_rest)},
                             {"non_engine_pct_of_in_process", 100.0 * Median(served_rest) / ma},
                             {"shared_memory", last->shared_memory},
                             {"shm_run", last->shm_run},  // over kilnd's shared-memory socket
                             {"target_pct", 5}};
  // Medians over blocks of the per-run figures; kilnd's are absent with --addr.
  for (const int side : {0, 1}) {
    json use = {{"client_process_cpu_us_per_run", Median(self_cpu[side])},
                {"client_process_minflt_per_run", Median(self_flt[side])}};
    if (kilnd_pid > 0) {
      use["kilnd_cpu_us_per_run"] = Median(kilnd_cpu[side]);
      use["kilnd_minflt_per_run"] = Median(kilnd_flt[side]);
      use["both_cpu_us_per_run"] = Median(self_cpu[side]) + Median(kilnd_cpu[side]);
    }
    out["encoder_overhead"][side == 0 ? "in_process_blocks" : "kilnd_blocks"] = use;
  }
}

int Main(int argc, char** argv) {
  Flags f;
  CLI::App app{"kiln_load: kilnd overhead and throughput over loopback gRPC (JSON on stdout)"};
  app.add_option("--addr", f.addr, "a running kilnd (default: start one)");
  app.add_option("--kilnd", f.kilnd, "kilnd binary to start")->capture_default_str();
  app.add_option("--tiny-rounds", f.tiny_rounds, "rounds of sequential tiny runs")
      ->capture_default_str();
  app.add_option("--tiny-runs", f.tiny_runs, "tiny runs per round")->capture_default_str();
  app.add_option("--tiny-seconds", f.tiny_seconds, "seconds per tiny throughput point")
      ->capture_default_str();
  app.add_option("--encoder-seconds", f.encoder_seconds, "seconds per encoder throughput point")
      ->capture_default_str();
  app.add_option("--encoder-blocks", f.encoder_blocks, "A/B blocks, in-process vs kilnd")
      ->capture_default_str();
  app.add_option("--block-runs", f.block_runs, "timed runs per block (after one untimed)")
      ->capture_default_str();
  app.add_option("--payload-runs", f.payload_runs, "runs per payload case")->capture_default_str();
  app.add_option("--concurrency", f.concurrency, "throughput points")->delimiter(',');
  app.add_flag("--skip-encoder", f.skip_encoder, "only the tiny graph");
  app.add_flag("--batching", f.batching,
               "only (d): encoder-layer requests with dynamic batching on vs off");
  app.add_option("--callers", f.callers, "(d) concurrent callers")->capture_default_str();
  app.add_option("--max-batch", f.max_batch, "(d) max_batch")->capture_default_str();
  app.add_option("--delay-us", f.delay_us, "(d) max_queue_delay_micros")->capture_default_str();
  app.add_option("--batching-seconds", f.batching_seconds, "(d) seconds per block")
      ->capture_default_str();
  app.add_option("--batching-blocks", f.batching_blocks, "(d) blocks each of on and off")
      ->capture_default_str();
  app.add_flag("--encoder-overhead", f.encoder_overhead,
               "only (c): the encoder layer through kilnd vs in this process");
  app.add_option("--device", f.device, "(d) the sessions' device, e.g. cuda:0 (default: kilnd's)");
  app.add_option("--batching-model", f.batching_model, "(d) the model: encoder or mlp")
      ->check(CLI::IsMember({"encoder", "mlp"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  // The in-process engine logs through spdlog: to stderr, keeping stdout JSON.
  spdlog::set_default_logger(spdlog::stderr_color_mt("kiln_load"));

  json out;
  out["machine"] = Machine();
  std::string cmd;
  for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + std::string(argv[i]);
  out["command"] = cmd;

  std::unique_ptr<testing::ScratchDir> cache;
  std::unique_ptr<testing::KilndChild> kilnd;
  if (f.addr.empty()) {
    cache = std::make_unique<testing::ScratchDir>();
    // Queue room for every thread of the highest concurrency: the default
    // quota (64 in flight, 32 queued) answers RESOURCE_EXHAUSTED beyond it.
    const int most = *std::max_element(f.concurrency.begin(), f.concurrency.end());
    const std::string config = cache->path() + "/kilnd.textproto";
    std::ofstream(config) << "default_quota { max_in_flight: " << 2 * most + 8
                          << " max_queue: " << 2 * most + 8 << " }\n";
    auto k = testing::KilndChild::Start(cache->path() + "/cache", f.kilnd, {"--config=" + config});
    Die(k.status(), "starting kilnd");
    kilnd = std::move(*k);
    f.addr = kilnd->addr();
  }
  out["addr"] = f.addr;
  auto client_or = Client::Create(f.addr);
  Die(client_or.status(), "connecting");
  const Client& client = **client_or;
  if (f.batching) return Batching(client, f, kilnd ? kilnd->pid() : -1, std::move(out));
  if (f.encoder_overhead) {
    const models::EncoderConfig config;
    models::Model m = models::EncoderLayer(config);
    std::mt19937_64 rng(1);
    TensorMap enc_in;
    enc_in.emplace("x", models::RandomF32(rng, {1, config.seq, config.hidden}, 1.0));
    auto session = client.CreateSession(GraphFromProto(m.graph));
    Die(session.status(), "encoder session");
    Die(client.SetParams(session->session_id(), m.params).status(), "encoder params");
    for (int i = 0; i < 5; ++i) Die(client.Run(session->session_id(), enc_in).status(), "warm-up");
    EncoderOverhead(client, m, session->session_id(), enc_in, f, kilnd ? kilnd->pid() : -1, out);
    std::printf("%s\n", out.dump().c_str());
    Die(client.CloseSession(session->session_id()), "close");
    return 0;
  }

  // (a) The tiny graph: x f32[1] -> x + 1.
  std::fprintf(stderr, "kiln_load: tiny graph, concurrency 1\n");
  GraphBuilder tiny("plus_one");
  tiny.output("y", tiny.add(tiny.input("x", v1::DTYPE_F32, {int64_t{1}}), tiny.scalar(1.0)));
  const v1::GraphSource tiny_src = GraphFromProto(tiny.Build());
  TensorMap tiny_in;
  tiny_in.emplace("x", HostTensor::FromVector<float>(v1::DTYPE_F32, {1}, {41.0f}));
  auto tiny_session = client.CreateSession(tiny_src);
  Die(tiny_session.status(), "tiny session");
  const std::string tiny_id = tiny_session->session_id();
  auto check = client.Run(tiny_id, tiny_in);
  Die(check.status(), "tiny run");
  if (check->outputs.at(0).second.data_as<float>()[0] != 42.0f)
    Die(absl::InternalError("x + 1 != 42"), "tiny run");

  auto run_session = [&] { return client.Run(tiny_id, tiny_in).status(); };
  auto run_oneshot = [&] { return client.Run(tiny_src, tiny_in).status(); };
  auto health = [&] { return client.Health().status(); };
  for (int i = 0; i < 500; ++i) {  // warm up the channel, caches and pools
    Die(run_session(), "warm-up");
    Die(run_oneshot(), "warm-up");
    Die(health(), "warm-up");
  }
  // Rounds alternate the three kinds of call so drift hits them alike.
  std::vector<double> all_s, all_o, all_h, p50_s, p99_s, p50_o, p99_o, p50_h;
  for (int round = 0; round < f.tiny_rounds; ++round) {
    std::vector<double> s, o, h;
    for (int i = 0; i < f.tiny_runs; ++i) {
      auto t0 = Clock::now();
      Die(run_session(), "tiny session run");
      s.push_back(MicrosSince(t0));
      t0 = Clock::now();
      Die(run_oneshot(), "tiny one-shot run");
      o.push_back(MicrosSince(t0));
      t0 = Clock::now();
      Die(health(), "health");
      h.push_back(MicrosSince(t0));
    }
    all_s.insert(all_s.end(), s.begin(), s.end());
    all_o.insert(all_o.end(), o.begin(), o.end());
    all_h.insert(all_h.end(), h.begin(), h.end());
    p50_s.push_back(Percentile(s, 0.5));
    p99_s.push_back(Percentile(s, 0.99));
    p50_o.push_back(Percentile(o, 0.5));
    p99_o.push_back(Percentile(o, 0.99));
    p50_h.push_back(Percentile(h, 0.5));
  }
  // What kilnd itself measured for the last runs (it keeps a report of each):
  // the engine's run and the wait for a run slot. The rest of the client's
  // latency is gRPC, (de)serialization and the server's request handling.
  std::vector<double> server_run, server_queue;
  if (auto kept = client.GetReports(0); kept.ok()) {
    for (const v1::DispatchReport& r : *kept) {
      server_run.push_back(r.run_micros());
      server_queue.push_back(r.queue_micros());
    }
  }
  out["tiny_overhead"] = {
      {"graph", "x f32[1] -> x + 1"},
      {"rounds", f.tiny_rounds},
      {"runs_per_round", f.tiny_runs},
      {"session",
       {{"pooled", Summary(all_s)},
        {"p50_us_median_of_rounds", Median(p50_s)},
        {"p99_us_median_of_rounds", Median(p99_s)}}},
      {"one_shot",
       {{"pooled", Summary(all_o)},
        {"p50_us_median_of_rounds", Median(p50_o)},
        {"p99_us_median_of_rounds", Median(p99_o)}}},
      {"grpc_health_check",
       {{"pooled", Summary(all_h)}, {"p50_us_median_of_rounds", Median(p50_h)}}},
      {"server_side_last_runs",
       {{"runs", server_run.size()},
        {"engine_run_p50_us", Median(server_run)},
        {"queue_p50_us", Median(server_queue)}}},
      {"targets", {{"p50_us", 100}, {"p99_us", 300}}}};

  // (a') What moving an encoder layer's activation (f32[1, 128, 768], 384 KiB)
  // costs per direction, with graphs that do almost nothing else.
  std::fprintf(stderr, "kiln_load: payload cost, concurrency 1\n");
  json payload = json::array();
  {
    struct Case {
      const char* name;
      std::function<void(GraphBuilder&)> build;
      Dims in;
    };
    const Dims big = {1, 128, 768};
    const std::vector<Case> cases = {
        {"4 B in, 4 B out",
         [](GraphBuilder& g) {
           g.output("y", g.add(g.input("x", v1::DTYPE_F32, {int64_t{1}}), g.scalar(1.0)));
         },
         {1}},
        {"384 KiB in, 4 B out",
         [&](GraphBuilder& g) {
           g.output(
               "y",
               g.reduce(v1::REDUCE_SUM,
                        g.input("x", v1::DTYPE_F32, {int64_t{1}, int64_t{128}, int64_t{768}}), {}));
         },
         big},
        {"4 B in, 384 KiB out",
         [&](GraphBuilder& g) {
           g.output("y", g.expand(g.input("x", v1::DTYPE_F32, {int64_t{1}, int64_t{1}, int64_t{1}}),
                                  big));
         },
         {1, 1, 1}},
        {"384 KiB in, 384 KiB out",
         [&](GraphBuilder& g) {
           g.output("y",
                    g.add(g.input("x", v1::DTYPE_F32, {int64_t{1}, int64_t{128}, int64_t{768}}),
                          g.scalar(1.0)));
         },
         big},
    };
    for (const Case& c : cases) {
      GraphBuilder g(c.name);
      c.build(g);
      auto session = client.CreateSession(GraphFromProto(g.Build()));
      Die(session.status(), "payload session");
      TensorMap in;
      in.emplace("x", std::move(HostTensor::Create(v1::DTYPE_F32, c.in)).value());
      std::vector<double> lat;
      for (int i = 0; i < 20 + f.payload_runs; ++i) {
        const auto t0 = Clock::now();
        Die(client.Run(session->session_id(), in).status(), "payload run");
        if (i >= 20) lat.push_back(MicrosSince(t0));
      }
      std::vector<double> engine;
      if (auto kept = client.GetReports(32); kept.ok()) {
        for (const v1::DispatchReport& r : *kept) engine.push_back(r.run_micros());
      }
      Die(client.CloseSession(session->session_id()), "close");
      payload.push_back({{"case", c.name},
                         {"client", Summary(lat)},
                         {"server_engine_run_p50_us", Median(engine)}});
    }
  }
  out["payload_cost"] = payload;

  // (b) Throughput curves.
  json tiny_curve = json::array();
  for (int c : f.concurrency) {
    std::fprintf(stderr, "kiln_load: tiny graph, concurrency %d\n", c);
    tiny_curve.push_back(Throughput(c, f.tiny_seconds, run_session));
  }
  out["tiny_throughput"] = tiny_curve;
  if (f.skip_encoder) {
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }

  const models::EncoderConfig config;
  models::Model m = models::EncoderLayer(config);
  std::mt19937_64 rng(1);
  TensorMap enc_in;
  enc_in.emplace("x", models::RandomF32(rng, {1, config.seq, config.hidden}, 1.0));
  auto enc_session = client.CreateSession(GraphFromProto(m.graph));
  Die(enc_session.status(), "encoder session");
  const std::string enc_id = enc_session->session_id();
  Die(client.SetParams(enc_id, m.params).status(), "encoder params");
  auto run_encoder = [&] { return client.Run(enc_id, enc_in).status(); };
  for (int i = 0; i < 5; ++i) Die(run_encoder(), "encoder warm-up");

  json enc_curve = json::array();
  for (int c : f.concurrency) {
    std::fprintf(stderr, "kiln_load: encoder layer, concurrency %d\n", c);
    enc_curve.push_back(Throughput(c, f.encoder_seconds, run_encoder));
  }
  out["encoder_throughput"] = enc_curve;

  EncoderOverhead(client, m, enc_id, enc_in, f, kilnd ? kilnd->pid() : -1, out);
  std::printf("%s\n", out.dump().c_str());
  Die(client.CloseSession(enc_id), "close");
  Die(client.CloseSession(tiny_id), "close");
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  // The in-process engine's OpenMP team waits as kilnd's does (base/openmp_policy.h);
  // the kilnd this starts inherits the same environment.
  kiln::UseBoundedOpenMpSpin(argv);
  // As kilnctl: both the client and the in-process engine of this process
  // keep their freed buffers (see TuneMallocForLargeTensors).
  kiln::TuneMallocForLargeTensors();
  try {
    return kiln::Main(argc, argv);
  } catch (const std::exception& e) {  // a library's (CLI11, JSON, allocation) unexpected error
    std::fprintf(stderr, "kiln_load: %s\n", e.what());
    return 1;
  }
}
