#include "engine/runtime/worker_protocol.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/time/clock.h"

#include "base/host_arena.h"
#include "base/status.h"
#include "absl/strings/str_cat.h"

namespace kiln::runtime::worker {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Errno("device worker socket write");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r == 0) return absl::UnavailableError("device worker socket closed");
    if (r < 0) {
      if (errno == EINTR) continue;
      return Errno("device worker socket read");
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

constexpr int64_t kShmAlign = 64;

}  // namespace

Channel::~Channel() { ::close(fd_); }

absl::Status Channel::Send(const google::protobuf::MessageLite& message) {
  const size_t n = message.ByteSizeLong();
  if (n > kMaxFrameBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a device worker message of ", n, " bytes exceeds ", kMaxFrameBytes));
  }
  std::string frame(4 + n, '\0');
  const uint32_t len = static_cast<uint32_t>(n);
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  if (!message.SerializeToArray(frame.data() + 4, static_cast<int>(n))) {
    return absl::InternalError("device worker message did not serialize");
  }
  absl::MutexLock lock(&send_mu_);
  return WriteAll(fd_, frame.data(), frame.size());
}

absl::Status Channel::Receive(google::protobuf::MessageLite* message, absl::Duration poll_first) {
  if (poll_first > absl::ZeroDuration()) {
    const absl::Time until = absl::Now() + poll_first;
    for (;;) {
      char c;
      const ssize_t r = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (r >= 0) break;  // a frame, or the end of the stream: read it below
      if (errno == EINTR) continue;
      if ((errno != EAGAIN && errno != EWOULDBLOCK) || absl::Now() >= until) break;
      std::this_thread::yield();
    }
  }
  unsigned char head[4];
  if (absl::Status s = ReadAll(fd_, reinterpret_cast<char*>(head), 4); !s.ok()) return s;
  const uint32_t len = head[0] | (head[1] << 8) | (head[2] << 16) | (uint32_t{head[3]} << 24);
  if (len > kMaxFrameBytes) {
    return absl::DataLossError(absl::StrCat("device worker frame of ", len, " bytes"));
  }
  std::string body(len, '\0');
  if (absl::Status s = ReadAll(fd_, body.data(), len); !s.ok()) return s;
  if (!message->ParseFromString(body)) return absl::DataLossError("malformed device worker frame");
  return absl::OkStatus();
}

void Channel::Shutdown() { ::shutdown(fd_, SHUT_RDWR); }

ShmRegion::ShmRegion(int fd, char* base, int64_t size, int64_t resident)
    : fd_(fd), base_(base), size_(size), resident_(resident) {
  absl::MutexLock lock(&mu_);
  if (size > 0) free_[0] = size;
}

ShmRegion::~ShmRegion() {
  if (base_ != nullptr) ::munmap(base_, static_cast<size_t>(size_));
  ::close(fd_);
}

absl::StatusOr<std::unique_ptr<ShmRegion>> ShmRegion::Create(int64_t bytes, int64_t resident_bytes) {
  KILN_ASSIGN_OR_RETURN(SharedMemfd m, CreateSharedMemfd("kiln-device-worker", bytes));
  return std::unique_ptr<ShmRegion>(
      new ShmRegion(m.fd, m.base, bytes, std::max<int64_t>(resident_bytes, 0)));
}

absl::StatusOr<std::unique_ptr<ShmRegion>> ShmRegion::Map(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Errno("fstat of the staging region");
  void* p = st.st_size == 0 ? nullptr
                            : ::mmap(nullptr, static_cast<size_t>(st.st_size),
                                     PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Errno("mmap of the staging region");
  // The worker never allocates, so it never releases: resident is moot.
  return std::unique_ptr<ShmRegion>(
      new ShmRegion(fd, static_cast<char*>(p), st.st_size, st.st_size));
}

std::optional<int64_t> ShmRegion::Allocate(int64_t bytes) {
  if (bytes <= 0 || bytes > size_) return std::nullopt;
  const int64_t need = (bytes + kShmAlign - 1) / kShmAlign * kShmAlign;
  absl::MutexLock lock(&mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const int64_t at = it->first;
    const int64_t rest = it->second - need;
    free_.erase(it);
    if (rest > 0) free_[at + need] = rest;
    used_[at] = need;
    return at;
  }
  return std::nullopt;
}

void ShmRegion::Free(int64_t offset) {
  absl::MutexLock lock(&mu_);
  auto u = used_.find(offset);
  if (u == used_.end()) return;
  int64_t at = u->first, len = u->second;
  used_.erase(u);
  auto next = free_.lower_bound(at);
  if (next != free_.end() && next->first == at + len) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == at) {
      prev->second += len;
      Release(prev->first, prev->second);
      return;
    }
  }
  free_[at] = len;
  Release(at, len);
}

void ShmRegion::Release(int64_t at, int64_t len) {
  if (at + len <= resident_) return;
  const int64_t page = 4096;
  // Whole pages only: a page shared with a block in use keeps its bytes.
  const int64_t begin = (std::max(at, resident_) + page - 1) / page * page;
  const int64_t end = (at + len) / page * page;
  if (end <= begin) return;
  // Best effort: on a kernel without hole punching the pages just stay.
  (void)::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, begin, end - begin);
}

bool ShmRegion::Contains(int64_t offset, int64_t bytes) const {
  return offset >= 0 && bytes >= 0 && offset <= size_ && bytes <= size_ - offset;
}

void ToProto(const backend::DeviceInfo& in, v1::worker::Info* out) {
  out->set_id(in.id);
  out->set_gpu(in.kind == backend::DeviceKind::kGpu);
  out->set_max_concurrent_runs(in.max_concurrent_runs);
  out->set_buffer_alignment(in.buffer_alignment);
  for (const auto& [k, v] : in.roofline_efficiency) (*out->mutable_roofline_efficiency())[k] = v;
  out->set_backend(in.backend);
  out->set_name(in.name);
  out->set_arch(in.arch);
  out->set_driver_version(in.driver_version);
  out->set_identity(in.identity);
  out->set_memory_bytes(in.memory_bytes);
  out->set_threads(in.threads);
  out->set_host_memory(in.host_memory);
  for (const auto& f : in.features) out->add_features(f);
  v1::worker::Profile* p = out->mutable_profile();
  p->set_peak_gflops_f32(in.profile.peak_gflops_f32);
  p->set_peak_gflops_f16(in.profile.peak_gflops_f16);
  p->set_bandwidth_gbps(in.profile.bandwidth_gbps);
  p->set_launch_overhead_us(in.profile.launch_overhead_us);
  p->set_host_to_device_gbps(in.profile.host_to_device_gbps);
  p->set_device_to_host_gbps(in.profile.device_to_host_gbps);
  p->set_sync_overhead_us(in.profile.sync_overhead_us);
  p->set_calibrated(in.profile.calibrated);
}

backend::DeviceInfo FromProto(const v1::worker::Info& in) {
  backend::DeviceInfo out;
  out.id = in.id();
  out.kind = in.gpu() ? backend::DeviceKind::kGpu : backend::DeviceKind::kCpu;
  out.max_concurrent_runs = in.max_concurrent_runs();
  out.buffer_alignment = in.buffer_alignment();
  for (const auto& [k, v] : in.roofline_efficiency()) out.roofline_efficiency[k] = v;
  out.backend = in.backend();
  out.name = in.name();
  out.arch = in.arch();
  out.driver_version = in.driver_version();
  out.identity = in.identity();
  out.memory_bytes = in.memory_bytes();
  out.threads = in.threads();
  out.host_memory = in.host_memory();
  for (const auto& f : in.features()) out.features.push_back(f);
  const v1::worker::Profile& p = in.profile();
  out.profile.peak_gflops_f32 = p.peak_gflops_f32();
  out.profile.peak_gflops_f16 = p.peak_gflops_f16();
  out.profile.bandwidth_gbps = p.bandwidth_gbps();
  out.profile.launch_overhead_us = p.launch_overhead_us();
  out.profile.host_to_device_gbps = p.host_to_device_gbps();
  out.profile.device_to_host_gbps = p.device_to_host_gbps();
  out.profile.sync_overhead_us = p.sync_overhead_us();
  out.profile.calibrated = p.calibrated();
  return out;
}

void ToProto(const backend::KernelSpec& in, v1::worker::Spec* out) {
  out->set_name(in.name);
  out->set_label(in.label);
  out->set_op(in.op);
  *out->mutable_attrs() = in.attrs;
  for (const auto& d : in.inputs) {
    v1::worker::Desc* p = out->add_inputs();
    p->set_dtype(d.dtype);
    for (int64_t x : d.dims) p->add_dims(x);
  }
  for (const auto& d : in.outputs) {
    v1::worker::Desc* p = out->add_outputs();
    p->set_dtype(d.dtype);
    for (int64_t x : d.dims) p->add_dims(x);
  }
}

backend::KernelSpec FromProto(const v1::worker::Spec& in) {
  backend::KernelSpec out;
  out.name = in.name();
  out.label = in.label();
  out.op = in.op();
  out.attrs = in.attrs();
  for (const auto& p : in.inputs()) {
    out.inputs.push_back({p.dtype(), Dims(p.dims().begin(), p.dims().end())});
  }
  for (const auto& p : in.outputs()) {
    out.outputs.push_back({p.dtype(), Dims(p.dims().begin(), p.dims().end())});
  }
  return out;
}

void SetStatus(const absl::Status& status, v1::worker::Reply* reply) {
  reply->set_code(static_cast<int>(status.code()));
  reply->set_message(std::string(status.message()));
  reply->set_device_fault(backend::FaultedDevice(status).has_value());
}

absl::Status StatusOf(const v1::worker::Reply& reply, const std::string& device) {
  if (reply.code() == 0) return absl::OkStatus();
  if (reply.device_fault()) {
    // The worker's message already names the device ("vulkan:0: ..."), the
    // fault payload is what the engine needs.
    absl::Status s(absl::StatusCode::kUnavailable, reply.message());
    s.SetPayload(backend::kDeviceFaultPayload, absl::Cord(device));
    return s;
  }
  return absl::Status(static_cast<absl::StatusCode>(reply.code()), reply.message());
}

}  // namespace kiln::runtime::worker
