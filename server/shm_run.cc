#include "server/shm_run.h"

#include <cstring>
#include <optional>
#include <vector>

#include <grpcpp/support/byte_buffer.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/dtype.h"
#include "base/status.h"
#include "server/client_string.h"
#include "server/service.h"

namespace kiln::server {
namespace {

constexpr int64_t kOutputAlignment = 64;  // as the engine's arenas

bool Overlap(const ShmRegion* ra, int64_t a, int64_t an, const ShmRegion* rb, int64_t b,
             int64_t bn) {
  return ra == rb && an > 0 && bn > 0 && a < b + bn && b < a + an;
}

}  // namespace

absl::StatusOr<const ShmRegion*> RunShm::Region(const ShmRegistry* shm, const Tenant& tenant,
                                                const std::string& id) {
  for (const auto& r : regions_) {
    if (r->id() == id) return r.get();
  }
  if (shm == nullptr) {
    return absl::UnavailableError(
        "kilnd runs without shared memory (shm_socket \"off\"): send tensors as bytes");
  }
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<const ShmRegion> r, shm->Find(tenant, id));
  regions_.push_back(std::move(r));
  return regions_.back().get();
}

absl::Status RunShm::BindNamed(const google::protobuf::RepeatedPtrField<v1::NamedTensor>& named,
                               std::vector<TensorRef>& inputs, const ShmRegistry* shm,
                               const Tenant& tenant) {
  for (int i = 0; i < named.size(); ++i) {
    const v1::NamedTensor& in = named[i];
    if (!in.has_shm()) continue;
    TensorRef& ref = inputs[i];  // CheckNamedTensors keeps the request's order
    const std::string what = absl::StrCat("input ", QuoteClientString(in.name()));
    KILN_ASSIGN_OR_RETURN(const ShmRegion* region, Region(shm, tenant, in.shm().region_id()));
    KILN_ASSIGN_OR_RETURN(char* data, region->Slice(in.shm().offset(), in.shm().bytes(), what));
    input_spans_.push_back({in.name(), Span{region, in.shm().offset(), in.shm().bytes()}});
    if (IsFloat(ref.dtype) || ref.bytes == 0) {
      ref.data = data;
      continue;
    }
    auto copy = std::make_unique<char[]>(static_cast<size_t>(ref.bytes));
    std::memcpy(copy.get(), data, static_cast<size_t>(ref.bytes));
    ref.data = copy.get();
    copies_.push_back(std::move(copy));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RunShm>> RunShm::BindInputs(
    const google::protobuf::RepeatedPtrField<v1::NamedTensor>& named,
    std::vector<TensorRef>& inputs, const ShmRegistry* shm, const Tenant& tenant) {
  bool any = false;
  for (const v1::NamedTensor& in : named) any = any || in.has_shm();
  if (!any) return nullptr;
  std::unique_ptr<RunShm> run(new RunShm(nullptr));
  KILN_RETURN_IF_ERROR(run->BindNamed(named, inputs, shm, tenant));
  return run;
}

absl::StatusOr<std::unique_ptr<RunShm>> RunShm::Bind(const v1::RunRequest& request,
                                                     std::vector<TensorRef>& inputs,
                                                     const ShmRegistry* shm, const Tenant& tenant) {
  bool any = !request.shm_outputs().empty() || request.has_shm_output_area();
  for (const v1::NamedTensor& in : request.inputs()) any = any || in.has_shm();
  if (!any) return nullptr;
  std::unique_ptr<RunShm> run(new RunShm(&request));
  KILN_RETURN_IF_ERROR(run->BindNamed(request.inputs(), inputs, shm, tenant));
  for (const v1::NamedTensor& out : request.shm_outputs()) {
    const std::string what = absl::StrCat("shm_outputs ", QuoteClientString(out.name()));
    if (!out.has_shm()) return absl::InvalidArgumentError(absl::StrCat(what, " has no shm"));
    KILN_ASSIGN_OR_RETURN(const ShmRegion* region, run->Region(shm, tenant, out.shm().region_id()));
    KILN_RETURN_IF_ERROR(region->Slice(out.shm().offset(), out.shm().bytes(), what).status());
    run->output_regions_.push_back(region);
  }
  if (request.has_shm_output_area()) {
    const v1::SharedMemoryRef& a = request.shm_output_area();
    KILN_ASSIGN_OR_RETURN(run->area_, run->Region(shm, tenant, a.region_id()));
    KILN_RETURN_IF_ERROR(run->area_->Slice(a.offset(), a.bytes(), "shm_output_area").status());
  }
  return run;
}

absl::Status RunShm::PlanOutputs(const std::vector<OutputType>& outputs) {
  if (request_ == nullptr) {
    return absl::InternalError("output places planned for a request that has none");
  }
  const v1::RunRequest& request = *request_;
  planned_.clear();
  std::vector<int64_t> sizes;
  for (const OutputType& o : outputs) {
    absl::StatusOr<int64_t> n = CheckedNumElements(o.dims);
    std::optional<int64_t> b = n.ok() ? BytesFor(o.dtype, *n) : std::nullopt;
    sizes.push_back(b.value_or(-1));
  }
  std::vector<bool> explicit_output(outputs.size(), false);
  for (int i = 0; i < request.shm_outputs_size(); ++i) {
    const v1::NamedTensor& want = request.shm_outputs(i);
    size_t o = 0;
    while (o < outputs.size() && outputs[o].name != want.name()) ++o;
    const std::string what = absl::StrCat("shm_outputs ", QuoteClientString(want.name()));
    if (o == outputs.size()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " is not an output of the graph"));
    }
    if (explicit_output[o]) return absl::InvalidArgumentError(absl::StrCat(what, " is given twice"));
    if (sizes[o] != want.shm().bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": the output is ",
                                                     DTypeName(outputs[o].dtype),
                                                     DimsToString(outputs[o].dims), ", ", sizes[o],
                                                     " bytes; shm.bytes is ", want.shm().bytes()));
    }
    explicit_output[o] = true;
    const ShmRegion* region = output_regions_[i];
    KILN_ASSIGN_OR_RETURN(char* data, region->Slice(want.shm().offset(), want.shm().bytes(), what));
    planned_.push_back(Output{want.name(), data, want.shm().bytes(), want.shm()});
  }
  if (area_ != nullptr) {
    const v1::SharedMemoryRef& a = request.shm_output_area();
    int64_t cursor = a.offset();
    const int64_t end = a.offset() + a.bytes();  // inside the region: Bind checked
    for (size_t o = 0; o < outputs.size(); ++o) {
      if (explicit_output[o] || sizes[o] < 0) continue;
      // Both below the region's size (an int64): no overflow.
      const int64_t at = (cursor + kOutputAlignment - 1) / kOutputAlignment * kOutputAlignment;
      if (at > end || sizes[o] > end - at) continue;  // comes back as bytes
      v1::SharedMemoryRef ref;
      ref.set_region_id(area_->id());
      ref.set_offset(at);
      ref.set_bytes(sizes[o]);
      KILN_ASSIGN_OR_RETURN(char* data, area_->Slice(at, sizes[o], "shm_output_area"));
      planned_.push_back(Output{outputs[o].name, data, sizes[o], ref});
      cursor = at + sizes[o];
    }
  }
  // Kernels must not read what they write: outputs overlap neither each
  // other nor an input in shared memory.
  auto region_of = [&](const v1::SharedMemoryRef& ref) -> const ShmRegion* {
    for (const auto& r : regions_) {
      if (r->id() == ref.region_id()) return r.get();
    }
    return nullptr;
  };
  for (size_t i = 0; i < planned_.size(); ++i) {
    const Output& p = planned_[i];
    const ShmRegion* pr = region_of(p.ref);
    for (size_t j = 0; j < i; ++j) {
      const Output& q = planned_[j];
      if (Overlap(pr, p.ref.offset(), p.bytes, region_of(q.ref), q.ref.offset(), q.bytes)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "outputs ", QuoteClientString(q.name), " and ", QuoteClientString(p.name),
            " overlap in shared memory"));
      }
    }
    for (const auto& [name, in] : input_spans_) {
      if (Overlap(pr, p.ref.offset(), p.bytes, in.region, in.offset, in.bytes)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "output ", QuoteClientString(p.name), " overlaps input ", QuoteClientString(name),
            " in shared memory (kernels would read what they write)"));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<RunOptions::OutputDestination> RunShm::Destinations() const {
  std::vector<RunOptions::OutputDestination> d;
  for (const Output& p : planned_) d.push_back({p.name, p.data, p.bytes});
  return d;
}

const RunShm::Output* RunShm::Find(const std::string& name) const {
  for (const Output& p : planned_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

void RunShm::Answer(const std::string& name, DType dtype, const Dims& dims, const HostTensor* value,
                    v1::NamedTensor* out) const {
  out->set_name(name);
  const Output* p = Find(name);
  if (p == nullptr || (value != nullptr && value->num_bytes() != p->bytes)) {
    value->ToProto(out->mutable_tensor());
    return;
  }
  if (value != nullptr && p->bytes > 0) {
    std::memcpy(p->data, value->data(), static_cast<size_t>(p->bytes));
  }
  v1::Tensor* t = out->mutable_tensor();
  t->set_dtype(dtype);
  for (int64_t d : dims) t->add_dims(d);
  *out->mutable_shm() = p->ref;
}

v1::ShmServerMessage SocketAnswer(const absl::Status& s, const std::string& request_id,
                                  const grpc::ByteBuffer& bytes,
                                  std::string* (v1::ShmServerMessage::*field)()) {
  v1::ShmServerMessage a;
  a.set_code(static_cast<int>(s.code()));
  a.set_message(s.ok() ? std::string("ok") : ToGrpc(s).error_message());
  a.set_request_id(request_id.empty() ? std::string("-") : request_id);
  if (s.ok()) {
    std::vector<grpc::Slice> slices;
    if (bytes.Dump(&slices).ok()) {
      std::string* out = (a.*field)();
      out->reserve(bytes.Length());
      for (const grpc::Slice& slice : slices) {
        out->append(reinterpret_cast<const char*>(slice.begin()), slice.size());
      }
    }
  }
  return a;
}

absl::Status SocketOutcome(absl::Status s, absl::Time deadline, absl::string_view what) {
  if (s.code() == absl::StatusCode::kCancelled && absl::Now() >= deadline) {
    return absl::DeadlineExceededError(
        absl::StrCat("the ", what, "'s deadline (run_timeout_ms) passed: ", s.message()));
  }
  return s;
}

}  // namespace kiln::server
