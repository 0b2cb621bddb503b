#include "server/reports.h"

#include <algorithm>

namespace kiln::server {
namespace {

v1::DispatchReport Parse(const std::string& bytes) {
  v1::DispatchReport r;
  r.ParseFromString(bytes);  // our own serialization: cannot fail
  return r;
}

}  // namespace

void ReportStore::Add(const std::string& tenant, const v1::DispatchReport& report) {
  if (per_tenant_ <= 0) return;
  Kept kept{report.request_id(), report.SerializeAsString()};
  kept.bytes.shrink_to_fit();
  const int64_t size = static_cast<int64_t>(kept.bytes.size());
  if (size > max_bytes_) return;
  absl::MutexLock lock(&reports_mu_);
  TenantReports& t = reports_[tenant];
  t.bytes += size;
  t.reports.push_back(std::move(kept));
  while (static_cast<int>(t.reports.size()) > per_tenant_ || t.bytes > max_bytes_) {
    t.bytes -= static_cast<int64_t>(t.reports.front().bytes.size());
    t.reports.pop_front();
  }
}

std::vector<v1::DispatchReport> ReportStore::Last(const std::string& tenant, int n) const {
  absl::MutexLock lock(&reports_mu_);
  auto it = reports_.find(tenant);
  if (it == reports_.end()) return {};
  const std::deque<Kept>& q = it->second.reports;
  const size_t take = n <= 0 ? q.size() : std::min(q.size(), static_cast<size_t>(n));
  std::vector<v1::DispatchReport> out;
  out.reserve(take);
  for (auto r = q.end() - static_cast<std::ptrdiff_t>(take); r != q.end(); ++r) {
    out.push_back(Parse(r->bytes));
  }
  return out;
}

std::optional<v1::DispatchReport> ReportStore::Find(const std::string& tenant,
                                                    const std::string& request_id) const {
  absl::MutexLock lock(&reports_mu_);
  auto it = reports_.find(tenant);
  if (it == reports_.end()) return std::nullopt;
  for (auto r = it->second.reports.rbegin(); r != it->second.reports.rend(); ++r) {
    if (r->request_id == request_id) return Parse(r->bytes);
  }
  return std::nullopt;
}

int64_t ReportStore::Bytes(const std::string& tenant) const {
  absl::MutexLock lock(&reports_mu_);
  auto it = reports_.find(tenant);
  return it == reports_.end() ? 0 : it->second.bytes;
}

}  // namespace kiln::server
