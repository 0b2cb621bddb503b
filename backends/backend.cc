#include "backends/backend.h"

#include <algorithm>
#include <mutex>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

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

absl::Status DeviceFault(const std::string& device, const std::string& what) {
  absl::Status s = absl::UnavailableError(absl::StrCat(device, ": device fault: ", what));
  s.SetPayload(kDeviceFaultPayload, absl::Cord(device));
  return s;
}

std::optional<std::string> FaultedDevice(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kUnavailable) return std::nullopt;
  absl::optional<absl::Cord> p = status.GetPayload(kDeviceFaultPayload);
  if (!p) return std::nullopt;
  return std::string(*p);
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
