// kilnd's Prometheus metrics (DESIGN.md section 7), prefix kiln_, served at
// http://<metrics_listen>/metrics by prometheus-cpp's exposer.
//
// Events are counted as they happen (requests, latencies, kernels); state is
// read at scrape time through one collector callback (cache statistics,
// device memory, sessions, runs in flight, param bytes per tenant) and from
// /proc/self (the process's memory, CPU time, threads and descriptors).
//
// Label cardinality is bounded by construction: `tenant` is a tenant name
// from the config (or "default", or "unauthenticated"), never a string a
// client sent; `device` and `backend` come from the device registry;
// `method`, `code`, `outcome` and `path` are enums. Callers pass only those.
//
// Thread safety: every method is thread-safe. The collector runs on the
// exposer's HTTP threads; it must not block for long.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kiln/v1/report.pb.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace prometheus {
class Exposer;
}

namespace kiln::server {

class Metrics {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;
  using Collector = std::function<std::vector<prometheus::MetricFamily>()>;

  // `listen`: "host:port" (port 0 picks a free port) or "off" (count, serve
  // nothing).
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const std::string& listen);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The bound HTTP port; 0 when off.
  int port() const { return port_; }
  // Sets the scrape-time collector (replacing any earlier one).
  void SetCollector(Collector collector);

  void CountRequest(const std::string& tenant, const std::string& method, const std::string& code);
  // One request message (a unary request, one SetParams chunk) of `bytes`.
  void ObserveRequestBytes(const std::string& tenant, const std::string& method, int64_t bytes);
  // An executable obtained for `tenant` (compiled, or loaded from a cache),
  // placed on `device`.
  void ObserveCompile(const std::string& tenant, const std::string& device,
                      v1::CacheOutcome outcome, absl::Duration took);
  // A finished run from its dispatch report: queue wait and run time by
  // tenant and device (the placement's chosen device), kernels and kernel
  // time by backend (the device id's prefix) and path.
  // `count_kernels` false for the requests of a dynamic batch but one (the
  // batch ran its kernels once).
  void ObserveRun(const std::string& tenant, const v1::DispatchReport& report,
                  bool count_kernels = true);
  // A request of a dynamic batch (server/batcher.h): its wait in the batch
  // queue, and the batch's rows (`batch_rows` > 0 once per batch).
  void ObserveBatch(const std::string& tenant, int64_t batch_rows, absl::Duration queue_wait);
  // Tensor bytes a Run moved between the wire and the engine, by direction
  // ("input", "output") and path: "in_place" (request bytes bound as the
  // engine's input where they were received), "copied" (one copy: into
  // aligned or device memory, or into the response message), "sliced" (an
  // output sent as gRPC slices over the engine's own buffer, no copy),
  // "batched" (concatenated into or split out of a dynamic batch).
  void CountRunTensorBytes(const std::string& tenant, const std::string& direction,
                           const std::string& path, int64_t bytes);
  // A training step of a training session (its run is also ObserveRun's).
  void ObserveTrainStep(const std::string& tenant, absl::Duration took);

  // A gauge or counter family for the collector: one sample per label set.
  static prometheus::MetricFamily Family(const std::string& name, const std::string& help,
                                         prometheus::MetricType type,
                                         const std::vector<std::pair<Labels, double>>& samples);

 private:
  class ScrapeCollectable;
  class ProcessCollectable;
  Metrics();
  // Kernels and kernel time of a report's steps, by backend and path.
  void CountKernelSteps(const v1::DispatchReport& report);

  // The children of a family counted on every request, by their label
  // values: one hash lookup under a reader lock, where prometheus' Add builds
  // a std::map of the labels, locks the family and compares maps (~1 us a
  // call, ~10 calls a Run). Children are never removed, so the pointers stay.
  template <typename T>
  struct Children {
    absl::Mutex mu;
    absl::flat_hash_map<std::string, T*> by_values ABSL_GUARDED_BY(mu);
  };
  template <typename T, typename... Args>
  static T& Child(prometheus::Family<T>& family, Children<T>& children,
                  std::initializer_list<std::pair<const char*, std::string_view>> labels,
                  const Args&... args);

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<ScrapeCollectable> scraped_;
  std::shared_ptr<ProcessCollectable> process_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;

  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Counter>* kernels_;
  prometheus::Family<prometheus::Counter>* kernel_seconds_;
  prometheus::Family<prometheus::Counter>* compiles_;
  prometheus::Family<prometheus::Histogram>* request_bytes_;
  prometheus::Family<prometheus::Histogram>* queue_seconds_;
  prometheus::Family<prometheus::Histogram>* compile_seconds_;
  prometheus::Family<prometheus::Histogram>* run_seconds_;
  prometheus::Family<prometheus::Counter>* run_tensor_bytes_;
  prometheus::Family<prometheus::Counter>* train_steps_;
  prometheus::Family<prometheus::Histogram>* train_step_seconds_;
  prometheus::Family<prometheus::Histogram>* batch_rows_;
  prometheus::Family<prometheus::Histogram>* batch_queue_seconds_;
  Children<prometheus::Counter> requests_by_, kernels_by_, kernel_seconds_by_,
      run_tensor_bytes_by_;
  Children<prometheus::Histogram> request_bytes_by_, queue_seconds_by_, run_seconds_by_,
      batch_rows_by_, batch_queue_seconds_by_;
};

}  // namespace kiln::server
