// The last dispatch reports of each tenant, for GetReport (DESIGN.md
// section 6: kept for the last N requests whether or not the caller asked).
//
// Thread safety: thread-safe.
#pragma once

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
  // Keeps `per_tenant` reports per tenant (0 keeps none).
  explicit ReportStore(int per_tenant) : per_tenant_(per_tenant) {}
  ReportStore(const ReportStore&) = delete;
  ReportStore& operator=(const ReportStore&) = delete;

  void Add(const std::string& tenant, const v1::DispatchReport& report);
  // The tenant's last `n` reports (0 = all kept), oldest first.
  std::vector<v1::DispatchReport> Last(const std::string& tenant, int n) const;
  // The tenant's report of `request_id`, if still kept.
  std::optional<v1::DispatchReport> Find(const std::string& tenant,
                                         const std::string& request_id) const;

 private:
  const int per_tenant_;
  mutable absl::Mutex reports_mu_;
  std::map<std::string, std::deque<v1::DispatchReport>> reports_ ABSL_GUARDED_BY(reports_mu_);
};

}  // namespace kiln::server
