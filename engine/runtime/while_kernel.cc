#include "engine/runtime/while_kernel.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/runtime/program.h"

namespace kiln::runtime {
namespace {

// The carries `program` reads (a subgraph input it never uses may be gone).
std::vector<TensorRef> Refs(const Program& program, const std::vector<HostTensor>& carries) {
  std::vector<TensorRef> refs;
  for (size_t i = 0; i < carries.size(); ++i) {
    const std::string name = absl::StrCat("c", i);
    for (const auto& in : program.signature().inputs) {
      if (in.name == name) refs.push_back(TensorRef::Of(name, carries[i]));
    }
  }
  return refs;
}

}  // namespace

WhileKernel::WhileKernel(std::string label, backend::KernelSpec spec, std::shared_ptr<Program> cond,
                         std::shared_ptr<Program> body, int64_t max_iterations,
                         std::string limit_source)
    : label_(std::move(label)),
      spec_(std::move(spec)),
      cond_(std::move(cond)),
      body_(std::move(body)),
      max_iterations_(max_iterations),
      limit_source_(std::move(limit_source)) {}

absl::Status WhileKernel::Launch(backend::Stream& stream, std::span<const backend::BufferView> inputs,
                                 std::span<const backend::BufferView> outputs) {
  if (inputs.size() != spec_.inputs.size() || outputs.size() != spec_.inputs.size()) {
    return absl::InternalError(absl::StrCat(label_, ": launched with ", inputs.size(), " inputs and ",
                                            outputs.size(), " outputs for ", spec_.inputs.size(),
                                            " carries"));
  }
  // Earlier kernels of the run wrote the carries on this stream.
  KILN_RETURN_IF_ERROR(stream.Synchronize());
  std::vector<HostTensor> carries;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].buffer == nullptr || inputs[i].buffer->host_ptr() == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(label_, ": While runs on host-memory devices only"));
    }
    KILN_ASSIGN_OR_RETURN(HostTensor t,
                          HostTensor::CreateUninitialized(spec_.inputs[i].dtype, spec_.inputs[i].dims));
    if (t.num_bytes() != inputs[i].bytes) {
      return absl::InternalError(absl::StrCat(label_, ": carry ", i, " has ", inputs[i].bytes,
                                              " bytes, want ", t.num_bytes()));
    }
    if (t.num_bytes() > 0) std::memcpy(t.data(), inputs[i].host(), t.num_bytes());
    carries.push_back(std::move(t));
  }
  RunOptions sub;
  if (run_ != nullptr) {
    sub.request_id = run_->request_id;
    sub.tenant = run_->tenant;
    sub.deadline = run_->deadline;
    sub.cancelled = run_->cancelled;
  }
  for (int64_t iteration = 0;; ++iteration) {
    const bool cancelled = sub.cancelled != nullptr && sub.cancelled->load(std::memory_order_relaxed);
    if (sub.deadline != absl::InfiniteFuture() && absl::Now() >= sub.deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the run's deadline passed; ", label_, " stopped after ", iteration, " iterations"));
    }
    if (cancelled) {
      return absl::CancelledError(absl::StrCat("the run was cancelled (the client went away); ",
                                               label_, " stopped after ", iteration, " iterations"));
    }
    absl::StatusOr<RunResult> go = cond_->Run(Refs(*cond_, carries), nullptr, sub);
    if (!go.ok()) {
      return absl::Status(go.status().code(), absl::StrCat(label_, ": cond, iteration ", iteration,
                                                           ": ", go.status().message()));
    }
    const HostTensor& flag = go->outputs.at(0).second;
    if (flag.dtype() != v1::DTYPE_BOOL || flag.num_elements() != 1) {
      return absl::InternalError(absl::StrCat(label_, ": cond did not return one bool"));
    }
    if (flag.data_as<uint8_t>()[0] == 0) break;
    if (iteration >= max_iterations_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          label_, ": still looping after ", max_iterations_, " iterations, the limit (",
          limit_source_, ")"));
    }
    absl::StatusOr<RunResult> next = body_->Run(Refs(*body_, carries), nullptr, sub);
    if (!next.ok()) {
      return absl::Status(next.status().code(), absl::StrCat(label_, ": body, iteration ", iteration,
                                                             ": ", next.status().message()));
    }
    if (next->outputs.size() != carries.size()) {
      return absl::InternalError(absl::StrCat(label_, ": body returned ", next->outputs.size(),
                                              " values for ", carries.size(), " carries"));
    }
    for (size_t i = 0; i < carries.size(); ++i) {
      HostTensor& t = next->outputs[i].second;
      if (t.dtype() != carries[i].dtype() || t.dims() != carries[i].dims()) {
        return absl::InternalError(absl::StrCat(label_, ": body changed the type of carry ", i));
      }
      carries[i] = std::move(t);
    }
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].bytes != carries[i].num_bytes()) {
      return absl::InternalError(absl::StrCat(label_, ": result ", i, " has ", outputs[i].bytes,
                                              " bytes, want ", carries[i].num_bytes()));
    }
    if (carries[i].num_bytes() > 0) std::memcpy(outputs[i].host(), carries[i].data(), carries[i].num_bytes());
  }
  return absl::OkStatus();
}

}  // namespace kiln::runtime
