#include "backends/cuda/cuda_stream.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/host_copy.h"
#include "base/status.h"

namespace kiln::cuda {
namespace {

// Copies larger than this go through the driver's own staging (for pageable
// memory cuMemcpyHtoDAsync copies the source out before it returns) rather
// than a chunk kept by the stream.
constexpr int64_t kMaxKeptStaging = int64_t{64} << 20;
constexpr int64_t kMinStaging = int64_t{64} << 10;
// Uploads through staging are copied and enqueued in pieces of this size
// (each piece's host copy split over HostCopier's threads).
constexpr int64_t kUploadPiece = int64_t{4} << 20;
// How long a stream's destructor waits for its work.
constexpr absl::Duration kTeardownWait = absl::Seconds(10);

}  // namespace

CudaEvent::~CudaEvent() {
  if (device_.Enter().ok()) Driver().cuEventDestroy(event_);
}

absl::StatusOr<double> CudaEvent::MicrosSince(const backend::Event& earlier) const {
  const auto* e = dynamic_cast<const CudaEvent*>(&earlier);
  if (e == nullptr || &e->device_ != &device_ || e->stream_ != stream_) {
    return absl::InvalidArgumentError(
        absl::StrCat(device_.info().id, ": the earlier event was not recorded on this stream"));
  }
  KILN_RETURN_IF_ERROR(device_.Enter());
  float ms = 0;
  const CUresult r = Driver().cuEventElapsedTime(&ms, e->event_, event_);
  if (r == CUDA_ERROR_NOT_READY) {
    return absl::FailedPreconditionError(
        absl::StrCat(device_.info().id, ": the events have not completed (synchronize first)"));
  }
  KILN_RETURN_IF_ERROR(device_.Check(r, "cuEventElapsedTime"));
  return static_cast<double>(ms) * 1000.0;
}

absl::StatusOr<std::unique_ptr<CudaStream>> CudaStream::Create(CudaDevice& device) {
  KILN_RETURN_IF_ERROR(device.Enter());
  CUstream s = nullptr;
  KILN_RETURN_IF_ERROR(
      device.Check(Driver().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate"));
  return std::unique_ptr<CudaStream>(new CudaStream(device, s));
}

CudaStream::~CudaStream() {
  const DriverApi& api = Driver();
  if (!device_.Enter().ok()) return;  // a faulted context: the worker is going away
  if (failed_.ok()) {
    (void)device_.PollUntilDone([&] { return api.cuStreamQuery(stream_); }, kTeardownWait,
                                absl::StrCat(device_.info().id, " stream teardown"));
  }
  if (workspace_ != 0) api.cuMemFreeAsync(workspace_, stream_);
  api.cuStreamDestroy(stream_);
  for (const auto& s : staging_) {
    if (s->done != nullptr) api.cuEventDestroy(s->done);
    api.cuMemFreeHost(s->host);
  }
  for (const ErrorBlock& b : error_blocks_) api.cuMemFreeHost(b.host);
}

absl::Status CudaStream::Note(absl::Status s) {
  if (!s.ok() && failed_.ok() && backend::FaultedDevice(s)) failed_ = s;
  return s;
}

absl::Status CudaStream::SynchronizeFor(absl::Duration timeout) {
  KILN_RETURN_IF_ERROR(failed_);
  if (capturing_) {
    return absl::FailedPreconditionError(
        absl::StrCat(device_.info().id, ": a capturing stream cannot be synchronized"));
  }
  KILN_RETURN_IF_ERROR(Note(device_.Enter()));
  const absl::Status s =
      device_.PollUntilDone([&] { return Driver().cuStreamQuery(stream_); }, timeout,
                            absl::StrCat("a wait for ", device_.info().id, "'s stream"));
  if (!s.ok()) {
    // Any failure of a wait leaves the stream's state unknown: it stays failed.
    failed_ = backend::FaultedDevice(s) ? s : backend::DeviceFault(device_.info().id, s.ToString());
    return failed_;
  }
  for (const PendingDownload& d : downloads_) {
    HostCopy(d.dst, d.staging->host, d.bytes);
    d.staging->busy = false;
  }
  downloads_.clear();
  // Data-dependent failures of the kernels just retired: the first one wins.
  absl::Status first;
  for (size_t k = 0; k < decoders_.size(); ++k) {
    uint64_t* w = error_blocks_[k / kSlotsPerBlock].host + 4 * (k % kSlotsPerBlock);
    if (w[0] != 0 && first.ok()) first = decoders_[k](w[1], w[2]);
    w[0] = w[1] = w[2] = 0;
  }
  decoders_.clear();
  // Every copy has finished; chunks kept only for one large read-back go.
  std::erase_if(staging_, [](const std::unique_ptr<Staging>& st) {
    if (st->bytes <= kMaxKeptStaging) {
      st->busy = false;
      return false;
    }
    Driver().cuEventDestroy(st->done);
    Driver().cuMemFreeHost(st->host);
    return true;
  });
  return first;
}

absl::Status CudaStream::Wait(const backend::Event& event) {
  KILN_RETURN_IF_ERROR(failed_);
  const auto* e = dynamic_cast<const CudaEvent*>(&event);
  if (e == nullptr || &e->device() != &device_) {
    return absl::InvalidArgumentError(
        absl::StrCat(device_.info().id, ": Wait on an event of another device"));
  }
  KILN_RETURN_IF_ERROR(Note(device_.Enter()));
  return Note(
      device_.Check(Driver().cuStreamWaitEvent(stream_, e->event(), 0), "cuStreamWaitEvent"));
}

absl::StatusOr<std::unique_ptr<backend::Event>> CudaStream::Record() {
  KILN_RETURN_IF_ERROR(failed_);
  KILN_RETURN_IF_ERROR(Note(device_.Enter()));
  CUevent ev = nullptr;
  KILN_RETURN_IF_ERROR(
      Note(device_.Check(Driver().cuEventCreate(&ev, CU_EVENT_DEFAULT), "cuEventCreate")));
  auto event = std::make_unique<CudaEvent>(device_, stream_, ev);
  if (capturing_) {
    KILN_RETURN_IF_ERROR(Note(device_.Check(
        Driver().cuEventRecordWithFlags(ev, stream_, CU_EVENT_RECORD_EXTERNAL),
        "cuEventRecordWithFlags(external)")));
  } else {
    KILN_RETURN_IF_ERROR(
        Note(device_.Check(Driver().cuEventRecord(ev, stream_), "cuEventRecord")));
  }
  return std::unique_ptr<backend::Event>(std::move(event));
}

absl::Status CudaStream::BeginCapture() {
  KILN_RETURN_IF_ERROR(failed_);
  if (capturing_) {
    return absl::FailedPreconditionError(absl::StrCat(device_.info().id, ": already capturing"));
  }
  KILN_RETURN_IF_ERROR(Note(device_.Enter()));
  KILN_RETURN_IF_ERROR(Note(device_.Check(
      Driver().cuStreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_RELAXED),
      "cuStreamBeginCapture")));
  capturing_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<backend::CapturedWork>> CudaStream::EndCapture() {
  if (!capturing_) {
    return absl::FailedPreconditionError(absl::StrCat(device_.info().id, ": not capturing"));
  }
  capturing_ = false;
  KILN_RETURN_IF_ERROR(Note(device_.Enter()));
  const DriverApi& api = Driver();
  CUgraph graph = nullptr;
  KILN_RETURN_IF_ERROR(
      Note(device_.Check(api.cuStreamEndCapture(stream_, &graph), "cuStreamEndCapture")));
  CUgraphExec exec = nullptr;
  const CUresult r = api.cuGraphInstantiateWithFlags(&exec, graph, 0);
  api.cuGraphDestroy(graph);
  KILN_RETURN_IF_ERROR(Note(device_.Check(r, "cuGraphInstantiateWithFlags")));
  return std::unique_ptr<backend::CapturedWork>(std::make_unique<CudaGraph>(device_, this, exec));
}

CudaGraph::~CudaGraph() {
  // An exec still running is freed by the driver when it completes.
  if (device_.Enter().ok()) Driver().cuGraphExecDestroy(exec_);
}

absl::Status CudaGraph::Replay(backend::Stream& stream) {
  KILN_ASSIGN_OR_RETURN(CudaStream * s, AsCudaStream(stream, device_));
  if (s != stream_) {
    return absl::InvalidArgumentError(
        absl::StrCat(device_.info().id, ": a CUDA graph replays on the stream it was captured on"));
  }
  KILN_RETURN_IF_ERROR(s->failed());
  if (s->capturing()) {
    return absl::FailedPreconditionError(
        absl::StrCat(device_.info().id, ": a graph cannot be replayed into a capture"));
  }
  KILN_RETURN_IF_ERROR(s->Note(device_.Enter()));
  return s->Note(device_.Check(Driver().cuGraphLaunch(exec_, s->stream()), "cuGraphLaunch"));
}

absl::StatusOr<CudaStream::Staging*> CudaStream::AcquireStaging(int64_t bytes) {
  const DriverApi& api = Driver();
  Staging* best = nullptr;
  for (const auto& s : staging_) {
    if (s->bytes < bytes) continue;
    if (s->busy) {
      const CUresult q = api.cuEventQuery(s->done);
      if (q == CUDA_ERROR_NOT_READY) continue;
      KILN_RETURN_IF_ERROR(Note(device_.Check(q, "cuEventQuery")));
      const bool pending =
          std::any_of(downloads_.begin(), downloads_.end(),
                      [&](const PendingDownload& d) { return d.staging == s.get(); });
      if (pending) continue;  // its bytes still wait to be copied out
      s->busy = false;
    }
    if (best == nullptr || s->bytes < best->bytes) best = s.get();
  }
  if (best != nullptr) return best;
  auto s = std::make_unique<Staging>();
  s->bytes = bytes <= kMinStaging
                 ? kMinStaging
                 : int64_t{1} << (64 - __builtin_clzll(static_cast<uint64_t>(bytes - 1)));
  KILN_RETURN_IF_ERROR(Note(device_.Check(
      api.cuMemHostAlloc(&s->host, static_cast<size_t>(s->bytes), 0), "cuMemHostAlloc")))
      << "(" << s->bytes << " bytes of pinned staging)";
  absl::Status st =
      device_.Check(api.cuEventCreate(&s->done, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  if (!st.ok()) {
    api.cuMemFreeHost(s->host);
    return Note(st);
  }
  staging_.push_back(std::move(s));
  return staging_.back().get();
}

absl::Status CudaStream::MarkStagingUsed(Staging& s) {
  s.busy = true;
  return Note(device_.Check(Driver().cuEventRecord(s.done, stream_), "cuEventRecord"));
}

absl::Status CudaStream::Upload(const void* src, CUdeviceptr dst, int64_t bytes) {
  KILN_RETURN_IF_ERROR(failed_);
  KILN_RETURN_IF_ERROR(Note(device_.Enter()));
  const DriverApi& api = Driver();
  if (!capturing_ && device_.IsRegistered(src, bytes)) {
    // Pinned by a host registration: DMA straight from it (the registrant
    // keeps the bytes until a synchronization passes this copy). Not while
    // capturing: a graph would read the range again at every replay.
    return Note(device_.Check(api.cuMemcpyHtoDAsync(dst, src, static_cast<size_t>(bytes), stream_),
                              "cuMemcpyHtoDAsync(registered)"));
  }
  if (bytes > kMaxKeptStaging) {
    return Note(device_.Check(api.cuMemcpyHtoDAsync(dst, src, static_cast<size_t>(bytes), stream_),
                              "cuMemcpyHtoDAsync"));
  }
  KILN_ASSIGN_OR_RETURN(Staging * s, AcquireStaging(bytes));
  // In pieces, each piece's DMA enqueued as soon as it is staged, so the
  // device copies one piece while the host stages the next.
  for (int64_t at = 0; at < bytes; at += kUploadPiece) {
    const size_t n = static_cast<size_t>(std::min(kUploadPiece, bytes - at));
    char* staged = static_cast<char*>(s->host) + at;
    HostCopy(staged, static_cast<const char*>(src) + at, static_cast<int64_t>(n));
    const absl::Status st = device_.Check(
        api.cuMemcpyHtoDAsync(dst + static_cast<CUdeviceptr>(at), staged, n, stream_),
        "cuMemcpyHtoDAsync");
    if (!st.ok()) {
      (void)MarkStagingUsed(*s);  // pieces already enqueued may still read it
      return Note(st);
    }
  }
  return MarkStagingUsed(*s);
}

absl::Status CudaStream::Download(CUdeviceptr src, void* dst, int64_t bytes) {
  KILN_RETURN_IF_ERROR(failed_);
  KILN_RETURN_IF_ERROR(Note(device_.Enter()));
  if (!capturing_ && device_.IsRegistered(dst, bytes)) {
    return Note(device_.Check(
        Driver().cuMemcpyDtoHAsync(dst, src, static_cast<size_t>(bytes), stream_),
        "cuMemcpyDtoHAsync(registered)"));
  }
  // Large read-backs get a chunk of their own too: a pageable destination
  // would make the driver's copy synchronous (an unbounded wait).
  KILN_ASSIGN_OR_RETURN(Staging * s, AcquireStaging(bytes));
  KILN_RETURN_IF_ERROR(Note(
      device_.Check(Driver().cuMemcpyDtoHAsync(s->host, src, static_cast<size_t>(bytes), stream_),
                    "cuMemcpyDtoHAsync")));
  KILN_RETURN_IF_ERROR(MarkStagingUsed(*s));
  downloads_.push_back({s, dst, bytes});
  return absl::OkStatus();
}

absl::StatusOr<CUdeviceptr> CudaStream::Workspace(int64_t bytes) {
  if (bytes <= workspace_bytes_) return workspace_;
  if (capturing_) {
    // A graph would bake in a workspace this call frees.
    return absl::FailedPreconditionError(absl::StrCat(
        device_.info().id, ": a kernel needs a larger workspace while the stream captures"));
  }
  const DriverApi& api = Driver();
  if (workspace_ != 0) {
    KILN_RETURN_IF_ERROR(
        Note(device_.Check(api.cuMemFreeAsync(workspace_, stream_), "cuMemFreeAsync")));
    workspace_ = 0;
    workspace_bytes_ = 0;
  }
  KILN_RETURN_IF_ERROR(Note(device_.Check(
      api.cuMemAllocFromPoolAsync(&workspace_, static_cast<size_t>(bytes), device_.pool(), stream_),
      "cuMemAllocFromPoolAsync(workspace)")));
  workspace_bytes_ = bytes;
  return workspace_;
}

absl::StatusOr<CUdeviceptr> CudaStream::AllocateTemporary(int64_t bytes) {
  if (capturing_) {
    return absl::FailedPreconditionError(
        absl::StrCat(device_.info().id, ": temporaries cannot be captured"));
  }
  CUdeviceptr p = 0;
  KILN_RETURN_IF_ERROR(Note(device_.Check(
      Driver().cuMemAllocFromPoolAsync(&p, static_cast<size_t>(bytes), device_.pool(), stream_),
      "cuMemAllocFromPoolAsync")))
      << "(" << bytes << " bytes of temporary memory)";
  return p;
}

void CudaStream::FreeTemporary(CUdeviceptr ptr) {
  (void)Note(device_.Check(Driver().cuMemFreeAsync(ptr, stream_), "cuMemFreeAsync"));
}

}  // namespace kiln::cuda

namespace kiln::cuda {

absl::StatusOr<CUdeviceptr> CudaStream::ReserveErrorSlot(ErrorDecoder decoder) {
  if (capturing_) {
    return absl::FailedPreconditionError(
        absl::StrCat(device_.info().id, ": error slots cannot be captured"));
  }
  const size_t k = decoders_.size();
  if (k / kSlotsPerBlock >= error_blocks_.size()) {
    const DriverApi& api = Driver();
    ErrorBlock b;
    void* host = nullptr;
    KILN_RETURN_IF_ERROR(
        Note(device_.Check(api.cuMemHostAlloc(&host, kSlotsPerBlock * 4 * sizeof(uint64_t),
                                              CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE),
                           "cuMemHostAlloc(error slots)")));
    b.host = static_cast<uint64_t*>(host);
    std::memset(b.host, 0, kSlotsPerBlock * 4 * sizeof(uint64_t));
    const absl::Status s = device_.Check(api.cuMemHostGetDevicePointer(&b.device, host, 0),
                                         "cuMemHostGetDevicePointer");
    if (!s.ok()) {
      api.cuMemFreeHost(host);
      return Note(s);
    }
    error_blocks_.push_back(b);
  }
  decoders_.push_back(std::move(decoder));
  return error_blocks_[k / kSlotsPerBlock].device + 4 * sizeof(uint64_t) * (k % kSlotsPerBlock);
}

}  // namespace kiln::cuda
