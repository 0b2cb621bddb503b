// Runs on hosts without an NVIDIA driver (the development machines, CI):
// the CUDA backend is linked in, its factory fails cleanly, the registry
// lists no CUDA device and names why, and the engine starts with its devices
// in this process and in device workers. Skipped where a driver loads.
#include <gtest/gtest.h>

#include <string>

#include "backends/backend.h"
#include "backends/cuda/cuda_api.h"
#include "engine/engine.h"
#include "engine/runtime/device_registry.h"

namespace kiln::cuda {
namespace {

bool HaveDriver() { return LoadDriver().ok(); }

TEST(CudaNoDriver, FactoryFailsWithTheReason) {
  if (HaveDriver()) GTEST_SKIP() << "a CUDA driver is present";
  bool registered = false;
  for (const auto& reg : backend::RegisteredBackends()) {
    if (reg.name != "cuda") continue;
    registered = true;
    absl::StatusOr<std::unique_ptr<backend::Backend>> b = reg.factory({});
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
    EXPECT_NE(b.status().message().find("libcuda"), absl::string_view::npos) << b.status();
  }
  EXPECT_TRUE(registered) << "the CUDA backend is not linked into kiln_backends";
}

TEST(CudaNoDriver, RegistryListsNoCudaDevice) {
  if (HaveDriver()) GTEST_SKIP() << "a CUDA driver is present";
  for (auto iso : {runtime::DeviceIsolation::kThread, runtime::DeviceIsolation::kProcess}) {
    runtime::RegistryOptions options;
    options.isolation = iso;
    absl::StatusOr<std::unique_ptr<runtime::DeviceRegistry>> r =
        runtime::DeviceRegistry::Create(options);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_FALSE((*r)->devices().empty());
    EXPECT_EQ((*r)->devices().front()->info().id, "cpu:0");
    for (const backend::Device* d : (*r)->devices()) EXPECT_NE(d->info().backend, "cuda");
    bool named = false;
    for (const std::string& u : (*r)->unavailable()) {
      if (u.rfind("cuda: ", 0) != 0) continue;
      named = true;
      // The backend's own reason already names it: said once, not "cuda: cuda: ...".
      EXPECT_EQ(u.rfind("cuda: cuda: ", 0), std::string::npos) << u;
    }
    EXPECT_TRUE(named) << "the registry does not say why cuda is unavailable";
  }
}

TEST(CudaNoDriver, EngineStarts) {
  if (HaveDriver()) GTEST_SKIP() << "a CUDA driver is present";
  for (auto iso :
       {EngineOptions::DeviceIsolation::kThread, EngineOptions::DeviceIsolation::kAuto}) {
    EngineOptions options;
    options.calibration = EngineOptions::Calibration::kNever;
    options.device_isolation = iso;
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    bool cpu = false;
    for (const backend::DeviceInfo* d : (*engine)->Devices()) {
      EXPECT_NE(d->backend, "cuda") << d->id;
      cpu = cpu || d->id == "cpu:0";
    }
    EXPECT_TRUE(cpu);
  }
}

}  // namespace
}  // namespace kiln::cuda
