// The model repository (kilnd --model_repository=DIR; docs/models.md):
//
//   DIR/<model>/<version>/model.kiln | model.pb | model.onnx   one graph file
//   DIR/<model>/<version>/*.safetensors, *.gguf, *.npz          its params, by name
//
// Model names are [A-Za-z0-9._-]{1,128} (not starting with '.'); versions are
// positive decimal integers. A version directory is immutable once written:
// kilnd reads it once, at load. Other entries are skipped with a warning.
//
// A loaded version holds its graph, its signature and one ParamSet with its
// weights. Every session opened on the model (CreateSession with
// GraphSource.model) binds that same ParamSet, whoever its tenant: the weights
// are in memory once. They are the repository's, not charged to tenants; a
// session that changes a param (SetParams) gets a private copy charged to its
// tenant (copy on write). A version that fails to load is FAILED with the
// reason, and stays so until its directory changes on disk or LoadModel asks.
//
// Unloading drops the repository's hold: new sessions cannot open on it, the
// sessions already open keep working, and the weights are freed (host and
// every device mirror) when the last of them closes. A version directory that
// disappears from disk is unloaded the same way.
//
// Hot reload: every poll period the root is scanned; a new newest version of
// a model loads (in load_on_demand mode only if an older one is loaded), and
// once it is ready the older versions that were loaded automatically unload
// (a version loaded by LoadModel stays until UnloadModel).
//
// Value-specialised models: a model.onnx whose shapes depend on an input's
// value (a Loop's trip count given as an input: io::OnnxSpecializer) cannot be
// imported once at load. Its version keeps the specializer instead (ModelVersion::
// specializer; its graph is then empty and its signature the ONNX model's
// declared inputs, outputs and initializers), and a session opened on it
// imports and compiles once per distinct value on its runs (SpecializeFor),
// bounded like `kilnctl run model.onnx` (the 16 most recent values, the
// import's limits). Its initializers are one ParamSet shared like any model's.
//
// Thread safety: thread-safe. Loads run on the caller's thread (kilnd's work
// pool) or the poll thread; one load per version at a time, other callers of
// that version wait for it.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "engine/engine.h"
#include "kiln/v1/config.pb.h"
#include "kiln/v1/service.pb.h"

namespace kiln::io {
class OnnxSpecializer;
}

namespace kiln::server {

// One loaded model version. Immutable; shared by the repository and every
// session opened on it.
struct ModelVersion {
  std::string name;
  int64_t version = 0;
  v1::Graph graph;
  GraphSignature signature;
  std::shared_ptr<ParamSet> params;  // null when the graph has no params
  int64_t param_bytes = 0;
  std::string graph_file;
  std::vector<std::string> weight_files;
  mutable std::atomic<int64_t> sessions{0};
  // Set for a value-specialised model.onnx (see above); null otherwise.
  std::shared_ptr<io::OnnxSpecializer> specializer;
};

// A value-specialised model's graph for one run: imported for the values of
// `inputs` (the model's inputs by name, as a session's run has them) or found
// among the ones imported before. `fixed` names the inputs whose values the
// graph holds (the run binds only the others); `value_key` identifies those
// values. Errors are the specializer's: INVALID_ARGUMENT for a value input
// missing or of the wrong dtype or shape, RESOURCE_EXHAUSTED naming the Loop
// for a trip count over the limit, the import's error otherwise.
struct Specialization {
  std::shared_ptr<const v1::Graph> graph;
  std::vector<std::string> fixed;
  std::string value_key;
};
absl::StatusOr<Specialization> SpecializeFor(const ModelVersion& model, const std::vector<TensorRef>& inputs);
// The value key of `inputs` under the value inputs known now (no import): what
// a session looks its executables up by.
std::string ValueKey(const ModelVersion& model, const std::vector<TensorRef>& inputs);
// `inputs` without those named in `fixed`.
std::vector<TensorRef> WithoutFixed(const std::vector<TensorRef>& inputs, const std::vector<std::string>& fixed);
// Specialisations a value-specialised model holds now, and imports done.
int64_t SpecializationsHeld(const ModelVersion& model);
int64_t SpecializationImports(const ModelVersion& model);

// Held by a session opened on a model: counts it in ListModels and keeps the
// version (and so its weights) alive until the session closes.
class ModelLease {
 public:
  explicit ModelLease(std::shared_ptr<const ModelVersion> model) : model_(std::move(model)) {
    model_->sessions.fetch_add(1);
  }
  ~ModelLease() { model_->sessions.fetch_sub(1); }
  ModelLease(const ModelLease&) = delete;
  ModelLease& operator=(const ModelLease&) = delete;
  const ModelVersion& model() const { return *model_; }
  const std::shared_ptr<const ModelVersion>& shared() const { return model_; }

 private:
  std::shared_ptr<const ModelVersion> model_;
};

class ModelRepository {
 public:
  // `limits` bound the graph files like client graphs. Borrows `engine`.
  ModelRepository(const v1::ModelRepositoryConfig& config, const v1::Limits& limits, Engine& engine);
  ~ModelRepository();  // stops the poll thread
  ModelRepository(const ModelRepository&) = delete;
  ModelRepository& operator=(const ModelRepository&) = delete;

  // Checks the root, scans it, loads the newest version of every model
  // (unless load_on_demand) and starts the poll thread. Fails only when the
  // root is not a readable directory; a model that fails to load is FAILED.
  absl::Status Start();
  const std::string& root() const { return config_.root(); }

  // A ready version for a new session: `version` 0 = the newest ready one,
  // else that one. A version on disk that is not loaded loads now. NOT_FOUND
  // names what exists; FAILED_PRECONDITION carries a failed load's reason.
  absl::StatusOr<std::shared_ptr<const ModelVersion>> Acquire(const std::string& name, int64_t version);

  // LoadModel: loads `version` (0 = newest on disk), reloading a FAILED one.
  absl::StatusOr<v1::ModelVersionInfo> Load(const std::string& name, int64_t version);
  // UnloadModel: `version` 0 = every loaded version.
  absl::StatusOr<std::vector<v1::ModelVersionInfo>> Unload(const std::string& name, int64_t version);
  // ListModels: every version on disk or still held, by name then version.
  std::vector<v1::ModelVersionInfo> List(const std::string& name = "") const;

  // One scan of the root (what the poll thread does each period).
  void Rescan();

  // The loaded value-specialised versions: their value inputs, the
  // specialisations held now and the imports done, for /metrics.
  struct SpecializedInfo {
    std::string name;
    int64_t version = 0;
    std::vector<std::string> value_inputs;
    int64_t held = 0;
    int64_t imports = 0;
  };
  std::vector<SpecializedInfo> Specialized() const;

  // Loads by outcome ("ok", "failed") and model, for /metrics.
  std::map<std::pair<std::string, std::string>, int64_t> LoadCounts() const;

 private:
  struct Entry {
    v1::ModelState state = v1::MODEL_STATE_AVAILABLE;
    std::string error;
    bool on_disk = true;
    bool explicit_load = false;  // LoadModel asked: hot reload leaves it
    std::shared_ptr<const ModelVersion> loaded;
    std::weak_ptr<const ModelVersion> unloading;  // dropped, still held by sessions
    int64_t disk_stamp = 0;  // the directory's mtime when last loaded or failed
  };

  // Loads (name, version) unless ready; waits for a load in progress.
  absl::StatusOr<std::shared_ptr<const ModelVersion>> EnsureLoaded(const std::string& name, int64_t version,
                                                                  bool explicit_load);
  absl::StatusOr<std::shared_ptr<ModelVersion>> LoadFromDisk(const std::string& name, int64_t version) const;
  // After `version` of `name` became ready: unloads older automatic versions.
  void RetireOlder(const std::string& name, int64_t version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::ModelVersionInfo InfoLocked(const std::string& name, int64_t version, const Entry& e) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  std::string VersionDir(const std::string& name, int64_t version) const;

  const v1::ModelRepositoryConfig config_;
  const v1::Limits limits_;
  Engine& engine_;
  mutable absl::Mutex mu_;
  absl::CondVar loaded_cv_;
  std::map<std::string, std::map<int64_t, Entry>> models_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, int64_t> load_counts_ ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
  std::thread poller_;
};

// Whether `name` may name a model: [A-Za-z0-9._-]{1,128}, not starting with '.'.
bool IsValidModelName(std::string_view name);

}  // namespace kiln::server
