// Attention and Rope on the CPU.
//
// Attention is blocked FlashAttention-style: each task is one (batch, kv
// head, block of the query rows that share that kv head); it walks only the
// key blocks its mask can reach, with an online softmax (running max, running
// sum, rescaled output accumulator), so memory is O(block^2) per thread
// whatever Sq and Sk are (64 x 128 logits, a 64 x Dv accumulator, and for
// f16/bf16 the converted Q/K/V blocks: at D = Dv = 128, 64 KiB for f32 and
// 224 KiB for f16/bf16). When a task's keys fit one block (Sk <= 128: an
// encoder's attention) and its rows are f32, P is normalized in place and
// P @ V written straight into the result. Block products run through
// dnnl_sgemm, single-threaded inside our OpenMP region; the row max and
// exponentials are AVX-512 where the CPU has it, else AVX2. Compute is
// f32; f16/bf16 storage is converted block by block. A task reads its query
// rows before it writes the same rows of the result, so the result may share
// q's memory.
//
// Layouts: q [B, Hq, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv] and the
// result [B, Hq, Sq, Dv]; or packed (rank 3, the heads named by the
// attributes): q [B, Sq, Hq*D], k [B, Sk, Hkv*D], v [B, Sk, Hkv*Dv], result
// [B, Sq, Hq*Dv], as projections write them. Packed, a head's rows are read
// and written with a stride (the block products' leading dims), so fuse
// gives this kernel the projections' results in place of the head
// transposes.
//
// Semantics (graph.proto AttentionAttrs, MaskKind):
//   logits = scale * q.k  (scale defaults to 1/sqrt(D); to 1 when D = 0,
//                          where every logit is the empty sum 0)
//   logits = softcap * tanh(logits / softcap)            when softcap > 0
//   then the mask: Causal, Prefix and SlidingWindow place query i at absolute
//   position i + (Sk - Sq); Custom drops keys whose mask is false; Bias adds
//   the operand (broadcast to [B, Hq, Sq, Sk]).
//   A query whose keys are all masked (or Sk = 0) outputs zeros, not NaN.
#include <immintrin.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/cpu/attention_rows.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/onednn_util.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/small_matmul.h"
#include "base/status.h"

namespace kiln::cpu {
namespace {

using backend::BufferView;
using backend::Claim;
using backend::KernelSpec;
using backend::TensorDesc;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// exp(x) for 8 floats: Cody-Waite range reduction and the Cephes expf
// polynomial (about 2 ulp). Arguments below -87, -inf included, give exactly
// 0, so masked logits contribute nothing; NaN stays NaN. The cut sits above
// the f32 normal range's end on purpose: results near FLT_MIN would go
// through denormal multiplies, which cost a microcode assist each, and
// masked (-inf) logits would take that path on every element.
inline __m256 Exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 hi = _mm256_set1_ps(88.0f);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(hi, _mm256_max_ps(lo, x));  // operand order keeps NaN
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

float RowMaxAvx2(const float* x, int64_t n) {
  __m256 m8 = _mm256_set1_ps(kNegInf);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(x + j));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m8);
  float m = kNegInf;
  for (float v : lanes) m = std::max(m, v);
  for (; j < n; ++j) m = std::max(m, x[j]);
  return m;
}

// x[j] = exp(x[j] - shift); returns the sum.
float ExpShiftSumAvx2(float* x, int64_t n, float shift) {
  const __m256 s8 = _mm256_set1_ps(shift);
  __m256 sum8 = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), s8));
    _mm256_storeu_ps(x + j, e);
    sum8 = _mm256_add_ps(sum8, e);
  }
  if (j < n) {
    alignas(32) float tail[8];
    for (int t = 0; t < 8; ++t) tail[t] = j + t < n ? x[j + t] - shift : kNegInf;
    const __m256 e = Exp8(_mm256_load_ps(tail));
    _mm256_store_ps(tail, e);
    sum8 = _mm256_add_ps(sum8, e);
    for (int64_t t = 0; j + t < n; ++t) x[j + t] = tail[t];
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum8);
  float sum = 0;
  for (float v : lanes) sum += v;
  return sum;
}

// ------------------------------------------------------------------ attention

struct AttentionConfig {
  DType dtype = v1::DTYPE_F32;
  int64_t b = 0, hq = 0, hkv = 0, sq = 0, sk = 0, d = 0, dv = 0;
  // Packed (rank-3) layout: q [B, Sq, Hq*D], k [B, Sk, Hkv*D], v [B, Sk,
  // Hkv*Dv], result [B, Sq, Hq*Dv] (the projections' layout, heads named by
  // AttentionAttrs.heads / kv_heads); else [B, H, S, D].
  bool packed = false;
  float scale = 1;
  float softcap = 0;
  v1::MaskKind mask = v1::MASK_NONE;
  int64_t prefix = 0, window = 0;
  bool mask_per_query = false;  // custom mask is [B, Sq, Sk] (else [B, Sk])
  int64_t bias_stride[4] = {};  // element strides over [B, Hq, Sq, Sk]; 0 = broadcast
};

// q, k, v and the result's dims in either layout (see AttentionConfig).
absl::Status ShapesOf(const KernelSpec& spec, AttentionConfig& c) {
  const auto& a = spec.attrs.attention();
  const int64_t rank = spec.inputs[0].rank();
  for (int i = 0; i < 3; ++i) {
    if (spec.inputs[i].rank() != rank || (rank != 3 && rank != 4)) {
      return absl::InvalidArgumentError(
          "q, k, v must all be rank 4 ([B, H, S, D]) or all rank 3 ([B, S, H*D])");
    }
    if (spec.inputs[i].dtype != c.dtype) return absl::InvalidArgumentError("q, k, v dtypes differ");
  }
  const Dims& q = spec.inputs[0].dims;
  const Dims& k = spec.inputs[1].dims;
  const Dims& v = spec.inputs[2].dims;
  Dims out;
  if (rank == 4) {
    c.b = q[0], c.hq = q[1], c.sq = q[2], c.d = q[3];
    c.hkv = k[1], c.sk = k[2], c.dv = v[3];
    if (k[0] != c.b || v[0] != c.b || v[1] != c.hkv || v[2] != c.sk || k[3] != c.d) {
      return absl::InvalidArgumentError("q, k, v shapes disagree");
    }
    out = {c.b, c.hq, c.sq, c.dv};
  } else {
    c.packed = true;
    c.hq = a.heads();
    c.hkv = a.kv_heads() != 0 ? a.kv_heads() : a.heads();
    if (c.hq <= 0 || c.hkv <= 0) {
      return absl::InvalidArgumentError("rank-3 q, k, v need attribute heads > 0");
    }
    if (q[2] % c.hq != 0 || k[2] % c.hkv != 0 || v[2] % c.hkv != 0) {
      return absl::InvalidArgumentError("the last dims of q, k, v must divide by their heads");
    }
    c.b = q[0], c.sq = q[1], c.d = q[2] / c.hq;
    c.sk = k[1], c.dv = v[2] / c.hkv;
    if (k[0] != c.b || v[0] != c.b || v[1] != c.sk || k[2] / c.hkv != c.d) {
      return absl::InvalidArgumentError("q, k, v shapes disagree");
    }
    out = {c.b, c.sq, c.hq * c.dv};
  }
  if (c.hq > 0 && (c.hkv == 0 || c.hq % c.hkv != 0)) {
    return absl::InvalidArgumentError("query heads must be a multiple of kv heads");
  }
  if (spec.outputs[0].dtype != c.dtype || spec.outputs[0].dims != out) {
    return absl::InvalidArgumentError(c.packed ? "result must be [B, Sq, Hq*Dv] of q's dtype"
                                               : "result must be [B, Hq, Sq, Dv] of q's dtype");
  }
  return absl::OkStatus();
}

absl::StatusOr<AttentionConfig> ConfigOf(const KernelSpec& spec) {
  const auto& a = spec.attrs.attention();
  const bool needs_operand = a.mask() == v1::MASK_CUSTOM || a.mask() == v1::MASK_BIAS;
  if (!v1::MaskKind_IsValid(a.mask())) return absl::InvalidArgumentError("unknown mask kind");
  if (spec.inputs.size() != (needs_operand ? 4u : 3u) || spec.outputs.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("mask ", v1::MaskKind_Name(a.mask()), " takes ",
                                                   needs_operand ? 4 : 3, " operands"));
  }
  AttentionConfig c;
  c.dtype = spec.inputs[0].dtype;
  if (!IsF32Storage(c.dtype)) {
    return absl::UnimplementedError(absl::StrCat("attention on ", DTypeName(c.dtype),
                                                 " is not implemented (f32, f16, bf16 are)"));
  }
  KILN_RETURN_IF_ERROR(ShapesOf(spec, c));
  c.scale = static_cast<float>(a.has_scale() ? a.scale() : c.d > 0 ? 1.0 / std::sqrt(c.d) : 1.0);
  c.softcap = static_cast<float>(a.softcap());
  c.mask = a.mask();
  c.prefix = a.prefix();
  c.window = a.window();
  if (c.mask == v1::MASK_SLIDING_WINDOW && c.window <= 0) {
    return absl::InvalidArgumentError("window must be positive");
  }
  if (c.mask == v1::MASK_CUSTOM) {
    const TensorDesc& m = spec.inputs[3];
    if (m.dtype != v1::DTYPE_BOOL) return absl::InvalidArgumentError("custom mask must be bool");
    c.mask_per_query = m.rank() == 3;
    const bool ok = (m.rank() == 2 && m.dims == Dims{c.b, c.sk}) ||
                    (m.rank() == 3 && m.dims == Dims{c.b, c.sq, c.sk});
    if (!ok) return absl::InvalidArgumentError("custom mask must be [B, Sk] or [B, Sq, Sk]");
  }
  if (c.mask == v1::MASK_BIAS) {
    const TensorDesc& m = spec.inputs[3];
    if (m.dtype != c.dtype) return absl::InvalidArgumentError("bias dtype must match q");
    if (m.rank() > 4) return absl::InvalidArgumentError("bias rank exceeds 4");
    const int64_t full[4] = {c.b, c.hq, c.sq, c.sk};
    int64_t stride = 1;
    for (int i = 3, j = static_cast<int>(m.rank()) - 1; i >= 0; --i, --j) {
      const int64_t size = j >= 0 ? m.dims[j] : 1;
      if (size != full[i] && size != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("bias ", DimsToString(m.dims), " does not broadcast to [B, Hq, Sq, Sk]"));
      }
      c.bias_stride[i] = size == 1 ? 0 : stride;
      stride *= size;
    }
  }
  return c;
}

Claim SupportsAttention(const KernelSpec& spec) {
  auto c = ConfigOf(spec);
  if (!c.ok()) return Claim::No(std::string(c.status().message()));
  return Claim::Yes();
}

class AttentionKernel final : public CpuKernel {
 public:
  static absl::StatusOr<std::unique_ptr<backend::Kernel>> Create(const KernelSpec& spec) {
    KILN_ASSIGN_OR_RETURN(AttentionConfig c, ConfigOf(spec));
    auto kernel = std::unique_ptr<AttentionKernel>(new AttentionKernel(c));
    return std::unique_ptr<backend::Kernel>(std::move(kernel));
  }

  std::string implementation() const override {
    return absl::StrCat("cpu:flash_attention_", DTypeName(c_.dtype));
  }

  absl::Status Run(std::span<const BufferView> inputs,
                   std::span<const BufferView> outputs) override {
    const int64_t tasks = c_.b * c_.hkv * q_blocks_;
    if (tasks == 0 || c_.dv == 0) return absl::OkStatus();
    Operands ops{inputs[0].host(), inputs[1].host(), inputs[2].host(),
                 inputs.size() > 3 ? inputs[3].host() : nullptr, outputs[0].host()};
    // Tasks are claimed from a shared counter, latest query blocks first:
    // under a causal mask they see the most keys, so the tail stays short.
    std::atomic<int64_t> next{0};
    ParallelFor(tasks, 1, [&](int64_t, int64_t) {
      // Each thread's block buffers live as long as the kernel, so launches
      // neither allocate nor fault pages in.
      const size_t thread = static_cast<size_t>(omp_get_thread_num());
      std::unique_ptr<Scratch> extra;
      if (thread >= scratch_.size()) extra = std::make_unique<Scratch>(*this);
      Scratch& scratch = extra ? *extra : *scratch_[thread];
      for (int64_t t; (t = next.fetch_add(1)) < tasks;) {
        const int64_t kv_head = t / q_blocks_;
        const int64_t block = q_blocks_ - 1 - t % q_blocks_;
        RunTask(ops, kv_head / c_.hkv, kv_head % c_.hkv, block, scratch);
      }
    });
    return absl::OkStatus();
  }

 private:
  struct Operands {
    const void* q;
    const void* k;
    const void* v;
    const void* mask;  // custom mask or bias; null otherwise
    void* out;
  };

  // Per-thread block buffers: O(block^2 + block * head dim) floats. q, kb
  // and vb hold converted (f16/bf16) or gathered rows: f32 reads q in place
  // unless a packed block's rows span heads, and K/V blocks always.
  struct Scratch {
    explicit Scratch(const AttentionKernel& k)
        : s(k.bq_ * k.bk_), o(k.bq_ * k.c_.dv), m(k.bq_), l(k.bq_), lo(k.bq_), hi(k.bq_) {
      q.resize(k.bq_ * k.c_.d);
      if (k.own_products_) {  // K^T panels; V's last, partial panel
        kt.resize((k.bk_ + kSmallPanel - 1) / kSmallPanel * kSmallPanel * k.c_.d);
        if (k.c_.dv % kSmallPanel != 0) vlast.resize(k.bk_ * kSmallPanel);
      }
      if (k.c_.dtype != v1::DTYPE_F32) {
        kb.resize(k.bk_ * k.c_.d);
        vb.resize(k.bk_ * k.c_.dv);
      }
    }
    std::vector<float> s, o, m, l, q, kb, vb, kt, vlast;
    std::vector<int64_t> lo, hi;
  };

  explicit AttentionKernel(const AttentionConfig& c) : c_(c) {
    // A task owns query rows of one kv head: the Sq rows of each of its
    // group of Hq / Hkv query heads, which lie contiguously in q and in the
    // result ([B, H, S, D]; packed, each head's rows are Hq*D apart). Blocks
    // of these rows share every K/V block they read, so GQA and MQA decoding
    // (small Sq) read K and V once per group, not per head.
    group_ = c_.hkv > 0 ? c_.hq / c_.hkv : 0;
    avx512_ = BestSmallMatMulIsa() == SmallMatMulIsa::kAvx512;
    own_products_ = avx512_ && SmallMatMulEnabled();
    const int64_t rows = group_ * c_.sq;
    // 64 rows x 128 keys keeps a block's logits (32 KiB) and the K/V blocks
    // in L2 while giving dnnl_sgemm products big enough to run at speed;
    // blocks shrink (to 8 rows) while there are fewer than 4 tasks a thread.
    bq_ = std::max<int64_t>(1, std::min<int64_t>(64, rows));
    const int64_t want_tasks = 4 * static_cast<int64_t>(omp_get_max_threads());
    while (bq_ > 8 && c_.b * c_.hkv * ((rows + bq_ - 1) / bq_) < want_tasks) bq_ /= 2;
    bk_ = std::max<int64_t>(1, std::min<int64_t>(128, c_.sk));
    q_blocks_ = (rows + bq_ - 1) / bq_;
    // Row strides along the sequence (elements) of q, k, v and the result.
    q_ld_ = c_.packed ? c_.hq * c_.d : c_.d;
    k_ld_ = c_.packed ? c_.hkv * c_.d : c_.d;
    v_ld_ = c_.packed ? c_.hkv * c_.dv : c_.dv;
    o_ld_ = c_.packed ? c_.hq * c_.dv : c_.dv;
    if (c_.b * c_.hkv * q_blocks_ > 0) {
      for (int t = 0; t < omp_get_max_threads(); ++t) {
        scratch_.push_back(std::make_unique<Scratch>(*this));
      }
    }
  }

  // The row steps on the widest ISA (attention_rows.h).
  float RowMax(const float* x, int64_t n) const {
    return avx512_ ? AttnRowMaxAvx512(x, n) : RowMaxAvx2(x, n);
  }
  float ExpShiftSum(float* x, int64_t n, float shift) const {
    return avx512_ ? AttnExpShiftSumAvx512(x, n, shift) : ExpShiftSumAvx2(x, n, shift);
  }

  // Element offsets of query (or result) row i of head h, and of key (or
  // value) row j of kv head hk, in batch b.
  int64_t QRow(int64_t b, int64_t h, int64_t i, int64_t width) const {
    return c_.packed ? ((b * c_.sq + i) * c_.hq + h) * width : ((b * c_.hq + h) * c_.sq + i) * width;
  }
  int64_t KvRow(int64_t b, int64_t hk, int64_t j, int64_t width) const {
    return c_.packed ? ((b * c_.sk + j) * c_.hkv + hk) * width
                     : ((b * c_.hkv + hk) * c_.sk + j) * width;
  }

  // Keys [lo, hi) that query row i may see under the structural masks.
  void KeyRange(int64_t i, int64_t* lo, int64_t* hi) const {
    const int64_t pos = i + (c_.sk - c_.sq);
    *lo = 0;
    *hi = c_.sk;
    switch (c_.mask) {
      case v1::MASK_CAUSAL: *hi = pos + 1; break;
      case v1::MASK_PREFIX: *hi = std::max(pos + 1, c_.prefix); break;
      case v1::MASK_SLIDING_WINDOW:
        *hi = pos + 1;
        *lo = pos - c_.window + 1;
        break;
      default: break;
    }
    *lo = std::clamp<int64_t>(*lo, 0, c_.sk);
    *hi = std::clamp<int64_t>(*hi, *lo, c_.sk);
  }

  // `rows` rows of `width` elements starting at element `first` of `base`,
  // `ld` elements apart, as f32 rows `*ld_out` apart: in place when the
  // storage is f32, else converted into `buffer` (rows * width floats).
  const float* F32Rows(const void* base, int64_t first, int64_t rows, int64_t width, int64_t ld,
                       float* buffer, int64_t* ld_out) const {
    const size_t es = ElementSize(c_.dtype);
    const char* p = static_cast<const char*>(base) + first * es;
    if (c_.dtype == v1::DTYPE_F32) {
      *ld_out = ld;
      return reinterpret_cast<const float*>(p);
    }
    *ld_out = width;
    if (ld == width) {
      ConvertToF32(c_.dtype, p, buffer, rows * width);
    } else {
      for (int64_t r = 0; r < rows; ++r) {
        ConvertToF32(c_.dtype, p + r * ld * es, buffer + r * width, width);
      }
    }
    return buffer;
  }

  // Whether task rows [v0, v0 + rows) lie evenly spaced in q and in the
  // result: always in [B, H, S, D]; packed, when they are one head's.
  bool EvenlySpaced(int64_t v0, int64_t rows) const {
    return !c_.packed || v0 / c_.sq == (v0 + rows - 1) / c_.sq;
  }

  // The task's query rows [v0, v0 + rows) as f32 rows *ld apart: in place
  // for f32 when they are evenly spaced, else converted or gathered into w.q.
  const float* QueryRows(const Operands& ops, int64_t b, int64_t hk, int64_t v0, int64_t rows,
                         Scratch& w, int64_t* ld) const {
    const int64_t h0 = hk * group_ + v0 / c_.sq;
    if (EvenlySpaced(v0, rows)) {
      return F32Rows(ops.q, QRow(b, h0, v0 % c_.sq, c_.d), rows, c_.d, q_ld_, w.q.data(), ld);
    }
    const size_t es = ElementSize(c_.dtype);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t v = v0 + r;
      const char* src = static_cast<const char*>(ops.q) +
                        QRow(b, hk * group_ + v / c_.sq, v % c_.sq, c_.d) * es;
      ConvertToF32(c_.dtype, src, w.q.data() + r * c_.d, c_.d);
    }
    *ld = c_.d;
    return w.q.data();
  }

  // Rows [block * bq_, ...) of kv head `hk`'s group: row v is query
  // v % Sq of head hk * group + v / Sq.
  void RunTask(const Operands& ops, int64_t b, int64_t hk, int64_t block, Scratch& w) const {
    const int64_t v0 = block * bq_, rows = std::min(bq_, group_ * c_.sq - v0);
    // The own products pack K per block: below 16 query rows (decoding)
    // dnnl_sgemm's in-place read of K was as fast or faster (docs/cpu.md).
    const bool own = own_products_ && rows >= 16;
    int64_t lq = 0, lk = 0, lv = 0;
    const float* q = QueryRows(ops, b, hk, v0, rows, w, &lq);
    int64_t first = c_.sk, last = 0;  // union of the rows' key ranges
    for (int64_t r = 0; r < rows; ++r) {
      KeyRange((v0 + r) % c_.sq, &w.lo[r], &w.hi[r]);
      if (w.lo[r] < w.hi[r]) first = std::min(first, w.lo[r]), last = std::max(last, w.hi[r]);
    }
    // One key block (Sk <= 128, or a window that fits one) with f32 rows
    // evenly spaced in the result: no online rescaling; each row of P is
    // normalized in place and P @ V is written straight into the result.
    const bool direct = last - first <= bk_ && c_.dtype == v1::DTYPE_F32 && EvenlySpaced(v0, rows);
    std::fill(w.m.begin(), w.m.begin() + rows, kNegInf);
    std::fill(w.l.begin(), w.l.begin() + rows, 0.0f);
    if (!direct) std::fill(w.o.begin(), w.o.begin() + rows * c_.dv, 0.0f);
    const int64_t h0 = hk * group_ + v0 / c_.sq;
    float* out_rows = direct ? static_cast<float*>(ops.out) + QRow(b, h0, v0 % c_.sq, c_.dv) : nullptr;
    bool wrote = false;
    for (int64_t j0 = first; j0 < last; j0 += bk_) {
      const int64_t cols = std::min(bk_, last - j0);
      const float* k = F32Rows(ops.k, KvRow(b, hk, j0, c_.d), cols, c_.d, k_ld_, w.kb.data(), &lk);
      float* s = w.s.data();
      if (c_.d > 0 && own) {
        // Own AVX-512 product on K^T packed with the scale: dnnl_sgemm ran
        // these 64 x 128 x 64 blocks at ~75 GFLOP/s a core.
        AttnPackKeysAvx512(k, lk, cols, c_.d, c_.scale, w.kt.data());
        SmallMatMulArgs g;
        g.m = rows, g.n = cols, g.k = c_.d;
        g.a = q, g.lda = lq;
        g.b = w.kt.data(), g.b_panel_stride = c_.d * kSmallPanel, g.b_row_stride = kSmallPanel;
        g.c = s, g.ldc = cols;
        SmallMatMulAvx512(g, 0, (cols + kSmallPanel - 1) / kSmallPanel);
      } else if (c_.d > 0) {
        dnnl_sgemm('N', 'T', rows, cols, c_.d, c_.scale, q, lq, k, lk, 0.0f, s, cols);
      } else {
        std::fill(s, s + rows * cols, 0.0f);
      }
      bool any = false;
      for (int64_t r = 0; r < rows; ++r) {
        float* row = s + r * cols;
        const int64_t v = v0 + r;
        // Only the span [a, e) of this block is visible under the structural
        // mask: the rest gets probability 0 without going through exp.
        const int64_t a = std::clamp<int64_t>(w.lo[r] - j0, 0, cols);
        const int64_t e = std::clamp<int64_t>(w.hi[r] - j0, a, cols);
        ApplyMask(ops, b, hk * group_ + v / c_.sq, v % c_.sq, j0 + a, e - a, row + a);
        const float block_max = e > a ? RowMax(row + a, e - a) : kNegInf;
        const float m_new = std::max(w.m[r], block_max);
        std::fill(row, row + a, 0.0f);
        std::fill(row + e, row + cols, 0.0f);
        if (m_new == kNegInf) {  // nothing visible yet: the row adds nothing
          std::fill(row + a, row + e, 0.0f);
          continue;
        }
        any = true;
        if (direct) {  // the only block: normalize P's row now
          const float sum = ExpShiftSum(row + a, e - a, m_new);
          const float inv = 1.0f / sum;
          for (int64_t j = a; j < e; ++j) row[j] *= inv;
          continue;
        }
        const float correction = w.m[r] == kNegInf ? 0.0f : std::exp(w.m[r] - m_new);
        w.l[r] = w.l[r] * correction + ExpShiftSum(row + a, e - a, m_new);
        w.m[r] = m_new;
        if (correction != 1.0f) {
          float* o = w.o.data() + r * c_.dv;
          for (int64_t x = 0; x < c_.dv; ++x) o[x] *= correction;
        }
      }
      if (!any) continue;
      const float* v =
          F32Rows(ops.v, KvRow(b, hk, j0, c_.dv), cols, c_.dv, v_ld_, w.vb.data(), &lv);
      if (own) {  // V read in place as panels of 16 columns
        SmallMatMulArgs g;
        g.m = rows, g.n = c_.dv, g.k = cols;
        g.a = s, g.lda = cols;
        g.b = v, g.b_panel_stride = kSmallPanel, g.b_row_stride = lv;
        const int64_t panels = (c_.dv + kSmallPanel - 1) / kSmallPanel;
        if (c_.dv % kSmallPanel != 0) {
          const int64_t j0 = (panels - 1) * kSmallPanel, width = c_.dv - j0;
          for (int64_t j = 0; j < cols; ++j) {
            float* dst = w.vlast.data() + j * kSmallPanel;
            std::copy(v + j * lv + j0, v + j * lv + j0 + width, dst);
            std::fill(dst + width, dst + kSmallPanel, 0.0f);
          }
          g.b_last_panel = w.vlast.data();
        }
        if (direct) {
          g.c = out_rows, g.ldc = o_ld_;
          wrote = true;
        } else {  // o += P @ V
          g.c = w.o.data(), g.ldc = c_.dv;
          g.residual = w.o.data(), g.ldr = c_.dv;
        }
        SmallMatMulAvx512(g, 0, panels);
      } else if (direct) {
        dnnl_sgemm('N', 'N', rows, c_.dv, cols, 1.0f, s, cols, v, lv, 0.0f, out_rows, o_ld_);
        wrote = true;
      } else {
        dnnl_sgemm('N', 'N', rows, c_.dv, cols, 1.0f, s, cols, v, lv, 1.0f, w.o.data(), c_.dv);
      }
    }
    if (direct) {
      if (!wrote) {  // no key visible to any row: zeros
        for (int64_t r = 0; r < rows; ++r) {
          std::fill(out_rows + r * o_ld_, out_rows + r * o_ld_ + c_.dv, 0.0f);
        }
      }
      return;
    }
    const size_t es = ElementSize(c_.dtype);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t v = v0 + r;
      const float inv = w.l[r] > 0 ? 1.0f / w.l[r] : 0.0f;  // fully masked row -> zeros
      float* o = w.o.data() + r * c_.dv;
      for (int64_t x = 0; x < c_.dv; ++x) o[x] *= inv;
      void* dst = static_cast<char*>(ops.out) +
                  QRow(b, hk * group_ + v / c_.sq, v % c_.sq, c_.dv) * es;
      ConvertFromF32(o, c_.dtype, dst, c_.dv);
    }
  }

  // Softcap, then the operand masks (custom, bias), on the logits of query
  // i (of head h) for keys [j0, j0 + cols).
  void ApplyMask(const Operands& ops, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t cols,
                 float* row) const {
    if (c_.softcap > 0) {
      const float inv = 1.0f / c_.softcap;
      for (int64_t j = 0; j < cols; ++j) row[j] = c_.softcap * std::tanh(row[j] * inv);
    }
    if (c_.mask == v1::MASK_CUSTOM) {
      const auto* m = static_cast<const uint8_t*>(ops.mask) +
                      (c_.mask_per_query ? (b * c_.sq + i) * c_.sk : b * c_.sk) + j0;
      for (int64_t j = 0; j < cols; ++j) {
        if (m[j] == 0) row[j] = kNegInf;
      }
    } else if (c_.mask == v1::MASK_BIAS) {
      const int64_t base = b * c_.bias_stride[0] + h * c_.bias_stride[1] + i * c_.bias_stride[2];
      const int64_t step = c_.bias_stride[3];
      for (int64_t j = 0; j < cols; ++j) {
        row[j] += LoadF32(c_.dtype, ops.mask, base + (j0 + j) * step);
      }
    }
  }

  const AttentionConfig c_;
  int64_t group_ = 0;  // query heads per kv head
  int64_t bq_ = 1, bk_ = 1, q_blocks_ = 0;
  int64_t q_ld_ = 0, k_ld_ = 0, v_ld_ = 0, o_ld_ = 0;
  bool avx512_ = false;        // row steps on AVX-512
  // Block products on SmallMatMulAvx512 (AVX-512 and KILN_CPU_SMALL_MATMUL not
  // 0), else dnnl_sgemm.
  bool own_products_ = false;
  std::vector<std::unique_ptr<Scratch>> scratch_;  // one per OpenMP thread
};

// ----------------------------------------------------------------------- rope

struct RopeConfig {
  DType dtype = v1::DTYPE_F32;
  int64_t b = 0, h = 0, s = 0, d = 0;
  int64_t rotary = 0;  // rotated dims; the rest of D passes through
  bool interleaved = false;
  double theta = 10000;
  int64_t offset = 0;
  DType pos_dtype = v1::DTYPE_UNSPECIFIED;  // unspecified = default positions
  bool pos_per_batch = false;               // positions [B, S] (else [S])
};

absl::StatusOr<RopeConfig> RopeConfigOf(const KernelSpec& spec) {
  if (spec.inputs.empty() || spec.inputs.size() > 2 || spec.outputs.size() != 1) {
    return absl::InvalidArgumentError("rope takes x and optional positions");
  }
  const TensorDesc& x = spec.inputs[0];
  RopeConfig c;
  c.dtype = x.dtype;
  if (!IsF32Storage(c.dtype)) {
    return absl::UnimplementedError(
        absl::StrCat("rope on ", DTypeName(c.dtype), " is not implemented (f32, f16, bf16 are)"));
  }
  if (x.rank() != 4) return absl::InvalidArgumentError("x must be [B, H, S, D]");
  if (spec.outputs[0].dtype != x.dtype || spec.outputs[0].dims != x.dims) {
    return absl::InvalidArgumentError("result must match x");
  }
  c.b = x.dims[0], c.h = x.dims[1], c.s = x.dims[2], c.d = x.dims[3];
  const auto& a = spec.attrs.rope();
  c.rotary = a.rotary_dim() == 0 ? c.d : a.rotary_dim();
  if (c.rotary < 0 || c.rotary > c.d || c.rotary % 2 != 0) {
    return absl::InvalidArgumentError("rotary_dim must be even and at most D");
  }
  c.interleaved = a.interleaved();
  c.theta = a.has_theta() ? a.theta() : 10000.0;
  if (!(c.theta > 0)) return absl::InvalidArgumentError("theta must be positive");
  c.offset = a.position_offset();
  if (spec.inputs.size() == 2) {
    const TensorDesc& p = spec.inputs[1];
    if (!IsInteger(p.dtype)) return absl::InvalidArgumentError("positions must be integers");
    c.pos_dtype = p.dtype;
    c.pos_per_batch = p.rank() == 2;
    if (p.dims != Dims{c.s} && p.dims != Dims{c.b, c.s}) {
      return absl::InvalidArgumentError("positions must be [S] or [B, S]");
    }
  }
  return c;
}

Claim SupportsRope(const KernelSpec& spec) {
  auto c = RopeConfigOf(spec);
  if (!c.ok()) return Claim::No(std::string(c.status().message()));
  return Claim::Yes();
}

int64_t LoadInteger(DType dtype, const void* base, int64_t i) {
  switch (dtype) {
    case v1::DTYPE_I8: return static_cast<const int8_t*>(base)[i];
    case v1::DTYPE_U8: return static_cast<const uint8_t*>(base)[i];
    case v1::DTYPE_I16: return static_cast<const int16_t*>(base)[i];
    case v1::DTYPE_I32: return static_cast<const int32_t*>(base)[i];
    default: return static_cast<const int64_t*>(base)[i];
  }
}

class RopeKernel final : public CpuKernel {
 public:
  static absl::StatusOr<std::unique_ptr<backend::Kernel>> Create(const KernelSpec& spec) {
    KILN_ASSIGN_OR_RETURN(RopeConfig c, RopeConfigOf(spec));
    auto kernel = std::unique_ptr<RopeKernel>(new RopeKernel(c));
    return std::unique_ptr<backend::Kernel>(std::move(kernel));
  }

  std::string implementation() const override {
    return absl::StrCat("cpu:rope_", DTypeName(c_.dtype));
  }

  absl::Status Run(std::span<const BufferView> inputs,
                   std::span<const BufferView> outputs) override {
    const int64_t rows = c_.b * c_.h * c_.s;
    if (rows == 0 || c_.d == 0) return absl::OkStatus();
    if (c_.pos_dtype != v1::DTYPE_UNSPECIFIED && half_ > 0) {
      const void* pos = inputs[1].host();
      ParallelFor(table_rows_, std::max<int64_t>(1, 4096 / half_), [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) FillTableRow(p, LoadInteger(c_.pos_dtype, pos, p));
      });
    }
    const void* x = inputs[0].host();
    void* y = outputs[0].host();
    const size_t es = ElementSize(c_.dtype);
    ParallelFor(rows, std::max<int64_t>(1, 16384 / c_.d), [&](int64_t r0, int64_t r1) {
      const bool f32 = c_.dtype == v1::DTYPE_F32;
      std::vector<float> in(f32 ? 0 : c_.d), out(f32 ? 0 : c_.d);
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t s = r % c_.s;
        const int64_t table_row = c_.pos_per_batch ? (r / (c_.h * c_.s)) * c_.s + s : s;
        const float* cos = cos_.data() + table_row * half_;
        const float* sin = sin_.data() + table_row * half_;
        // Rotate reads each pair before writing it, so y may alias x.
        if (f32) {
          Rotate(static_cast<const float*>(x) + r * c_.d, cos, sin,
                 static_cast<float*>(y) + r * c_.d);
          continue;
        }
        ConvertToF32(c_.dtype, static_cast<const char*>(x) + r * c_.d * es, in.data(), c_.d);
        Rotate(in.data(), cos, sin, out.data());
        ConvertFromF32(out.data(), c_.dtype, static_cast<char*>(y) + r * c_.d * es, c_.d);
      }
    });
    return absl::OkStatus();
  }

 private:
  explicit RopeKernel(const RopeConfig& c) : c_(c), half_(c.rotary / 2) {
    inv_freq_.resize(half_);
    for (int64_t i = 0; i < half_; ++i) {
      inv_freq_[i] = std::pow(c_.theta, -2.0 * static_cast<double>(i) / c_.rotary);
    }
    table_rows_ = c_.pos_per_batch ? c_.b * c_.s : c_.s;
    cos_.resize(table_rows_ * half_);
    sin_.resize(table_rows_ * half_);
    // Default positions are known now: the table is built once.
    if (c_.pos_dtype == v1::DTYPE_UNSPECIFIED) {
      for (int64_t p = 0; p < table_rows_; ++p) FillTableRow(p, p + c_.offset);
    }
  }

  // Angles in f64: positions in the tens of thousands times a frequency
  // lose whole radians' worth of bits in f32.
  void FillTableRow(int64_t row, int64_t position) {
    for (int64_t i = 0; i < half_; ++i) {
      const double angle = static_cast<double>(position) * inv_freq_[i];
      cos_[row * half_ + i] = static_cast<float>(std::cos(angle));
      sin_[row * half_ + i] = static_cast<float>(std::sin(angle));
    }
  }

  // Pairs (i, i + rotary/2), or (2i, 2i + 1) when interleaved, turn by the
  // angle of frequency i; dims past rotary_dim pass through.
  void Rotate(const float* x, const float* cos, const float* sin, float* y) const {
    if (c_.interleaved) {
      for (int64_t i = 0; i < half_; ++i) {
        const float a = x[2 * i], b = x[2 * i + 1];
        y[2 * i] = a * cos[i] - b * sin[i];
        y[2 * i + 1] = b * cos[i] + a * sin[i];
      }
    } else {
      for (int64_t i = 0; i < half_; ++i) {
        const float a = x[i], b = x[i + half_];
        y[i] = a * cos[i] - b * sin[i];
        y[i + half_] = b * cos[i] + a * sin[i];
      }
    }
    for (int64_t i = c_.rotary; i < c_.d; ++i) y[i] = x[i];
  }

  const RopeConfig c_;
  const int64_t half_;
  int64_t table_rows_ = 0;
  std::vector<double> inv_freq_;
  std::vector<float> cos_, sin_;  // [table_rows, rotary / 2]
};

const CpuOpRegistration kRegistration({
    {v1::OP_ATTENTION, &SupportsAttention, &AttentionKernel::Create},
    {v1::OP_ROPE, &SupportsRope, &RopeKernel::Create},
});

}  // namespace
}  // namespace kiln::cpu
