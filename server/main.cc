// kilnd: the Kiln daemon. See docs/server.md.
#include <pthread.h>
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/openmp_policy.h"
#include "server/config.h"
#include "server/server.h"

ABSL_FLAG(std::optional<std::string>, listen, std::nullopt,
          "gRPC addresses, comma-separated: host:port (default 127.0.0.1:7450; port 0 picks a "
          "free port) and unix:/path/kilnd.sock (a Unix socket; the peer's uid may pick its "
          "tenant: unix_peer_tenants). Off loopback kilnd needs tenants in --config and TLS "
          "(--tls_cert, --tls_key).");
ABSL_FLAG(std::string, port_file, "", "Write the bound gRPC port to this file once serving.");
ABSL_FLAG(std::optional<std::string>, metrics_listen, std::nullopt,
          "Prometheus /metrics address host:port (default 127.0.0.1:9450; port 0 picks a free "
          "port; off disables).");
ABSL_FLAG(std::string, metrics_port_file, "", "Write the bound metrics port to this file.");
ABSL_FLAG(std::optional<std::string>, cache_dir, std::nullopt,
          "Compile cache directory (default $XDG_CACHE_HOME/kiln, else ~/.cache/kiln).");
ABSL_FLAG(std::string, config, "",
          "kiln.v1.ServerConfig textproto (configs/kilnd.textproto); flags given explicitly "
          "override its fields.");
ABSL_FLAG(std::optional<absl::Duration>, drain_timeout, std::nullopt,
          "On SIGTERM/SIGINT, how long in-flight work may take to finish (default 30s).");
ABSL_FLAG(std::optional<int>, max_concurrent_runs, std::nullopt,
          "Runs executing at once over all tenants (default 2).");
ABSL_FLAG(std::optional<int>, cpu_threads, std::nullopt, "CPU kernel threads (default: every core).");
ABSL_FLAG(std::optional<std::string>, calibration, std::nullopt,
          "Device calibration for placement: auto (once per device, cached in the cache dir), "
          "always (measure at every start, rewriting the cached profile), or never (nominal "
          "profiles).");
ABSL_FLAG(std::optional<std::string>, tls_cert, std::nullopt,
          "PEM server certificate: the gRPC port speaks TLS (with --tls_key; config tls.cert_file).");
ABSL_FLAG(std::optional<std::string>, tls_key, std::nullopt,
          "PEM private key of --tls_cert (config tls.key_file).");
ABSL_FLAG(std::optional<std::string>, tls_client_ca, std::nullopt,
          "PEM CA that client certificates must chain to: mTLS, certificates map to tenants "
          "(config tls.client_ca_file).");
ABSL_FLAG(std::optional<std::string>, device_isolation, std::nullopt,
          "Where devices other than the CPU run: auto (default: a device worker process per "
          "device, when kiln-device-worker is installed), process, or thread (in kilnd).");
ABSL_FLAG(std::optional<std::string>, model_repository, std::nullopt,
          "Directory of models: <model>/<version>/model.{kiln,pb,onnx} plus *.safetensors / *.gguf "
          "weights (config model_repository.root; docs/models.md).");
ABSL_FLAG(std::optional<std::string>, plugin_dir, std::nullopt,
          "Directory of custom-op kernel plugins (*.so, include/kiln/plugin.h), loaded once at "
          "start; bad plugins are refused and logged (config plugin_dir; docs/plugins.md).");
ABSL_FLAG(std::optional<std::string>, shm_socket, std::nullopt,
          "The shared-memory socket local clients register regions on: @name (abstract), a "
          "path, or off (default @kilnd-<pid>-0.shm; config shm_socket).");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error or off.");

namespace {

// Writes `text` to `path` through a temp file and a rename, so a reader
// polling for the file never sees it half written.
bool WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out.good()) return false;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  return !ec;
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything else: may re-execute kilnd with the OpenMP spin bounded.
  kiln::UseBoundedOpenMpSpin(argv);
  // Debian's Abseil is built with its debug deadlock detector on: every
  // Mutex::Lock then records the lock in one process-wide graph under a
  // global spin lock, and every ~Mutex removes its node (a Run call creates
  // and destroys several). Off, before any thread starts: kilnd's lock order
  // is checked by the TSan build instead (tests/tsan).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage(
      "kilnd: the Kiln ML compiler and runtime as a multi-tenant gRPC daemon.\n"
      "  kilnd [--config=configs/kilnd.textproto] [--listen=127.0.0.1:7450] ...\n"
      "See docs/server.md.");
  absl::ParseCommandLine(argc, argv);

  auto logger = spdlog::stderr_color_mt("kilnd");
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(absl::GetFlag(FLAGS_log_level)));
  spdlog::flush_on(spdlog::level::trace);

  // Signals are taken by sigwait below; block them before any thread starts
  // so every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  kiln::server::FlagOverrides flags;
  flags.listen = absl::GetFlag(FLAGS_listen);
  flags.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  flags.cache_dir = absl::GetFlag(FLAGS_cache_dir);
  if (auto d = absl::GetFlag(FLAGS_drain_timeout)) {
    flags.drain_timeout_seconds = absl::ToDoubleSeconds(*d);
  }
  flags.max_concurrent_runs = absl::GetFlag(FLAGS_max_concurrent_runs);
  flags.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  flags.calibration = absl::GetFlag(FLAGS_calibration);
  flags.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  flags.tls_key = absl::GetFlag(FLAGS_tls_key);
  flags.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  flags.device_isolation = absl::GetFlag(FLAGS_device_isolation);
  flags.model_repository = absl::GetFlag(FLAGS_model_repository);
  flags.plugin_dir = absl::GetFlag(FLAGS_plugin_dir);
  flags.shm_socket = absl::GetFlag(FLAGS_shm_socket);
  auto config = kiln::server::LoadConfig(absl::GetFlag(FLAGS_config), flags);
  if (!config.ok()) {
    spdlog::critical("kilnd: {}", std::string(config.status().message()));
    return 2;
  }

  auto server = kiln::server::KilnServer::Create(*config);
  if (!server.ok()) {
    spdlog::critical("kilnd: cannot start: {}", std::string(server.status().message()));
    return 1;
  }
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    if (!WriteFileAtomically(path, absl::StrCat((*server)->port(), "\n"))) {
      spdlog::critical("kilnd: cannot write --port_file {}", path);
      return 1;
    }
  }
  if (const std::string path = absl::GetFlag(FLAGS_metrics_port_file); !path.empty()) {
    if (!WriteFileAtomically(path, absl::StrCat((*server)->metrics_port(), "\n"))) {
      spdlog::critical("kilnd: cannot write --metrics_port_file {}", path);
      return 1;
    }
  }

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  spdlog::info("received {}", signal_number == SIGTERM ? "SIGTERM" : "SIGINT");
  // Runs cannot be stopped mid-graph: if one outlasts the drain, leave anyway.
  const double grace = config->drain_timeout_seconds() + 10;
  std::thread([grace] {
    std::this_thread::sleep_for(std::chrono::duration<double>(grace));
    spdlog::warn("work still running {:.0f} s after the signal; exiting without it", grace);
    spdlog::shutdown();
    std::_Exit(0);
  }).detach();
  (*server)->Shutdown();
  (*server)->LeakMetricsExposerForExit();
  server->reset();
  spdlog::info("exit 0");
  spdlog::shutdown();
  std::fflush(nullptr);
  // Everything of ours is torn down; skip the libraries' static teardown
  // (gRPC's takes over a second and has nothing left to do).
  std::_Exit(0);
}
