// The cost model (DESIGN.md section 5): work estimates for kernels and copies
// (flops and bytes from the KernelSpec), turned into time on a device by a
// roofline over its profile plus its launch overhead, with the corrections
// per op family that each device's backend reports (no backend is named here).
//
// Thread safety: set up (SetProfile) before sharing; const
// methods are then safe from any thread.
#pragma once

#include <string>

#include "absl/container/flat_hash_map.h"
#include "backends/backend.h"

namespace kiln::runtime {

struct Work {
  double flops = 0;
  double bytes = 0;  // read + written
};

// Work of one kernel, from its op, attributes and concrete types.
Work EstimateWork(const backend::KernelSpec& spec);

// Coarse op families the corrections are keyed by.
enum class OpFamily { kMatMul, kConv, kAttention, kElementwise, kReduce, kNorm, kShape, kOther };
OpFamily FamilyOf(v1::OpKind op);
const char* FamilyName(OpFamily family);

class CostModel {
 public:
  CostModel();

  // Estimated microseconds for one kernel on a device.
  double KernelMicros(const backend::KernelSpec& spec, const backend::DeviceInfo& device) const;
  double KernelMicros(const Work& work, OpFamily family, DType dtype,
                      const backend::DeviceInfo& device) const;
  // Estimated microseconds to move `bytes` from one device to another (0 on
  // the same device; host-memory devices exchange through memcpy bandwidth).
  double CopyMicros(double bytes, const backend::DeviceInfo& from,
                    const backend::DeviceInfo& to) const;

  // A measured profile for a device, used instead of the backend's nominal one.
  void SetProfile(const std::string& device, const backend::DeviceProfile& profile);
  const backend::DeviceProfile& Profile(const backend::DeviceInfo& device) const;

  // Fraction of the roofline the device reaches for an op family, as its
  // backend reports it (DeviceInfo::roofline_efficiency; default 1).
  double Efficiency(const backend::DeviceInfo& device, OpFamily family) const;

 private:
  absl::flat_hash_map<std::string, backend::DeviceProfile> profiles_;  // by device id
};

}  // namespace kiln::runtime
