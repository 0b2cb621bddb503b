#include "engine/runtime/params.h"

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace kiln::runtime {

absl::StatusOr<std::shared_ptr<ParamSetImpl>> ParamSetImpl::Create(
    std::shared_ptr<const void> keep_alive, backend::Device& home,
    std::span<const TensorRef> values, bool training, std::set<std::string> written) {
  auto set = std::shared_ptr<ParamSetImpl>(new ParamSetImpl(std::move(keep_alive), home));
  set->training_ = training;
  set->written_ = std::move(written);
  KILN_ASSIGN_OR_RETURN(auto stream, home.CreateStream());
  for (const TensorRef& v : values) {
    if (v.name.empty()) return absl::InvalidArgumentError("a param has an empty name");
    if (set->entries_.contains(v.name)) {
      return absl::InvalidArgumentError(absl::StrCat("param \"", v.name, "\" given twice"));
    }
    if (!IsKnownDType(v.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("param \"", v.name, "\" has an unknown dtype"));
    }
    auto n = CheckedNumElements(v.dims);
    if (!n.ok()) return absl::InvalidArgumentError(absl::StrCat("param \"", v.name, "\": ", n.status().message()));
    auto bytes = BytesFor(v.dtype, *n);
    if (!bytes || *bytes != v.bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param \"", v.name, "\" is ", DTypeName(v.dtype), DimsToString(v.dims), " and needs ",
          bytes ? *bytes : -1, " bytes, got ", v.bytes));
    }
    KILN_ASSIGN_OR_RETURN(auto buf, home.Allocate(*bytes));
    if (*bytes > 0) {
      KILN_RETURN_IF_ERROR(home.CopyToDevice(*stream, v.data, backend::BufferView{buf.get(), 0, *bytes}));
    }
    set->entries_[v.name] = Entry{v.dtype, v.dims, *bytes};
    set->home_buffers_[v.name] = std::move(buf);
    set->total_bytes_ += *bytes;
  }
  KILN_RETURN_IF_ERROR(stream->Synchronize());
  return set;
}

std::vector<std::string> ParamSetImpl::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

const ParamSetImpl::Entry* ParamSetImpl::Find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

absl::StatusOr<backend::BufferView> ParamSetImpl::Spare(const std::string& name) const {
  const Entry* e = Find(name);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("no param \"", name, "\""));
  if (!training_step_set()) {
    return absl::FailedPreconditionError(
        absl::StrCat("param \"", name, "\" belongs to no training step's set"));
  }
  std::unique_ptr<backend::Buffer>& spare = spare_buffers_[name];
  if (spare == nullptr) {
    auto made = home_.Allocate(e->bytes);
    if (!made.ok()) {
      return StatusBuilder(made.status())
             << "for the second buffer of trained param \"" << name << "\"";
    }
    spare = std::move(made).value();
    spare_bytes_.fetch_add(e->bytes, std::memory_order_relaxed);
  }
  return backend::BufferView{spare.get(), 0, e->bytes};
}

void ParamSetImpl::CommitSpare(const std::string& name) const {
  auto it = spare_buffers_.find(name);
  if (it == spare_buffers_.end() || it->second == nullptr) return;
  std::swap(home_buffers_.at(name), it->second);
}

absl::StatusOr<HostTensor> ParamSetImpl::Read(const std::string& name) const {
  const Entry* e = Find(name);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("no param \"", name, "\""));
  absl::ReaderMutexLock step(&step_mu_);
  // Every byte is copied from the device below: no zero-fill pass first.
  KILN_ASSIGN_OR_RETURN(HostTensor t, HostTensor::CreateUninitialized(e->dtype, e->dims));
  KILN_ASSIGN_OR_RETURN(auto stream, home_.CreateStream());
  if (e->bytes > 0) {
    KILN_RETURN_IF_ERROR(home_.CopyToHost(
        *stream, backend::BufferView{home_buffers_.at(name).get(), 0, e->bytes}, t.data()));
  }
  KILN_RETURN_IF_ERROR(stream->Synchronize());
  return t;
}

absl::StatusOr<backend::BufferView> ParamSetImpl::On(const std::string& name,
                                                     backend::Device& device) const {
  const Entry* e = Find(name);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("no param \"", name, "\""));
  if (&device == &home_) return backend::BufferView{home_buffers_.at(name).get(), 0, e->bytes};
  if (training_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "param \"", name, "\" belongs to a training set on ", home_.info().id,
        "; it cannot be read on ", device.info().id));
  }
  absl::MutexLock lock(&mirrors_mu_);
  auto key = std::make_pair(name, device.info().id);
  auto it = mirrors_.find(key);
  if (it != mirrors_.end() && it->second.first != device.generation()) {
    // The device restarted and lost its memory: mirror again. The stale
    // handle stays alive (a run may still hold a view of it; its uses fail
    // as device faults) until the set goes.
    retired_.push_back(std::move(it->second.second));
    mirrors_.erase(it);
    it = mirrors_.end();
  }
  if (it == mirrors_.end()) {
    const uint64_t generation = device.generation();
    KILN_ASSIGN_OR_RETURN(auto buf, device.Allocate(e->bytes));
    KILN_ASSIGN_OR_RETURN(auto stream, device.CreateStream());
    backend::Buffer* src = home_buffers_.at(name).get();
    if (e->bytes > 0) {
      KILN_RETURN_IF_ERROR(
          device.CopyToDevice(*stream, src->host_ptr(), backend::BufferView{buf.get(), 0, e->bytes}));
    }
    KILN_RETURN_IF_ERROR(stream->Synchronize());
    it = mirrors_.emplace(key, std::make_pair(generation, std::move(buf))).first;
  }
  return backend::BufferView{it->second.second.get(), 0, e->bytes};
}

absl::StatusOr<std::shared_ptr<const backend::PackedOperand>> ParamSetImpl::Packed(
    const std::string& name, backend::Device& device, const std::string& key,
    PackFn pack) const {
  if (training_ && (written_.empty() || written_.contains(name))) return nullptr;
  const std::string full = absl::StrCat(device.info().id, "/", name, "/", key);
  const uint64_t generation = device.generation();
  absl::MutexLock lock(&packed_mu_);
  auto it = packed_.find(full);
  if (it != packed_.end() && it->second.first == generation) return it->second.second;
  KILN_ASSIGN_OR_RETURN(backend::BufferView view, On(name, device));
  absl::StatusOr<std::shared_ptr<const backend::PackedOperand>> made = pack(view);
  if (!made.ok()) return StatusBuilder(made.status()) << "while packing param \"" << name << "\"";
  packed_[full] = {generation, *made};
  return *made;
}

}  // namespace kiln::runtime
