#include "base/host_buffer_pool.h"

#include <cstdlib>
#include <vector>

namespace kiln {

HostBufferPool::~HostBufferPool() {
  absl::MutexLock lock(&mu_);
  for (auto& [bytes, p] : kept_) std::free(p);
}

HostBufferPool& HostBufferPool::Default() {
  static HostBufferPool* const pool = [] {
    size_t limit = kDefaultLimit;
    if (const char* env = std::getenv("KILN_HOST_BUFFER_POOL_BYTES");
        env != nullptr && *env != '\0') {
      const long long v = std::atoll(env);
      limit = v > 0 ? static_cast<size_t>(v) : 0;
    }
    return new HostBufferPool(limit);
  }();
  return *pool;
}

void* HostBufferPool::Allocate(size_t bytes) {
  const size_t size = Rounded(bytes);
  void* p = nullptr;
  {
    absl::MutexLock lock(&mu_);
    // Newest first: its pages are the likeliest to be in cache.
    for (auto it = kept_.rbegin(); it != kept_.rend(); ++it) {
      if (it->first != size) continue;
      p = it->second;
      kept_bytes_ -= size;
      kept_.erase(std::next(it).base());
      break;
    }
  }
  if (p == nullptr) p = std::aligned_alloc(64, size);
  if (p == nullptr) return nullptr;
  absl::MutexLock lock(&mu_);
  out_.emplace(p, size);
  out_count_.fetch_add(1, std::memory_order_relaxed);
  return p;
}

bool HostBufferPool::Release(void* p) {
  if (p == nullptr || out_count_.load(std::memory_order_relaxed) == 0) return false;
  std::vector<void*> to_free;
  {
    absl::MutexLock lock(&mu_);
    auto it = out_.find(p);
    if (it == out_.end()) return false;
    const size_t size = it->second;
    out_.erase(it);
    out_count_.fetch_sub(1, std::memory_order_relaxed);
    if (size > limit_) {
      to_free.push_back(p);
    } else {
      while (kept_bytes_ + size > limit_ && !kept_.empty()) {
        kept_bytes_ -= kept_.front().first;
        to_free.push_back(kept_.front().second);
        kept_.pop_front();
      }
      kept_.emplace_back(size, p);
      kept_bytes_ += size;
    }
  }
  for (void* f : to_free) std::free(f);  // munmap outside the lock
  return true;
}

}  // namespace kiln
