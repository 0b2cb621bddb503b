#include "engine/io/onnx/onnx_specialize.h"

#include <algorithm>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "engine/io/onnx/onnx_internal.h"

namespace kiln::io {

namespace {

// A value input holds at most this many elements (a key, not data).
constexpr int64_t kMaxValueElements = 16;

struct Candidate {
  std::string name;
  DType dtype;
  Dims dims;
};

absl::StatusOr<std::vector<Candidate>> Candidates(std::string_view bytes) {
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return absl::ResourceExhaustedError("ONNX model over 2 GiB");
  }
  onnx::ModelProto model;
  if (!model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(
        "not an ONNX model: the bytes do not parse as onnx.ModelProto");
  }
  absl::flat_hash_set<std::string> initializers;
  for (const auto& i : model.graph().initializer()) initializers.insert(i.name());
  std::vector<Candidate> out;
  for (const auto& vi : model.graph().input()) {
    if (initializers.contains(vi.name()) || !vi.type().has_tensor_type()) continue;
    const auto& tt = vi.type().tensor_type();
    const std::optional<DType> dt = onnx_internal::DTypeFromOnnx(tt.elem_type());
    if (!dt || !(IsInteger(*dt) || *dt == v1::DTYPE_BOOL) || !tt.has_shape()) continue;
    int64_t n = 1;
    Dims dims;
    for (const auto& d : tt.shape().dim()) {
      const int64_t size =
          d.has_dim_value() && d.dim_value() >= 0 ? d.dim_value() : kMaxValueElements + 1;
      n = std::min(n * std::min(size, kMaxValueElements + 1), kMaxValueElements + 1);
      dims.push_back(size);
    }
    if (n <= kMaxValueElements) out.push_back({vi.name(), *dt, std::move(dims)});
  }
  return out;
}

}  // namespace

absl::StatusOr<OnnxInterface> ReadOnnxInterface(std::string_view bytes, const ir::InferLimits& limits) {
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return absl::ResourceExhaustedError("ONNX model over 2 GiB");
  }
  onnx::ModelProto model;
  if (!model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(
        "not an ONNX model: the bytes do not parse as onnx.ModelProto");
  }
  OnnxInterface out;
  absl::flat_hash_set<std::string> initializers;
  for (const auto& init : model.graph().initializer()) {
    if (!initializers.insert(init.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("ONNX initializer \"", init.name(), "\" appears twice"));
    }
    absl::StatusOr<HostTensor> t = onnx_internal::TensorFromProto(init, limits);
    if (!t.ok()) return StatusBuilder(t.status()) << "ONNX initializer \"" << init.name() << "\"";
    out.initializers.emplace_back(init.name(), *std::move(t));
  }
  // An output may leave its type out (the import infers it): then its
  // entry has no dtype and no dims.
  auto type_of = [&](const onnx::ValueInfoProto& vi, bool output) -> absl::StatusOr<v1::TensorType> {
    if (output && (!vi.type().has_tensor_type() || vi.type().tensor_type().elem_type() == 0)) {
      return v1::TensorType();
    }
    if (!vi.type().has_tensor_type()) {
      return absl::InvalidArgumentError(absl::StrCat("\"", vi.name(), "\" is not a tensor"));
    }
    const auto& tt = vi.type().tensor_type();
    const std::optional<DType> dt = onnx_internal::DTypeFromOnnx(tt.elem_type());
    if (!dt) {
      return absl::UnimplementedError(absl::StrCat("\"", vi.name(), "\": element type ",
                                                   tt.elem_type(), " has no Kiln dtype"));
    }
    v1::TensorType t;
    t.set_dtype(*dt);
    if (tt.shape().dim_size() > limits.max_rank) {
      return absl::InvalidArgumentError(absl::StrCat("\"", vi.name(), "\": rank ",
                                                     tt.shape().dim_size(), " exceeds the limit ",
                                                     limits.max_rank));
    }
    for (int i = 0; i < tt.shape().dim_size(); ++i) {
      const auto& d = tt.shape().dim(i);
      if (d.has_dim_value() && d.dim_value() >= 0) {
        t.add_dims()->set_size(d.dim_value());
      } else if (d.has_dim_param() && !d.dim_param().empty()) {
        t.add_dims()->set_symbol(d.dim_param());
      } else {
        t.add_dims()->set_symbol(absl::StrCat(vi.name(), ".", i));
      }
    }
    return t;
  };
  for (const auto& vi : model.graph().input()) {
    if (initializers.contains(vi.name())) continue;
    absl::StatusOr<v1::TensorType> t = type_of(vi, false);
    if (!t.ok()) return StatusBuilder(t.status()) << "ONNX graph input";
    out.inputs.emplace_back(vi.name(), *std::move(t));
  }
  for (const auto& vi : model.graph().output()) {
    absl::StatusOr<v1::TensorType> t = type_of(vi, true);
    if (!t.ok()) return StatusBuilder(t.status()) << "ONNX graph output";
    out.outputs.emplace_back(vi.name(), *std::move(t));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ValueInputCandidates(std::string_view bytes) {
  KILN_ASSIGN_OR_RETURN(std::vector<Candidate> c, Candidates(bytes));
  std::vector<std::string> names;
  for (const Candidate& k : c) names.push_back(k.name);
  return names;
}

absl::StatusOr<std::unique_ptr<OnnxSpecializer>> OnnxSpecializer::Create(std::string bytes,
                                                                         Options options) {
  if (!options.import.input_values.empty()) {
    return absl::InvalidArgumentError("OnnxSpecializer sets input_values itself");
  }
  if (options.max_specializations < 1) {
    return absl::InvalidArgumentError("max_specializations must be at least 1");
  }
  std::unique_ptr<OnnxSpecializer> s(new OnnxSpecializer());
  s->bytes_ = std::move(bytes);
  s->options_ = std::move(options);
  KILN_ASSIGN_OR_RETURN(std::vector<Candidate> found, Candidates(s->bytes_));
  std::vector<std::string> candidates;
  for (Candidate& k : found) {
    candidates.push_back(k.name);
    s->declared_[k.name] = {k.dtype, std::move(k.dims)};
  }
  absl::StatusOr<std::shared_ptr<const OnnxModel>> generic = s->Import({});
  if (generic.ok()) {
    s->generic_ = *std::move(generic);
    return s;
  }
  if (!absl::IsUnimplemented(generic.status()) || candidates.empty()) return generic.status();
  absl::MutexLock l(&s->mu_);
  s->value_inputs_ = std::move(candidates);
  return s;
}

std::vector<std::string> OnnxSpecializer::value_inputs() const {
  absl::MutexLock l(&mu_);
  return value_inputs_;
}

int64_t OnnxSpecializer::imports() const {
  absl::MutexLock l(&mu_);
  return imports_;
}

int OnnxSpecializer::cached() const {
  absl::MutexLock l(&mu_);
  return static_cast<int>(lru_.size());
}

absl::StatusOr<std::shared_ptr<const OnnxModel>> OnnxSpecializer::Import(
    const std::vector<std::pair<std::string, const HostTensor*>>& fixed) {
  OnnxImportOptions o = options_.import;
  o.input_values = fixed;
  {
    absl::MutexLock l(&mu_);
    ++imports_;
  }
  KILN_ASSIGN_OR_RETURN(OnnxModel m, ImportOnnxModel(bytes_, o));
  return std::make_shared<const OnnxModel>(std::move(m));
}

absl::StatusOr<std::shared_ptr<const OnnxModel>> OnnxSpecializer::For(
    std::span<const std::pair<std::string, const HostTensor*>> inputs) {
  if (generic_ != nullptr) return generic_;
  std::vector<std::string> names;
  bool narrowed;
  {
    absl::MutexLock l(&mu_);
    names = value_inputs_;
    narrowed = narrowed_;
  }
  // The value inputs' tensors, checked, and the key they make.
  std::vector<std::pair<std::string, const HostTensor*>> fixed;
  for (const std::string& name : names) {
    const HostTensor* t = nullptr;
    for (const auto& [n, v] : inputs) {
      if (n == name) t = v;
    }
    if (t == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("input \"", name,
                       "\" is missing: the model's shapes depend on its value (Kiln "
                       "compiles one specialisation per value)"));
    }
    if (!(IsInteger(t->dtype()) || t->dtype() == v1::DTYPE_BOOL) ||
        t->num_elements() > kMaxValueElements) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input \"", name,
          "\" must be a small integer or bool tensor (the model's shapes depend on its "
          "value), got ",
          DTypeName(t->dtype()), DimsToString(t->dims())));
    }
    const auto& [dtype, dims] = declared_.at(name);
    if (t->dtype() != dtype || t->dims() != dims) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input \"", name, "\" must be ", DTypeName(dtype), DimsToString(dims),
          " as the model declares it, got ", DTypeName(t->dtype()), DimsToString(t->dims())));
    }
    fixed.emplace_back(name, t);
  }
  auto key_of = [](const std::vector<std::pair<std::string, const HostTensor*>>& f) {
    Key key;
    for (const auto& [name, t] : f) {
      key.push_back(t->dtype());
      key.push_back(t->rank());
      key.insert(key.end(), t->dims().begin(), t->dims().end());
      for (int64_t i = 0; i < t->num_elements(); ++i) key.push_back(onnx_internal::GetInt(*t, i));
    }
    return key;
  };
  if (narrowed) {
    const Key key = key_of(fixed);
    absl::MutexLock l(&mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<const OnnxModel> model, Import(fixed));
  if (!narrowed) {
    // Keep only the inputs the import cannot do without: each left out in
    // turn (the others fixed) must make the import fail.
    std::vector<std::pair<std::string, const HostTensor*>> needed;
    for (size_t k = 0; k < fixed.size(); ++k) {
      std::vector<std::pair<std::string, const HostTensor*>> others = needed;
      others.insert(others.end(), fixed.begin() + static_cast<std::ptrdiff_t>(k) + 1, fixed.end());
      if (!Import(others).ok()) needed.push_back(fixed[k]);
    }
    if (needed.size() != fixed.size()) {
      KILN_ASSIGN_OR_RETURN(model, Import(needed));
      fixed = std::move(needed);
    }
    absl::MutexLock l(&mu_);
    if (!narrowed_) {
      value_inputs_.clear();
      for (const auto& [name, t] : fixed) value_inputs_.push_back(name);
      narrowed_ = true;
    } else if (value_inputs_.size() != fixed.size()) {
      // Another caller narrowed first (to the same set: the import is
      // deterministic); this model was imported for a different set.
      return absl::InternalError("value inputs narrowed twice to different sets");
    }
  }
  const Key key = key_of(fixed);
  absl::MutexLock l(&mu_);
  auto it = index_.find(key);
  if (it != index_.end()) return it->second->second;
  lru_.emplace_front(key, model);
  index_[key] = lru_.begin();
  while (static_cast<int>(lru_.size()) > options_.max_specializations) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return model;
}

}  // namespace kiln::io
