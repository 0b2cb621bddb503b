// The cost model (DESIGN.md section 5): work estimates for kernels and copies
// (flops and bytes from the KernelSpec), turned into time on a device by a
// roofline over its profile plus its launch overhead, with the corrections
// per op family that each device's backend reports (no backend is named here).
//
// Thread safety: set up (SetProfile) before sharing; const
// methods are then safe from any thread.
#pragma once

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "backends/backend.h"

namespace kiln::runtime {

struct Work {
  double flops = 0;
  double bytes = 0;  // read + written
  // Elements that go through a transcendental function (exp, tanh, erf, ...):
  // on a CPU these cost tens of instructions each, far from the FMA peak
  // that `flops` is timed against (HostProfile::transcendental_gelems).
  double transcendentals = 0;
};

// Unary kinds evaluated by a polynomial or range-reduced approximation.
bool IsTranscendental(v1::UnaryKind kind);

// Work of one kernel, from its op, attributes and concrete types.
Work EstimateWork(const backend::KernelSpec& spec);

// What calibration measures of a host device beyond backend::DeviceProfile:
// the cost of its thread team and the bandwidth of its last-level cache. All
// zero for accelerators and for a CPU on one thread (nothing to add then).
struct HostProfile {
  // Added to the launch cost of a kernel that spans the team
  // (SpansThreadTeam): the fork and join of the OpenMP team, back to back
  // at one team size (a one-kernel run, again and again).
  double parallel_launch_us = 0;
  // The same when consecutive kernels split into teams of different sizes,
  // as the layers of a model do: charged instead of parallel_launch_us to
  // every such kernel of a run that has two or more (CostModel::RunMicros).
  double mixed_launch_us = 0;
  // Bandwidth while a kernel's bytes fit in the last-level cache of
  // `cache_bytes`; backend::DeviceProfile::bandwidth_gbps is then measured
  // past it (memory). 0 = one bandwidth for every size.
  double cache_bandwidth_gbps = 0;
  int64_t cache_bytes = 0;
  // Billions of elements a second through tanh over the whole team, cache
  // resident (Work::transcendentals); 0 = not measured (no extra cost).
  double transcendental_gelems = 0;
};

// Whether a kernel of this much work is large enough for the CPU's kernels to
// split it across their thread team: their grains give each thread ~32k FMAs
// or ~16k-64k elements (backends/cpu/parallel.h's callers), so anything past
// 64k flops or 256 KiB counts; smaller kernels run on the calling thread.
bool SpansThreadTeam(const Work& work);

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
  // The fixed part of KernelMicros: the launch, and the team's fork + join
  // for a kernel that spans a host's thread team.
  double FixedMicros(const Work& work, const backend::DeviceInfo& device) const;
  // Estimated microseconds to move `bytes` from one device to another (0 on
  // the same device; host-memory devices exchange through memcpy bandwidth).
  double CopyMicros(double bytes, const backend::DeviceInfo& from,
                    const backend::DeviceInfo& to) const;

  // A measured profile for a device, used instead of the backend's nominal one.
  void SetProfile(const std::string& device, const backend::DeviceProfile& profile);
  const backend::DeviceProfile& Profile(const backend::DeviceInfo& device) const;
  // The measured team and cache figures of a host device (none: all zero).
  void SetHostProfile(const std::string& device, const HostProfile& profile);
  const HostProfile& Host(const backend::DeviceInfo& device) const;
  // Fixed cost of a run on `device` beyond what KernelMicros gives its
  // kernels and the copies: the queue's submit + wait (sync_overhead_us),
  // and, when `team_kernels` (kernels that span a host's thread team) is two
  // or more, mixed_launch_us - parallel_launch_us for each of them.
  double RunMicros(const backend::DeviceInfo& device, int team_kernels) const;

  // Fraction of the roofline the device reaches for an op family, as its
  // backend reports it (DeviceInfo::roofline_efficiency; default 1).
  double Efficiency(const backend::DeviceInfo& device, OpFamily family) const;

 private:
  absl::flat_hash_map<std::string, backend::DeviceProfile> profiles_;  // by device id
  absl::flat_hash_map<std::string, HostProfile> host_profiles_;        // by device id
};

}  // namespace kiln::runtime
