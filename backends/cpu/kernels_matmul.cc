// MatMul and FusedMatMul on the CPU: f32 products of at most 64 rows on the
// own micro-kernel of small_matmul.h (SmallMatMulKernel, below), every other
// product through oneDNN matmul primitives.
//
// The primitive is built once per kernel with the concrete shapes. Batch
// dims follow NumPy broadcasting: a broadcast operand gets a dim of 1 in its
// oneDNN descriptor (oneDNN broadcasts those), transposes are strides, and
// batch dims that are laid out contiguously in all three tensors are merged
// first. When only `a` carries a batch (x @ W, the linear layer), the batch
// is folded into M so oneDNN sees one large 2-D product.
//
// Storage types: f32 runs as is; bf16 runs oneDNN's bf16 matmul (f32
// accumulation) when this CPU has a native implementation; f16 (which oneDNN
// 2.6 computes only on AVX512-FP16 CPUs) and bf16 without one are converted to
// f32 around an f32 primitive. K = 0 runs the same primitive over a single zero
// column, so the epilogue still sees act(0 + bias) + residual. The integer
// product (i8 or u8 @ i8 -> i32, the int8 inference form) runs oneDNN's
// s8/u8 x s8 -> s32 matmul where that is exact (VNNI), else an exact f32 GEMM
// on the integer values (OneDnnInt8IsExact).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/onednn_util.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/small_matmul.h"
#include "backends/packing.h"
#include "base/status.h"

namespace kiln::cpu {
namespace {

using backend::BufferView;
using backend::Claim;
using backend::KernelSpec;
using backend::TensorDesc;
using dt = dnnl::memory::data_type;

// Products at least this large (M*N*K) of one unbatched matrix prefer oneDNN's
// gemm-based implementation, which is dnnl_sgemm's code and runs at its speed,
// while oneDNN 2.6's brgemm matmul (its first choice) fell to 74-93% of
// dnnl_sgemm for square sizes 1024 to 2048 on a 2-core Zen 5, and to 53-92%
// on 2 threads of a Xeon. Smaller and batched products keep brgemm, which
// matched or beat the gemm path there (e.g. 12 x 128x128x64: 403 vs 377 GF/s).
constexpr double kPreferGemmFlops = 16.0 * 1024 * 1024;

// oneDNN 2.6's int8 GEMM is exact only with VNNI (vpdpbusd sums four u8 x s8
// products into s32). Without it (AVX2, AVX-512 before Cascade Lake) its jit
// kernels pair products with vpmaddubsw, which saturates their sum at 16 bits:
// on this project's AVX2 VM a [5, 37] @ [37, 11] s8 product came out 28444
// where 19039 is right. There the integer product runs as an f32 GEMM on the
// integer values instead, exact while every partial sum stays below 2^24:
// K <= 1024 with both operands in [-128, 127] (a u8 operand is centred to
// a - 128 and 128 * colsum(b) added back).
constexpr int64_t kMaxExactF32K = 1024;

bool OneDnnInt8IsExact() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto vnni = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_vnni);
  return (isa & vnni) == vnni;
}

// The activation of a FusedMatMul as a oneDNN eltwise post-op.
struct Activation {
  bool present = false;
  dnnl::algorithm alg = dnnl::algorithm::undef;
  float alpha = 0;
  float beta = 0;
  std::string name;
};

// Unary kinds oneDNN 2.6 eltwise computes; the reason otherwise.
absl::StatusOr<Activation> ActivationOf(v1::UnaryKind kind) {
  using A = dnnl::algorithm;
  auto act = [](A alg, float alpha, float beta, std::string name) {
    return Activation{true, alg, alpha, beta, std::move(name)};
  };
  switch (kind) {
    case v1::UNARY_KIND_UNSPECIFIED:
    case v1::UNARY_IDENTITY: return Activation{};
    case v1::UNARY_RELU: return act(A::eltwise_relu, 0, 0, "relu");
    case v1::UNARY_GELU: return act(A::eltwise_gelu_erf, 0, 0, "gelu");
    case v1::UNARY_GELU_TANH: return act(A::eltwise_gelu_tanh, 0, 0, "gelu_tanh");
    case v1::UNARY_SILU: return act(A::eltwise_swish, 1, 0, "silu");
    case v1::UNARY_SIGMOID: return act(A::eltwise_logistic, 0, 0, "sigmoid");
    case v1::UNARY_TANH: return act(A::eltwise_tanh, 0, 0, "tanh");
    case v1::UNARY_EXP: return act(A::eltwise_exp, 0, 0, "exp");
    case v1::UNARY_LOG: return act(A::eltwise_log, 0, 0, "log");
    case v1::UNARY_SQRT: return act(A::eltwise_sqrt, 0, 0, "sqrt");
    case v1::UNARY_RSQRT: return act(A::eltwise_pow, 1, -0.5f, "rsqrt");
    case v1::UNARY_NEG: return act(A::eltwise_linear, -1, 0, "neg");
    case v1::UNARY_ABS: return act(A::eltwise_abs, 0, 0, "abs");
    case v1::UNARY_RECIPROCAL: return act(A::eltwise_pow, 1, -1, "reciprocal");
    case v1::UNARY_SOFTPLUS: return act(A::eltwise_soft_relu, 0, 0, "softplus");
    case v1::UNARY_ROUND:
      // oneDNN rounds half to even; graph.proto does not pin the tie rule.
      return absl::UnimplementedError(
          "fused round is not claimed: oneDNN rounds ties to even and graph.proto does not "
          "pin the tie rule");
    default:
      return absl::UnimplementedError(absl::StrCat(
          "oneDNN 2.6 eltwise has no ", v1::UnaryKind_Name(kind), " to fuse into a matmul"));
  }
}

// The product after rank-1 promotion, broadcasting and batch merging.
struct MatMulPlan {
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0;
  // Batch dims of the result of size > 1, outermost first, with element
  // strides per operand (0 = that operand is broadcast along the dim).
  std::vector<int64_t> batch, a_stride, b_stride, c_stride;
  int64_t out_elements = 0;
  // A rank-1 b makes the result's last dim M: a bias then runs along rows.
  bool bias_per_row = false;
};

absl::StatusOr<MatMulPlan> PlanMatMul(const Dims& a_dims, const Dims& b_dims, bool ta, bool tb,
                                      const Dims& out_dims, bool has_bias) {
  Dims a = a_dims, b = b_dims;
  if (a.empty() || b.empty()) return absl::InvalidArgumentError("operands must have rank >= 1");
  const bool a_vec = a.size() == 1, b_vec = b.size() == 1;
  if (a_vec) a.insert(a.begin(), 1);
  if (b_vec) b.push_back(1);
  const size_t ra = a.size(), rb = b.size();
  MatMulPlan p;
  p.ta = ta;
  p.tb = tb;
  p.bias_per_row = has_bias && b_vec && !a_vec;
  p.m = ta ? a[ra - 1] : a[ra - 2];
  p.k = ta ? a[ra - 2] : a[ra - 1];
  const int64_t kb = tb ? b[rb - 1] : b[rb - 2];
  p.n = tb ? b[rb - 2] : b[rb - 1];
  if (p.k != kb) {
    return absl::InvalidArgumentError(absl::StrCat("contracting dims differ: ", p.k, " vs ", kb));
  }
  // A transposed rank-1 operand keeps its length as M (or N), which the
  // promoted result shape drops: only a length of 1 is consistent.
  if (a_vec && p.m != 1) {
    return absl::InvalidArgumentError("transpose_a on a rank-1 operand longer than 1");
  }
  if (b_vec && p.n != 1) {
    return absl::InvalidArgumentError("transpose_b on a rank-1 operand longer than 1");
  }
  const size_t r = std::max(ra, rb) - 2;
  Dims ab(r, 1), bb(r, 1), cb(r, 1);
  std::copy(a.begin(), a.end() - 2, ab.begin() + (r - (ra - 2)));
  std::copy(b.begin(), b.end() - 2, bb.begin() + (r - (rb - 2)));
  for (size_t i = 0; i < r; ++i) {
    if (ab[i] != bb[i] && ab[i] != 1 && bb[i] != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch dims do not broadcast: ", DimsToString(a_dims), " @ ", DimsToString(b_dims)));
    }
    cb[i] = ab[i] == 1 ? bb[i] : ab[i];
  }
  Dims want = cb;
  if (!a_vec) want.push_back(p.m);
  if (!b_vec) want.push_back(p.n);
  if (want != out_dims) {
    return absl::InvalidArgumentError(
        absl::StrCat("result dims ", DimsToString(out_dims), " differ from ", DimsToString(want)));
  }
  p.out_elements = p.m * p.n;
  for (int64_t d : cb) p.out_elements *= d;
  // Row-major batch strides of each operand over its own dims; 0 where it
  // broadcasts. Dims of size 1 in the result carry no data and are dropped.
  int64_t sa = p.m * p.k, sb = p.k * p.n, sc = p.m * p.n;
  std::vector<int64_t> size, stra, strb, strc;
  for (size_t j = r; j-- > 0;) {
    if (cb[j] != 1) {
      size.insert(size.begin(), cb[j]);
      stra.insert(stra.begin(), ab[j] == 1 ? 0 : sa);
      strb.insert(strb.begin(), bb[j] == 1 ? 0 : sb);
      strc.insert(strc.begin(), sc);
    }
    sa *= ab[j];
    sb *= bb[j];
    sc *= cb[j];
  }
  // Merge dim i into i-1 where every operand walks them as one dim.
  for (size_t i = 0; i < size.size(); ++i) {
    if (i > 0 && stra[i - 1] == stra[i] * size[i] && strb[i - 1] == strb[i] * size[i] &&
        strc[i - 1] == strc[i] * size[i]) {
      p.batch.back() *= size[i];
      p.a_stride.back() = stra[i];
      p.b_stride.back() = strb[i];
      p.c_stride.back() = strc[i];
      continue;
    }
    p.batch.push_back(size[i]);
    p.a_stride.push_back(stra[i]);
    p.b_stride.push_back(strb[i]);
    p.c_stride.push_back(strc[i]);
  }
  // x @ W with W shared by the whole batch: one [batch * M, K] @ [K, N]
  // (unless a per-row bias has to repeat with the batch).
  if (p.batch.size() == 1 && !ta && !p.bias_per_row && p.b_stride[0] == 0 &&
      p.a_stride[0] == p.m * p.k && p.c_stride[0] == p.m * p.n) {
    p.m *= p.batch[0];
    p.batch.clear();
    p.a_stride.clear();
    p.b_stride.clear();
    p.c_stride.clear();
  }
  return p;
}

struct FusedParts {
  bool transpose_a = false, transpose_b = false;
  bool has_bias = false, has_residual = false;
  Activation act;
};

absl::StatusOr<FusedParts> PartsOf(const KernelSpec& spec) {
  FusedParts f;
  if (spec.op == v1::OP_MATMUL) {
    f.transpose_a = spec.attrs.matmul().transpose_a();
    f.transpose_b = spec.attrs.matmul().transpose_b();
    return f;
  }
  const auto& a = spec.attrs.fused_matmul();
  f.transpose_a = a.transpose_a();
  f.transpose_b = a.transpose_b();
  f.has_bias = a.has_bias();
  f.has_residual = a.has_residual();
  KILN_ASSIGN_OR_RETURN(f.act, ActivationOf(a.activation()));
  return f;
}

absl::StatusOr<std::pair<FusedParts, MatMulPlan>> Validate(const KernelSpec& spec) {
  KILN_ASSIGN_OR_RETURN(FusedParts f, PartsOf(spec));
  const size_t want = 2 + f.has_bias + f.has_residual;
  if (spec.inputs.size() != want || spec.outputs.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("expects ", want, " operands and 1 result, got ",
                                                   spec.inputs.size(), " and ",
                                                   spec.outputs.size()));
  }
  const DType dtype = spec.outputs[0].dtype;
  if (dtype == v1::DTYPE_I32) {
    // The integer product: i8 or u8 @ i8 -> i32 (oneDNN's s8/u8 x s8 matmul).
    const DType a = spec.inputs[0].dtype, b = spec.inputs[1].dtype;
    if (spec.op != v1::OP_MATMUL || (a != v1::DTYPE_I8 && a != v1::DTYPE_U8) || b != v1::DTYPE_I8) {
      return absl::UnimplementedError(
          absl::StrCat("integer matmul is i8 or u8 @ i8 -> i32 without epilogue, got ",
                       DTypeName(a), " @ ", DTypeName(b)));
    }
  } else if (!IsF32Storage(dtype)) {
    return absl::UnimplementedError(absl::StrCat(
        "matmul on ", DTypeName(dtype), " is not implemented (f32, f16, bf16 and i8 are)"));
  } else {
    for (const TensorDesc& in : spec.inputs) {
      if (in.dtype != dtype) {
        return absl::UnimplementedError("operands of mixed dtypes are not implemented");
      }
    }
  }
  KILN_ASSIGN_OR_RETURN(MatMulPlan p,
                        PlanMatMul(spec.inputs[0].dims, spec.inputs[1].dims, f.transpose_a,
                                   f.transpose_b, spec.outputs[0].dims, f.has_bias));
  if (dtype == v1::DTYPE_I32 && !OneDnnInt8IsExact()) {
    if (p.k > kMaxExactF32K) {
      return absl::UnimplementedError(absl::StrCat(
          "integer matmul with K = ", p.k, " > ", kMaxExactF32K,
          " needs a CPU with VNNI (oneDNN's int8 GEMM without it saturates 16-bit sums, and "
          "the exact f32 fallback holds to K = ",
          kMaxExactF32K, ")"));
    }
    if (spec.inputs[0].dtype == v1::DTYPE_U8 && spec.inputs[1].dims.size() != 2) {
      return absl::UnimplementedError(
          "integer matmul of a u8 operand with a batched i8 operand needs a CPU with VNNI");
    }
  }
  size_t next = 2;
  if (f.has_bias) {
    // The bias runs along the result's last dim (NumPy's broadcast of
    // a @ b + bias), which is M when b is a vector.
    const Dims& out = spec.outputs[0].dims;
    const int64_t len = out.empty() ? 1 : out.back();
    const Dims& bias = spec.inputs[next++].dims;
    if (bias.size() != 1 || bias[0] != len) {
      return absl::InvalidArgumentError(
          absl::StrCat("bias must be [", len, "], got ", DimsToString(bias)));
    }
  }
  if (f.has_residual && spec.inputs[next].dims != spec.outputs[0].dims) {
    return absl::InvalidArgumentError("residual must match the result shape");
  }
  return std::make_pair(std::move(f), std::move(p));
}

Claim SupportsMatMul(const KernelSpec& spec) {
  auto v = Validate(spec);
  if (!v.ok()) return Claim::No(std::string(v.status().message()));
  return Claim::Yes();
}

bool Overlaps(const BufferView& x, const BufferView& y) {
  const char* a = static_cast<const char*>(x.host());
  const char* b = static_cast<const char*>(y.host());
  return a < b + y.bytes && b < a + x.bytes;
}

// B of an f32 oneDNN matmul reordered once into the blocked layout the
// primitive chose for it (MatMulKernel's packed path).
class OneDnnPackedB final : public backend::PackedOperand {
 public:
  explicit OneDnnPackedB(dnnl::memory m) : memory(std::move(m)) {}
  int64_t bytes() const override { return static_cast<int64_t>(memory.get_desc().get_size()); }
  dnnl::memory memory;
};

// KILN_CPU_ONEDNN_PACKED=0 turns the packed path off (read once).
bool OneDnnPackedEnabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("KILN_CPU_ONEDNN_PACKED");
    return v == nullptr || std::string_view(v) != "0";
  }();
  return enabled;
}

// A memory descriptor as text: dims and the blocking (strides, inner blocks),
// so equal text means equal layout.
std::string LayoutKey(const dnnl::memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  std::string key = absl::StrCat("dt", static_cast<int>(d.data_type), ":dims");
  for (int i = 0; i < d.ndims; ++i) absl::StrAppend(&key, "_", d.dims[i]);
  if (d.format_kind != dnnl_blocked)
    return absl::StrCat(key, ":format", static_cast<int>(d.format_kind));
  const dnnl_blocking_desc_t& b = d.format_desc.blocking;
  absl::StrAppend(&key, ":strides");
  for (int i = 0; i < d.ndims; ++i) absl::StrAppend(&key, "_", b.strides[i]);
  absl::StrAppend(&key, ":blocks");
  for (int i = 0; i < b.inner_nblks; ++i)
    absl::StrAppend(&key, "_", b.inner_idxs[i], "x", b.inner_blks[i]);
  return key;
}

// The oneDNN matmul (every f32 product the small-M kernel does not take, and
// the other types). An f32 product whose B the engine packs (a constant or an
// inference param: backends/packing.h) also gets a second primitive built
// with B in the layout oneDNN prefers (format `any`: brgemm's blocked panels
// on AVX-512), and reads B reordered into it once instead of re-packing it
// inside every call. Measured on the encoder layer's M = 128 products
// (docs/benchmarks.md, issue 12 enc12).
class MatMulKernel final : public CpuKernel, public backend::PackingKernel {
 public:
  // `packable`: build the packed path where it applies (not for the
  // unpacked fallback of SmallMatMulKernel, which packs B its own way).
  static absl::StatusOr<std::unique_ptr<MatMulKernel>> Create(const KernelSpec& spec,
                                                              bool packable = true) {
    KILN_ASSIGN_OR_RETURN(auto v, Validate(spec));
    auto kernel = std::unique_ptr<MatMulKernel>(new MatMulKernel());
    kernel->packable_ = packable;
    kernel->parts_ = std::move(v.first);
    kernel->plan_ = std::move(v.second);
    kernel->dtype_ = spec.outputs[0].dtype;
    kernel->a_unsigned_ = spec.inputs[0].dtype == v1::DTYPE_U8;
    kernel->a_elements_ = spec.inputs[0].num_elements();
    kernel->b_elements_ = spec.inputs[1].num_elements();
    KILN_RETURN_IF_ERROR(DnnlTry(spec.label, [&] { kernel->Build(); })) << "building " << spec.name;
    return kernel;
  }

  std::string implementation() const override {
    std::string s = "onednn:matmul";
    if (dtype_ == v1::DTYPE_I32) {
      absl::StrAppend(&s, a_unsigned_ ? "_u8s8s32" : "_s8s8s32",
                      int_via_f32_ ? "_as_exact_f32" : "");
    } else if (dtype_ != v1::DTYPE_F32) {
      absl::StrAppend(&s, "_", DTypeName(dtype_));
    }
    if (parts_.has_bias) absl::StrAppend(&s, "+bias");
    if (parts_.act.present) absl::StrAppend(&s, "+", parts_.act.name);
    if (parts_.has_residual) absl::StrAppend(&s, "+residual");
    if (packed_b_ != nullptr) absl::StrAppend(&s, "+packed_b");
    return s;
  }

  std::vector<int> packable_inputs() const override {
    if (packing_key_.empty()) return {};
    return {1};
  }

  std::string packing_key(int input) const override {
    return absl::StrCat("cpu:onednn_f32_weights:", packing_key_, ":input=", input);
  }

  absl::StatusOr<std::shared_ptr<const backend::PackedOperand>> Pack(
      int input, const BufferView& value) const override {
    if (input != 1 || packing_key_.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("input ", input, " is not packable"));
    }
    if (value.bytes != plan_.k * plan_.n * static_cast<int64_t>(sizeof(float))) {
      return absl::InvalidArgumentError(
          absl::StrCat("packing b: ", value.bytes, " bytes for k=", plan_.k, " n=", plan_.n));
    }
    std::shared_ptr<OneDnnPackedB> packed;
    KILN_RETURN_IF_ERROR(DnnlTry("packing matmul weights", [&] {
      dnnl::memory plain(weights_.get_desc(), DnnlEngine(), value.host());
      packed = std::make_shared<OneDnnPackedB>(dnnl::memory(packed_b_desc_, DnnlEngine()));
      dnnl::stream stream(DnnlEngine());
      dnnl::reorder(plain, packed->memory).execute(stream, plain, packed->memory);
      stream.wait();
    }));
    return std::shared_ptr<const backend::PackedOperand>(std::move(packed));
  }

  void UsePacked(int input, const backend::PackedOperand* packed) override {
    if (input == 1) packed_b_ = dynamic_cast<const OneDnnPackedB*>(packed);
  }

  absl::Status Run(std::span<const BufferView> inputs,
                   std::span<const BufferView> outputs) override {
    if (plan_.out_elements == 0) return absl::OkStatus();
    if (packed_b_ != nullptr) return RunPacked(inputs, outputs);
    const void* a = inputs[0].host();
    const void* b = inputs[1].host();
    const void* bias = parts_.has_bias ? inputs[2].host() : nullptr;
    const BufferView* residual = parts_.has_residual ? &inputs[2 + parts_.has_bias] : nullptr;
    const void* res = residual != nullptr ? residual->host() : nullptr;
    void* dst = outputs[0].host();
    if (int_via_f32_) {
      if (!zero_k_) {
        IntToF32(a, a_unsigned_, a32_.data(), a_elements_);
        IntToF32(b, false, b32_.data(), b_elements_);
        a = a32_.data();
        b = b32_.data();
      }
      dst = c32_.data();
    } else if (convert_) {
      if (!zero_k_) {
        ParallelConvertToF32(dtype_, a, a32_.data(), a_elements_);
        ParallelConvertToF32(dtype_, b, b32_.data(), b_elements_);
        a = a32_.data();
        b = b32_.data();
      }
      if (bias != nullptr) {
        ConvertToF32(dtype_, bias, bias32_.data(), bias32_.size());
        bias = bias32_.data();
      }
      if (res != nullptr) {
        ParallelConvertToF32(dtype_, res, res32_.data(), plan_.out_elements);
        res = res32_.data();
      }
      dst = c32_.data();
    } else if (res != nullptr && Overlaps(*residual, outputs[0])) {
      // The primitive may write partial sums to dst before its epilogue reads
      // the residual, so an in-place residual is read from a copy.
      res_copy_.resize(residual->bytes);
      ParallelMemcpy(res_copy_.data(), res, residual->bytes);
      res = res_copy_.data();
    }
    if (zero_k_) a = b = zeros_.data();
    absl::Status status = DnnlTry("matmul", [&] {
      src_.set_data_handle(const_cast<void*>(a));
      weights_.set_data_handle(const_cast<void*>(b));
      dst_.set_data_handle(dst);
      std::unordered_map<int, dnnl::memory> args = {
          {DNNL_ARG_SRC, src_}, {DNNL_ARG_WEIGHTS, weights_}, {DNNL_ARG_DST, dst_}};
      if (bias != nullptr) {
        bias_.set_data_handle(const_cast<void*>(bias));
        args.emplace(bias_post_op_ < 0
                         ? DNNL_ARG_BIAS
                         : DNNL_ARG_ATTR_MULTIPLE_POST_OP(bias_post_op_) | DNNL_ARG_SRC_1,
                     bias_);
      }
      if (res != nullptr) {
        residual_.set_data_handle(const_cast<void*>(res));
        args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(residual_post_op_) | DNNL_ARG_SRC_1, residual_);
      }
      primitive_.execute(stream_, args);
      stream_.wait();
    });
    if (!status.ok()) return status;
    if (convert_)
      ParallelConvertFromF32(c32_.data(), dtype_, outputs[0].host(), plan_.out_elements);
    if (int_via_f32_) FinishIntViaF32(inputs[1].host(), outputs[0].host());
    return absl::OkStatus();
  }

 private:
  MatMulKernel() = default;

  // i8 (or u8, centred to [-128, 127]) values as f32.
  static void IntToF32(const void* src, bool is_unsigned, float* dst, int64_t n) {
    ParallelFor(n, int64_t{1} << 16, [&](int64_t b, int64_t e) {
      if (is_unsigned) {
        const auto* s = static_cast<const uint8_t*>(src);
        for (int64_t i = b; i < e; ++i) dst[i] = static_cast<float>(static_cast<int>(s[i]) - 128);
      } else {
        const auto* s = static_cast<const int8_t*>(src);
        for (int64_t i = b; i < e; ++i) dst[i] = static_cast<float>(s[i]);
      }
    });
  }

  // The exact integer result from the f32 GEMM's (integral) one; a centred
  // u8 operand gets 128 * colsum(b) back (b is [K, N] or [N, K] then).
  void FinishIntViaF32(const void* b_data, void* out) {
    const int64_t n = plan_.n, k = plan_.k;
    if (a_unsigned_) {
      const auto* b = static_cast<const int8_t*>(b_data);
      std::fill(colsum_.begin(), colsum_.end(), 0);
      for (int64_t kk = 0; kk < k; ++kk) {
        for (int64_t j = 0; j < n; ++j) colsum_[j] += plan_.tb ? b[j * k + kk] : b[kk * n + j];
      }
    }
    auto* c = static_cast<int32_t*>(out);
    ParallelFor(plan_.out_elements, int64_t{1} << 16, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        c[i] = static_cast<int32_t>(std::lrint(c32_[i])) + (a_unsigned_ ? 128 * colsum_[i % n] : 0);
      }
    });
  }

  // Memory descriptor of a [batch..., rows, cols] operand: `batch_stride`
  // per merged batch dim (0 = broadcast, given dim 1), and the matrix stored
  // transposed when `transposed`.
  dnnl::memory::desc Describe(dt type, const std::vector<int64_t>& batch_stride, int64_t rows,
                              int64_t cols, bool transposed) const {
    dnnl::memory::dims dims, strides;
    for (size_t i = 0; i < plan_.batch.size(); ++i) {
      const bool broadcast = batch_stride.empty() || batch_stride[i] == 0;
      dims.push_back(broadcast ? 1 : plan_.batch[i]);
      strides.push_back(broadcast ? rows * cols : batch_stride[i]);
    }
    dims.push_back(rows);
    dims.push_back(cols);
    strides.push_back(transposed ? 1 : cols);
    strides.push_back(transposed ? rows : 1);
    return dnnl::memory::desc(dims, type, strides);
  }

  // An f32 launch reading B from the packed copy bound by UsePacked.
  absl::Status RunPacked(std::span<const BufferView> inputs, std::span<const BufferView> outputs) {
    const void* res = nullptr;
    if (parts_.has_residual) {
      const BufferView& residual = inputs[2 + parts_.has_bias];
      res = residual.host();
      if (Overlaps(residual, outputs[0])) {  // as in Run: read an in-place residual from a copy
        res_copy_.resize(residual.bytes);
        ParallelMemcpy(res_copy_.data(), res, residual.bytes);
        res = res_copy_.data();
      }
    }
    return DnnlTry("matmul", [&] {
      src_.set_data_handle(inputs[0].host());
      packed_weights_.set_data_handle(packed_b_->memory.get_data_handle());
      dst_.set_data_handle(outputs[0].host());
      std::unordered_map<int, dnnl::memory> args = {
          {DNNL_ARG_SRC, src_}, {DNNL_ARG_WEIGHTS, packed_weights_}, {DNNL_ARG_DST, dst_}};
      if (parts_.has_bias) {
        bias_.set_data_handle(inputs[2].host());
        args.emplace(DNNL_ARG_BIAS, bias_);
      }
      if (res != nullptr) {
        residual_.set_data_handle(const_cast<void*>(res));
        args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(residual_post_op_) | DNNL_ARG_SRC_1, residual_);
      }
      packed_primitive_.execute(stream_, args);
      stream_.wait();
    });
  }

  // The packed path (see the class comment) for an f32 product without
  // batch dims or a per-row bias: a primitive whose B is `any`, when oneDNN
  // then wants a layout other than the plain one. Leaves packing_key_ empty
  // otherwise. Throws dnnl::error.
  void BuildPacked(const dnnl::matmul::primitive_desc& plain) {
    if (!packable_ || !OneDnnPackedEnabled() || dtype_ != v1::DTYPE_F32 || convert_ || zero_k_ ||
        !plan_.batch.empty() || plan_.bias_per_row) {
      return;
    }
    const dnnl::memory::desc any({plan_.k, plan_.n}, dt::f32, dnnl::memory::format_tag::any);
    const dnnl::memory::desc a = plain.src_desc(), c = plain.dst_desc();
    dnnl::post_ops ops;
    if (parts_.act.present)
      ops.append_eltwise(1.0f, parts_.act.alg, parts_.act.alpha, parts_.act.beta);
    if (parts_.has_residual) ops.append_binary(dnnl::algorithm::binary_add, c);
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    const dnnl::matmul::desc desc = parts_.has_bias
                                        ? dnnl::matmul::desc(a, any, bias_.get_desc(), c)
                                        : dnnl::matmul::desc(a, any, c);
    std::optional<dnnl::matmul::primitive_desc> pd;
    try {
      pd.emplace(desc, attr, DnnlEngine());
    } catch (const dnnl::error&) {
      return;  // no implementation for this epilogue with B `any`: unpacked only
    }
    if (pd->weights_desc() == weights_.get_desc()) return;  // it wants B as given
    packed_b_desc_ = pd->weights_desc();
    packed_weights_ = dnnl::memory(packed_b_desc_, DnnlEngine(), DNNL_MEMORY_NONE);
    packed_primitive_ = dnnl::matmul(*pd);
    packing_key_ = absl::StrCat(LayoutKey(packed_b_desc_), plan_.tb ? ":from_transposed" : "");
  }

  // Creates the primitive for compute type `type`; throws dnnl::error.
  dnnl::matmul::primitive_desc MakeDesc(dt type) { return MakeDesc(type, type, type); }
  // Operand and result types of their own (the integer product).
  dnnl::matmul::primitive_desc MakeDesc(dt a_type, dt b_type, dt type) {
    const MatMulPlan& p = plan_;
    const int64_t k = zero_k_ ? 1 : p.k;
    // With K = 0 both operands are one shared zero column/row.
    const std::vector<int64_t> none;
    const dnnl::memory::desc a =
        Describe(a_type, zero_k_ ? none : p.a_stride, p.m, k, p.ta && !zero_k_);
    const dnnl::memory::desc b =
        Describe(b_type, zero_k_ ? none : p.b_stride, k, p.n, p.tb && !zero_k_);
    const dnnl::memory::desc c = Describe(type, p.c_stride, p.m, p.n, false);
    dnnl::memory::dims bias_dims(p.batch.size() + 2, 1);
    bias_dims[p.bias_per_row ? bias_dims.size() - 2 : bias_dims.size() - 1] =
        p.bias_per_row ? p.m : p.n;
    const dnnl::memory::desc bias = parts_.has_bias
                                        ? dnnl::memory::desc(bias_dims, type, Contiguous(bias_dims))
                                        : dnnl::memory::desc();
    dnnl::post_ops ops;
    int index = 0;
    // oneDNN's bias argument has only reference code for a per-row bias, so
    // that one is a leading binary-add post-op (before the activation).
    bias_post_op_ = -1;
    if (parts_.has_bias && p.bias_per_row) {
      ops.append_binary(dnnl::algorithm::binary_add, bias);
      bias_post_op_ = index++;
    }
    if (parts_.act.present) {
      ops.append_eltwise(1.0f, parts_.act.alg, parts_.act.alpha, parts_.act.beta);
      ++index;
    }
    if (parts_.has_residual) {
      ops.append_binary(dnnl::algorithm::binary_add, c);
      residual_post_op_ = index;
    }
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    const dnnl::matmul::desc desc = parts_.has_bias && bias_post_op_ < 0
                                        ? dnnl::matmul::desc(a, b, bias, c)
                                        : dnnl::matmul::desc(a, b, c);
    const bool prefer_gemm = type == dt::f32 && p.batch.empty() &&
                             static_cast<double>(p.m) * p.n * k >= kPreferGemmFlops;
    auto pd =
        PickImplementation<dnnl::matmul::primitive_desc>(desc, attr, prefer_gemm ? "gemm:" : "");
    src_ = dnnl::memory(a, DnnlEngine(), DNNL_MEMORY_NONE);
    weights_ = dnnl::memory(b, DnnlEngine(), DNNL_MEMORY_NONE);
    dst_ = dnnl::memory(c, DnnlEngine(), DNNL_MEMORY_NONE);
    if (parts_.has_bias) bias_ = dnnl::memory(bias, DnnlEngine(), DNNL_MEMORY_NONE);
    if (parts_.has_residual) residual_ = dnnl::memory(c, DnnlEngine(), DNNL_MEMORY_NONE);
    return pd;
  }

  static dnnl::memory::dims Contiguous(const dnnl::memory::dims& dims) {
    dnnl::memory::dims strides(dims.size(), 1);
    for (size_t i = dims.size() - 1; i-- > 0;) strides[i] = strides[i + 1] * dims[i + 1];
    return strides;
  }

  void Build() {
    if (plan_.out_elements == 0) return;
    zero_k_ = plan_.k == 0;
    stream_ = dnnl::stream(DnnlEngine());
    std::optional<dnnl::matmul::primitive_desc> pd;
    if (dtype_ == v1::DTYPE_BF16) {
      // bf16 natively only where oneDNN has more than its reference loops
      // (CPUs without AVX-512 have none, or no bf16 matmul at all).
      try {
        pd = MakeDesc(dt::bf16);
        if (std::string(pd->impl_info_str()).rfind("ref", 0) == 0) pd.reset();
      } catch (const dnnl::error&) {
        pd.reset();
      }
    } else if (dtype_ == v1::DTYPE_F32) {
      pd = MakeDesc(dt::f32);
    } else if (dtype_ == v1::DTYPE_I32 && OneDnnInt8IsExact()) {
      pd = MakeDesc(a_unsigned_ ? dt::u8 : dt::s8, dt::s8, dt::s32);
    } else if (dtype_ == v1::DTYPE_I32) {
      int_via_f32_ = true;  // see OneDnnInt8IsExact
      pd = MakeDesc(dt::f32);
      if (!zero_k_) {
        a32_.resize(a_elements_);
        b32_.resize(b_elements_);
      }
      c32_.resize(plan_.out_elements);
      if (a_unsigned_) colsum_.resize(plan_.n);
    }
    if (!pd) {
      convert_ = true;
      pd = MakeDesc(dt::f32);
      if (!zero_k_) {
        a32_.resize(a_elements_);
        b32_.resize(b_elements_);
      }
      if (parts_.has_bias) bias32_.resize(plan_.bias_per_row ? plan_.m : plan_.n);
      if (parts_.has_residual) res32_.resize(plan_.out_elements);
      c32_.resize(plan_.out_elements);
    }
    if (zero_k_) zeros_.assign((plan_.m + plan_.n) * sizeof(float), 0);
    primitive_ = dnnl::matmul(*pd);
    BuildPacked(*pd);
  }

  FusedParts parts_;
  MatMulPlan plan_;
  DType dtype_ = v1::DTYPE_F32;
  bool a_unsigned_ = false;      // the integer product's a is u8 (else s8)
  bool int_via_f32_ = false;     // the integer product as an exact f32 GEMM (no VNNI)
  std::vector<int32_t> colsum_;  // int_via_f32_ with a u8 a: sum over K of b
  int64_t a_elements_ = 0, b_elements_ = 0;
  bool convert_ = false;  // storage converted to and from f32 around the primitive
  bool zero_k_ = false;
  int residual_post_op_ = 0;
  int bias_post_op_ = -1;  // the per-row bias's post-op index; -1 = bias argument
  dnnl::stream stream_;
  dnnl::matmul primitive_;
  dnnl::memory src_, weights_, dst_, bias_, residual_;
  // The packed path: empty key = none. packed_b_ is bound by UsePacked and
  // owned by the engine.
  bool packable_ = true;
  std::string packing_key_;
  dnnl::memory::desc packed_b_desc_;
  dnnl::memory packed_weights_;
  dnnl::matmul packed_primitive_;
  const OneDnnPackedB* packed_b_ = nullptr;
  // Scratch reused by every launch (Launch is not reentrant).
  std::vector<float> a32_, b32_, bias32_, res32_, c32_;
  std::vector<char> zeros_, res_copy_;
};

// B packed into column panels (small_matmul.h), shared by every kernel whose
// packing_key matches.
class PackedPanels final : public backend::PackedOperand {
 public:
  explicit PackedPanels(int64_t floats) : data(static_cast<size_t>(floats)) {}
  int64_t bytes() const override { return static_cast<int64_t>(data.size() * sizeof(float)); }
  std::vector<float> data;
};

// f32 products of at most SmallMatMulMaxM() rows (after a batch shared by B
// is folded into M) on the own micro-kernel of small_matmul.h, B read packed
// when the engine packed it (constants, params) and in place otherwise.
//
// Chosen by measurement against oneDNN 2.6's matmul on a 2-core AMD EPYC
// (AVX2), 784x512 products, 2 threads (docs/benchmarks.md, issue 12 item 1):
// with B packed the micro-kernel is faster at every M <= 64; reading an
// unpacked B (row stride N, a transposed B packed on every launch) it is
// faster up to M = 16 only, so above that an unpacked launch runs oneDNN
// (built at prepare for that case).
class SmallMatMulKernel final : public CpuKernel, public backend::PackingKernel {
 public:
  static constexpr int64_t kUnpackedMaxM = 16;

  // The kernel for `spec` when the small path applies to it, else null.
  static absl::StatusOr<std::unique_ptr<SmallMatMulKernel>> CreateIfApplies(
      const KernelSpec& spec) {
    if (!SmallMatMulEnabled() || spec.outputs.size() != 1 ||
        spec.outputs[0].dtype != v1::DTYPE_F32) {
      return std::unique_ptr<SmallMatMulKernel>();
    }
    KILN_ASSIGN_OR_RETURN(auto v, Validate(spec));
    const MatMulPlan& p = v.second;
    SmallAct act = SmallAct::kNone;
    if (!p.batch.empty() || p.ta || p.bias_per_row || p.m > SmallMatMulMaxM(BestSmallMatMulIsa()) ||
        !SmallActOf(spec.op == v1::OP_FUSED_MATMUL ? spec.attrs.fused_matmul().activation()
                                                   : v1::UNARY_KIND_UNSPECIFIED,
                    &act)) {
      return std::unique_ptr<SmallMatMulKernel>();
    }
    // Above kSmallMatMulMaxM rows a transcendental activation stays with
    // oneDNN, whose GELU post-op cost ~2% of the encoder's FFN product where
    // ours (accurate to ~2 ulp, ActRows) cost ~15% (docs/benchmarks.md, enc12b).
    if (p.m > kSmallMatMulMaxM && SmallActAfterStore(act)) return std::unique_ptr<SmallMatMulKernel>();
    auto kernel = std::unique_ptr<SmallMatMulKernel>(new SmallMatMulKernel());
    kernel->parts_ = v.first;
    kernel->plan_ = v.second;
    kernel->act_ = act;
    kernel->isa_ = BestSmallMatMulIsa();
    if (p.m > kUnpackedMaxM) {
      KILN_ASSIGN_OR_RETURN(kernel->unpacked_, MatMulKernel::Create(spec, /*packable=*/false));
    }
    return kernel;
  }

  std::string implementation() const override {
    if (packed_b_ == nullptr && unpacked_ != nullptr) return unpacked_->implementation();
    std::string s = absl::StrCat("cpu:matmul_small_m_", SmallMatMulIsaName(isa_));
    if (packed_b_ != nullptr) absl::StrAppend(&s, "+packed_b");
    if (parts_.has_bias) absl::StrAppend(&s, "+bias");
    if (parts_.act.present) absl::StrAppend(&s, "+", parts_.act.name);
    if (parts_.has_residual) absl::StrAppend(&s, "+residual");
    return s;
  }

  std::vector<int> packable_inputs() const override { return {1}; }

  std::string packing_key(int input) const override {
    return absl::StrCat("cpu:small_matmul_panels16_f32:k=", plan_.k, ":n=", plan_.n,
                        plan_.tb ? ":transposed" : "", ":input=", input);
  }

  absl::StatusOr<std::shared_ptr<const backend::PackedOperand>> Pack(
      int input, const BufferView& value) const override {
    if (input != 1) return absl::InvalidArgumentError(absl::StrCat("input ", input, " is not packable"));
    if (value.bytes != plan_.k * plan_.n * static_cast<int64_t>(sizeof(float))) {
      return absl::InvalidArgumentError(absl::StrCat("packing b: ", value.bytes, " bytes for k=",
                                                     plan_.k, " n=", plan_.n));
    }
    auto packed = std::make_shared<PackedPanels>(PackedBFloats(plan_.k, plan_.n));
    PackB(value.as<const float>(), plan_.k, plan_.n, plan_.tb, packed->data.data());
    return std::shared_ptr<const backend::PackedOperand>(std::move(packed));
  }

  void UsePacked(int input, const backend::PackedOperand* packed) override {
    if (input == 1) packed_b_ = dynamic_cast<const PackedPanels*>(packed);
  }

  absl::Status Run(std::span<const BufferView> inputs,
                   std::span<const BufferView> outputs) override {
    if (plan_.out_elements == 0) return absl::OkStatus();
    if (packed_b_ == nullptr && unpacked_ != nullptr) return unpacked_->Run(inputs, outputs);
    const int64_t m = plan_.m, n = plan_.n, k = plan_.k;
    const BufferView& out = outputs[0];
    SmallMatMulArgs g;
    g.m = m;
    g.n = n;
    g.k = k;
    g.act = act_;
    g.c = out.as<float>();
    g.ldc = n;
    // Inputs the result overwrites (an in-place plan) are read from copies.
    g.a = ReadOnly(inputs[0], out, &a_copy_);
    g.lda = k;
    if (packed_b_ != nullptr) {
      g.b = packed_b_->data.data();
      g.b_panel_stride = k * kSmallPanel;
      g.b_row_stride = kSmallPanel;
    } else {
      const float* b = ReadOnly(inputs[1], out, &b_copy_);
      if (plan_.tb) {
        b_scratch_.resize(PackedBFloats(k, n));
        PackB(b, k, n, true, b_scratch_.data());
        g.b = b_scratch_.data();
        g.b_panel_stride = k * kSmallPanel;
        g.b_row_stride = kSmallPanel;
      } else {
        g.b = b;
        g.b_panel_stride = kSmallPanel;
        g.b_row_stride = n;
        if (n % kSmallPanel != 0) {
          b_scratch_.resize(k * kSmallPanel);
          PackBPanel(b, k, n, n / kSmallPanel, b_scratch_.data());
          g.b_last_panel = b_scratch_.data();
        }
      }
    }
    size_t next = 2;
    if (parts_.has_bias) g.bias = ReadOnly(inputs[next++], out, &bias_copy_);
    if (parts_.has_residual) {
      // The epilogue reads each residual element just before it writes the
      // same element of C: an exactly aliased residual is safe, a shifted one
      // is not, nor any with an activation that runs after C was stored.
      const BufferView& r = inputs[next];
      g.residual = r.host() == out.host() && !SmallActAfterStore(act_)
                       ? r.as<const float>()
                       : ReadOnly(r, out, &res_copy_);
      g.ldr = n;
    }
    SmallMatMul(isa_, g);
    return absl::OkStatus();
  }

 private:
  SmallMatMulKernel() = default;

  static const float* ReadOnly(const BufferView& in, const BufferView& out,
                               std::vector<float>* copy) {
    if (!Overlaps(in, out)) return in.as<const float>();
    copy->resize(in.bytes / sizeof(float));
    std::memcpy(copy->data(), in.host(), in.bytes);
    return copy->data();
  }

  FusedParts parts_;
  MatMulPlan plan_;
  SmallAct act_ = SmallAct::kNone;
  SmallMatMulIsa isa_ = SmallMatMulIsa::kAvx2;
  const PackedPanels* packed_b_ = nullptr;  // bound by UsePacked, owned by the engine
  std::unique_ptr<MatMulKernel> unpacked_;  // oneDNN, for unpacked B above kUnpackedMaxM
  // Scratch reused by every launch (Launch is not reentrant).
  std::vector<float> a_copy_, b_copy_, bias_copy_, res_copy_, b_scratch_;
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateMatMul(const KernelSpec& spec) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<SmallMatMulKernel> small,
                        SmallMatMulKernel::CreateIfApplies(spec));
  if (small != nullptr) return std::unique_ptr<backend::Kernel>(std::move(small));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<MatMulKernel> kernel, MatMulKernel::Create(spec));
  return std::unique_ptr<backend::Kernel>(std::move(kernel));
}

const CpuOpRegistration kRegistration({
    {v1::OP_MATMUL, &SupportsMatMul, &CreateMatMul},
    {v1::OP_FUSED_MATMUL, &SupportsMatMul, &CreateMatMul},
});

}  // namespace
}  // namespace kiln::cpu
