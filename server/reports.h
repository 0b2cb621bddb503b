// The last dispatch reports of each tenant, for GetReport (DESIGN.md
// section 6: kept for the last N requests whether or not the caller asked).
//
// Each report is kept serialized: one allocation per report instead of a
// tree of small ones scattered among freed tensor buffers (which kept glibc
// from returning those buffers: ~200 MiB per tenant with 64 reports), and its
// bytes are counted against a per-tenant budget; the oldest go first.
//
// Thread safety: thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "kiln/v1/report.pb.h"

namespace kiln::server {

class ReportStore {
 public:
  // Keeps up to `per_tenant` reports per tenant (0 keeps none), and at most
  // `max_bytes_per_tenant` serialized bytes of them (a report larger than
  // that alone is not kept).
  ReportStore(int per_tenant, int64_t max_bytes_per_tenant)
      : per_tenant_(per_tenant), max_bytes_(max_bytes_per_tenant) {}
  ReportStore(const ReportStore&) = delete;
  ReportStore& operator=(const ReportStore&) = delete;

  void Add(const std::string& tenant, const v1::DispatchReport& report);
  // The tenant's last `n` reports (0 = all kept), oldest first.
  std::vector<v1::DispatchReport> Last(const std::string& tenant, int n) const;
  // The tenant's report of `request_id`, if still kept.
  std::optional<v1::DispatchReport> Find(const std::string& tenant,
                                         const std::string& request_id) const;
  // Serialized bytes kept for the tenant.
  int64_t Bytes(const std::string& tenant) const;

 private:
  struct Kept {
    std::string request_id;
    std::string bytes;  // the serialized v1::DispatchReport
  };
  struct TenantReports {
    std::deque<Kept> reports;  // oldest first
    int64_t bytes = 0;
  };

  const int per_tenant_;
  const int64_t max_bytes_;
  mutable absl::Mutex reports_mu_;
  std::map<std::string, TenantReports> reports_ ABSL_GUARDED_BY(reports_mu_);
};

}  // namespace kiln::server
