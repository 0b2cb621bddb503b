#include "server/tenants.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kiln/v1/report.pb.h"
#include "server/client_string.h"
#include "server/config.h"

namespace kiln::server {

Tenant::Usage Tenant::usage() const {
  absl::MutexLock lock(&usage_mu_);
  return usage_;
}

absl::Status Tenant::AcquireSession() {
  absl::MutexLock lock(&usage_mu_);
  if (usage_.sessions >= quota_.max_sessions()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant \"", name_, "\" has ", usage_.sessions, " open sessions, the quota max_sessions = ",
        quota_.max_sessions(), "; close a session (CloseSession) first"));
  }
  ++usage_.sessions;
  return absl::OkStatus();
}

void Tenant::ReleaseSession() {
  absl::MutexLock lock(&usage_mu_);
  --usage_.sessions;
}

absl::Status Tenant::AcquireRun() {
  absl::MutexLock lock(&usage_mu_);
  if (usage_.runs_in_flight >= quota_.max_in_flight()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant \"", name_, "\" has ", usage_.runs_in_flight,
        " runs in flight, the quota max_in_flight = ", quota_.max_in_flight(),
        "; wait for a run to finish"));
  }
  ++usage_.runs_in_flight;
  return absl::OkStatus();
}

void Tenant::ReleaseRun() {
  absl::MutexLock lock(&usage_mu_);
  --usage_.runs_in_flight;
}

absl::Status Tenant::AcquireBytes(int64_t param_bytes, int64_t device_bytes) {
  absl::MutexLock lock(&usage_mu_);
  if (param_bytes > 0 && param_bytes > quota_.max_param_bytes() - usage_.param_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant \"", name_, "\": ", param_bytes, " more param bytes would exceed the quota "
        "max_param_bytes = ", quota_.max_param_bytes(), " (", usage_.param_bytes, " in use)"));
  }
  if (device_bytes > 0 && device_bytes > quota_.max_device_memory_bytes() - usage_.device_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant \"", name_, "\": ", device_bytes, " more bytes of device memory would exceed the "
        "quota max_device_memory_bytes = ", quota_.max_device_memory_bytes(), " (",
        usage_.device_bytes, " in use by params and executable arenas)"));
  }
  usage_.param_bytes += param_bytes;
  usage_.device_bytes += device_bytes;
  return absl::OkStatus();
}

void Tenant::ReleaseBytes(int64_t param_bytes, int64_t device_bytes) {
  absl::MutexLock lock(&usage_mu_);
  usage_.param_bytes -= param_bytes;
  usage_.device_bytes -= device_bytes;
}

absl::Status Tenant::CheckRequestBytes(int64_t bytes, std::string_view what) const {
  if (bytes <= quota_.max_request_bytes()) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "tenant \"", name_, "\": the ", std::string(what), " message has ", bytes,
      " bytes, over the quota max_request_bytes = ", quota_.max_request_bytes(),
      "; send params with SetParams in smaller chunks"));
}

bool Tenant::NoteExecutable(const std::string& key) {
  absl::MutexLock lock(&cache_mu_);
  if (known_executables_.contains(key)) return true;
  known_executables_.insert(key);
  known_order_.push_back(key);
  if (known_order_.size() > kMaxKnownExecutables) {
    known_executables_.erase(known_order_.front());
    known_order_.pop_front();
  }
  return false;
}

void Tenant::CountCacheOutcome(int outcome) {
  absl::MutexLock lock(&cache_mu_);
  switch (outcome) {
    case v1::CACHE_HIT_MEMORY:
      ++cache_counts_.memory_hits;
      break;
    case v1::CACHE_HIT_DISK:
      ++cache_counts_.disk_hits;
      break;
    case v1::CACHE_MISS:
      ++cache_counts_.misses;
      break;
    default:
      break;
  }
}

Tenant::CacheCounts Tenant::cache_counts() const {
  absl::MutexLock lock(&cache_mu_);
  return cache_counts_;
}

absl::StatusOr<std::unique_ptr<TenantRegistry>> TenantRegistry::Create(
    const v1::ServerConfig& config) {
  std::unique_ptr<TenantRegistry> r(new TenantRegistry());
  if (config.tenants().empty()) {
    r->open_ = true;
    r->tenants_.push_back(std::make_unique<Tenant>(kOpenTenant, config.default_quota(), 1.0));
    return r;
  }
  for (const v1::TenantConfig& t : config.tenants()) {
    r->tenants_.push_back(std::make_unique<Tenant>(t.name(), t.quota(), t.weight()));
    Tenant* tenant = r->tenants_.back().get();
    if (t.admin()) r->admins_.insert(tenant);
    for (const std::string& san : t.client_cert_san()) {
      if (!r->by_cert_san_.emplace(san, tenant).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("tenant \"", t.name(), "\": client_cert_san \"", san, "\" is listed twice"));
      }
    }
    for (const std::string& subject : t.client_cert_subject()) {
      if (!r->by_cert_subject_.emplace(subject, tenant).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tenant \"", t.name(), "\": client_cert_subject \"", subject, "\" is listed twice"));
      }
    }
    for (const std::string& key : t.api_key_sha256()) {
      std::string hex = key;
      absl::AsciiStrToLower(&hex);
      if (!r->by_key_hash_.emplace(hex, r->tenants_.back().get()).second) {
        return absl::InvalidArgumentError(absl::StrCat("tenant \"", t.name(),
                                                       "\": an api key is listed twice"));
      }
    }
  }
  for (const v1::UnixPeerTenant& p : config.unix_peer_tenants()) {
    Tenant* tenant = nullptr;
    for (const auto& t : r->tenants_) {
      if (t->name() == p.tenant()) tenant = t.get();
    }
    if (tenant == nullptr || !r->by_unix_uid_.emplace(p.uid(), tenant).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unix_peer_tenants: uid ", p.uid(), " is listed twice or names no tenant"));
    }
  }
  return r;
}

absl::StatusOr<Tenant*> TenantRegistry::Authenticate(
    std::optional<std::string_view> authorization, const PeerIdentity& peer) const {
  if (open_) return tenants_.front().get();
  if (peer.has_certificate) {
    Tenant* by_cert = nullptr;
    if (auto it = by_cert_subject_.find(peer.subject); it != by_cert_subject_.end()) {
      by_cert = it->second;
    }
    for (const std::string& san : peer.sans) {
      if (by_cert != nullptr) break;
      if (auto it = by_cert_san_.find(san); it != by_cert_san_.end()) by_cert = it->second;
    }
    if (by_cert == nullptr) {
      return absl::UnauthenticatedError(absl::StrCat(
          "the client certificate (subject ", QuoteClientString(peer.subject),
          ") maps to no tenant: no tenant lists its subject in client_cert_subject or one of "
          "its ", peer.sans.size(), " subject alternative names in client_cert_san"));
    }
    if (!authorization) return by_cert;
    absl::StatusOr<Tenant*> by_key = Authenticate(authorization);
    if (!by_key.ok()) return by_key;
    if (*by_key != by_cert) {
      return absl::UnauthenticatedError(absl::StrCat(
          "the client certificate is tenant \"", by_cert->name(),
          "\"'s but the API key is another tenant's; send one identity"));
    }
    return by_cert;
  }
  if (!authorization && peer.unix_uid) {
    if (auto it = by_unix_uid_.find(*peer.unix_uid); it != by_unix_uid_.end()) return it->second;
    return absl::UnauthenticatedError(absl::StrCat(
        "the Unix socket peer's uid ", *peer.unix_uid,
        " maps to no tenant (unix_peer_tenants) and the call has no API key"));
  }
  if (!authorization) {
    return absl::UnauthenticatedError(
        "missing API key: send metadata \"authorization: Bearer <key>\" (kilnctl --api_key or "
        "KILN_API_KEY)");
  }
  std::string_view v = *authorization;
  constexpr std::string_view kBearer = "bearer ";
  if (v.size() <= kBearer.size() ||
      !absl::EqualsIgnoreCase(absl::string_view(v.data(), kBearer.size()),
                              absl::string_view(kBearer.data(), kBearer.size()))) {
    return absl::UnauthenticatedError(
        "malformed authorization metadata: expected \"Bearer <key>\"");
  }
  const std::string key(v.substr(kBearer.size()));
  auto it = by_key_hash_.find(Sha256Hex(key));
  if (it == by_key_hash_.end()) {
    return absl::UnauthenticatedError("unknown API key: its SHA-256 matches no tenant in the config");
  }
  return it->second;
}

}  // namespace kiln::server
