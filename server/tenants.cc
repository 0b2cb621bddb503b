#include "server/tenants.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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
    for (const std::string& key : t.api_key_sha256()) {
      std::string hex = key;
      absl::AsciiStrToLower(&hex);
      if (!r->by_key_hash_.emplace(hex, r->tenants_.back().get()).second) {
        return absl::InvalidArgumentError(absl::StrCat("tenant \"", t.name(),
                                                       "\": an api key is listed twice"));
      }
    }
  }
  return r;
}

absl::StatusOr<Tenant*> TenantRegistry::Authenticate(
    std::optional<std::string_view> authorization) const {
  if (open_) return tenants_.front().get();
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
