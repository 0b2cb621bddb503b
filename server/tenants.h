// Tenants: who is calling (an API key's SHA-256, or a verified client
// certificate's subject or subject alternative names, matched against the config),
// what they may use (quota, fair-queuing weight), and what they use now.
//
// Thread safety: a TenantRegistry is immutable after Create; Tenant's name,
// quota and weight are immutable, its usage is guarded by usage_mu_. Tenants
// live as long as their registry.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kiln/v1/config.pb.h"

namespace kiln::server {

// What a call's verified client certificate says about its owner (server/tls.h
// reads it from the call's auth context).
struct PeerIdentity {
  bool has_certificate = false;   // a verified client certificate came with the call
  std::string subject;            // RFC 2253, "CN=alice,O=Example"
  std::vector<std::string> sans;  // subject alternative names (DNS, URI, email, IP)
  // The peer process's uid, when the call came over a Unix-socket listener
  // (server/unix_listener.h).
  std::optional<uint32_t> unix_uid;
};

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

  // The compile cache as this tenant sees it. Executables are shared across
  // tenants, but whether one was already there is the business of the tenant
  // that put it there: an executable this tenant never used before is a miss
  // for it, whichever tenant's compile the shared cache kept.
  // Records that the tenant uses executable `key`; true when it had before
  // (remembers the last kMaxKnownExecutables keys).
  bool NoteExecutable(const std::string& key);
  struct CacheCounts {
    int64_t memory_hits = 0;
    int64_t disk_hits = 0;
    int64_t misses = 0;
  };
  void CountCacheOutcome(int outcome);  // a v1::CacheOutcome, as reported to the tenant
  CacheCounts cache_counts() const;
  static constexpr size_t kMaxKnownExecutables = 4096;

 private:
  const std::string name_;
  const v1::TenantQuota quota_;
  const double weight_;

  mutable absl::Mutex usage_mu_;
  Usage usage_ ABSL_GUARDED_BY(usage_mu_);

  mutable absl::Mutex cache_mu_;
  absl::flat_hash_set<std::string> known_executables_ ABSL_GUARDED_BY(cache_mu_);
  std::deque<std::string> known_order_ ABSL_GUARDED_BY(cache_mu_);  // oldest first
  CacheCounts cache_counts_ ABSL_GUARDED_BY(cache_mu_);
};

class TenantRegistry {
 public:
  // REQUIRES: `config` has defaults applied and is valid (server/config.h).
  // Without tenants in the config, one open tenant ("default") with the
  // default quota serves every caller.
  static absl::StatusOr<std::unique_ptr<TenantRegistry>> Create(const v1::ServerConfig& config);

  // Maps a call to a tenant: its verified client certificate (`peer`), else
  // the `authorization` metadata value ("Bearer <key>"; nullopt when the call
  // has none), else the Unix peer's uid (unix_peer_tenants). UNAUTHENTICATED when tenants are configured and the key is
  // missing, malformed or unknown, when a certificate maps to no tenant, or
  // when certificate and key name different tenants. The open tenant accepts
  // every call.
  absl::StatusOr<Tenant*> Authenticate(std::optional<std::string_view> authorization,
                                       const PeerIdentity& peer = {}) const;

  bool open() const { return open_; }
  // Whether `tenant` sees server-wide details (TenantConfig.admin; the open
  // tenant does).
  bool IsAdmin(const Tenant& tenant) const { return open_ || admins_.contains(&tenant); }
  const std::vector<std::unique_ptr<Tenant>>& tenants() const { return tenants_; }

 private:
  TenantRegistry() = default;
  bool open_ = false;
  std::vector<std::unique_ptr<Tenant>> tenants_;
  absl::flat_hash_map<std::string, Tenant*> by_key_hash_;  // hex SHA-256 -> tenant
  absl::flat_hash_map<std::string, Tenant*> by_cert_san_;
  absl::flat_hash_map<std::string, Tenant*> by_cert_subject_;
  absl::flat_hash_set<const Tenant*> admins_;
  absl::flat_hash_map<uint32_t, Tenant*> by_unix_uid_;  // ServerConfig.unix_peer_tenants
};

}  // namespace kiln::server
