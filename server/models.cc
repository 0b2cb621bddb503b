#include "server/models.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/checked_int.h"
#include "base/status.h"
#include "engine/io/gguf.h"
#include "engine/io/npz.h"
#include "engine/io/safetensors.h"
#include "server/limits.h"
#include "server/rpc_common.h"
#include "spdlog/spdlog.h"
#ifdef KILN_SERVER_HAVE_ONNX
#include "engine/io/onnx/onnx_import.h"
#include "engine/io/onnx/onnx_specialize.h"
#endif

namespace kiln::server {
namespace {

namespace fs = std::filesystem;

constexpr const char* kGraphFiles[] = {"model.kiln", "model.pb", "model.onnx"};
// A value-specialised model keeps this many imports (the most recent values),
// as `kilnctl run model.onnx` does.
[[maybe_unused]] constexpr int kMaxSpecializations = 16;
// A value input holds at most 16 elements of at most 8 bytes.
[[maybe_unused]] constexpr int64_t kMaxValueBytes = 16 * 8;

std::optional<int64_t> ParseVersion(const std::string& s) {
  if (s.empty() || s.size() > 18 || s[0] == '0') return std::nullopt;
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v <= 0) return std::nullopt;
  return v;
}

// The newest modification time (ns) of the directory and the files in it: a
// version that failed to load (a half-copied weight file) is retried on the
// next scan once anything in it changes.
int64_t Stamp(const std::string& dir) {
  auto mtime = [](const std::string& path) -> int64_t {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return 0;
    return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  };
  int64_t newest = mtime(dir);
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    newest = std::max(newest, mtime(it->path().string()));
  }
  return newest;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, int64_t max_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a readable regular file"));
  }
  if (st.st_size > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(path, " is ", st.st_size, " bytes, over the limit of ", max_bytes));
  }
  std::ifstream in(path, std::ios::binary);
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  if (!in.read(bytes.data(), st.st_size)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
  }
  return bytes;
}

// Weight files open for the load: their tensors are read in place (the
// mapped bytes go straight to CreateParams).
struct Weights {
  std::vector<io::SafetensorsFile> safetensors;
  std::vector<io::GgufFile> gguf;
  std::vector<std::vector<std::pair<std::string, HostTensor>>> npz;  // read whole (zip)
  struct Source {
    std::string file;
    DType dtype;
    Dims dims;
    std::string_view bytes;
    std::string unreadable;  // a GGUF block type Kiln does not read
  };
  std::map<std::string, Source> by_name;
};

absl::Status AddWeight(Weights& w, const std::string& file, const std::string& name, Weights::Source src) {
  auto [it, inserted] = w.by_name.emplace(name, std::move(src));
  if (!inserted) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", QuoteClientString(name, 128), " is in both ",
                                                   it->second.file, " and ", file));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsValidModelName(std::string_view name) {
  if (name.empty() || name.size() > 128 || name[0] == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

ModelRepository::ModelRepository(const v1::ModelRepositoryConfig& config, const v1::Limits& limits,
                                 Engine& engine)
    : config_(config), limits_(limits), engine_(engine) {}

ModelRepository::~ModelRepository() {
  stop_.Notify();
  if (poller_.joinable()) poller_.join();
}

std::string ModelRepository::VersionDir(const std::string& name, int64_t version) const {
  return (fs::path(config_.root()) / name / std::to_string(version)).string();
}

absl::Status ModelRepository::Start() {
  std::error_code ec;
  if (!fs::is_directory(config_.root(), ec)) {
    return absl::InvalidArgumentError(absl::StrCat("model_repository: ", QuoteClientString(config_.root(), 256),
                                                   " is not a directory"));
  }
  Rescan();
  double poll = config_.poll_seconds() == 0 ? 5.0 : config_.poll_seconds();
  if (poll > 0) {
    poll = std::max(poll, 0.05);
    poller_ = std::thread([this, poll] {
      while (!stop_.WaitForNotificationWithTimeout(absl::Seconds(poll))) Rescan();
    });
  }
  return absl::OkStatus();
}

void ModelRepository::Rescan() {
  // What is on disk now.
  std::map<std::string, std::set<int64_t>> disk;
  std::error_code ec;
  for (fs::directory_iterator it(config_.root(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!it->is_directory(ec)) continue;
    if (!IsValidModelName(name)) {
      spdlog::warn("model repository: skipping {} (a model name is [A-Za-z0-9._-]{{1,128}})",
                   QuoteClientString(name, 128));
      continue;
    }
    std::set<int64_t>& versions = disk[name];
    std::error_code vec;
    for (fs::directory_iterator v(it->path(), vec), vend; !vec && v != vend; v.increment(vec)) {
      if (!v->is_directory(vec)) continue;
      const std::string vname = v->path().filename().string();
      if (std::optional<int64_t> n = ParseVersion(vname)) {
        versions.insert(*n);
      } else {
        spdlog::warn("model repository: skipping {}/{} (a version is a positive integer)", name,
                     QuoteClientString(vname, 64));
      }
    }
  }

  std::vector<std::pair<std::string, int64_t>> to_load;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, versions] : models_) {
      const auto d = disk.find(name);
      for (auto it = versions.begin(); it != versions.end();) {
        Entry& e = it->second;
        e.on_disk = d != disk.end() && d->second.contains(it->first);
        if (!e.on_disk && e.loaded) {
          spdlog::info("model {} version {}: its directory is gone; unloading", name, it->first);
          e.unloading = e.loaded;
          e.loaded.reset();
          e.state = v1::MODEL_STATE_UNLOADING;
        }
        if (!e.on_disk && e.state != v1::MODEL_STATE_LOADING && e.unloading.expired()) {
          it = versions.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (const auto& [name, versions] : disk) {
      auto& entries = models_[name];
      for (int64_t v : versions) entries.try_emplace(v);
      if (versions.empty()) continue;
      const int64_t newest = *versions.rbegin();
      Entry& e = entries[newest];
      bool any_loaded = false;
      for (const auto& [v, other] : entries) any_loaded = any_loaded || other.loaded != nullptr;
      const bool wanted = !config_.load_on_demand() || any_loaded;
      const bool retry = e.state == v1::MODEL_STATE_FAILED && Stamp(VersionDir(name, newest)) != e.disk_stamp;
      if (wanted && (e.state == v1::MODEL_STATE_AVAILABLE || retry)) to_load.emplace_back(name, newest);
    }
    for (auto it = models_.begin(); it != models_.end();) {
      it = it->second.empty() ? models_.erase(it) : std::next(it);
    }
  }
  for (const auto& [name, version] : to_load) (void)EnsureLoaded(name, version, /*explicit_load=*/false);
}

absl::StatusOr<std::shared_ptr<const ModelVersion>> ModelRepository::EnsureLoaded(const std::string& name,
                                                                                  int64_t version,
                                                                                  bool explicit_load) {
  {
    absl::MutexLock lock(&mu_);
    for (;;) {
      auto m = models_.find(name);
      if (m == models_.end() || !m->second.contains(version)) {
        return absl::NotFoundError(absl::StrCat("model ", name, " has no version ", version));
      }
      Entry& e = m->second[version];
      if (e.state == v1::MODEL_STATE_LOADING) {
        loaded_cv_.Wait(&mu_);
        continue;
      }
      if (e.loaded) {
        e.explicit_load = e.explicit_load || explicit_load;
        return e.loaded;
      }
      if (!e.on_disk) return absl::NotFoundError(absl::StrCat("model ", name, " version ", version, " is gone from disk"));
      e.state = v1::MODEL_STATE_LOADING;
      e.error.clear();
      break;
    }
  }
  const absl::Time t0 = absl::Now();
  const int64_t stamp = Stamp(VersionDir(name, version));
  absl::StatusOr<std::shared_ptr<ModelVersion>> loaded = LoadFromDisk(name, version);
  absl::MutexLock lock(&mu_);
  loaded_cv_.SignalAll();
  Entry& e = models_[name][version];
  e.disk_stamp = stamp;
  if (!loaded.ok()) {
    e.state = v1::MODEL_STATE_FAILED;
    e.error = std::string(loaded.status().message());
    ++load_counts_[{name, "failed"}];
    spdlog::warn("model {} version {}: load failed: {}", name, version, e.error);
    return absl::FailedPreconditionError(
        absl::StrCat("model ", name, " version ", version, " failed to load: ", e.error));
  }
  e.state = v1::MODEL_STATE_READY;
  e.loaded = *std::move(loaded);
  e.explicit_load = e.explicit_load || explicit_load;
  ++load_counts_[{name, "ok"}];
  spdlog::info("model {} version {} ready: {} and {} weight file(s), {} param(s), {} bytes, in {}",
               name, version, e.loaded->graph_file, e.loaded->weight_files.size(),
               e.loaded->signature.params.size(), e.loaded->param_bytes,
               absl::FormatDuration(absl::Now() - t0));
  RetireOlder(name, version);
  return e.loaded;
}

void ModelRepository::RetireOlder(const std::string& name, int64_t version) {
  for (auto& [v, e] : models_[name]) {
    if (v >= version || !e.loaded || e.explicit_load) continue;
    spdlog::info("model {} version {}: version {} is ready; unloading", name, v, version);
    e.unloading = e.loaded;
    e.loaded.reset();
    e.state = v1::MODEL_STATE_UNLOADING;
  }
}

absl::StatusOr<std::shared_ptr<ModelVersion>> ModelRepository::LoadFromDisk(const std::string& name,
                                                                            int64_t version) const {
  const std::string dir = VersionDir(name, version);
  auto model = std::make_shared<ModelVersion>();
  model->name = name;
  model->version = version;
  const int64_t max_bytes = config_.max_model_bytes() > 0 ? config_.max_model_bytes() : int64_t{64} << 30;

  // The files: one graph, any weights.
  std::vector<std::string> graphs, safetensors, gguf, npz;
  CheckedInt total = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string file = it->path().filename().string();
    if (!it->is_regular_file(ec)) continue;  // follows symlinks, as model stores use them
    const bool graph = std::find(std::begin(kGraphFiles), std::end(kGraphFiles), file) != std::end(kGraphFiles);
    const bool st = absl::EndsWith(file, ".safetensors");
    const bool gg = absl::EndsWith(file, ".gguf");
    const bool nz = absl::EndsWith(file, ".npz");
    if (!graph && !st && !gg && !nz) continue;
    total = total + static_cast<int64_t>(it->file_size(ec));
    (graph ? graphs : st ? safetensors : gg ? gguf : npz).push_back(file);
  }
  if (ec) return absl::InvalidArgumentError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  if (graphs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, " has no graph file (model.kiln, model.pb or model.onnx)"));
  }
  if (graphs.size() > 1) {
    std::sort(graphs.begin(), graphs.end());
    return absl::InvalidArgumentError(absl::StrCat(dir, " has ", absl::StrJoin(graphs, " and "),
                                                   ": one graph file per version"));
  }
  if (!total.ok() || total.get() > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(dir, ": the graph and weight files are over max_model_bytes = ",
                                                     max_bytes));
  }
  std::sort(safetensors.begin(), safetensors.end());
  std::sort(gguf.begin(), gguf.end());
  std::sort(npz.begin(), npz.end());
  model->graph_file = graphs[0];
  const std::string graph_path = (fs::path(dir) / graphs[0]).string();

  Weights w;
  std::vector<std::pair<std::string, HostTensor>> onnx_params;
  KILN_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(graph_path, max_bytes));
  if (graphs[0] == "model.kiln") {
    v1::GraphSource source;
    source.set_text(std::move(bytes));
    absl::StatusOr<v1::Graph> g = ResolveGraph(source, limits_);
    if (!g.ok()) return StatusBuilder(g.status()) << "in " << graphs[0];
    model->graph = *std::move(g);
  } else if (graphs[0] == "model.pb") {
    v1::GraphSource source;
    if (!source.mutable_graph()->ParseFromString(bytes)) {
      return absl::InvalidArgumentError("model.pb is not a serialized kiln.v1.Graph");
    }
    absl::StatusOr<v1::Graph> g = ResolveGraph(source, limits_);
    if (!g.ok()) return StatusBuilder(g.status()) << "in model.pb";
    model->graph = *std::move(g);
  } else {
#ifdef KILN_SERVER_HAVE_ONNX
    io::OnnxImportOptions options;
    options.all_initializers_as_params = true;
    options.max_model_bytes = max_bytes;
    // A Loop whose trip count is known at import runs at most as many
    // iterations as kilnd's While does.
    if (limits_.max_while_iterations() > 0) options.max_loop_iterations = limits_.max_while_iterations();
    absl::StatusOr<io::OnnxModel> onnx = io::ImportOnnxModel(bytes, options);
    if (!onnx.ok() && absl::IsUnimplemented(onnx.status())) {
      // Maybe its shapes depend on an input's value (a Loop's trip count as an
      // input): then it is imported per value on the runs (SpecializeFor).
      absl::StatusOr<io::OnnxInterface> iface = io::ReadOnnxInterface(bytes, options.limits);
      if (!iface.ok()) return StatusBuilder(iface.status()) << "in model.onnx";
      io::OnnxSpecializer::Options so;
      so.import = options;
      so.max_specializations = kMaxSpecializations;
      absl::StatusOr<std::unique_ptr<io::OnnxSpecializer>> spec = io::OnnxSpecializer::Create(bytes, so);
      if (spec.ok() && !(*spec)->generic()) {
        model->specializer = *std::move(spec);
        auto type_of = [](const HostTensor& t) {
          v1::TensorType type;
          type.set_dtype(t.dtype());
          for (int64_t d : t.dims()) type.add_dims()->set_size(d);
          return type;
        };
        for (auto& [name, type] : iface->inputs) model->signature.inputs.push_back({name, std::move(type)});
        for (auto& [name, type] : iface->outputs) model->signature.outputs.push_back({name, std::move(type)});
        for (auto& [name, t] : iface->initializers) {
          model->signature.params.push_back({name, type_of(t)});
          onnx_params.emplace_back(name, std::move(t));
        }
        spdlog::info("model {} version {}: model.onnx is value-specialised on {} (imported per distinct value "
                     "on the runs, the {} most recent kept)",
                     name, version, absl::StrJoin(model->specializer->value_inputs(), ", "), kMaxSpecializations);
      }
    }
    if (model->specializer == nullptr) {
      if (!onnx.ok()) return StatusBuilder(onnx.status()) << "in model.onnx";
      model->graph = std::move(onnx->graph);
      onnx_params = std::move(onnx->params);
      KILN_RETURN_IF_ERROR(CheckGraph(model->graph, limits_)) << "in model.onnx";
    }
#else
    return absl::UnimplementedError("this kilnd was built without the ONNX importer (libonnx-dev)");
#endif
  }
  if (model->specializer == nullptr) {
    KILN_ASSIGN_OR_RETURN(model->signature, engine_.Inspect(model->graph));
  }

  // The weights, by tensor name; every param needs one.
  for (const std::string& file : safetensors) {
    KILN_ASSIGN_OR_RETURN(io::SafetensorsFile f, io::SafetensorsFile::Open((fs::path(dir) / file).string()));
    w.safetensors.push_back(std::move(f));
    model->weight_files.push_back(file);
  }
  for (const std::string& file : gguf) {
    KILN_ASSIGN_OR_RETURN(io::GgufFile f, io::GgufFile::Open((fs::path(dir) / file).string()));
    w.gguf.push_back(std::move(f));
    model->weight_files.push_back(file);
  }
  for (const std::string& file : npz) {
    io::NpzLimits limits;
    limits.max_total_bytes = max_bytes;
    KILN_ASSIGN_OR_RETURN(auto tensors, io::ReadNpz((fs::path(dir) / file).string(), limits));
    w.npz.push_back(std::move(tensors));
    model->weight_files.push_back(file);
  }
  for (size_t i = 0; i < w.npz.size(); ++i) {
    for (const auto& [tname, t] : w.npz[i]) {
      KILN_RETURN_IF_ERROR(AddWeight(w, npz[i], tname, {npz[i], t.dtype(), t.dims(), t.bytes(), ""}));
    }
  }
  for (size_t i = 0; i < w.safetensors.size(); ++i) {
    for (const io::SafetensorsEntry& e : w.safetensors[i].tensors()) {
      KILN_RETURN_IF_ERROR(AddWeight(w, safetensors[i], e.name,
                                     {safetensors[i], e.dtype, e.dims, w.safetensors[i].Bytes(e), ""}));
    }
  }
  for (size_t i = 0; i < w.gguf.size(); ++i) {
    for (const io::GgufTensorInfo& t : w.gguf[i].tensors()) {
      KILN_RETURN_IF_ERROR(AddWeight(w, gguf[i], t.name,
                                     {gguf[i], t.dtype, t.dims, w.gguf[i].Bytes(t),
                                      t.dtype == v1::DTYPE_UNSPECIFIED ? t.type_name : ""}));
    }
  }
  for (const auto& [pname, value] : onnx_params) {
    KILN_RETURN_IF_ERROR(AddWeight(w, graphs[0], pname,
                                   {graphs[0], value.dtype(), value.dims(), value.bytes(), ""}));
  }
  std::vector<TensorRef> refs;
  std::vector<std::string> missing;
  CheckedInt param_bytes = 0;
  for (const GraphSignature::Entry& p : model->signature.params) {
    auto it = w.by_name.find(p.name);
    if (it == w.by_name.end()) {
      missing.push_back(p.name);
      continue;
    }
    const Weights::Source& src = it->second;
    if (!src.unreadable.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("param ", p.name, " in ", src.file, " is ", src.unreadable,
                                                     ", a GGUF block type Kiln does not read"));
    }
    KILN_RETURN_IF_ERROR(CheckParamAgainst(model->signature, p.name, src.dtype, src.dims)) << "from " << src.file;
    refs.push_back({p.name, src.dtype, src.dims, src.bytes.data(), static_cast<int64_t>(src.bytes.size())});
    param_bytes = param_bytes + static_cast<int64_t>(src.bytes.size());
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param(s) ", absl::StrJoin(missing, ", "), " of ", graphs[0], " have no tensor in the weight files",
        model->weight_files.empty() ? " (there are none: add a .safetensors, .gguf or .npz file)"
                                    : absl::StrCat(" (", absl::StrJoin(model->weight_files, ", "), ")")));
  }
  model->param_bytes = param_bytes.value().value_or(0);
  if (!refs.empty()) {
    KILN_ASSIGN_OR_RETURN(model->params, engine_.CreateParams(refs));
  }
  // A graph whose inputs are all concrete compiles now, so its errors surface
  // at load and the first session finds the executable cached.
  bool symbolic = model->specializer != nullptr;  // compiled per value on the runs
  for (const auto& in : model->signature.inputs) {
    for (const v1::Dim& dim : in.type.dims()) symbolic = symbolic || !dim.has_size();
  }
  if (!symbolic) {
    KILN_RETURN_IF_ERROR(engine_.Compile(model->graph, CompileOptions{}, {}).status()) << "compiling " << graphs[0];
  }
  return model;
}

absl::StatusOr<std::shared_ptr<const ModelVersion>> ModelRepository::Acquire(const std::string& name,
                                                                            int64_t version) {
  if (!IsValidModelName(name)) {
    return absl::InvalidArgumentError(absl::StrCat("model name ", QuoteClientString(name, 128),
                                                   " is not [A-Za-z0-9._-]{1,128}"));
  }
  if (version < 0) return absl::InvalidArgumentError(absl::StrCat("model version ", version, " is negative"));
  int64_t pick = version;
  {
    absl::MutexLock lock(&mu_);
    auto m = models_.find(name);
    if (m == models_.end()) {
      std::vector<std::string> names;
      for (const auto& [n, v] : models_) names.push_back(n);
      return absl::NotFoundError(absl::StrCat("no model ", name, " in the repository; its models: ",
                                              names.empty() ? "none" : absl::StrJoin(names, ", ")));
    }
    if (pick == 0) {
      for (auto it = m->second.rbegin(); it != m->second.rend(); ++it) {
        if (it->second.loaded) return it->second.loaded;
      }
      // None ready: the newest on disk loads (on demand).
      for (auto it = m->second.rbegin(); it != m->second.rend() && pick == 0; ++it) {
        if (it->second.on_disk) pick = it->first;
      }
      if (pick == 0) return absl::NotFoundError(absl::StrCat("model ", name, " has no version on disk"));
    }
    auto e = m->second.find(pick);
    if (e != m->second.end() && e->second.state == v1::MODEL_STATE_UNLOADING) {
      return absl::FailedPreconditionError(absl::StrCat("model ", name, " version ", pick,
                                                        " was unloaded (LoadModel loads it again)"));
    }
  }
  return EnsureLoaded(name, pick, /*explicit_load=*/false);
}

absl::StatusOr<v1::ModelVersionInfo> ModelRepository::Load(const std::string& name, int64_t version) {
  if (!IsValidModelName(name)) {
    return absl::InvalidArgumentError(absl::StrCat("model name ", QuoteClientString(name, 128),
                                                   " is not [A-Za-z0-9._-]{1,128}"));
  }
  Rescan();  // LoadModel sees what is on disk now
  int64_t pick = version;
  {
    absl::MutexLock lock(&mu_);
    auto m = models_.find(name);
    if (m == models_.end()) return absl::NotFoundError(absl::StrCat("no model ", name, " in the repository"));
    if (pick == 0) {
      for (const auto& [v, e] : m->second) {
        if (e.on_disk) pick = v;
      }
    }
    auto e = m->second.find(pick);
    if (e == m->second.end()) return absl::NotFoundError(absl::StrCat("model ", name, " has no version ", pick));
    if (e->second.state == v1::MODEL_STATE_FAILED) e->second.state = v1::MODEL_STATE_AVAILABLE;  // retry
  }
  KILN_RETURN_IF_ERROR(EnsureLoaded(name, pick, /*explicit_load=*/true).status());
  absl::MutexLock lock(&mu_);
  return InfoLocked(name, pick, models_[name][pick]);
}

absl::StatusOr<std::vector<v1::ModelVersionInfo>> ModelRepository::Unload(const std::string& name,
                                                                         int64_t version) {
  absl::MutexLock lock(&mu_);
  auto m = models_.find(name);
  if (m == models_.end()) {
    return absl::NotFoundError(absl::StrCat("no model ", QuoteClientString(name, 128), " in the repository"));
  }
  std::vector<v1::ModelVersionInfo> out;
  for (auto& [v, e] : m->second) {
    if ((version != 0 && v != version) || !e.loaded) continue;
    e.unloading = e.loaded;
    e.loaded.reset();
    e.explicit_load = false;
    e.state = v1::MODEL_STATE_UNLOADING;
    spdlog::info("model {} version {}: unloaded", name, v);
    out.push_back(InfoLocked(name, v, e));
  }
  if (out.empty()) {
    return absl::FailedPreconditionError(version == 0 ? absl::StrCat("model ", name, " has no loaded version")
                                                      : absl::StrCat("model ", name, " version ", version,
                                                                     " is not loaded"));
  }
  // With config's load_on_demand off an unloaded newest version would load
  // again at the next scan; it stays down until LoadModel (AVAILABLE only
  // once its sessions are gone, and then only on request).
  return out;
}

v1::ModelVersionInfo ModelRepository::InfoLocked(const std::string& name, int64_t version, const Entry& e) const {
  v1::ModelVersionInfo info;
  info.set_name(name);
  info.set_version(version);
  info.set_state(e.state);
  info.set_error(e.error);
  std::shared_ptr<const ModelVersion> m = e.loaded ? e.loaded : e.unloading.lock();
  if (e.state == v1::MODEL_STATE_UNLOADING && !m) info.set_state(v1::MODEL_STATE_AVAILABLE);
  if (m) {
    info.set_graph_file(m->graph_file);
    for (const std::string& f : m->weight_files) info.add_weight_files(f);
    info.set_param_bytes(m->param_bytes);
    info.set_sessions(m->sessions.load());
    if (e.loaded) SignatureToProto(m->signature, info.mutable_signature());
    if (m->specializer) {
      for (const std::string& in : m->specializer->value_inputs()) info.add_value_inputs(in);
    }
  }
  return info;
}

std::vector<v1::ModelVersionInfo> ModelRepository::List(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::ModelVersionInfo> out;
  for (const auto& [n, versions] : models_) {
    if (!name.empty() && n != name) continue;
    for (const auto& [v, e] : versions) out.push_back(InfoLocked(n, v, e));
  }
  return out;
}

std::vector<ModelRepository::SpecializedInfo> ModelRepository::Specialized() const {
  std::vector<std::shared_ptr<const ModelVersion>> loaded;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [n, versions] : models_) {
      for (const auto& [v, e] : versions) {
        if (e.loaded && e.loaded->specializer) loaded.push_back(e.loaded);
      }
    }
  }
  std::vector<SpecializedInfo> out;
  for (const auto& m : loaded) {
    SpecializedInfo info{m->name, m->version, {}, SpecializationsHeld(*m), SpecializationImports(*m)};
#ifdef KILN_SERVER_HAVE_ONNX
    info.value_inputs = m->specializer->value_inputs();
#endif
    out.push_back(std::move(info));
  }
  return out;
}

std::map<std::pair<std::string, std::string>, int64_t> ModelRepository::LoadCounts() const {
  absl::MutexLock lock(&mu_);
  return load_counts_;
}

std::vector<TensorRef> WithoutFixed(const std::vector<TensorRef>& inputs, const std::vector<std::string>& fixed) {
  std::vector<TensorRef> out;
  for (const TensorRef& t : inputs) {
    if (std::find(fixed.begin(), fixed.end(), t.name) == fixed.end()) out.push_back(t);
  }
  return out;
}

#ifdef KILN_SERVER_HAVE_ONNX
std::string ValueKey(const ModelVersion& model, const std::vector<TensorRef>& inputs) {
  std::string key;
  for (const std::string& name : model.specializer->value_inputs()) {
    for (const TensorRef& t : inputs) {
      if (t.name != name) continue;
      const int64_t n = std::min(t.bytes, kMaxValueBytes);
      absl::StrAppend(&key, name, ":", t.dtype, DimsToString(t.dims), "=",
                      absl::BytesToHexString(absl::string_view(static_cast<const char*>(t.data), static_cast<size_t>(n))), ";");
    }
  }
  return key;
}

absl::StatusOr<Specialization> SpecializeFor(const ModelVersion& model, const std::vector<TensorRef>& inputs) {
  io::OnnxSpecializer& s = *model.specializer;
  const std::vector<std::string> names = s.value_inputs();
  std::vector<HostTensor> held;
  std::vector<std::string> held_names;
  for (const TensorRef& t : inputs) {
    if (std::find(names.begin(), names.end(), t.name) == names.end()) continue;
    if (t.bytes > kMaxValueBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input \"", t.name, "\" must be a small integer or bool tensor (the model's shapes depend on its value), got ",
          DTypeName(t.dtype), DimsToString(t.dims)));
    }
    KILN_ASSIGN_OR_RETURN(HostTensor h, HostTensor::FromBytes(t.dtype, t.dims,
                                                              std::string_view(static_cast<const char*>(t.data),
                                                                               static_cast<size_t>(t.bytes))));
    held.push_back(std::move(h));
    held_names.push_back(t.name);
  }
  std::vector<std::pair<std::string, const HostTensor*>> values;
  for (size_t i = 0; i < held.size(); ++i) values.emplace_back(held_names[i], &held[i]);
  absl::StatusOr<std::shared_ptr<const io::OnnxModel>> m = s.For(values);
  if (!m.ok()) {
    return absl::Status(m.status().code(), absl::StrCat("model ", model.name, " version ", model.version,
                                                        " (value-specialised): ", m.status().message()));
  }
  Specialization out;
  out.graph = std::shared_ptr<const v1::Graph>(*m, &(*m)->graph);
  out.fixed = s.value_inputs();
  out.value_key = ValueKey(model, inputs);
  return out;
}

int64_t SpecializationsHeld(const ModelVersion& model) {
  return model.specializer ? model.specializer->cached() : 0;
}
int64_t SpecializationImports(const ModelVersion& model) {
  return model.specializer ? model.specializer->imports() : 0;
}
#else
std::string ValueKey(const ModelVersion&, const std::vector<TensorRef>&) { return ""; }
absl::StatusOr<Specialization> SpecializeFor(const ModelVersion&, const std::vector<TensorRef>&) {
  return absl::UnimplementedError("this kilnd was built without the ONNX importer (libonnx-dev)");
}
int64_t SpecializationsHeld(const ModelVersion&) { return 0; }
int64_t SpecializationImports(const ModelVersion&) { return 0; }
#endif

}  // namespace kiln::server
