#include "server/reports.h"

#include <algorithm>

namespace kiln::server {

void ReportStore::Add(const std::string& tenant, const v1::DispatchReport& report) {
  if (per_tenant_ <= 0) return;
  absl::MutexLock lock(&reports_mu_);
  std::deque<v1::DispatchReport>& q = reports_[tenant];
  q.push_back(report);
  while (static_cast<int>(q.size()) > per_tenant_) q.pop_front();
}

std::vector<v1::DispatchReport> ReportStore::Last(const std::string& tenant, int n) const {
  absl::MutexLock lock(&reports_mu_);
  auto it = reports_.find(tenant);
  if (it == reports_.end()) return {};
  const std::deque<v1::DispatchReport>& q = it->second;
  const size_t take = n <= 0 ? q.size() : std::min(q.size(), static_cast<size_t>(n));
  return std::vector<v1::DispatchReport>(q.end() - static_cast<std::ptrdiff_t>(take), q.end());
}

std::optional<v1::DispatchReport> ReportStore::Find(const std::string& tenant,
                                                    const std::string& request_id) const {
  absl::MutexLock lock(&reports_mu_);
  auto it = reports_.find(tenant);
  if (it == reports_.end()) return std::nullopt;
  for (auto r = it->second.rbegin(); r != it->second.rend(); ++r) {
    if (r->request_id() == request_id) return *r;
  }
  return std::nullopt;
}

}  // namespace kiln::server
