// Conformance cases for Attention and Rope. Attention covers every MaskKind
// (structural masks with Sq < Sk and Sq > Sk), GQA and MQA, softcap, explicit
// scales, fully masked rows (zeros), size-0 and size-1 dims, and long key
// sequences, each also in the packed layout (rank-3 q [B, Sq, Hq*D], k and v
// [B, Sk, Hkv*D(v)], heads from the attributes: what fuse gives the CPU in
// place of the head transposes); Rope covers both pairings, partial rotary
// dims and position operands. References are f64 loops over the stored inputs.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/conformance/conformance.h"

namespace kiln::conformance {
namespace {

using backend::KernelSpec;

std::vector<double> ToDoubles(const HostTensor& t) {
  std::vector<double> v(t.num_elements());
  for (int64_t i = 0; i < t.num_elements(); ++i) v[i] = At(t, i);
  return v;
}

// ------------------------------------------------------------------ attention

bool Visible(const v1::AttentionAttrs& a, int64_t i, int64_t j, int64_t sq, int64_t sk) {
  const int64_t pos = i + (sk - sq);  // bottom-right aligned
  switch (a.mask()) {
    case v1::MASK_CAUSAL: return j <= pos;
    case v1::MASK_PREFIX: return j < a.prefix() || j <= pos;
    case v1::MASK_SLIDING_WINDOW: return j <= pos && pos - j < a.window();
    default: return true;
  }
}

std::vector<HostTensor> AttentionReference(const KernelSpec& spec,
                                           const std::vector<HostTensor>& in) {
  const auto& a = spec.attrs.attention();
  const Dims& qd = in[0].dims();
  const bool packed = qd.size() == 3;
  int64_t nb, hq, sq, d, hkv, sk, dv;
  if (packed) {
    hq = a.heads(), hkv = a.kv_heads() != 0 ? a.kv_heads() : a.heads();
    nb = qd[0], sq = qd[1], d = qd[2] / hq;
    sk = in[1].dims()[1], dv = in[2].dims()[2] / hkv;
  } else {
    nb = qd[0], hq = qd[1], sq = qd[2], d = qd[3];
    hkv = in[1].dims()[1], sk = in[1].dims()[2], dv = in[2].dims()[3];
  }
  // Row offsets of (batch, head, position) rows of `width` elements.
  auto q_row = [&](int64_t b, int64_t h, int64_t i, int64_t width) {
    return packed ? ((b * sq + i) * hq + h) * width : ((b * hq + h) * sq + i) * width;
  };
  auto kv_row = [&](int64_t b, int64_t h, int64_t j, int64_t width) {
    return packed ? ((b * sk + j) * hkv + h) * width : ((b * hkv + h) * sk + j) * width;
  };
  const double scale = a.has_scale() ? a.scale() : d > 0 ? 1 / std::sqrt(double(d)) : 1.0;
  const std::vector<double> q = ToDoubles(in[0]), k = ToDoubles(in[1]), v = ToDoubles(in[2]);
  std::vector<double> extra;
  Dims extra_dims;
  if (in.size() > 3) extra = ToDoubles(in[3]), extra_dims = in[3].dims();
  // Broadcast strides of the bias over [B, Hq, Sq, Sk].
  int64_t bs[4] = {0, 0, 0, 0};
  if (a.mask() == v1::MASK_BIAS) {
    int64_t stride = 1;
    for (int i = 3, j = static_cast<int>(extra_dims.size()) - 1; i >= 0; --i, --j) {
      const int64_t size = j >= 0 ? extra_dims[j] : 1;
      bs[i] = size == 1 ? 0 : stride;
      stride *= size;
    }
  }
  HostTensor out = F64(spec.outputs[0].dims);
  std::vector<double> logits(sk);
  std::vector<bool> keep(sk);
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t hk = h / (hq / hkv);
      for (int64_t i = 0; i < sq; ++i) {
        double mx = -INFINITY;
        for (int64_t j = 0; j < sk; ++j) {
          double dot = 0;
          for (int64_t x = 0; x < d; ++x) {
            dot += q[q_row(b, h, i, d) + x] * k[kv_row(b, hk, j, d) + x];
          }
          double l = scale * dot;
          if (a.softcap() > 0) l = a.softcap() * std::tanh(l / a.softcap());
          keep[j] = Visible(a, i, j, sq, sk);
          if (a.mask() == v1::MASK_CUSTOM) {
            keep[j] = extra[extra_dims.size() == 3 ? (b * sq + i) * sk + j : b * sk + j] != 0;
          }
          if (a.mask() == v1::MASK_BIAS) l += extra[b * bs[0] + h * bs[1] + i * bs[2] + j * bs[3]];
          if (l == -INFINITY) keep[j] = false;
          logits[j] = l;
          if (keep[j]) mx = std::max(mx, l);
        }
        const int64_t row = q_row(b, h, i, dv);
        if (mx == -INFINITY) continue;  // every key masked: zeros
        double sum = 0;
        for (int64_t j = 0; j < sk; ++j) {
          logits[j] = keep[j] ? std::exp(logits[j] - mx) : 0;
          sum += logits[j];
        }
        for (int64_t x = 0; x < dv; ++x) {
          double acc = 0;
          for (int64_t j = 0; j < sk; ++j) acc += logits[j] * v[kv_row(b, hk, j, dv) + x];
          out.SetFromDouble(row + x, acc / sum);
        }
      }
    }
  }
  std::vector<HostTensor> result;
  result.push_back(std::move(out));
  return result;
}

struct AttnShape {
  int64_t b, hq, hkv, sq, sk, d, dv;
};

struct AttnCase {
  std::string tag;
  AttnShape s;
  v1::AttentionAttrs attrs;
  Dims extra;  // custom mask or bias dims (mask kinds that take one)
  double lo = -1, hi = 1;
  bool mask_row_off = false;  // custom: first query row (or batch) sees nothing
  bool bias_row_off = false;  // bias: first row all -inf
};

v1::AttentionAttrs Mask(v1::MaskKind kind, int64_t param = 0) {
  v1::AttentionAttrs a;
  a.set_mask(kind);
  if (kind == v1::MASK_PREFIX) a.set_prefix(param);
  if (kind == v1::MASK_SLIDING_WINDOW) a.set_window(param);
  return a;
}

v1::AttentionAttrs With(v1::AttentionAttrs a, double scale, double softcap) {
  if (scale != 0) a.set_scale(scale);
  a.set_softcap(softcap);
  return a;
}

// `packed`: the rank-3 layout, heads named by the attributes (kv_heads left
// 0, its default, when it equals heads).
Case MakeAttention(const AttnCase& ac, DType dtype, bool packed = false) {
  const AttnShape& s = ac.s;
  Case c;
  c.name = absl::StrCat("attention/", DTypeName(dtype), packed ? "_packed_" : "_", ac.tag, "_b",
                        s.b, "h", s.hq, "kv", s.hkv, "_q", s.sq, "k", s.sk, "_d", s.d, "v", s.dv);
  std::mt19937_64 rng = RngFor(c.name);
  c.spec.name = c.name;
  c.spec.label = absl::StrCat("case ", c.name);
  c.spec.op = v1::OP_ATTENTION;
  *c.spec.attrs.mutable_attention() = ac.attrs;
  Dims qd = {s.b, s.hq, s.sq, s.d}, kd = {s.b, s.hkv, s.sk, s.d}, vd = {s.b, s.hkv, s.sk, s.dv},
       od = {s.b, s.hq, s.sq, s.dv};
  if (packed) {
    c.spec.attrs.mutable_attention()->set_heads(s.hq);
    c.spec.attrs.mutable_attention()->set_kv_heads(s.hkv == s.hq ? 0 : s.hkv);
    qd = {s.b, s.sq, s.hq * s.d}, kd = {s.b, s.sk, s.hkv * s.d}, vd = {s.b, s.sk, s.hkv * s.dv};
    od = {s.b, s.sq, s.hq * s.dv};
  }
  c.spec.inputs = {Desc(dtype, qd), Desc(dtype, kd), Desc(dtype, vd)};
  c.spec.outputs = {Desc(dtype, od)};
  c.inputs.push_back(RandomTensor(rng, dtype, qd, ac.lo, ac.hi));
  c.inputs.push_back(RandomTensor(rng, dtype, kd, ac.lo, ac.hi));
  c.inputs.push_back(RandomTensor(rng, dtype, vd));
  if (ac.attrs.mask() == v1::MASK_CUSTOM) {
    c.spec.inputs.push_back(Desc(v1::DTYPE_BOOL, ac.extra));
    HostTensor m = RandomTensor(rng, v1::DTYPE_BOOL, ac.extra);
    // The first row of the mask (a whole batch for [B, Sk]) sees nothing.
    if (ac.mask_row_off) {
      for (int64_t j = 0; j < ac.extra.back(); ++j) m.SetFromDouble(j, 0);
    }
    c.inputs.push_back(std::move(m));
  }
  if (ac.attrs.mask() == v1::MASK_BIAS) {
    c.spec.inputs.push_back(Desc(dtype, ac.extra));
    HostTensor bias = RandomTensor(rng, dtype, ac.extra, -2, 2);
    if (ac.bias_row_off) {
      for (int64_t j = 0; j < ac.extra.back(); ++j) bias.SetFromDouble(j, -INFINITY);
    }
    c.inputs.push_back(std::move(bias));
  }
  c.reference = AttentionReference;
  c.tol = DefaultTolerance(dtype, std::max<int64_t>({s.d, s.sk, 1}));
  return c;
}

std::vector<AttnCase> F32AttentionCases() {
  using v1::MASK_BIAS, v1::MASK_BIDIRECTIONAL, v1::MASK_CAUSAL, v1::MASK_CUSTOM, v1::MASK_NONE,
      v1::MASK_PREFIX, v1::MASK_SLIDING_WINDOW;
  std::vector<AttnCase> v = {
      {"none", {2, 4, 4, 17, 17, 16, 16}, Mask(MASK_NONE)},
      {"causal", {1, 2, 2, 65, 65, 32, 24}, Mask(MASK_CAUSAL)},
      {"causal_gqa_decode", {1, 6, 2, 3, 130, 16, 16}, Mask(MASK_CAUSAL)},
      {"causal_sq_gt_sk", {1, 2, 1, 130, 65, 8, 8}, Mask(MASK_CAUSAL)},  // early rows: zeros
      {"bidir_mqa", {2, 4, 1, 1, 130, 16, 8}, Mask(MASK_BIDIRECTIONAL)},
      {"prefix", {1, 2, 2, 65, 65, 16, 16}, Mask(MASK_PREFIX, 10)},
      {"prefix_sq_lt_sk", {1, 2, 2, 17, 65, 16, 16}, Mask(MASK_PREFIX, 40)},
      {"prefix_beyond_sk", {1, 1, 1, 17, 33, 8, 8}, Mask(MASK_PREFIX, 100)},
      {"window", {1, 2, 1, 130, 130, 16, 16}, Mask(MASK_SLIDING_WINDOW, 16)},
      {"window1", {1, 1, 1, 17, 17, 8, 8}, Mask(MASK_SLIDING_WINDOW, 1)},
      {"window_sq_lt_sk", {2, 2, 2, 17, 300, 16, 16}, Mask(MASK_SLIDING_WINDOW, 100)},
      {"custom_bsk", {2, 2, 2, 17, 33, 16, 16}, Mask(MASK_CUSTOM), {2, 33}, -1, 1, true},
      {"custom_bsqsk", {2, 2, 1, 17, 130, 16, 16}, Mask(MASK_CUSTOM), {2, 17, 130}, -1, 1, true},
      {"bias_full", {2, 3, 3, 17, 33, 16, 16}, Mask(MASK_BIAS), {2, 3, 17, 33}},
      {"bias_sk", {2, 3, 3, 17, 33, 16, 16}, Mask(MASK_BIAS), {33}},
      {"bias_b11sk", {2, 3, 1, 17, 33, 16, 16}, Mask(MASK_BIAS), {2, 1, 1, 33}},
      {"bias_hsqsk", {2, 3, 3, 17, 33, 16, 16}, Mask(MASK_BIAS), {3, 17, 33}},
      {"bias_neginf_row",
       {1, 2, 2, 3, 33, 8, 8},
       Mask(MASK_BIAS),
       {1, 1, 3, 33},
       -1,
       1,
       false,
       true},
      {"bias_gqa_rows_span_heads", {2, 8, 2, 5, 33, 16, 16}, Mask(MASK_BIAS), {1, 8, 5, 33}},
      {"custom_gqa_rows_span_heads", {1, 12, 3, 3, 65, 8, 8}, Mask(MASK_CUSTOM), {1, 3, 65}},
      {"window_mqa_decode", {1, 16, 1, 2, 300, 16, 16}, Mask(MASK_SLIDING_WINDOW, 130)},
      {"softcap_causal", {1, 2, 2, 65, 65, 16, 16}, With(Mask(MASK_CAUSAL), 0, 5.0), {}, -3, 3},
      {"softcap_bias", {1, 2, 2, 17, 33, 16, 16}, With(Mask(MASK_BIAS), 2.0, 3.0), {17, 33}},
      {"scale", {1, 2, 2, 17, 33, 16, 16}, With(Mask(MASK_NONE), 0.5, 0)},
      {"peaked", {1, 2, 2, 33, 65, 32, 32}, With(Mask(MASK_CAUSAL), 1.0, 0), {}, -3, 3},
      {"one", {1, 1, 1, 1, 1, 1, 1}, Mask(MASK_CAUSAL)},
      {"empty_batch", {0, 2, 2, 3, 5, 4, 4}, Mask(MASK_NONE)},
      {"empty_q", {1, 2, 2, 0, 5, 4, 4}, Mask(MASK_CAUSAL)},
      {"empty_k", {1, 2, 2, 3, 0, 4, 4}, Mask(MASK_NONE)},  // all rows masked: zeros
      {"empty_dv", {1, 2, 2, 3, 5, 4, 0}, Mask(MASK_NONE)},
      {"empty_d", {1, 2, 2, 3, 5, 0, 4}, Mask(MASK_CAUSAL)},  // logits 0: causal means
      {"odd_dims", {1, 3, 3, 5, 7, 3, 5}, Mask(MASK_CAUSAL)},
      // Long sequences: several key blocks, causal block skipping, windows.
      {"long_causal_gqa", {1, 2, 1, 1024, 1024, 64, 64}, Mask(MASK_CAUSAL)},
      {"long_window_decode", {1, 2, 2, 17, 1024, 32, 32}, Mask(MASK_SLIDING_WINDOW, 300)},
      {"long_none", {1, 1, 1, 257, 1024, 64, 64}, Mask(MASK_NONE)},
  };
  return v;
}

std::vector<AttnCase> LowPrecisionAttentionCases() {
  using v1::MASK_BIAS, v1::MASK_CAUSAL, v1::MASK_CUSTOM, v1::MASK_SLIDING_WINDOW;
  return {
      {"causal_gqa", {1, 4, 2, 33, 65, 32, 32}, Mask(MASK_CAUSAL)},
      {"window_long", {1, 2, 1, 65, 260, 16, 16}, Mask(MASK_SLIDING_WINDOW, 50)},
      {"custom", {2, 2, 2, 17, 33, 16, 16}, Mask(MASK_CUSTOM), {2, 17, 33}, -1, 1, true},
      {"bias", {2, 2, 2, 17, 33, 16, 16}, Mask(MASK_BIAS), {2, 1, 17, 33}},
      {"softcap", {1, 2, 2, 17, 33, 16, 16}, With(Mask(MASK_CAUSAL), 0, 4.0), {}, -3, 3},
  };
}

// Random shapes, GQA groupings, mask kinds and parameters (deterministic).
std::vector<AttnCase> RandomAttentionCases(int count) {
  std::mt19937_64 rng = RngFor("attention_random");
  auto pick = [&rng](std::vector<int64_t> from) { return from[rng() % from.size()]; };
  std::vector<AttnCase> v;
  for (int i = 0; i < count; ++i) {
    AttnCase ac;
    const int64_t hkv = pick({1, 2, 3});
    ac.s = {pick({1, 2}),
            hkv * pick({1, 2, 4}),
            hkv,
            pick({1, 3, 17, 65, 130}),
            pick({1, 17, 65, 130, 260}),
            pick({8, 16, 32, 64}),
            pick({8, 16, 64})};
    const auto kind = static_cast<v1::MaskKind>(rng() % 7);
    const int64_t param = kind == v1::MASK_PREFIX ? pick({0, 1, 17, 100}) : pick({1, 5, 64, 300});
    ac.attrs = With(Mask(kind, param), rng() % 3 == 0 ? 0.3 : 0, rng() % 3 == 0 ? 4.0 : 0);
    if (kind == v1::MASK_CUSTOM) {
      ac.extra = rng() % 2 ? Dims{ac.s.b, ac.s.sk} : Dims{ac.s.b, ac.s.sq, ac.s.sk};
    }
    if (kind == v1::MASK_BIAS) {
      const Dims full = {ac.s.b, ac.s.hq, ac.s.sq, ac.s.sk};
      const size_t rank = 1 + rng() % 4;
      for (size_t d = 4 - rank; d < 4; ++d) ac.extra.push_back(rng() % 3 == 0 ? 1 : full[d]);
    }
    ac.tag = absl::StrCat("random", i, "_", v1::MaskKind_Name(kind));
    v.push_back(ac);
  }
  return v;
}

std::vector<Case> AttentionCases() {
  std::vector<Case> cases;
  for (const AttnCase& ac : F32AttentionCases()) cases.push_back(MakeAttention(ac, v1::DTYPE_F32));
  for (const AttnCase& ac : RandomAttentionCases(16)) {
    cases.push_back(MakeAttention(ac, v1::DTYPE_F32));
  }
  for (DType dtype : {v1::DTYPE_F16, v1::DTYPE_BF16}) {
    for (const AttnCase& ac : LowPrecisionAttentionCases())
      cases.push_back(MakeAttention(ac, dtype));
  }
  // The packed layout: every f32 case but the long ones (the same kernel
  // loops; only the row addressing differs), the random ones, BERT-base's
  // encoder shape, and the low-precision ones (rows converted one by one).
  for (const AttnCase& ac : F32AttentionCases()) {
    if (ac.tag.rfind("long_", 0) == 0) continue;
    cases.push_back(MakeAttention(ac, v1::DTYPE_F32, true));
  }
  for (const AttnCase& ac : RandomAttentionCases(16)) {
    cases.push_back(MakeAttention(ac, v1::DTYPE_F32, true));
  }
  cases.push_back(MakeAttention(
      {"bert", {2, 12, 12, 128, 128, 64, 64}, Mask(v1::MASK_BIDIRECTIONAL)}, v1::DTYPE_F32, true));
  cases.push_back(MakeAttention({"long_causal_gqa", {1, 4, 2, 300, 300, 64, 64},
                                 Mask(v1::MASK_CAUSAL)},
                                v1::DTYPE_F32, true));
  for (DType dtype : {v1::DTYPE_F16, v1::DTYPE_BF16}) {
    for (const AttnCase& ac : LowPrecisionAttentionCases())
      cases.push_back(MakeAttention(ac, dtype, true));
  }
  return cases;
}

// ----------------------------------------------------------------------- rope

std::vector<HostTensor> RopeReference(const KernelSpec& spec, const std::vector<HostTensor>& in) {
  const auto& a = spec.attrs.rope();
  const Dims& xd = in[0].dims();
  const int64_t nb = xd[0], nh = xd[1], ns = xd[2], d = xd[3];
  const int64_t rd = a.rotary_dim() == 0 ? d : a.rotary_dim(), half = rd / 2;
  const double theta = a.has_theta() ? a.theta() : 10000.0;
  HostTensor out = F64(xd);
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t s = 0; s < ns; ++s) {
        double pos = static_cast<double>(s + a.position_offset());
        if (in.size() > 1) pos = At(in[1], in[1].rank() == 2 ? b * ns + s : s);
        const int64_t row = ((b * nh + h) * ns + s) * d;
        for (int64_t x = rd; x < d; ++x) out.SetFromDouble(row + x, At(in[0], row + x));
        for (int64_t i = 0; i < half; ++i) {
          const double angle = pos * std::pow(theta, -2.0 * i / rd);
          const int64_t i1 = a.interleaved() ? 2 * i : i,
                        i2 = a.interleaved() ? 2 * i + 1 : i + half;
          const double u = At(in[0], row + i1), w = At(in[0], row + i2);
          out.SetFromDouble(row + i1, u * std::cos(angle) - w * std::sin(angle));
          out.SetFromDouble(row + i2, w * std::cos(angle) + u * std::sin(angle));
        }
      }
    }
  }
  std::vector<HostTensor> result;
  result.push_back(std::move(out));
  return result;
}

struct RopeCase {
  std::string tag;
  Dims x;
  bool interleaved = false;
  int64_t rotary_dim = 0;
  double theta = 0;  // 0 = default
  int64_t offset = 0;
  DType pos_dtype = v1::DTYPE_UNSPECIFIED;
  bool pos_per_batch = false;
  int64_t max_pos = 0;
};

Case MakeRope(const RopeCase& rc, DType dtype) {
  Case c;
  c.name = absl::StrCat("rope/", DTypeName(dtype), "_", rc.tag, "_", absl::StrJoin(rc.x, "x"));
  std::mt19937_64 rng = RngFor(c.name);
  c.spec.name = c.name;
  c.spec.label = absl::StrCat("case ", c.name);
  c.spec.op = v1::OP_ROPE;
  auto* a = c.spec.attrs.mutable_rope();
  a->set_interleaved(rc.interleaved);
  a->set_rotary_dim(rc.rotary_dim);
  if (rc.theta != 0) a->set_theta(rc.theta);
  a->set_position_offset(rc.offset);
  c.spec.inputs = {Desc(dtype, rc.x)};
  c.spec.outputs = {Desc(dtype, rc.x)};
  c.inputs.push_back(RandomTensor(rng, dtype, rc.x));
  if (rc.pos_dtype != v1::DTYPE_UNSPECIFIED) {
    const Dims pd = rc.pos_per_batch ? Dims{rc.x[0], rc.x[2]} : Dims{rc.x[2]};
    c.spec.inputs.push_back(Desc(rc.pos_dtype, pd));
    c.inputs.push_back(RandomTensor(rng, rc.pos_dtype, pd, 0, static_cast<double>(rc.max_pos)));
  }
  c.reference = RopeReference;
  c.tol = DefaultTolerance(dtype, 2);
  return c;
}

std::vector<Case> RopeCases() {
  const std::vector<RopeCase> f32 = {
      {"half_split", {2, 3, 17, 16}},
      {"interleaved", {2, 3, 17, 16}, true},
      {"partial", {1, 2, 17, 16}, false, 8},
      {"partial_interleaved", {1, 2, 17, 18}, true, 6},
      {"theta_offset", {1, 2, 65, 64}, false, 0, 500000, 1000},
      {"pos_s_i32", {2, 2, 17, 32}, false, 0, 0, 0, v1::DTYPE_I32, false, 100000},
      {"pos_bs_i64", {2, 2, 17, 32}, true, 0, 0, 0, v1::DTYPE_I64, true, 5000},
      {"pos_bs_partial_u8", {3, 1, 5, 10}, false, 4, 0, 0, v1::DTYPE_U8, true, 255},
      {"pos_i16", {1, 1, 7, 2}, false, 0, 0, 0, v1::DTYPE_I16, false, 30000},
      {"d2", {1, 1, 3, 2}},
      {"one", {1, 1, 1, 2}},
      {"empty_s", {2, 2, 0, 8}},
      {"empty_b_pos", {0, 2, 3, 8}, false, 0, 0, 0, v1::DTYPE_I64, true, 10},
      {"empty_d", {1, 2, 3, 0}},
      {"long", {1, 4, 1024, 128}, false, 64, 0, 7},
  };
  std::vector<Case> cases;
  for (const RopeCase& rc : f32) cases.push_back(MakeRope(rc, v1::DTYPE_F32));
  const std::vector<RopeCase> low = {
      {"half_split", {2, 3, 17, 16}},
      {"interleaved_pos", {2, 2, 17, 32}, true, 0, 0, 0, v1::DTYPE_I32, true, 4000},
      {"partial", {1, 2, 17, 16}, false, 8},
  };
  for (DType dtype : {v1::DTYPE_F16, v1::DTYPE_BF16}) {
    for (const RopeCase& rc : low) cases.push_back(MakeRope(rc, dtype));
  }
  return cases;
}

const FamilyRegistration kAttention("attention", AttentionCases);
const FamilyRegistration kRope("rope", RopeCases);

}  // namespace
}  // namespace kiln::conformance
