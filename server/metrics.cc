#include "server/metrics.h"

#include <exception>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace kiln::server {
namespace {

// Seconds, 50 us to 30 s.
const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3,
      100e-3, 250e-3, 500e-3, 1, 2.5, 5, 10, 30};
  return *b;
}

std::string Lower(std::string s) {
  absl::AsciiStrToLower(&s);
  return s;
}

}  // namespace

class Metrics::ScrapeCollectable : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    absl::MutexLock lock(&collector_mu_);
    if (!collector_) return {};
    return collector_();
  }
  void Set(Collector c) {
    absl::MutexLock lock(&collector_mu_);
    collector_ = std::move(c);
  }

 private:
  mutable absl::Mutex collector_mu_;
  Collector collector_ ABSL_GUARDED_BY(collector_mu_);
};

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      scraped_(std::make_shared<ScrapeCollectable>()) {
  requests_ = &prometheus::BuildCounter()
                   .Name("kiln_requests_total")
                   .Help("RPCs finished, by tenant, method and gRPC status code")
                   .Register(*registry_);
  kernels_ = &prometheus::BuildCounter()
                  .Name("kiln_kernels_total")
                  .Help("Kernels launched by runs, by backend and path (native, common_ir, rewritten)")
                  .Register(*registry_);
  compiles_ = &prometheus::BuildCounter()
                   .Name("kiln_compiles_total")
                   .Help("Executable lookups by requests, by cache outcome")
                   .Register(*registry_);
  queue_seconds_ = &prometheus::BuildHistogram()
                        .Name("kiln_queue_seconds")
                        .Help("Time runs waited in the scheduler's queue, by tenant")
                        .Register(*registry_);
  compile_seconds_ = &prometheus::BuildHistogram()
                          .Name("kiln_compile_seconds")
                          .Help("Time to get an executable (compile or cache load), by outcome")
                          .Register(*registry_);
  run_seconds_ = &prometheus::BuildHistogram()
                      .Name("kiln_run_seconds")
                      .Help("Time runs executed on devices, by tenant")
                      .Register(*registry_);
}

Metrics::~Metrics() = default;

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const std::string& listen) {
  std::unique_ptr<Metrics> m(new Metrics());
  if (listen == "off") return m;
  try {
    m->exposer_ = std::make_unique<prometheus::Exposer>(listen, 2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", listen, ": ", e.what(),
                     " (--metrics_listen=host:port, port 0 picks a free one, or off)"));
  }
  m->exposer_->RegisterCollectable(m->registry_);
  m->exposer_->RegisterCollectable(m->scraped_);
  const std::vector<int> ports = m->exposer_->GetListeningPorts();
  if (ports.empty()) return absl::UnavailableError(absl::StrCat("metrics: no port bound for ", listen));
  m->port_ = ports.front();
  return m;
}

void Metrics::SetCollector(Collector collector) { scraped_->Set(std::move(collector)); }

void Metrics::CountRequest(const std::string& tenant, const std::string& method,
                           const std::string& code) {
  requests_->Add({{"tenant", tenant}, {"method", method}, {"code", code}}).Increment();
}

void Metrics::ObserveQueue(const std::string& tenant, absl::Duration waited) {
  queue_seconds_->Add({{"tenant", tenant}}, LatencyBuckets()).Observe(absl::ToDoubleSeconds(waited));
}

void Metrics::ObserveCompile(v1::CacheOutcome outcome, absl::Duration took) {
  std::string name = v1::CacheOutcome_Name(outcome);
  if (name.starts_with("CACHE_")) name = name.substr(6);
  name = Lower(name);
  compiles_->Add({{"outcome", name}}).Increment();
  compile_seconds_->Add({{"outcome", name}}, LatencyBuckets())
      .Observe(absl::ToDoubleSeconds(took));
}

void Metrics::ObserveRun(const std::string& tenant, absl::Duration took) {
  run_seconds_->Add({{"tenant", tenant}}, LatencyBuckets()).Observe(absl::ToDoubleSeconds(took));
}

void Metrics::CountKernels(const v1::DispatchReport& report) {
  std::map<std::pair<std::string, std::string>, int> counts;
  for (const v1::DispatchStep& s : report.steps()) {
    if (s.kind() != v1::STEP_KERNEL) continue;
    const std::string backend = s.device().substr(0, s.device().find(':'));
    std::string path = v1::Path_Name(s.path());
    if (path.starts_with("PATH_")) path = path.substr(5);
    ++counts[{backend, Lower(path)}];
  }
  for (const auto& [key, n] : counts) {
    kernels_->Add({{"backend", key.first}, {"path", key.second}}).Increment(n);
  }
}

prometheus::MetricFamily Metrics::Family(const std::string& name, const std::string& help,
                                         prometheus::MetricType type,
                                         const std::vector<std::pair<Labels, double>>& samples) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  for (const auto& [labels, value] : samples) {
    prometheus::ClientMetric m;
    for (const auto& [k, v] : labels) m.label.push_back({k, v});
    if (type == prometheus::MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
    f.metric.push_back(std::move(m));
  }
  return f;
}

}  // namespace kiln::server
