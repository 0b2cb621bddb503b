// kiln_shm_bench: what moving 4 MiB in and 4 MiB out costs through kilnd
// (issue 12 item 3), gRPC bytes against shared memory, side by side in one
// run. The graph is y = x * 1 with x f32[1024, 1024]; every run asks for its
// dispatch report, and "added" is the client-observed latency minus the
// engine's run time of that same run (report.run_micros), so the engine's
// own work (one pass over 4 MiB) is not counted for either transport.
//
//   grpc       kiln::Client with shared memory off: tensors in the messages
//   grpc_unix  the same as grpc over kilnd's Unix-domain-socket listener
//              (HTTP/2 without TCP), when there is one
//   shm_copy   kiln::Client with shared memory on: the client copies the
//              input into its region and the outputs out of it (what a
//              caller holding HostTensors gets)
//   shm_inplace  the tensor lives in shared memory: a RunRequest naming a
//              region the caller filled once, outputs read in place (what
//              a caller that lays out its tensors in shared memory gets),
//              sent as a gRPC Run
//   shm_inplace_socket  the same RunRequest sent over kilnd's shared-memory
//              socket (ShmConnection::TryRun; docs/server.md "Runs over the
//              socket"), when the kilnd takes runs there
// shm_copy is the default client: since sock12 its Run goes over the socket too
// (RunResult::shm_run says; "shm_copy_socket_runs" in the JSON).
//
// Blocks of runs alternate grpc, shm_copy, shm_inplace, grpc_unix,
// shm_inplace_socket; medians and p90 per mode. --kilnd runs another build's
// kilnd (main's, for a before/after in one run). Starts its own kilnd unless --addr is given. Prints one JSON object
// on stdout.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "clients/cpp/client.h"
#include "clients/cpp/shm.h"
#include "nlohmann/json.hpp"
#include "tests/clients/kilnd_child.h"

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * v.size()));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

struct Samples {
  std::vector<double> total_us, engine_us, added_us;
  void Add(double total, double engine) {
    total_us.push_back(total);
    engine_us.push_back(engine);
    added_us.push_back(total - engine);
  }
  nlohmann::json Json() const {
    return {{"runs", total_us.size()},
            {"total_ms_p50", Percentile(total_us, 0.5) / 1000},
            {"engine_ms_p50", Percentile(engine_us, 0.5) / 1000},
            {"added_ms_p50", Percentile(added_us, 0.5) / 1000},
            {"added_ms_p90", Percentile(added_us, 0.9) / 1000},
            {"added_ms_min", Percentile(added_us, 0.0) / 1000}};
  }
};

double Load() {
  double load[3] = {0, 0, 0};
  return getloadavg(load, 3) < 0 ? -1 : load[0];
}

int Main(int argc, char** argv) {
  CLI::App app("kiln_shm_bench: 4 MiB in / 4 MiB out through kilnd, gRPC vs shared memory");
  std::string addr;
  int blocks = 10, runs = 20, n = 1024;
  app.add_option("--addr", addr, "a running kilnd on this host (default: start one)");
  app.add_option("--blocks", blocks, "alternating blocks per mode");
  app.add_option("--runs", runs, "runs per block");
  app.add_option("--n", n, "x is f32[n, n]");
  std::string kilnd_binary;
  app.add_option("--kilnd", kilnd_binary, "the kilnd binary to start (default: this build's)");
  std::string unix_socket;
  app.add_option("--unix-socket", unix_socket,
                 "with --addr: kilnd's Unix socket path, for the grpc_unix mode");
  CLI11_PARSE(app, argc, argv);
  TuneMallocForLargeTensors();

  std::unique_ptr<testing::ScratchDir> cache;
  std::unique_ptr<testing::KilndChild> kilnd;
  if (addr.empty()) {
    cache = std::make_unique<testing::ScratchDir>();
    unix_socket = cache->path() + "/kilnd.sock";
    auto k = testing::KilndChild::Start(cache->path() + "/cache", kilnd_binary,
                                        {"--listen=127.0.0.1:0,unix:" + unix_socket});
    if (!k.ok()) {
      std::fprintf(stderr, "kilnd: %s\n", std::string(k.status().message()).c_str());
      return 1;
    }
    kilnd = *std::move(k);
    addr = kilnd->addr();
  }
  ClientOptions on, off;
  off.shared_memory = false;
  auto shm_client = Client::Create(addr, on);
  auto grpc_client = Client::Create(addr, off);
  if (!shm_client.ok() || !grpc_client.ok()) return 1;
  std::unique_ptr<Client> unix_client;
  if (!unix_socket.empty()) {
    auto c = Client::Create("unix:" + unix_socket, off);
    if (!c.ok()) return 1;
    unix_client = *std::move(c);
  }
  // Modes 0 grpc, 1 shm_copy, 2 shm_inplace, 3 grpc_unix (when a Unix
  // socket), 4 shm_inplace_socket (when kilnd takes runs on its socket).
  std::vector<int> modes = {0, 1, 2};
  if (unix_client) modes.push_back(3);
  const std::string text = "graph \"identity\"\ninput x: f32[" + std::to_string(n) + ", " +
                           std::to_string(n) + "]\nlet y = x * 1\nout y\n";
  auto session = (*grpc_client)->CreateSession(GraphFromText(text));
  if (!session.ok()) {
    std::fprintf(stderr, "session: %s\n", std::string(session.status().message()).c_str());
    return 1;
  }
  const std::string& sid = session->session_id();
  std::vector<float> values(static_cast<size_t>(n) * n);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 977) * 0.5f;
  TensorMap inputs;
  inputs.emplace("x", HostTensor::FromVector(v1::DTYPE_F32, {n, n}, values));
  const int64_t bytes = static_cast<int64_t>(values.size()) * 4;

  // The in-place mode's region: input at 0, the output area after it.
  auto ctx = (*grpc_client)->NewContext();
  auto connection = ShmConnection::Connect((*grpc_client)->stub(), *ctx);
  if (!connection.ok()) {
    std::fprintf(stderr, "shared memory: %s\n", std::string(connection.status().message()).c_str());
    return 1;
  }
  auto region = (*connection)->CreateRegion("bench-inplace", 2 * bytes + 4096);
  if (!region.ok()) return 1;
  if ((*connection)->takes_runs()) modes.push_back(4);
  std::memcpy((*region)->data(), values.data(), bytes);
  v1::RunRequest inplace;
  inplace.set_session_id(sid);
  inplace.set_report(true);
  v1::NamedTensor* x = inplace.add_inputs();
  x->set_name("x");
  x->mutable_tensor()->set_dtype(v1::DTYPE_F32);
  x->mutable_tensor()->add_dims(n);
  x->mutable_tensor()->add_dims(n);
  x->mutable_shm()->set_region_id("bench-inplace");
  x->mutable_shm()->set_offset(0);
  x->mutable_shm()->set_bytes(bytes);
  inplace.mutable_shm_output_area()->set_region_id("bench-inplace");
  inplace.mutable_shm_output_area()->set_offset(bytes);
  inplace.mutable_shm_output_area()->set_bytes(bytes + 4096);

  Client::RunOptions with_report;
  with_report.report = true;
  Samples grpc, shm_copy, shm_inplace, grpc_unix, shm_inplace_socket;
  bool checked = false;
  bool shm_copy_socket_runs = true;
  auto one = [&](int mode, bool record) -> bool {
    const auto t0 = Clock::now();
    double engine_us = 0;
    if (mode == 2 || mode == 4) {
      v1::RunResponse resp;
      grpc::Status s;
      if (mode == 2) {
        auto c = (*grpc_client)->NewContext();
        s = (*grpc_client)->stub().Run(c.get(), inplace, &resp);
      } else {
        std::optional<absl::StatusOr<v1::RunResponse>> r =
            (*connection)->TryRun(inplace, absl::InfiniteFuture());
        if (!r || !r->ok()) {
          std::fprintf(stderr, "in place over the socket: %s\n",
                       !r ? "not sent" : std::string(r->status().message()).c_str());
          return false;
        }
        resp = **std::move(r);
      }
      if (!s.ok() || resp.outputs_size() != 1 || !resp.outputs(0).has_shm()) {
        std::fprintf(stderr, "in place: %s\n", s.error_message().c_str());
        return false;
      }
      // The caller reads y where it is; touch it as a reader would.
      const float* y =
          reinterpret_cast<const float*>((*region)->data() + resp.outputs(0).shm().offset());
      if (!checked && (y[12345] != values[12345] || y[values.size() - 1] != values.back())) {
        std::fprintf(stderr, "in place: wrong output\n");
        return false;
      }
      engine_us = resp.report().run_micros();
    } else {
      const Client& client = mode == 0 ? **grpc_client : mode == 1 ? **shm_client : *unix_client;
      auto r = client.Run(sid, inputs, with_report);
      if (!r.ok() || r->shared_memory != (mode == 1)) {
        std::fprintf(stderr, "mode %d: %s\n", mode, r.ok() ? "transport" : std::string(r.status().message()).c_str());
        return false;
      }
      if (!checked && r->output("y")->data_as<float>()[777] != values[777]) return false;
      if (mode == 1) shm_copy_socket_runs = shm_copy_socket_runs && r->shm_run;
      engine_us = r->report.run_micros();
    }
    const double total_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (record) {
      (mode == 0   ? grpc
       : mode == 1 ? shm_copy
       : mode == 2 ? shm_inplace
       : mode == 3 ? grpc_unix
                   : shm_inplace_socket)
          .Add(total_us, engine_us);
    }
    return true;
  };
  for (int mode : modes) {
    for (int i = 0; i < 5; ++i) {
      if (!one(mode, false)) return 1;
    }
  }
  checked = true;
  for (int b = 0; b < blocks; ++b) {
    for (int mode : modes) {
      for (int i = 0; i < runs; ++i) {
        if (!one(mode, true)) return 1;
      }
    }
  }
  const double g = Percentile(grpc.added_us, 0.5) / 1000;
  const double c = Percentile(shm_copy.added_us, 0.5) / 1000;
  const double p = Percentile(shm_inplace.added_us, 0.5) / 1000;
  nlohmann::json out = {
      {"bench", "kiln_shm_bench"},
      {"tensor_bytes_each_way", bytes},
      {"grpc", grpc.Json()},
      {"shm_copy", shm_copy.Json()},
      {"shm_inplace", shm_inplace.Json()},
      {"grpc_over_shm_inplace_added", p > 0 ? g / p : 0},
      {"load_1min", Load()},
      {"targets",
       {{"grpc_added_ms<=2", g <= 2}, {"shm_added_ms<=0.2", p <= 0.2}, {"shm_copy_added_ms", c}}}};
  out["shm_copy_socket_runs"] = shm_copy_socket_runs;
  if (std::find(modes.begin(), modes.end(), 4) != modes.end()) {
    const double k = Percentile(shm_inplace_socket.added_us, 0.5) / 1000;
    out["shm_inplace_socket"] = shm_inplace_socket.Json();
    out["targets"]["shm_socket_added_ms<=0.2"] = k <= 0.2;
    out["shm_inplace_grpc_over_socket_added"] = k > 0 ? p / k : 0;
  }
  if (unix_client) {
    const double u = Percentile(grpc_unix.added_us, 0.5) / 1000;
    out["grpc_unix"] = grpc_unix.Json();
    out["grpc_tcp_over_unix_added"] = u > 0 ? g / u : 0;
    out["targets"]["grpc_unix_added_ms<=2"] = u <= 2;
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::Main(argc, argv); }
