#include "server/sessions.h"

#include <openssl/rand.h>

#include <algorithm>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/limits.h"

namespace kiln::server {

Session::Session(std::string id, Tenant& owner, v1::Graph graph, GraphSignature signature,
                 CompileOptions options)
    : id_(std::move(id)),
      owner_(owner),
      graph_(std::move(graph)),
      signature_(std::move(signature)),
      training_(options.transforms.has_training()
                    ? std::optional<v1::TrainingSpec>(options.transforms.training())
                    : std::nullopt),
      options_([&] {
        CompileOptions o = std::move(options);
        o.transforms.clear_training();
        return o;
      }()),
      symbolic_([this] {
        for (const auto& in : signature_.inputs) {
          for (const v1::Dim& d : in.type.dims()) {
            if (!d.has_size()) return true;
          }
        }
        return false;
      }()) {}

CompileOptions Session::training_options() const {
  CompileOptions o = options_;
  if (training_) *o.transforms.mutable_training() = *training_;
  return o;
}

std::optional<Session::Compiled> Session::FindExecutable(const std::string& shape_key) const {
  absl::MutexLock lock(&state_mu_);
  auto it = executables_.find(shape_key);
  if (it == executables_.end()) return std::nullopt;
  return it->second;
}

std::optional<double> Session::EstimatedRunMicros(const std::string& shape_key) const {
  absl::MutexLock lock(&state_mu_);
  auto it = executables_.find(shape_key);
  if (it == executables_.end()) return std::nullopt;
  const double estimate = it->second.executable->estimated_run_micros();
  if (estimate <= 0) return std::nullopt;
  return estimate;
}

int64_t Session::AddExecutable(const std::string& shape_key, Compiled compiled) {
  absl::MutexLock lock(&state_mu_);
  if (closed_ || executables_.contains(shape_key)) return compiled.arena_bytes;
  int64_t forgotten = 0;
  while (executables_.size() >= max_executables_) {
    forgotten += executables_.at(lru_.back()).arena_bytes;
    executables_.erase(lru_.back());
    lru_.pop_back();
  }
  lru_.push_front(shape_key);
  executables_.emplace(shape_key, std::move(compiled));
  return forgotten;
}

void Session::SetBatching(BatchingConfig config, std::string inputs_reason) {
  batching_ = config;
  inputs_batch_reason_ = std::move(inputs_reason);
  // A batched run's executable is per total rows: room for each size (up to
  // 64 of them) besides the session's own shapes.
  if (config.enabled()) {
    max_executables_ = kMaxExecutables + static_cast<size_t>(std::min<int64_t>(config.max_batch, 64));
  }
}

std::string Session::OutputsBatchReasonFor(const std::vector<TensorRef>& inputs,
                                           const ir::VerifyOptions& verify) const {
  // The inputs' dims with the leading (batch) dim left out.
  std::string key;
  for (const TensorRef& t : inputs) {
    absl::StrAppend(&key, t.name, ":", t.dims.empty() ? -1 : t.dims[0] == inputs[0].dims[0] ? 0 : 1,
                    DimsToString(std::span<const int64_t>(t.dims).subspan(t.dims.empty() ? 0 : 1)),
                    ";");
  }
  {
    absl::MutexLock lock(&batch_reasons_mu_);
    if (auto it = batch_reasons_.find(key); it != batch_reasons_.end()) return it->second;
  }
  std::string reason = OutputsBatchReason(graph_, inputs, verify);
  absl::MutexLock lock(&batch_reasons_mu_);
  if (batch_reasons_.size() >= kMaxBatchReasons) batch_reasons_.clear();
  batch_reasons_.emplace(std::move(key), reason);
  return reason;
}

std::shared_ptr<ParamSet> Session::params() const {
  absl::MutexLock lock(&state_mu_);
  return params_;
}

std::map<std::string, int64_t> Session::param_bytes() const {
  absl::MutexLock lock(&state_mu_);
  return param_bytes_;
}

absl::Status Session::SetParams(std::shared_ptr<ParamSet> params,
                                std::map<std::string, int64_t> bytes, int64_t set_device_bytes) {
  int64_t released = 0;
  {
    absl::MutexLock lock(&state_mu_);
    if (closed_) return absl::NotFoundError(absl::StrCat("session \"", id_, "\" was closed"));
    params_ = std::move(params);
    param_bytes_ = std::move(bytes);
    params_shared_ = false;
    released = std::exchange(set_device_bytes_, set_device_bytes);
  }
  if (released > 0) owner_.ReleaseBytes(0, released);
  return absl::OkStatus();
}

void Session::AttachModel(std::unique_ptr<ModelLease> lease) {
  absl::MutexLock lock(&state_mu_);
  params_ = lease->model().params;
  param_bytes_.clear();
  params_shared_ = true;
  value_specialized_ = lease->model().specializer != nullptr;
  model_ = std::move(lease);
}

std::shared_ptr<const ModelVersion> Session::specialized() const {
  if (!value_specialized_) return nullptr;
  absl::MutexLock lock(&state_mu_);
  return model_ ? model_->shared() : nullptr;
}

bool Session::params_shared() const {
  absl::MutexLock lock(&state_mu_);
  return params_shared_;
}

std::string Session::model() const {
  absl::MutexLock lock(&state_mu_);
  if (!model_) return "";
  return absl::StrCat(model_->model().name, ":", model_->model().version);
}

Session::Charge Session::ChargeLocked() const {
  Charge c;
  if (closed_) return c;
  for (const auto& [name, b] : param_bytes_) c.param_bytes += b;
  c.device_bytes = c.param_bytes + set_device_bytes_;
  for (const auto& [key, e] : executables_) c.device_bytes += e.arena_bytes;
  return c;
}

Session::Charge Session::charge() const {
  absl::MutexLock lock(&state_mu_);
  return ChargeLocked();
}

Session::Charge Session::Close() {
  absl::MutexLock lock(&state_mu_);
  const Charge c = ChargeLocked();
  closed_ = true;
  // Runs in flight keep their executable and params; the session lets go
  // (of the model too: it no longer counts among the model's sessions).
  executables_.clear();
  lru_.clear();
  model_.reset();
  return c;
}

bool Session::closed() const {
  absl::MutexLock lock(&state_mu_);
  return closed_;
}

std::string SessionStore::NewId() {
  unsigned char raw[16];
  if (RAND_bytes(raw, sizeof(raw)) != 1) {
    // OpenSSL's generator failing is our broken invariant, not the caller's.
    std::abort();
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "s-";
  for (unsigned char b : raw) {
    id.push_back(kHex[b >> 4]);
    id.push_back(kHex[b & 15]);
  }
  return id;
}

void SessionStore::Add(std::shared_ptr<Session> session) {
  absl::MutexLock lock(&sessions_mu_);
  const std::string id = session->id();
  sessions_.emplace(id, std::move(session));
}

absl::StatusOr<std::shared_ptr<Session>> SessionStore::Find(const Tenant& tenant,
                                                            const std::string& id) const {
  absl::MutexLock lock(&sessions_mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || &it->second->owner() != &tenant) {
    return absl::NotFoundError(absl::StrCat(
        "session ", QuoteClientString(id), " not found (closed, never created, or created by another tenant)"));
  }
  return it->second;
}

absl::Status SessionStore::Remove(const Tenant& tenant, const std::string& id) {
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&sessions_mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end() || &it->second->owner() != &tenant) {
      return absl::NotFoundError(absl::StrCat(
          "session ", QuoteClientString(id), " not found (closed, never created, or created by another tenant)"));
    }
    session = std::move(it->second);
    sessions_.erase(it);
  }
  const Session::Charge c = session->Close();
  session->owner().ReleaseBytes(c.param_bytes, c.device_bytes);
  session->owner().ReleaseSession();
  return absl::OkStatus();
}

std::map<std::string, int64_t> SessionStore::CountByTenant() const {
  absl::MutexLock lock(&sessions_mu_);
  std::map<std::string, int64_t> out;
  for (const auto& [id, s] : sessions_) ++out[s->owner().name()];
  return out;
}

}  // namespace kiln::server
