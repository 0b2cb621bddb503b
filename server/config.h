// kilnd's configuration: the embedded defaults, then a --config textproto of
// kiln.v1.ServerConfig, then the flags given explicitly, validated as a whole.
//
// Every field has a working default (see kDefault* below and
// configs/kilnd.textproto); a zero or empty field means "the default".
// Pure functions; thread-compatible.
#pragma once

#include "base/sha256.h"

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/ir/verifier.h"
#include "kiln/v1/config.pb.h"

namespace kiln::server {

inline constexpr char kDefaultListen[] = "127.0.0.1:7450";
inline constexpr char kDefaultMetricsListen[] = "127.0.0.1:9450";
inline constexpr int64_t kDefaultCacheMaxBytes = int64_t{4} << 30;
inline constexpr double kDefaultDrainSeconds = 30;
inline constexpr int kDefaultReportsPerTenant = 64;
inline constexpr int64_t kDefaultReportBytesPerTenant = int64_t{8} << 20;
inline constexpr int kDefaultMaxConcurrentRuns = 2;
// Limits.
inline constexpr int64_t kDefaultMaxMessageBytes = int64_t{64} << 20;
inline constexpr int64_t kDefaultMaxTensorElements = int64_t{1} << 28;
inline constexpr int64_t kDefaultMaxTensorBytes = int64_t{1} << 30;
inline constexpr int kDefaultMaxNodes = 100000;
inline constexpr int kDefaultMaxSubgraphDepth = 8;
inline constexpr int kDefaultMaxRank = 8;
inline constexpr int64_t kDefaultMaxWhileIterations = 1000000;
// The default quota (also the open tenant's).
inline constexpr int kDefaultMaxSessions = 64;
inline constexpr int64_t kDefaultMaxParamBytes = int64_t{8} << 30;
inline constexpr int kDefaultMaxInFlight = 64;
inline constexpr int kDefaultMaxQueue = 32;
inline constexpr int kDefaultMaxConcurrentCompiles = 1;
inline constexpr int64_t kDefaultMaxDeviceMemoryBytes = int64_t{16} << 30;
inline constexpr int kDefaultMaxShmRegions = 64;
inline constexpr int64_t kDefaultMaxShmBytes = int64_t{16} << 30;

// The name of the one open tenant kilnd serves when no tenant is configured.
inline constexpr char kOpenTenant[] = "default";

// Values from flags that were given on the command line; each one that is set
// replaces the config file's field.
struct FlagOverrides {
  std::optional<std::string> listen;
  std::optional<std::string> metrics_listen;
  std::optional<std::string> cache_dir;
  std::optional<double> drain_timeout_seconds;
  std::optional<int> max_concurrent_runs;
  std::optional<int> cpu_threads;
  std::optional<std::string> calibration;
  std::optional<std::string> tls_cert;       // tls.cert_file
  std::optional<std::string> tls_key;        // tls.key_file
  std::optional<std::string> tls_client_ca;  // tls.client_ca_file
  std::optional<std::string> device_isolation;
  std::optional<std::string> model_repository;  // model_repository.root
  std::optional<std::string> plugin_dir;
  std::optional<std::string> shm_socket;
};

// Reads `path` ("" = no file) as a textproto, applies `flags`, fills the
// defaults and validates. Errors name the file, line and field.
absl::StatusOr<v1::ServerConfig> LoadConfig(const std::string& path, const FlagOverrides& flags);

// Parses a textproto (no file); `origin` names it in errors.
absl::StatusOr<v1::ServerConfig> ParseConfigText(const std::string& text, const std::string& origin);

// Fills every unset field (limits, quotas, tenants' quotas from default_quota).
void ApplyDefaults(v1::ServerConfig& config);

// Checks a config with defaults applied: tenants (names, keys and client
// certificate identities unique, keys are 64 hex digits, each tenant has a
// key or a certificate identity), TLS fields that need each other, positive
// limits, and that a non-loopback `listen` has both TLS and tenants.
absl::Status ValidateConfig(const v1::ServerConfig& config);

// True for 127.0.0.0/8, [::1], localhost and unix: addresses.
bool IsLoopbackAddress(const std::string& address);

// $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln, else /tmp/kiln-cache.
std::string DefaultCacheDir();

// Lower-case hex SHA-256 of `bytes` (how API keys are stored in the config).
using ::kiln::Sha256Hex;  // base/sha256.h

// The engine's graph limits from the config's limits.
ir::VerifyOptions VerifyOptionsFrom(const v1::Limits& limits);

}  // namespace kiln::server
