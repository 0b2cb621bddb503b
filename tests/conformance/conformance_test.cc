// Runs every registered case on every device of every backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "engine/runtime/device_registry.h"
#include "tests/conformance/conformance.h"

namespace kiln::conformance {
namespace {

struct DeviceSet {
  std::unique_ptr<runtime::DeviceRegistry> registry;
  std::vector<backend::Device*> devices;
};

// Every device of every backend, in this process; with
// KILN_TEST_ISOLATION=process every backend but the CPU's runs in device
// worker processes (runtime/worker_client.h), so the suite checks the
// process boundary too.
DeviceSet& Devices() {
  static DeviceSet* set = [] {
    auto* s = new DeviceSet();
    runtime::RegistryOptions ro;
    const char* iso = std::getenv("KILN_TEST_ISOLATION");
    ro.isolation = iso != nullptr && std::string(iso) == "process" ? runtime::DeviceIsolation::kProcess
                                                                   : runtime::DeviceIsolation::kThread;
    auto r = runtime::DeviceRegistry::Create(ro);
    if (!r.ok()) {
      std::fprintf(stderr, "no devices: %s\n", std::string(r.status().message()).c_str());
      std::abort();
    }
    for (const std::string& u : (*r)->unavailable()) std::fprintf(stderr, "unavailable: %s\n", u.c_str());
    s->devices = (*r)->devices();
    s->registry = std::move(r).value();
    return s;
  }();
  return *set;
}

class ConformanceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ConformanceTest, MatchesReferenceOnEveryDevice) {
  const std::string family_name = GetParam();
  Family family;
  for (const auto& f : Families()) {
    if (f.name == family_name) family = f;
  }
  const std::vector<Case> cases = family.generator();
  ASSERT_FALSE(cases.empty());
  ASSERT_FALSE(Devices().devices.empty()) << "no device at all (the CPU backend must register)";
  // KILN_CONFORMANCE_GPU_ONLY (the ctest label `gpu`): only hardware GPUs,
  // skipped cleanly where there is none (CI, lavapipe).
  std::vector<backend::Device*> devices;
  const bool gpu_only = std::getenv("KILN_CONFORMANCE_GPU_ONLY") != nullptr;
  for (backend::Device* d : Devices().devices) {
    if (!gpu_only || d->info().kind == backend::DeviceKind::kGpu) devices.push_back(d);
  }
  if (devices.empty()) GTEST_SKIP() << "no GPU device";
  for (backend::Device* device : devices) {
    int ran = 0, skipped = 0, traded = 0;
    const std::vector<std::string>& features = device->info().features;
    for (const Case& c : cases) {
      SCOPED_TRACE(absl::StrCat(device->info().id, " ", c.name));
      if (!device->Supports(c.spec).native) {
        ++skipped;
        // The CPU is the guaranteed fallback: it claims every case.
        EXPECT_NE(device->info().backend, "cpu") << device->Supports(c.spec).reason;
        continue;
      }
      auto got = RunOnDevice(*device, c);
      if (!c.expect_error.empty()) {
        ASSERT_FALSE(got.ok()) << "expected an error containing: " << c.expect_error;
        EXPECT_NE(std::string(got.status().message()).find(c.expect_error), std::string::npos)
            << got.status();
        ++ran;
        continue;
      }
      ASSERT_TRUE(got.ok()) << got.status();
      const bool trade = !c.traded_feature.empty() &&
                         std::find(features.begin(), features.end(), c.traded_feature) != features.end();
      traded += trade;
      const std::vector<HostTensor> want =
          trade ? c.traded_reference(c.spec, c.inputs) : c.reference(c.spec, c.inputs);
      ASSERT_EQ(got->size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        const std::string diff = Compare((*got)[i], want[i], trade ? c.traded_tol : c.tol);
        EXPECT_TRUE(diff.empty()) << "output " << i << (trade ? " (traded reference)" : "") << ": "
                                  << diff;
      }
      ++ran;
    }
    std::printf("[ %s ] %s: %d cases ran, %d not claimed, %d against a traded reference\n",
                device->info().id.c_str(), family_name.c_str(), ran, skipped, traded);
  }
}

std::vector<std::string> FamilyNames() {
  std::vector<std::string> names;
  for (const auto& f : Families()) names.push_back(f.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Ops, ConformanceTest, ::testing::ValuesIn(FamilyNames()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kiln::conformance
