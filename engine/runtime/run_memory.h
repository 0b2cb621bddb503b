// Device memory held by runs, by tenant (DESIGN.md section 5, "Programs and run
// contexts"). A run context's memory (arena and input staging on each device)
// belongs to the program while the context idles in its pool, and is charged
// to the tenant whose run holds it while that run executes, so concurrent runs
// of one shared program are each accounted to their own tenant. The engine
// reports the figures per device (DeviceStats::tenant_run_memory_bytes); kilnd
// shows them per tenant.
//
// Thread safety: thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kiln::runtime {

class RunMemoryLedger {
 public:
  // `bytes` by device id.
  void Charge(const std::string& tenant, const std::map<std::string, int64_t>& bytes) {
    absl::MutexLock lock(&mu_);
    for (const auto& [device, n] : bytes) held_[device][tenant] += n;
  }
  void Release(const std::string& tenant, const std::map<std::string, int64_t>& bytes) {
    absl::MutexLock lock(&mu_);
    for (const auto& [device, n] : bytes) {
      auto& by_tenant = held_[device];
      if ((by_tenant[tenant] -= n) <= 0) by_tenant.erase(tenant);
    }
  }
  // Tenant -> bytes held on `device` now.
  std::map<std::string, int64_t> On(const std::string& device) const {
    absl::MutexLock lock(&mu_);
    auto it = held_.find(device);
    return it == held_.end() ? std::map<std::string, int64_t>{} : it->second;
  }

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::map<std::string, int64_t>> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kiln::runtime
