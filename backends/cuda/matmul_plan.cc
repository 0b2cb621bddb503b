#include "backends/cuda/matmul_plan.h"

#include <algorithm>

namespace kiln::cuda {

absl::StatusOr<MatMulPlan> PlanMatMul(const backend::KernelSpec& spec) {
  MatMulPlan p;
  if (spec.op == v1::OP_MATMUL) {
    p.ta = spec.attrs.matmul().transpose_a();
    p.tb = spec.attrs.matmul().transpose_b();
    p.tf32 = spec.attrs.matmul().allow_tf32();
  } else {
    const auto& f = spec.attrs.fused_matmul();
    p.ta = f.transpose_a(), p.tb = f.transpose_b();
    p.has_bias = f.has_bias(), p.has_residual = f.has_residual();
    p.act = f.activation() == v1::UNARY_IDENTITY ? v1::UNARY_KIND_UNSPECIFIED : f.activation();
    p.tf32 = f.allow_tf32();
  }
  // TF32 is an f32 matter: 16-bit products use their own tensor cores.
  p.tf32 = p.tf32 && spec.outputs.size() == 1 && spec.outputs[0].dtype == v1::DTYPE_F32;
  p.exact_f32 = !p.tf32 && spec.outputs.size() == 1 && spec.outputs[0].dtype == v1::DTYPE_F32;
  if (spec.inputs.size() != 2u + p.has_bias + p.has_residual || spec.outputs.size() != 1) {
    return absl::InvalidArgumentError("operand count");
  }
  Dims a = spec.inputs[0].dims, b = spec.inputs[1].dims;
  if (a.empty() || b.empty()) return absl::InvalidArgumentError("scalar operand");
  if (a.size() == 1) a.insert(a.begin(), 1);
  if (b.size() == 1) b.push_back(1);
  const size_t ra = a.size(), rb = b.size();
  p.M = p.ta ? a[ra - 1] : a[ra - 2];
  p.K = p.ta ? a[ra - 2] : a[ra - 1];
  const int64_t kb = p.tb ? b[rb - 1] : b[rb - 2];
  p.N = p.tb ? b[rb - 2] : b[rb - 1];
  if (p.K != kb) return absl::InvalidArgumentError("contracting dims differ");
  // Right-aligned batch dims with broadcast strides, collapsed into runs.
  const size_t r = std::max(ra, rb) - 2;
  std::vector<int64_t> ad(r, 1), bd(r, 1);
  std::copy(a.begin(), a.end() - 2, ad.begin() + (r - (ra - 2)));
  std::copy(b.begin(), b.end() - 2, bd.begin() + (r - (rb - 2)));
  std::vector<int64_t> full_dims(r), full_as(r), full_bs(r);
  int64_t a_stride = p.M * p.K, b_stride = p.K * p.N;
  for (size_t d = r; d-- > 0;) {
    if (ad[d] != bd[d] && ad[d] != 1 && bd[d] != 1) return absl::InvalidArgumentError("batch");
    full_dims[d] = (ad[d] == 0 || bd[d] == 0) ? 0 : std::max(ad[d], bd[d]);
    full_as[d] = ad[d] == 1 ? 0 : a_stride;
    full_bs[d] = bd[d] == 1 ? 0 : b_stride;
    a_stride *= ad[d];
    b_stride *= bd[d];
  }
  std::vector<int64_t> dims, as, bs;
  int64_t batch = 1;
  for (size_t d = 0; d < r; ++d) {
    batch *= full_dims[d];
    if (full_dims[d] == 1) continue;
    if (!dims.empty() && as.back() == full_as[d] * full_dims[d] &&
        bs.back() == full_bs[d] * full_dims[d]) {
      dims.back() *= full_dims[d];
      as.back() = full_as[d];
      bs.back() = full_bs[d];
      continue;
    }
    dims.push_back(full_dims[d]);
    as.push_back(full_as[d]);
    bs.push_back(full_bs[d]);
  }
  // An unbatched B under a plain A: one taller product.
  const bool b_shared = std::all_of(bs.begin(), bs.end(), [](int64_t s) { return s == 0; });
  if (b_shared && !p.ta && batch > 1) {
    p.M *= batch;
    dims.clear();
  }
  if (dims.empty()) {
    p.calls.push_back({0, 0, 0});
    return p;
  }
  // The innermost run is one strided-batched call unless an operand
  // broadcasts along it (stride 0, which cuBLASLt's batching is not relied
  // on for): then every batch is its own call.
  const bool strided = as.back() != 0 && bs.back() != 0;
  if (strided) {
    p.count = dims.back();
    p.a_stride = as.back();
    p.b_stride = bs.back();
  }
  int64_t outer = 1;
  for (size_t d = 0; d + (strided ? 1 : 0) < dims.size(); ++d) outer *= dims[d];
  if (outer > 4096) return absl::InvalidArgumentError("more than 4096 broadcast batch calls");
  for (int64_t o = 0; o < outer; ++o) {
    int64_t rem = o, a_off = 0, b_off = 0;
    for (size_t d = dims.size() - (strided ? 1 : 0); d-- > 0;) {
      const int64_t c = rem % dims[d];
      rem /= dims[d];
      a_off += c * as[d];
      b_off += c * bs[d];
    }
    p.calls.push_back({a_off, b_off, o * p.count * p.M * p.N});
  }
  return p;
}

}  // namespace kiln::cuda
