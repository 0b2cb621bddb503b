#include "backends/backend.h"

#include <algorithm>
#include <mutex>

namespace kiln::backend {
namespace {

std::mutex& RegistryMutex() {
  static std::mutex mu;
  return mu;
}

std::vector<RegisteredBackend>& Registry() {
  static auto* registry = new std::vector<RegisteredBackend>();
  return *registry;
}

}  // namespace

int64_t TensorDesc::num_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

int64_t TensorDesc::num_bytes() const {
  auto b = BytesFor(dtype, num_elements());
  return b ? *b : 0;
}

BackendRegistration::BackendRegistration(std::string name, int priority, BackendFactory factory) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Registry().push_back({std::move(name), priority, std::move(factory)});
}

std::vector<RegisteredBackend> RegisteredBackends() {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto out = Registry();
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.priority < b.priority; });
  return out;
}

}  // namespace kiln::backend
