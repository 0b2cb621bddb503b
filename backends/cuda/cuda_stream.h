// A CUDA stream as a backend::Stream, and its events.
//
// Work goes to the device as it is enqueued (FlushWork has nothing to hand
// over). Host copies go through pinned staging chunks owned by the stream:
// CopyToDevice copies the caller's bytes into a chunk before it returns and
// the chunk is reused once the event recorded after its copy completed;
// CopyToHost lands in a chunk and is copied out to the caller's memory by the
// SynchronizeFor that passes it (uploads are staged and enqueued in 1 MiB
// pieces, so the DMA of one overlaps the staging of the next). Host memory
// the device registered (CudaDevice::RegisterHostMemory, pinned) is copied
// to and from directly with no staging, as the contract allows for it.
// Every host wait polls with a deadline
// (CudaDevice::PollUntilDone); one that times out is a device fault and the
// stream stays failed.
//
// Data-dependent failures (an out-of-range gather index) are written by the
// kernel into an error slot in mapped pinned memory; they surface as the
// status of the SynchronizeFor that retires the kernel (not a device fault:
// the stream stays usable).
//
// Thread safety: one thread at a time (backend.h). The device outlives the stream.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "backends/capture.h"
#include "backends/cuda/cuda_device.h"

namespace kiln::cuda {

class CudaEvent final : public backend::Event {
 public:
  CudaEvent(const CudaDevice& device, CUstream stream, CUevent event)
      : device_(device), stream_(stream), event_(event) {}
  ~CudaEvent() override;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  absl::StatusOr<double> MicrosSince(const backend::Event& earlier) const override;
  const CudaDevice& device() const { return device_; }
  CUevent event() const { return event_; }

 private:
  const CudaDevice& device_;
  CUstream stream_;  // the stream it was recorded on
  CUevent event_;
};

// An instantiated CUDA graph captured on one stream; replayed on it.
class CudaGraph final : public backend::CapturedWork {
 public:
  CudaGraph(CudaDevice& device, const void* stream, CUgraphExec exec)
      : device_(device), stream_(stream), exec_(exec) {}
  ~CudaGraph() override;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  absl::Status Replay(backend::Stream& stream) override;

 private:
  CudaDevice& device_;
  const void* stream_;  // the CudaStream it was captured on
  CUgraphExec exec_;
};

class CudaStream final : public backend::Stream, public backend::CapturingStream {
 public:
  static absl::StatusOr<std::unique_ptr<CudaStream>> Create(CudaDevice& device);
  ~CudaStream() override;  // waits (bounded) for the work in flight
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  absl::Status SynchronizeFor(absl::Duration timeout) override;
  absl::Status Wait(const backend::Event& event) override;
  absl::Status FlushWork() override { return failed_; }
  absl::StatusOr<std::unique_ptr<backend::Event>> Record() override;
  // CUDA graphs: stream capture (relaxed mode, so other threads' runs on the
  // device go on meanwhile); events recorded while capturing are external
  // event-record nodes of the graph, so a replay records them again and
  // their times are the replay's. EndCapture instantiates the graph.
  absl::Status BeginCapture() override;
  absl::StatusOr<std::unique_ptr<backend::CapturedWork>> EndCapture() override;
  bool capturing() const { return capturing_; }

  CudaDevice& device() const { return device_; }
  CUstream stream() const { return stream_; }
  // The first failure on this stream (OK while healthy).
  const absl::Status& failed() const { return failed_; }
  // Records `s` as the stream's failure when it is a device fault; returns `s`.
  absl::Status Note(absl::Status s);

  // Host -> device: `src` is read before this returns, unless it lies in a
  // registered host range (then by the time a synchronization passes it).
  absl::Status Upload(const void* src, CUdeviceptr dst, int64_t bytes);
  // Device -> host: `dst` is written by the SynchronizeFor that passes this point.
  absl::Status Download(CUdeviceptr src, void* dst, int64_t bytes);
  // Device-local scratch of at least `bytes` that stays valid for work
  // enqueued on this stream until the next call (cuBLASLt workspaces).
  absl::StatusOr<CUdeviceptr> Workspace(int64_t bytes);
  // Stream-ordered temporary memory: valid for work enqueued after this call;
  // FreeTemporary enqueues its release.
  absl::StatusOr<CUdeviceptr> AllocateTemporary(int64_t bytes);
  void FreeTemporary(CUdeviceptr ptr);

  // An error slot for one kernel launch: 4 words in host memory the device
  // writes (word 0 = code, 0 while fine; the first failing thread sets it with
  // atomicCAS, then words 1 and 2). The next SynchronizeFor decodes a nonzero
  // slot into its status with `decoder(word1, word2)` and frees the slot.
  using ErrorDecoder = std::function<absl::Status(uint64_t, uint64_t)>;
  absl::StatusOr<CUdeviceptr> ReserveErrorSlot(ErrorDecoder decoder);

 private:
  struct Staging {
    void* host = nullptr;
    int64_t bytes = 0;
    CUevent done = nullptr;  // recorded after the copy that last used it
    bool busy = false;
  };
  struct PendingDownload {
    Staging* staging;
    void* dst;
    int64_t bytes;
  };

  CudaStream(CudaDevice& device, CUstream stream) : device_(device), stream_(stream) {}
  absl::StatusOr<Staging*> AcquireStaging(int64_t bytes);
  absl::Status MarkStagingUsed(Staging& s);

  CudaDevice& device_;
  CUstream stream_;
  absl::Status failed_;
  bool capturing_ = false;
  std::vector<std::unique_ptr<Staging>> staging_;
  std::vector<PendingDownload> downloads_;
  CUdeviceptr workspace_ = 0;
  int64_t workspace_bytes_ = 0;
  // Error slots: blocks of kSlotsPerBlock slots of 4 words; slot k is in
  // block k / kSlotsPerBlock. `decoders_[k]` for the slots in use.
  static constexpr int kSlotsPerBlock = 64;
  struct ErrorBlock {
    uint64_t* host = nullptr;
    CUdeviceptr device = 0;
  };
  std::vector<ErrorBlock> error_blocks_;
  std::vector<ErrorDecoder> decoders_;
};

}  // namespace kiln::cuda
