#include "server/config.h"

#include <openssl/evp.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "base/status.h"
#include "server/batcher.h"
#include "server/limits.h"
#include "server/models.h"
#include "server/unix_listener.h"

namespace kiln::server {
namespace {

class CollectErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (!first_.empty()) return;
    first_ = absl::StrCat(line + 1, ":", column + 1, ": ", message);
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

// Host part of "host:port", "[v6]:port" or "host".
std::string HostOf(const std::string& address) {
  if (address.starts_with('[')) {
    const size_t close = address.find(']');
    return close == std::string::npos ? address : address.substr(1, close - 1);
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || address.find(':') != colon) return address;
  return address.substr(0, colon);
}

void DefaultQuota(v1::TenantQuota& q, const v1::TenantQuota& fallback) {
  if (q.max_sessions() == 0) q.set_max_sessions(fallback.max_sessions());
  if (q.max_param_bytes() == 0) q.set_max_param_bytes(fallback.max_param_bytes());
  if (q.max_in_flight() == 0) q.set_max_in_flight(fallback.max_in_flight());
  if (q.max_request_bytes() == 0) q.set_max_request_bytes(fallback.max_request_bytes());
  if (q.max_device_memory_bytes() == 0) {
    q.set_max_device_memory_bytes(fallback.max_device_memory_bytes());
  }
  if (q.max_queue() == 0) q.set_max_queue(fallback.max_queue());
  if (q.max_concurrent_compiles() == 0) {
    q.set_max_concurrent_compiles(fallback.max_concurrent_compiles());
  }
  if (q.max_shm_regions() == 0) q.set_max_shm_regions(fallback.max_shm_regions());
  if (q.max_shm_bytes() == 0) q.set_max_shm_bytes(fallback.max_shm_bytes());
}

absl::Status CheckQuota(const v1::TenantQuota& q, const std::string& where) {
  auto bad = [&](const char* field, int64_t v) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".", field, " is ", v, "; quotas must be >= 0 (0 = the default)"));
  };
  if (q.max_sessions() < 0) return bad("max_sessions", q.max_sessions());
  if (q.max_param_bytes() < 0) return bad("max_param_bytes", q.max_param_bytes());
  if (q.max_in_flight() < 0) return bad("max_in_flight", q.max_in_flight());
  if (q.max_request_bytes() < 0) return bad("max_request_bytes", q.max_request_bytes());
  if (q.max_device_memory_bytes() < 0) {
    return bad("max_device_memory_bytes", q.max_device_memory_bytes());
  }
  if (q.max_queue() < 0) return bad("max_queue", q.max_queue());
  if (q.max_concurrent_compiles() < 0) {
    return bad("max_concurrent_compiles", q.max_concurrent_compiles());
  }
  if (q.max_shm_regions() < 0) return bad("max_shm_regions", q.max_shm_regions());
  if (q.max_shm_bytes() < 0) return bad("max_shm_bytes", q.max_shm_bytes());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::ServerConfig> ParseConfigText(const std::string& text,
                                                 const std::string& origin) {
  v1::ServerConfig config;
  google::protobuf::TextFormat::Parser parser;
  CollectErrors errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &config)) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ":", errors.first().empty() ? "invalid textproto" : errors.first(),
                     " (fields are those of kiln.v1.ServerConfig in proto/kiln/v1/config.proto)"));
  }
  return config;
}

absl::StatusOr<v1::ServerConfig> LoadConfig(const std::string& path, const FlagOverrides& flags) {
  v1::ServerConfig config;
  if (!path.empty()) {
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read --config file ", path));
    std::stringstream text;
    text << in.rdbuf();
    auto parsed = ParseConfigText(text.str(), path);
    if (!parsed.ok()) return parsed.status();
    config = std::move(parsed).value();
  }
  if (flags.listen) config.set_listen(*flags.listen);
  if (flags.metrics_listen) config.set_metrics_listen(*flags.metrics_listen);
  if (flags.cache_dir) config.set_cache_dir(*flags.cache_dir);
  if (flags.drain_timeout_seconds) config.set_drain_timeout_seconds(*flags.drain_timeout_seconds);
  if (flags.max_concurrent_runs) config.set_max_concurrent_runs(*flags.max_concurrent_runs);
  if (flags.cpu_threads) config.set_cpu_threads(*flags.cpu_threads);
  if (flags.calibration) config.set_calibration(*flags.calibration);
  if (flags.tls_cert) config.mutable_tls()->set_cert_file(*flags.tls_cert);
  if (flags.tls_key) config.mutable_tls()->set_key_file(*flags.tls_key);
  if (flags.tls_client_ca) config.mutable_tls()->set_client_ca_file(*flags.tls_client_ca);
  if (flags.device_isolation) config.set_device_isolation(*flags.device_isolation);
  if (flags.model_repository) config.mutable_model_repository()->set_root(*flags.model_repository);
  if (flags.plugin_dir) config.set_plugin_dir(*flags.plugin_dir);
  if (flags.shm_socket) config.set_shm_socket(*flags.shm_socket);
  if (config.calibration().empty()) config.set_calibration("auto");
  if (config.calibration() != "auto" && config.calibration() != "always" &&
      config.calibration() != "never") {
    return absl::InvalidArgumentError(absl::StrCat(
        "calibration must be auto, always or never; got \"", config.calibration(), "\""));
  }
  // Validate before defaults fill in: a negative drain must not become 30 s.
  if (config.drain_timeout_seconds() < 0) {
    return absl::InvalidArgumentError("drain_timeout_seconds must be >= 0");
  }
  ApplyDefaults(config);
  if (auto s = ValidateConfig(config); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.empty() ? "" : absl::StrCat(path, ": "), s.message()));
  }
  return config;
}

void ApplyDefaults(v1::ServerConfig& config) {
  if (config.listen().empty()) config.set_listen(kDefaultListen);
  if (config.metrics_listen().empty()) config.set_metrics_listen(kDefaultMetricsListen);
  if (config.cache_dir().empty()) config.set_cache_dir(DefaultCacheDir());
  if (config.cache_max_bytes() == 0) config.set_cache_max_bytes(kDefaultCacheMaxBytes);
  if (config.drain_timeout_seconds() == 0) config.set_drain_timeout_seconds(kDefaultDrainSeconds);
  if (config.reports_per_tenant() == 0) config.set_reports_per_tenant(kDefaultReportsPerTenant);
  if (config.report_bytes_per_tenant() == 0) {
    config.set_report_bytes_per_tenant(kDefaultReportBytesPerTenant);
  }
  if (config.max_concurrent_runs() == 0) config.set_max_concurrent_runs(kDefaultMaxConcurrentRuns);

  v1::Limits& l = *config.mutable_limits();
  if (l.max_message_bytes() == 0) l.set_max_message_bytes(kDefaultMaxMessageBytes);
  if (l.max_tensor_elements() == 0) l.set_max_tensor_elements(kDefaultMaxTensorElements);
  if (l.max_tensor_bytes() == 0) l.set_max_tensor_bytes(kDefaultMaxTensorBytes);
  if (l.max_nodes() == 0) l.set_max_nodes(kDefaultMaxNodes);
  if (l.max_subgraph_depth() == 0) l.set_max_subgraph_depth(kDefaultMaxSubgraphDepth);
  if (l.max_rank() == 0) l.set_max_rank(kDefaultMaxRank);
  if (l.max_while_iterations() == 0) l.set_max_while_iterations(kDefaultMaxWhileIterations);

  v1::TenantQuota builtin;
  builtin.set_max_sessions(kDefaultMaxSessions);
  builtin.set_max_param_bytes(kDefaultMaxParamBytes);
  builtin.set_max_in_flight(kDefaultMaxInFlight);
  builtin.set_max_request_bytes(l.max_message_bytes());
  builtin.set_max_device_memory_bytes(kDefaultMaxDeviceMemoryBytes);
  builtin.set_max_queue(kDefaultMaxQueue);
  builtin.set_max_concurrent_compiles(kDefaultMaxConcurrentCompiles);
  builtin.set_max_shm_regions(kDefaultMaxShmRegions);
  builtin.set_max_shm_bytes(kDefaultMaxShmBytes);
  DefaultQuota(*config.mutable_default_quota(), builtin);
  for (v1::TenantConfig& t : *config.mutable_tenants()) {
    DefaultQuota(*t.mutable_quota(), config.default_quota());
    if (t.weight() == 0) t.set_weight(1);
    for (std::string& key : *t.mutable_api_key_sha256()) absl::AsciiStrToLower(&key);
  }
}

absl::Status ValidateConfig(const v1::ServerConfig& config) {
  const v1::Limits& l = config.limits();
  auto positive = [](const char* field, int64_t v) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("limits.", field, " is ", v, "; must be > 0"));
  };
  for (auto s : {positive("max_message_bytes", l.max_message_bytes()),
                 positive("max_tensor_elements", l.max_tensor_elements()),
                 positive("max_tensor_bytes", l.max_tensor_bytes()),
                 positive("max_nodes", l.max_nodes()),
                 positive("max_subgraph_depth", l.max_subgraph_depth()),
                 positive("max_rank", l.max_rank()),
                 positive("max_while_iterations", l.max_while_iterations())}) {
    if (!s.ok()) return s;
  }
  if (l.max_message_bytes() > (int64_t{2} << 30) - 1) {
    return absl::InvalidArgumentError("limits.max_message_bytes must be below 2 GiB (gRPC's limit)");
  }
  if (config.device_wait_floor_seconds() < 0 || config.device_wait_slack() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device_wait_floor_seconds is ", config.device_wait_floor_seconds(),
        " and device_wait_slack is ", config.device_wait_slack(), "; both must be >= 0 (0 = the default)"));
  }
  if (!config.device_isolation().empty() && config.device_isolation() != "auto" &&
      config.device_isolation() != "process" && config.device_isolation() != "thread") {
    return absl::InvalidArgumentError(absl::StrCat(
        "device_isolation is \"", config.device_isolation(), "\"; must be auto, process or thread"));
  }
  if (config.model_repository().max_model_bytes() < 0) {
    return absl::InvalidArgumentError("model_repository.max_model_bytes must be >= 0 (0 = 64 GiB)");
  }
  const auto& serving = config.model_repository().models();
  for (int i = 0; i < serving.size(); ++i) {
    const std::string where = absl::StrCat("model_repository.models[", i, "]");
    if (!IsValidModelName(serving[i].name())) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ".name ", QuoteClientString(serving[i].name()),
          " is not a model name ([A-Za-z0-9._-]{1,128}, not starting with '.')"));
    }
    for (int j = 0; j < i; ++j) {
      if (serving[j].name() == serving[i].name()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ".name \"", serving[i].name(),
                                                       "\" is also model_repository.models[", j,
                                                       "].name"));
      }
    }
    if (absl::Status s = ToBatchingConfig(serving[i].batching(), where + ".batching").status();
        !s.ok()) {
      return s;
    }
  }
  if (!std::isfinite(config.model_repository().poll_seconds())) {
    return absl::InvalidArgumentError("model_repository.poll_seconds must be a number (0 = 5 s, < 0 = never)");
  }
  if (config.device_worker_grace_seconds() < 0) {
    return absl::InvalidArgumentError("device_worker_grace_seconds must be >= 0 (0 = 5)");
  }
  if (config.max_concurrent_runs() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_concurrent_runs is ", config.max_concurrent_runs(), "; must be >= 1"));
  }
  if (config.reports_per_tenant() < 0) {
    return absl::InvalidArgumentError("reports_per_tenant must be >= 0");
  }
  if (config.report_bytes_per_tenant() < 0) {
    return absl::InvalidArgumentError("report_bytes_per_tenant must be >= 0 (0 = 8 MiB)");
  }
  if (config.cpu_threads() < 0) return absl::InvalidArgumentError("cpu_threads must be >= 0");
  {
    absl::flat_hash_set<uint32_t> uids;
    for (const v1::UnixPeerTenant& p : config.unix_peer_tenants()) {
      bool known = false;
      for (const v1::TenantConfig& t : config.tenants()) known = known || t.name() == p.tenant();
      if (!known) {
        return absl::InvalidArgumentError(absl::StrCat(
            "unix_peer_tenants: uid ", p.uid(), " maps to tenant ", QuoteClientString(p.tenant()),
            ", which is not in tenants"));
      }
      if (!uids.insert(p.uid()).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("unix_peer_tenants: uid ", p.uid(), " is listed twice"));
      }
    }
  }
  if (const std::string& shm = config.shm_socket(); !shm.empty() && shm != "off") {
    // sockaddr_un.sun_path holds 108 bytes, a NUL included.
    if (shm.size() > 107 || shm == "@" || shm.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shm_socket ", QuoteClientString(shm),
          " is not a socket name (\"@name\" abstract, or a path of at most 107 bytes)"));
    }
  }
  if (config.cache_max_bytes() < 0) return absl::InvalidArgumentError("cache_max_bytes must be >= 0");
  if (auto s = CheckQuota(config.default_quota(), "default_quota"); !s.ok()) return s;

  const v1::TlsConfig& tls = config.tls();
  const bool tls_on = !tls.cert_file().empty();
  if (tls_on != !tls.key_file().empty()) {
    return absl::InvalidArgumentError(
        "tls.cert_file and tls.key_file go together: set both (TLS on) or neither");
  }
  if (!tls_on && (!tls.client_ca_file().empty() || !tls.crl_dir().empty() ||
                  tls.require_client_cert())) {
    return absl::InvalidArgumentError(
        "tls.client_ca_file, tls.crl_dir and tls.require_client_cert need TLS: set "
        "tls.cert_file and tls.key_file too");
  }
  if (tls.client_ca_file().empty() && (!tls.crl_dir().empty() || tls.require_client_cert())) {
    return absl::InvalidArgumentError(
        "tls.crl_dir and tls.require_client_cert are about client certificates: set "
        "tls.client_ca_file (the CA they must chain to)");
  }

  std::set<std::string> names, keys, sans, subjects;
  for (int i = 0; i < config.tenants_size(); ++i) {
    const v1::TenantConfig& t = config.tenants(i);
    const std::string where = absl::StrCat("tenants[", i, "]");
    if (t.name().empty()) return absl::InvalidArgumentError(absl::StrCat(where, " has no name"));
    if (!names.insert(t.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("two tenants are named \"", t.name(), "\""));
    }
    const bool by_cert = !t.client_cert_san().empty() || !t.client_cert_subject().empty();
    if (t.api_key_sha256().empty() && !by_cert) {
      return absl::InvalidArgumentError(
          absl::StrCat("tenant \"", t.name(), "\" has no api_key_sha256 and no client_cert_san "
                       "or client_cert_subject; make a key's hash with: "
                       "printf %s \"$KEY\" | sha256sum"));
    }
    if (by_cert && tls.client_ca_file().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tenant \"", t.name(), "\" is identified by client certificate, which needs mTLS: set "
          "tls.client_ca_file (and tls.cert_file, tls.key_file)"));
    }
    for (const std::string& key : t.api_key_sha256()) {
      bool hex = key.size() == 64;
      for (char c : key) hex = hex && absl::ascii_isxdigit(static_cast<unsigned char>(c));
      if (!hex) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tenant \"", t.name(), "\": api_key_sha256 \"", key,
            "\" is not 64 hex digits (the SHA-256 of the key, not the key itself)"));
      }
      if (!keys.insert(key).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("tenant \"", t.name(), "\": an api key is listed for two tenants"));
      }
    }
    for (const std::string& san : t.client_cert_san()) {
      if (san.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tenant \"", t.name(), "\": an empty client_cert_san"));
      }
      if (!sans.insert(san).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tenant \"", t.name(), "\": client_cert_san \"", san, "\" is listed twice"));
      }
    }
    for (const std::string& subject : t.client_cert_subject()) {
      if (subject.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tenant \"", t.name(), "\": an empty client_cert_subject"));
      }
      if (!subjects.insert(subject).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tenant \"", t.name(), "\": client_cert_subject \"", subject, "\" is listed twice"));
      }
    }
    if (t.weight() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("tenant \"", t.name(), "\": weight must be >= 0"));
    }
    if (auto s = CheckQuota(t.quota(), absl::StrCat("tenant \"", t.name(), "\" quota")); !s.ok()) {
      return s;
    }
  }
  KILN_ASSIGN_OR_RETURN(const ListenAddresses listen, SplitListen(config.listen()));
  bool loopback = true;
  for (const std::string& a : listen.grpc) loopback = loopback && IsLoopbackAddress(a);
  if (!loopback && (config.tenants().empty() || !tls_on)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to listen on ", config.listen(), " without ",
        config.tenants().empty() && !tls_on ? "authentication and TLS"
        : config.tenants().empty()          ? "authentication"
                                            : "TLS",
        ": off loopback kilnd needs tenants (API keys or client certificates) and TLS "
        "(tls.cert_file and tls.key_file, or --tls_cert and --tls_key), so that keys never "
        "cross the network in plaintext; see configs/multi-tenant.textproto, or use "
        "--listen=127.0.0.1:<port>"));
  }
  return absl::OkStatus();
}

bool IsLoopbackAddress(const std::string& address) {
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:")) return true;
  std::string host = HostOf(absl::StartsWith(address, "ipv4:")   ? address.substr(5)
                            : absl::StartsWith(address, "ipv6:") ? address.substr(5)
                                                                 : address);
  absl::AsciiStrToLower(&host);
  if (host == "localhost" || host == "::1" || host == "0:0:0:0:0:0:0:1") return true;
  // 127.0.0.0/8
  if (!absl::StartsWith(host, "127.")) return false;
  int parts = 0;
  for (absl::string_view p : absl::StrSplit(host, '.')) {
    int v = 0;
    if (!absl::SimpleAtoi(p, &v) || v < 0 || v > 255) return false;
    ++parts;
  }
  return parts == 4;
}

std::string DefaultCacheDir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return absl::StrCat(xdg, "/kiln");
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return absl::StrCat(home, "/.cache/kiln");
  }
  return "/tmp/kiln-cache";
}


ir::VerifyOptions VerifyOptionsFrom(const v1::Limits& limits) {
  ir::VerifyOptions v;
  v.max_nodes = limits.max_nodes();
  v.limits.max_rank = limits.max_rank();
  v.limits.max_tensor_elements = limits.max_tensor_elements();
  v.limits.max_tensor_bytes = limits.max_tensor_bytes();
  v.limits.max_subgraph_depth = limits.max_subgraph_depth();
  return v;
}

}  // namespace kiln::server
