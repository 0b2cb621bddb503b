#include "engine/runtime/cost_model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kiln::runtime {
namespace {

double Elems(const backend::TensorDesc& d) { return static_cast<double>(d.num_elements()); }

double IoBytes(const backend::KernelSpec& spec) {
  double b = 0;
  for (const auto& t : spec.inputs) b += static_cast<double>(t.num_bytes());
  for (const auto& t : spec.outputs) b += static_cast<double>(t.num_bytes());
  return b;
}

}  // namespace

OpFamily FamilyOf(v1::OpKind op) {
  switch (op) {
    case v1::OP_MATMUL: case v1::OP_DOT_GENERAL: case v1::OP_FUSED_MATMUL:
    case v1::OP_DEQUANT_MATMUL: case v1::OP_DENSE_SOLVE:
      return OpFamily::kMatMul;
    case v1::OP_CONV: case v1::OP_CONV_TRANSPOSE2D: case v1::OP_POOL: case v1::OP_FUSED_CONV:
      return OpFamily::kConv;
    case v1::OP_ATTENTION:
      return OpFamily::kAttention;
    case v1::OP_UNARY: case v1::OP_BINARY: case v1::OP_COMPARE: case v1::OP_WHERE:
    case v1::OP_CAST: case v1::OP_CLAMP: case v1::OP_FUSED_ELEMENTWISE: case v1::OP_ROPE:
      return OpFamily::kElementwise;
    case v1::OP_REDUCE: case v1::OP_ARGMAX: case v1::OP_CUMSUM: case v1::OP_TOPK:
    case v1::OP_SOFTMAX_CROSS_ENTROPY: case v1::OP_MEAN_SQUARED_ERROR:
      return OpFamily::kReduce;
    case v1::OP_SOFTMAX: case v1::OP_LOG_SOFTMAX: case v1::OP_LAYER_NORM: case v1::OP_RMS_NORM:
    case v1::OP_GROUP_NORM: case v1::OP_FUSED_RESIDUAL_NORM:
      return OpFamily::kNorm;
    case v1::OP_RESHAPE: case v1::OP_TRANSPOSE: case v1::OP_SLICE: case v1::OP_CONCAT:
    case v1::OP_EXPAND: case v1::OP_PAD: case v1::OP_GATHER: case v1::OP_SCATTER_ADD:
    case v1::OP_COPY:
      return OpFamily::kShape;
    default:
      return OpFamily::kOther;
  }
}

const char* FamilyName(OpFamily family) {
  switch (family) {
    case OpFamily::kMatMul: return "matmul";
    case OpFamily::kConv: return "conv";
    case OpFamily::kAttention: return "attention";
    case OpFamily::kElementwise: return "elementwise";
    case OpFamily::kReduce: return "reduce";
    case OpFamily::kNorm: return "norm";
    case OpFamily::kShape: return "shape";
    case OpFamily::kOther: return "other";
  }
  return "other";
}

bool IsTranscendental(v1::UnaryKind kind) {
  switch (kind) {
    case v1::UNARY_GELU:
    case v1::UNARY_GELU_TANH:
    case v1::UNARY_SILU:
    case v1::UNARY_SIGMOID:
    case v1::UNARY_TANH:
    case v1::UNARY_EXP:
    case v1::UNARY_LOG:
    case v1::UNARY_SIN:
    case v1::UNARY_COS:
    case v1::UNARY_ERF:
    case v1::UNARY_SOFTPLUS:
      return true;
    default:
      return false;
  }
}

namespace {

// Transcendental evaluations per output element of one elementwise step.
double TranscendentalsOf(v1::OpKind op, const v1::UnaryAttrs* unary,
                         const v1::BinaryAttrs* binary) {
  if (op == v1::OP_UNARY && unary != nullptr && IsTranscendental(unary->kind())) return 1;
  if (op == v1::OP_BINARY && binary != nullptr && binary->kind() == v1::BINARY_POW) return 1;
  return 0;
}

}  // namespace

Work EstimateWork(const backend::KernelSpec& spec) {
  Work w;
  w.bytes = IoBytes(spec);
  const double out = spec.outputs.empty() ? 0 : Elems(spec.outputs[0]);
  switch (spec.op) {
    case v1::OP_UNARY:
      w.transcendentals = out * TranscendentalsOf(spec.op, &spec.attrs.unary(), nullptr);
      break;
    case v1::OP_BINARY:
      w.transcendentals = out * TranscendentalsOf(spec.op, nullptr, &spec.attrs.binary());
      break;
    case v1::OP_FUSED_ELEMENTWISE:
      for (const v1::FusedInstr& in : spec.attrs.fused_elementwise().instrs()) {
        w.transcendentals +=
            out * TranscendentalsOf(in.op(), in.has_unary() ? &in.unary() : nullptr,
                                    in.has_binary() ? &in.binary() : nullptr);
      }
      break;
    case v1::OP_FUSED_MATMUL:
      if (IsTranscendental(spec.attrs.fused_matmul().activation())) w.transcendentals = out;
      break;
    case v1::OP_SOFTMAX:
    case v1::OP_LOG_SOFTMAX:
      w.transcendentals = spec.inputs.empty() ? 0 : Elems(spec.inputs[0]);
      break;
    default:
      break;
  }
  switch (spec.op) {
    case v1::OP_MATMUL:
    case v1::OP_FUSED_MATMUL: {
      const auto& a = spec.inputs[0].dims;
      const bool ta = spec.op == v1::OP_MATMUL ? spec.attrs.matmul().transpose_a()
                                               : spec.attrs.fused_matmul().transpose_a();
      const double k = a.empty() ? 1 : (a.size() == 1 ? a[0] : (ta ? a[a.size() - 2] : a.back()));
      w.flops = 2.0 * out * k;
      break;
    }
    case v1::OP_DOT_GENERAL: {
      double k = 1;
      for (int64_t ax : spec.attrs.dot_general().lhs_contracting()) k *= spec.inputs[0].dims[ax];
      w.flops = 2.0 * out * k;
      break;
    }
    case v1::OP_ATTENTION: {
      const auto& q = spec.inputs[0].dims;
      const auto& k = spec.inputs[1].dims;
      const auto& v = spec.inputs[2].dims;
      if (q.size() == 3) {  // packed [B, S, H*D]: heads from the attributes
        const auto& a = spec.attrs.attention();
        const double hq = std::max<int64_t>(1, a.heads());
        const double hkv = std::max<int64_t>(1, a.kv_heads() != 0 ? a.kv_heads() : a.heads());
        const double scores = static_cast<double>(q[0]) * hq * q[1] * k[1];
        w.flops = 2.0 * scores * (q[2] / hq + v[2] / hkv) + 5.0 * scores;
        break;
      }
      const double scores = static_cast<double>(q[0]) * q[1] * q[2] * k[2];
      w.flops = 2.0 * scores * (q[3] + v[3]) + 5.0 * scores;
      break;
    }
    case v1::OP_CONV:
    case v1::OP_FUSED_CONV: {
      const auto& wd = spec.inputs[1].dims;
      double per = 1;
      for (size_t i = 1; i < wd.size(); ++i) per *= static_cast<double>(wd[i]);
      w.flops = 2.0 * out * per;
      break;
    }
    case v1::OP_FUSED_ELEMENTWISE:
      w.flops = out * std::max(1, spec.attrs.fused_elementwise().instrs_size());
      break;
    case v1::OP_SOFTMAX: case v1::OP_LOG_SOFTMAX: case v1::OP_LAYER_NORM: case v1::OP_RMS_NORM:
    case v1::OP_FUSED_RESIDUAL_NORM:
      w.flops = 6.0 * Elems(spec.inputs[0]);
      break;
    default:
      w.flops = spec.inputs.empty() ? out : std::max(out, Elems(spec.inputs[0]));
      break;
  }
  return w;
}

bool SpansThreadTeam(const Work& work) { return work.flops >= 65536.0 || work.bytes >= 262144.0; }

CostModel::CostModel() = default;

double CostModel::Efficiency(const backend::DeviceInfo& device, OpFamily family) const {
  auto it = device.roofline_efficiency.find(FamilyName(family));
  if (it == device.roofline_efficiency.end() || !(it->second > 0)) return 1.0;
  return std::min(it->second, 1.0);
}

void CostModel::SetProfile(const std::string& device, const backend::DeviceProfile& profile) {
  profiles_[device] = profile;
}

const backend::DeviceProfile& CostModel::Profile(const backend::DeviceInfo& device) const {
  auto it = profiles_.find(device.id);
  return it == profiles_.end() ? device.profile : it->second;
}

void CostModel::SetHostProfile(const std::string& device, const HostProfile& profile) {
  host_profiles_[device] = profile;
}

const HostProfile& CostModel::Host(const backend::DeviceInfo& device) const {
  static const HostProfile kNone;
  auto it = host_profiles_.find(device.id);
  return it == host_profiles_.end() ? kNone : it->second;
}

double CostModel::RunMicros(const backend::DeviceInfo& device, int team_kernels) const {
  const HostProfile& h = Host(device);
  const double mixed =
      team_kernels >= 2 ? std::max(0.0, h.mixed_launch_us - h.parallel_launch_us) : 0.0;
  return Profile(device).sync_overhead_us + team_kernels * mixed;
}

double CostModel::KernelMicros(const backend::KernelSpec& spec,
                               const backend::DeviceInfo& device) const {
  const DType dtype = spec.outputs.empty() ? v1::DTYPE_F32 : spec.outputs[0].dtype;
  return KernelMicros(EstimateWork(spec), FamilyOf(spec.op), dtype, device);
}

double CostModel::KernelMicros(const Work& work, OpFamily family, DType dtype,
                               const backend::DeviceInfo& device) const {
  const auto& p = Profile(device);
  // A calibrated profile was measured with our own matmul and elementwise
  // kernels, so those families reach it by construction; the table corrects
  // the rest (and nominal profiles).
  const bool measured = p.calibrated && (family == OpFamily::kMatMul || family == OpFamily::kElementwise);
  const double eff = measured ? 1.0 : Efficiency(device, family);
  const double gflops =
      (dtype == v1::DTYPE_F16 || dtype == v1::DTYPE_BF16) ? p.peak_gflops_f16 : p.peak_gflops_f32;
  const HostProfile& h = Host(device);
  // A working set that fits the last-level cache streams at its speed; past
  // it, at the memory's (both measured by calibration on host devices).
  const double bandwidth =
      h.cache_bandwidth_gbps > 0 && work.bytes <= static_cast<double>(h.cache_bytes)
          ? h.cache_bandwidth_gbps
          : p.bandwidth_gbps;
  const double compute_us =
      (gflops > 0 ? work.flops / (gflops * 1e3 * eff) : 0) +
      (h.transcendental_gelems > 0 ? work.transcendentals / (h.transcendental_gelems * 1e3) : 0);
  const double memory_us = bandwidth > 0 ? work.bytes / (bandwidth * 1e3 * eff) : 0;
  return std::max(compute_us, memory_us) + FixedMicros(work, device);
}

double CostModel::FixedMicros(const Work& work, const backend::DeviceInfo& device) const {
  return Profile(device).launch_overhead_us +
         (SpansThreadTeam(work) ? Host(device).parallel_launch_us : 0.0);
}

double CostModel::CopyMicros(double bytes, const backend::DeviceInfo& from,
                             const backend::DeviceInfo& to) const {
  if (from.id == to.id) return 0;
  // Uploads are paced by the destination's host-to-device link, read-backs by
  // the source's device-to-host link (often slower: uncached or staged).
  const bool upload = from.host_memory;
  const auto& link = upload ? Profile(to) : Profile(from);
  double gbps = upload ? link.host_to_device_gbps : link.device_to_host_gbps;
  if (gbps <= 0) gbps = link.host_to_device_gbps;
  if (gbps <= 0) gbps = std::max(1.0, link.bandwidth_gbps);
  return bytes / (gbps * 1e3) + link.launch_overhead_us;
}

}  // namespace kiln::runtime
