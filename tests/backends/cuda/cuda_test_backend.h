// A fresh CUDA backend instance for the device tests (its devices have their own
// module caches), or null where no CUDA device is usable (the tests then skip).
#pragma once

#include <memory>
#include <utility>

#include "backends/backend.h"

namespace kiln::cuda::testing {

inline std::unique_ptr<backend::Backend> MakeBackend() {
  for (const auto& reg : backend::RegisteredBackends()) {
    if (reg.name != "cuda") continue;
    auto b = reg.factory({});
    if (b.ok() && !(*b)->devices().empty()) return std::move(b).value();
  }
  return nullptr;
}

}  // namespace kiln::cuda::testing
