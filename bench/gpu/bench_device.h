// What the GPU benchmarks that drive a Kiln device share: opening the device
// by id, timing launches on its stream, and f32 values to and from a 32- or
// 16-bit float dtype's bytes.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "base/half.h"
#include "bench/gpu/bench_util.h"

namespace kiln::bench {

// The device `device_id` ("cuda:0", "vulkan:0") from the backends registered
// under its prefix, each created kept in `backends` (they own their devices);
// nullptr where none lists it.
inline backend::Device* OpenDevice(const std::string& device_id,
                                   std::vector<std::unique_ptr<backend::Backend>>* backends) {
  backend::Device* dev = nullptr;
  for (const auto& reg : backend::RegisteredBackends()) {
    if (device_id.rfind(reg.name + ":", 0) != 0) continue;
    auto b = reg.factory({});
    if (!b.ok()) continue;
    for (backend::Device* d : (*b)->devices()) {
      if (d->info().id == device_id) dev = d;
    }
    backends->push_back(std::move(b).value());
  }
  return dev;
}

// Milliseconds per call of `launch` (one call = one pass) on `stream`, timed
// with the stream's events: three warm-up calls, then the median of `rounds`
// rounds of `reps` calls; -1 when a launch or the stream fails.
inline double TimeOnStream(backend::Stream& stream, int rounds, int reps,
                           const std::function<bool()>& launch) {
  for (int i = 0; i < 3; ++i) {
    if (!launch()) return -1;
  }
  if (!stream.Synchronize().ok()) return -1;
  std::vector<double> ms;
  for (int r = 0; r < rounds; ++r) {
    auto e0 = stream.Record();
    for (int i = 0; i < reps; ++i) {
      if (!launch()) return -1;
    }
    auto e1 = stream.Record();
    if (!e0.ok() || !e1.ok() || !stream.Synchronize().ok()) return -1;
    auto us = (*e1)->MicrosSince(**e0);
    if (!us.ok()) return -1;
    ms.push_back(*us / 1000.0 / reps);
  }
  return Median(ms);
}

// Bytes per element of f32, f16 or bf16.
inline int64_t FloatBytes(DType dt) { return dt == v1::DTYPE_F32 ? 4 : 2; }

inline std::vector<char> EncodeFloats(DType dt, const std::vector<float>& v) {
  std::vector<char> out(v.size() * FloatBytes(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == v1::DTYPE_F32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
      continue;
    }
    const uint16_t h = dt == v1::DTYPE_F16 ? FloatToHalf(v[i]) : FloatToBf16(v[i]);
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
  return out;
}

inline float DecodeFloat(DType dt, const char* p) {
  if (dt == v1::DTYPE_F32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return dt == v1::DTYPE_F16 ? HalfToFloat(h) : Bf16ToFloat(h);
}

}  // namespace kiln::bench
