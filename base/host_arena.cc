#include "base/host_arena.h"

#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace kiln {
namespace {

absl::Status Errno(const char* what) {
  return absl::ResourceExhaustedError(absl::StrCat(what, " of the host arena: ", std::strerror(errno)));
}

int64_t RoundUp(int64_t bytes) {
  return (bytes + HostArena::kAlignment - 1) / HostArena::kAlignment * HostArena::kAlignment;
}

std::atomic<HostArena*> active_arena{nullptr};
std::atomic<HostArena*> made_arena{nullptr};

}  // namespace

HostArena::HostArena(int fd, char* base, int64_t size) : fd_(fd), base_(base), size_(size) {
  absl::MutexLock lock(&mu_);
  if (size > 0) free_[0] = size;
}

HostArena::~HostArena() {
  ::munmap(base_, static_cast<size_t>(size_));
  ::close(fd_);
}

absl::StatusOr<SharedMemfd> CreateSharedMemfd(const char* what, int64_t bytes) {
  const int fd = ::memfd_create(what, MFD_CLOEXEC);
  if (fd < 0) return Errno(absl::StrCat("memfd_create of ", what).c_str());
  if (::ftruncate(fd, bytes) != 0) {
    absl::Status s = Errno(absl::StrCat("ftruncate of ", what).c_str());
    ::close(fd);
    return s;
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    absl::Status s = Errno(absl::StrCat("mmap of ", what).c_str());
    ::close(fd);
    return s;
  }
  return SharedMemfd{fd, static_cast<char*>(p)};
}

absl::StatusOr<std::unique_ptr<HostArena>> HostArena::Create(int64_t bytes) {
  if (bytes <= 0) return absl::InvalidArgumentError("a host arena needs a positive size");
  bytes = RoundUp(bytes);
  KILN_ASSIGN_OR_RETURN(SharedMemfd m, CreateSharedMemfd("kiln-host-arena", bytes));
  return std::unique_ptr<HostArena>(new HostArena(m.fd, m.base, bytes));
}

HostArena* HostArena::Process(int64_t bytes) {
  static HostArena* const arena = [bytes]() -> HostArena* {
    int64_t size = bytes;
    if (const char* env = std::getenv("KILN_HOST_ARENA_BYTES"); env != nullptr && *env != '\0') {
      size = std::strtoll(env, nullptr, 10);
    }
    if (size <= 0) return nullptr;
    auto a = Create(size);
    HostArena* made = a.ok() ? a->release() : nullptr;
    made_arena.store(made, std::memory_order_release);
    return made;
  }();
  return arena;
}

HostArena* HostArena::Made() { return made_arena.load(std::memory_order_acquire); }

void HostArena::Deactivate() { active_arena.store(nullptr, std::memory_order_release); }

HostArena* HostArena::ForHostTensors() { return active_arena.load(std::memory_order_acquire); }

void HostArena::Activate() {
  // Only the process's: HostTensor gives its buffers back to Made().
  if (this == Made()) active_arena.store(this, std::memory_order_release);
}

void* HostArena::Allocate(int64_t bytes) {
  if (bytes <= 0 || bytes > size_) {
    absl::MutexLock lock(&mu_);
    ++misses_;
    return nullptr;
  }
  const int64_t need = RoundUp(bytes);
  absl::MutexLock lock(&mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const int64_t at = it->first;
    const int64_t rest = it->second - need;
    free_.erase(it);
    if (rest > 0) free_[at + need] = rest;
    used_[at] = Block{need, true, 0};
    in_use_ += need;
    peak_ = std::max(peak_, in_use_);
    ++allocations_;
    return base_ + at;
  }
  ++misses_;
  return nullptr;
}

void HostArena::FreeBlock(std::map<int64_t, Block>::iterator it) {
  int64_t at = it->first, len = it->second.bytes;
  in_use_ -= len;
  used_.erase(it);
  // Merge with the free neighbours.
  auto next = free_.lower_bound(at);
  if (next != free_.end() && next->first == at + len) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == at) {
      at = prev->first;
      len += prev->second;
      free_.erase(prev);
    }
  }
  free_[at] = len;
}

bool HostArena::Release(void* p) {
  if (p == nullptr || !Contains(p)) return false;
  const int64_t at = static_cast<char*>(p) - base_;
  absl::MutexLock lock(&mu_);
  auto it = used_.find(at);
  if (it == used_.end() || !it->second.owned) return false;
  it->second.owned = false;
  if (it->second.holds == 0) FreeBlock(it);
  return true;
}

std::optional<HostArena::Span> HostArena::Hold(const void* p, int64_t bytes) {
  if (p == nullptr || bytes <= 0 || !Contains(p)) return std::nullopt;
  const int64_t at = static_cast<const char*>(p) - base_;
  absl::MutexLock lock(&mu_);
  auto it = used_.upper_bound(at);
  if (it == used_.begin()) return std::nullopt;
  --it;
  // A live buffer of its owner's, wholly inside one block.
  if (!it->second.owned || bytes > it->first + it->second.bytes - at) return std::nullopt;
  ++it->second.holds;
  return Span{it->first, at};
}

void HostArena::Unhold(int64_t block) {
  absl::MutexLock lock(&mu_);
  auto it = used_.find(block);
  if (it == used_.end() || it->second.holds <= 0) return;
  if (--it->second.holds == 0 && !it->second.owned) FreeBlock(it);
}

HostArena::Stats HostArena::stats() const {
  Stats s;
  s.size = size_;
  s.direct_bytes = direct_bytes_.load(std::memory_order_relaxed);
  s.direct_copies = direct_copies_.load(std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  s.in_use_bytes = in_use_;
  s.peak_bytes = peak_;
  s.allocations = allocations_;
  s.misses = misses_;
  return s;
}

}  // namespace kiln
