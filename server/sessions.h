// Sessions: a verified graph plus bound params, owned by one tenant
// (DESIGN.md section 7). Executables are the engine's (shared and
// content-addressed); a session remembers the ones it uses per input-shape
// signature so a run skips graph import and key hashing.
//
// What a session charges its tenant (param bytes, device bytes) is recorded
// here and released by SessionStore::Remove.
//
// Thread safety: Session and SessionStore are thread-safe. Sessions are
// shared_ptr: a run keeps its session (and the ParamSet it read) alive after
// the session is closed.
#pragma once

#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/engine.h"
#include "server/batcher.h"
#include "server/models.h"
#include "server/tenants.h"

namespace kiln::server {

class Session {
 public:
  Session(std::string id, Tenant& owner, v1::Graph graph, GraphSignature signature,
          CompileOptions options);
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const std::string& id() const { return id_; }
  Tenant& owner() const { return owner_; }
  const v1::Graph& graph() const { return graph_; }
  const GraphSignature& signature() const { return signature_; }
  // Without the training spec: what Run compiles (the forward graph).
  const CompileOptions& options() const { return options_; }
  // A training session's spec (CreateSession with options.transforms.training);
  // TrainStep compiles options() plus it.
  const std::optional<v1::TrainingSpec>& training() const { return training_; }
  CompileOptions training_options() const;
  // True when runs update params in place (CreateSessionRequest.state:
  // options().state_updates); such runs are serialized on the session.
  bool stateful() const { return !options_.state_updates.empty(); }
  // True when some input has a symbolic dim, or the session is on a
  // value-specialised model: executables are per shape (and value).
  bool symbolic() const { return symbolic_ || value_specialized_; }
  // Whether the session is on a value-specialised model
  // (ModelVersion::specializer): each run's graph is SpecializeFor its inputs.
  bool value_specialized() const { return value_specialized_; }
  // That model while the session is open (null once closed, or when the
  // session is not value-specialised).
  std::shared_ptr<const ModelVersion> specialized() const;

  struct Compiled {
    std::shared_ptr<Executable> executable;
    v1::CompileReport report;  // as compiled (or loaded) the first time
    int64_t arena_bytes = 0;   // charged to the tenant's device memory
    // A value-specialised model's: the inputs whose values the executable
    // holds (the run binds only the others). Empty otherwise.
    std::vector<std::string> fixed;
  };
  // The executable remembered for `shape_key`, if any.
  std::optional<Compiled> FindExecutable(const std::string& shape_key) const;
  // The cost model's estimate of one run of that executable on the device it
  // was placed on, if the session has it.
  std::optional<double> EstimatedRunMicros(const std::string& shape_key) const;
  // Remembers `compiled` (whose arena bytes the caller has charged). Returns
  // the arena bytes of executables forgotten to stay under the per-session
  // limit, for the caller to release.
  int64_t AddExecutable(const std::string& shape_key, Compiled compiled);

  std::shared_ptr<ParamSet> params() const;
  // A session opened on a repository model: binds the model's shared params
  // (charged to no tenant) and holds the lease until Close. REQUIRES: before
  // the session is shared.
  void AttachModel(std::unique_ptr<ModelLease> lease);
  // Whether the bound params are a model's shared set (a change copies them,
  // and the copy is charged to the tenant: BindParams).
  bool params_shared() const;
  // "name:version" of the model, or "" for a session on a client graph.
  std::string model() const;
  // Bytes of each bound param, by name.
  std::map<std::string, int64_t> param_bytes() const;

  // Serializes param updates (read current set, merge, swap).
  absl::Mutex& update_mu() { return update_mu_; }
  // Binds a new param set. `set_device_bytes`: device memory the set holds
  // besides its params' bytes (a training set's second buffer of each
  // updated value, ParamSetImpl::Spare), which the caller charged to the
  // tenant's device memory and which stays charged while the set is the
  // session's, whatever executables the session remembers or forgets. The
  // replaced set's such bytes are released to the tenant here. REQUIRES:
  // update_mu() held. Fails NOT_FOUND when the session was closed meanwhile
  // (nothing released).
  absl::Status SetParams(std::shared_ptr<ParamSet> params, std::map<std::string, int64_t> bytes,
                         int64_t set_device_bytes = 0) ABSL_EXCLUSIVE_LOCKS_REQUIRED(update_mu_);

  // Dynamic batching of the session's runs (server/batcher.h): `config`, and
  // why runs can never join a batch ("" when they may: InputsBatchReason).
  // REQUIRES: before the session is shared.
  void SetBatching(BatchingConfig config, std::string inputs_reason);
  const BatchingConfig& batching() const { return batching_; }
  const std::string& inputs_batch_reason() const { return inputs_batch_reason_; }
  // OutputsBatchReason for these inputs, remembered per non-batch shape
  // (the last 256 shapes).
  std::string OutputsBatchReasonFor(const std::vector<TensorRef>& inputs,
                                    const ir::VerifyOptions& verify) const;

  // What the session charges its tenant now.
  struct Charge {
    int64_t param_bytes = 0;
    int64_t device_bytes = 0;
  };
  Charge charge() const;
  // Marks the session closed and returns its charge (once; later calls 0).
  Charge Close();
  bool closed() const;

 private:
  static constexpr size_t kMaxExecutables = 16;
  static constexpr size_t kMaxBatchReasons = 256;
  Charge ChargeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);

  const std::string id_;
  Tenant& owner_;
  const v1::Graph graph_;
  const GraphSignature signature_;
  const std::optional<v1::TrainingSpec> training_;
  const CompileOptions options_;
  const bool symbolic_;
  bool value_specialized_ = false;  // set by AttachModel, then const

  absl::Mutex update_mu_;
  BatchingConfig batching_;
  std::string inputs_batch_reason_;
  // Executables remembered: kMaxExecutables, plus one per batch size.
  size_t max_executables_ = kMaxExecutables;

  mutable absl::Mutex batch_reasons_mu_;
  mutable std::map<std::string, std::string> batch_reasons_ ABSL_GUARDED_BY(batch_reasons_mu_);

  mutable absl::Mutex state_mu_;
  std::map<std::string, Compiled> executables_ ABSL_GUARDED_BY(state_mu_);
  std::list<std::string> lru_ ABSL_GUARDED_BY(state_mu_);  // front = most recent
  std::shared_ptr<ParamSet> params_ ABSL_GUARDED_BY(state_mu_);
  std::map<std::string, int64_t> param_bytes_ ABSL_GUARDED_BY(state_mu_);
  int64_t set_device_bytes_ ABSL_GUARDED_BY(state_mu_) = 0;  // SetParams
  bool closed_ ABSL_GUARDED_BY(state_mu_) = false;
  std::unique_ptr<ModelLease> model_ ABSL_GUARDED_BY(state_mu_);
  bool params_shared_ ABSL_GUARDED_BY(state_mu_) = false;
};

class SessionStore {
 public:
  SessionStore() = default;
  SessionStore(const SessionStore&) = delete;
  SessionStore& operator=(const SessionStore&) = delete;

  // A new unguessable id (128 random bits).
  static std::string NewId();

  void Add(std::shared_ptr<Session> session);
  // The tenant's session `id`. Another tenant's session answers NOT_FOUND,
  // exactly as an id that does not exist.
  absl::StatusOr<std::shared_ptr<Session>> Find(const Tenant& tenant, const std::string& id) const;
  // Removes and closes the session, releasing its charge and session slot.
  absl::Status Remove(const Tenant& tenant, const std::string& id);
  // Open sessions per tenant name.
  std::map<std::string, int64_t> CountByTenant() const;

 private:
  mutable absl::Mutex sessions_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(sessions_mu_);
};

}  // namespace kiln::server
