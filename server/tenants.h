// Tenants: who is calling (an API key's SHA-256 matched against the config),
// what they may use (quota, fair-queuing weight), and what they use now.
//
// Thread safety: a TenantRegistry is immutable after Create; Tenant's name,
// quota and weight are immutable, its usage is guarded by usage_mu_. Tenants
// live as long as their registry.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kiln/v1/config.pb.h"

namespace kiln::server {

class Tenant {
 public:
  // `quota` has every field set (config defaults applied).
  Tenant(std::string name, v1::TenantQuota quota, double weight)
      : name_(std::move(name)), quota_(std::move(quota)), weight_(weight) {}
  Tenant(const Tenant&) = delete;
  Tenant& operator=(const Tenant&) = delete;

  const std::string& name() const { return name_; }
  const v1::TenantQuota& quota() const { return quota_; }
  double weight() const { return weight_; }

  struct Usage {
    int64_t sessions = 0;
    int64_t param_bytes = 0;   // params of all sessions, plus uploads in progress
    int64_t device_bytes = 0;  // params plus the arenas of the sessions' executables
    int64_t runs_in_flight = 0;  // admitted Run calls not yet answered
  };
  Usage usage() const;

  // Takes one session slot, or RESOURCE_EXHAUSTED naming max_sessions.
  absl::Status AcquireSession();
  void ReleaseSession();
  // Admits one Run call (compiling, queued or running on a device), or
  // RESOURCE_EXHAUSTED naming max_in_flight. Released when the call is answered.
  absl::Status AcquireRun();
  void ReleaseRun();
  // Charges bytes against max_param_bytes and max_device_memory_bytes (both
  // or neither), or RESOURCE_EXHAUSTED naming the quota, its limit and the
  // bytes in use. Called before the memory is allocated.
  absl::Status AcquireBytes(int64_t param_bytes, int64_t device_bytes);
  void ReleaseBytes(int64_t param_bytes, int64_t device_bytes);

  // A request message of `bytes` against max_request_bytes.
  absl::Status CheckRequestBytes(int64_t bytes, std::string_view what) const;

 private:
  const std::string name_;
  const v1::TenantQuota quota_;
  const double weight_;

  mutable absl::Mutex usage_mu_;
  Usage usage_ ABSL_GUARDED_BY(usage_mu_);
};

class TenantRegistry {
 public:
  // REQUIRES: `config` has defaults applied and is valid (server/config.h).
  // Without tenants in the config, one open tenant ("default") with the
  // default quota serves every caller.
  static absl::StatusOr<std::unique_ptr<TenantRegistry>> Create(const v1::ServerConfig& config);

  // Maps the `authorization` metadata value ("Bearer <key>"; nullopt when the
  // call has none) to a tenant. UNAUTHENTICATED when tenants are configured
  // and the key is missing, malformed or unknown; the open tenant accepts
  // every call.
  absl::StatusOr<Tenant*> Authenticate(std::optional<std::string_view> authorization) const;

  bool open() const { return open_; }
  const std::vector<std::unique_ptr<Tenant>>& tenants() const { return tenants_; }

 private:
  TenantRegistry() = default;
  bool open_ = false;
  std::vector<std::unique_ptr<Tenant>> tenants_;
  absl::flat_hash_map<std::string, Tenant*> by_key_hash_;  // hex SHA-256 -> tenant
};

}  // namespace kiln::server
