#include "server/metrics.h"

#include <unistd.h>

#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/host_arena.h"
#include "base/host_buffer_pool.h"
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

// Bytes, 64 B to 1 GiB in powers of 4.
const prometheus::Histogram::BucketBoundaries& ByteBuckets() {
  static const auto* b = [] {
    auto* v = new prometheus::Histogram::BucketBoundaries;
    for (double x = 64; x <= double{1 << 30}; x *= 4) v->push_back(x);
    return v;
  }();
  return *b;
}

// Rows of a dynamic batch, 1 to 1024 (kMaxBatchRows) in powers of 2.
const prometheus::Histogram::BucketBoundaries& BatchRowBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
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

// The process itself, from /proc/self at scrape time (Linux).
class Metrics::ProcessCollectable : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    using prometheus::MetricType;
    std::vector<prometheus::MetricFamily> out;
    const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
    const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
    double vm_pages = 0, rss_pages = 0;
    if (std::ifstream statm("/proc/self/statm"); statm >> vm_pages >> rss_pages) {
      out.push_back(Family("kiln_process_resident_memory_bytes", "Resident memory of kilnd",
                           MetricType::Gauge, {{{}, rss_pages * page}}));
      out.push_back(Family("kiln_process_virtual_memory_bytes", "Virtual memory of kilnd",
                           MetricType::Gauge, {{{}, vm_pages * page}}));
    }
    // Large host buffers kept for reuse (base/host_buffer_pool.h): resident,
    // in no tenant's quota, bounded by the limit.
    const HostBufferPool& pool = HostBufferPool::Default();
    out.push_back(Family("kiln_host_buffer_pool_bytes",
                         "Large host buffers kilnd keeps for reuse (resident, in no quota)",
                         MetricType::Gauge, {{{}, static_cast<double>(pool.kept_bytes())}}));
    out.push_back(Family("kiln_host_buffer_pool_limit_bytes",
                         "The most kiln_host_buffer_pool_bytes may reach (KILN_HOST_BUFFER_POOL_BYTES)",
                         MetricType::Gauge, {{{}, static_cast<double>(pool.limit())}}));
    // The host arena device workers map (base/host_arena.h): large HostTensors
    // whose copies to and from a device worker cross by reference.
    if (const HostArena* arena = HostArena::ForHostTensors(); arena != nullptr) {
      const HostArena::Stats a = arena->stats();
      out.push_back(Family("kiln_host_arena_bytes",
                           "Size of the shared host arena (KILN_HOST_ARENA_BYTES)",
                           MetricType::Gauge, {{{}, static_cast<double>(a.size)}}));
      out.push_back(Family("kiln_host_arena_in_use_bytes",
                           "Host arena bytes in live buffers (owned or held by a copy)",
                           MetricType::Gauge, {{{}, static_cast<double>(a.in_use_bytes)}}));
      out.push_back(Family("kiln_host_arena_misses_total",
                           "Large host buffers that found no room in the host arena (heap instead)",
                           MetricType::Counter, {{{}, static_cast<double>(a.misses)}}));
      out.push_back(Family("kiln_host_arena_direct_bytes_total",
                           "Bytes copied between the host arena and a device worker by reference",
                           MetricType::Counter, {{{}, static_cast<double>(a.direct_bytes)}}));
    }
    // /proc/self/stat: fields after the parenthesised name, which may hold spaces.
    std::ifstream stat_file("/proc/self/stat");
    std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
    if (const size_t close = stat.rfind(')'); close != std::string::npos) {
      std::istringstream fields(stat.substr(close + 2));
      std::vector<std::string> f((std::istream_iterator<std::string>(fields)),
                                 std::istream_iterator<std::string>());
      // f[0] is field 3 (state): utime 14, stime 15, num_threads 20, starttime 22.
      if (f.size() > 19) {
        const double cpu = (std::stod(f[11]) + std::stod(f[12])) / ticks;
        out.push_back(Family("kiln_process_cpu_seconds_total", "CPU time kilnd used (user + system)",
                             MetricType::Counter, {{{}, cpu}}));
        out.push_back(Family("kiln_process_threads", "Threads of kilnd", MetricType::Gauge,
                             {{{}, std::stod(f[17])}}));
      }
    }
    std::error_code ec;
    double fds = 0;
    for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end;
         it.increment(ec)) {
      ++fds;
    }
    if (!ec) {
      out.push_back(Family("kiln_process_open_fds", "Open file descriptors of kilnd",
                           MetricType::Gauge, {{{}, fds}}));
    }
    return out;
  }
};

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      scraped_(std::make_shared<ScrapeCollectable>()),
      process_(std::make_shared<ProcessCollectable>()) {
  requests_ = &prometheus::BuildCounter()
                   .Name("kiln_requests_total")
                   .Help("RPCs finished, by tenant, method and gRPC status code")
                   .Register(*registry_);
  kernels_ = &prometheus::BuildCounter()
                  .Name("kiln_kernels_total")
                  .Help("Kernels launched by runs, by backend and path (native, common_ir, rewritten)")
                  .Register(*registry_);
  kernel_seconds_ = &prometheus::BuildCounter()
                         .Name("kiln_kernel_seconds_total")
                         .Help("Device time of the kernels runs launched, by backend and path")
                         .Register(*registry_);
  request_bytes_ = &prometheus::BuildHistogram()
                        .Name("kiln_request_bytes")
                        .Help("Request message sizes (one SetParams chunk each), by tenant and method")
                        .Register(*registry_);
  compiles_ = &prometheus::BuildCounter()
                   .Name("kiln_compiles_total")
                   .Help("Executable lookups by requests, by tenant and cache outcome")
                   .Register(*registry_);
  queue_seconds_ = &prometheus::BuildHistogram()
                        .Name("kiln_queue_seconds")
                        .Help("Time runs waited in their device's queue, by tenant and device")
                        .Register(*registry_);
  compile_seconds_ = &prometheus::BuildHistogram()
                          .Name("kiln_compile_seconds")
                          .Help("Time to get an executable (compile or cache load), by tenant, device and outcome")
                          .Register(*registry_);
  run_seconds_ = &prometheus::BuildHistogram()
                      .Name("kiln_run_seconds")
                      .Help("Time runs executed on their device, by tenant and device")
                      .Register(*registry_);
  run_tensor_bytes_ = &prometheus::BuildCounter()
                          .Name("kiln_run_tensor_bytes_total")
                          .Help("Tensor bytes of Run requests and responses, by tenant, direction "
                                "(input, output) and path (in_place, copied, sliced, batched)")
                          .Register(*registry_);
  train_steps_ = &prometheus::BuildCounter()
                      .Name("kiln_train_steps_total")
                      .Help("Training steps taken by training sessions, by tenant")
                      .Register(*registry_);
  train_step_seconds_ = &prometheus::BuildHistogram()
                             .Name("kiln_train_step_seconds")
                             .Help("Time of a training step (queue and run), by tenant")
                             .Register(*registry_);
  batch_rows_ = &prometheus::BuildHistogram()
                     .Name("kiln_batch_rows")
                     .Help("Rows (batch size) of each dynamically batched run, by tenant")
                     .Register(*registry_);
  batch_queue_seconds_ = &prometheus::BuildHistogram()
                              .Name("kiln_batch_queue_seconds")
                              .Help("Time a request waited in its dynamic batch queue, by tenant")
                              .Register(*registry_);
}

Metrics::~Metrics() = default;

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const std::string& listen) {
  std::unique_ptr<Metrics> m(new Metrics());
  if (listen == "off") return m;
  try {
    // civetweb serves one connection per thread and waits request_timeout_ms
    // (default 30 s) for a request on an open one: with 2 threads, two idle
    // TCP connections stopped every scrape for 30 s. 8 threads and a 5 s wait
    // take 8 idle connections to delay a scrape, for at most 5 s.
    m->exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", listen, "num_threads", "8", "request_timeout_ms", "5000"});
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", listen, ": ", e.what(),
                     " (--metrics_listen=host:port, port 0 picks a free one, or off)"));
  }
  m->exposer_->RegisterCollectable(m->registry_);
  m->exposer_->RegisterCollectable(m->scraped_);
  m->exposer_->RegisterCollectable(m->process_);
  const std::vector<int> ports = m->exposer_->GetListeningPorts();
  if (ports.empty()) return absl::UnavailableError(absl::StrCat("metrics: no port bound for ", listen));
  m->port_ = ports.front();
  return m;
}

void Metrics::SetCollector(Collector collector) { scraped_->Set(std::move(collector)); }

template <typename T, typename... Args>
T& Metrics::Child(prometheus::Family<T>& family, Children<T>& children,
                  std::initializer_list<std::pair<const char*, std::string_view>> labels,
                  const Args&... args) {
  std::string key;  // each value length-prefixed: no two label sets share a key
  for (const auto& label : labels) {
    const absl::string_view value(label.second.data(), label.second.size());
    absl::StrAppend(&key, static_cast<uint64_t>(value.size()), ":", value, ";");
  }
  {
    absl::ReaderMutexLock lock(&children.mu);
    auto it = children.by_values.find(key);
    if (it != children.by_values.end()) return *it->second;
  }
  prometheus::Labels l;
  for (const auto& label : labels) l.emplace(label.first, std::string(label.second));
  T& child = family.Add(l, args...);  // the family's own child for these labels
  absl::MutexLock lock(&children.mu);
  children.by_values.emplace(std::move(key), &child);
  return child;
}

void Metrics::CountRequest(const std::string& tenant, const std::string& method,
                           const std::string& code) {
  Child(*requests_, requests_by_, {{"tenant", tenant}, {"method", method}, {"code", code}})
      .Increment();
}

void Metrics::ObserveRequestBytes(const std::string& tenant, const std::string& method,
                                  int64_t bytes) {
  Child(*request_bytes_, request_bytes_by_, {{"tenant", tenant}, {"method", method}},
        ByteBuckets())
      .Observe(static_cast<double>(bytes));
}

void Metrics::ObserveCompile(const std::string& tenant, const std::string& device,
                             v1::CacheOutcome outcome, absl::Duration took) {
  std::string name = v1::CacheOutcome_Name(outcome);
  if (name.starts_with("CACHE_")) name = name.substr(6);
  name = Lower(name);
  compiles_->Add({{"tenant", tenant}, {"outcome", name}}).Increment();
  compile_seconds_->Add({{"tenant", tenant}, {"device", device}, {"outcome", name}},
                        LatencyBuckets())
      .Observe(absl::ToDoubleSeconds(took));
}

void Metrics::ObserveRun(const std::string& tenant, const v1::DispatchReport& report,
                         bool count_kernels) {
  const std::string& device = report.placement().chosen();
  Child(*queue_seconds_, queue_seconds_by_, {{"tenant", tenant}, {"device", device}},
        LatencyBuckets())
      .Observe(report.queue_micros() * 1e-6);
  Child(*run_seconds_, run_seconds_by_, {{"tenant", tenant}, {"device", device}},
        LatencyBuckets())
      .Observe(report.run_micros() * 1e-6);
  if (count_kernels) CountKernelSteps(report);
}

void Metrics::ObserveBatch(const std::string& tenant, int64_t batch_rows,
                           absl::Duration queue_wait) {
  if (batch_rows > 0) {
    Child(*batch_rows_, batch_rows_by_, {{"tenant", tenant}}, BatchRowBuckets())
        .Observe(static_cast<double>(batch_rows));
  }
  Child(*batch_queue_seconds_, batch_queue_seconds_by_, {{"tenant", tenant}}, LatencyBuckets())
      .Observe(absl::ToDoubleSeconds(queue_wait));
}

void Metrics::CountRunTensorBytes(const std::string& tenant, const std::string& direction,
                                  const std::string& path, int64_t bytes) {
  Child(*run_tensor_bytes_, run_tensor_bytes_by_,
        {{"tenant", tenant}, {"direction", direction}, {"path", path}})
      .Increment(static_cast<double>(bytes));
}

void Metrics::ObserveTrainStep(const std::string& tenant, absl::Duration took) {
  const prometheus::Labels labels{{"tenant", tenant}};
  train_steps_->Add(labels).Increment();
  train_step_seconds_->Add(labels, LatencyBuckets()).Observe(absl::ToDoubleSeconds(took));
}

void Metrics::CountKernelSteps(const v1::DispatchReport& report) {
  struct Kernels {
    int count = 0;
    double micros = 0;
  };
  // By backend (a view into the report) and path enum: names made once per pair.
  std::map<std::pair<std::string_view, int>, Kernels> by_path;
  for (const v1::DispatchStep& s : report.steps()) {
    if (s.kind() != v1::STEP_KERNEL) continue;
    const std::string_view device = s.device();
    Kernels& k = by_path[{device.substr(0, device.find(':')), s.path()}];
    ++k.count;
    k.micros += s.duration_micros();
  }
  for (const auto& [key, k] : by_path) {
    std::string path = v1::Path_Name(static_cast<v1::Path>(key.second));
    if (path.starts_with("PATH_")) path = path.substr(5);
    path = Lower(path);
    Child(*kernels_, kernels_by_, {{"backend", key.first}, {"path", path}}).Increment(k.count);
    Child(*kernel_seconds_, kernel_seconds_by_, {{"backend", key.first}, {"path", path}})
        .Increment(k.micros * 1e-6);
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
