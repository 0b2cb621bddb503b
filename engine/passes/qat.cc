#include "engine/passes/qat.h"

#include <cmath>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/ir/rewriter.h"

namespace kiln::passes {
namespace {

using ir::ValueRef;

constexpr double kMinRangeFraction = 0x1p-30;  // scales stay off 0
constexpr double kMinRange = 1e-30;

struct Grid {
  double qmin, qmax;
};

Grid GridOf(int bits, bool symmetric) {
  if (symmetric) return {-std::ldexp(1.0, bits - 1), std::ldexp(1.0, bits - 1) - 1};
  return {0, std::ldexp(1.0, bits) - 1};
}

class Qat {
 public:
  Qat(ir::Graph& g, const v1::QatSpec& spec, std::vector<LsqScale>* lsq)
      : g_(g), spec_(spec), bits_(spec.bits() == 0 ? 8 : spec.bits()), lsq_(lsq) {}

  absl::Status Visit(int32_t id) {
    const ir::Node& n = *g_.FindNode(id);
    if (n.operands.size() < 2) return absl::OkStatus();
    const ValueRef x = n.operands[0], w = n.operands[1];
    if (g_.TypeOf(x).dtype != v1::DTYPE_F32 || g_.TypeOf(w).dtype != v1::DTYPE_F32) {
      return absl::OkStatus();
    }
    const int64_t wrank = g_.TypeOf(w).rank();
    int64_t channel = -1;
    if (spec_.weight_per_channel() && wrank >= 1) {
      if (n.op == v1::OP_CONV) {
        channel = 0;
      } else {
        // A vector weight ([K]) has no output channel.
        channel = wrank == 1 ? -1 : n.attrs.matmul().transpose_b() ? wrank - 2 : wrank - 1;
      }
    }
    ir::Rewriter r(g_, n, n.path);
    ValueRef qw = Weight(r, n, w, channel);
    ValueRef qx = spec_.weights_only() ? x : Activation(r, x);
    KILN_RETURN_IF_ERROR(r.status()) << "while quantizing the operands of " << ir::NodeLabel(n);
    ir::Node& m = *g_.FindNode(id);
    m.operands[0] = qx;
    m.operands[1] = qw;
    return absl::OkStatus();
  }

 private:
  // max(v, kMinRangeFraction * v_max_over_tensor, kMinRange) keeps a scale
  // positive however the tensor is filled (all zeros included).
  ValueRef Positive(ir::Rewriter& r, ValueRef range) {
    return r.Binary(v1::BINARY_MAX, range, r.Scalar(kMinRange, v1::DTYPE_F32));
  }

  // Reduces `v` over every axis but `channel` (all when -1).
  ValueRef Reduce(ir::Rewriter& r, v1::ReduceKind kind, ValueRef v, int64_t channel) {
    std::vector<int64_t> axes;
    for (int64_t i = 0; i < g_.TypeOf(v).rank(); ++i) {
      if (i != channel) axes.push_back(i);
    }
    if (axes.empty()) return v;
    return r.Reduce(kind, v, axes, false);
  }

  v1::Attrs FakeAttrs(int64_t channel, bool symmetric) {
    v1::Attrs a;
    auto* f = a.mutable_fake_quantize();
    f->set_bits(bits_);
    f->set_symmetric(symmetric);
    if (channel >= 0) f->set_axis(channel);
    return a;
  }

  // fake_quantize(v) with its scale (and zero point) from v's range.
  ValueRef FromRange(ir::Rewriter& r, ValueRef v, int64_t channel, bool symmetric) {
    const Grid grid = GridOf(bits_, symmetric);
    // One new node per statement: the order in which a call's arguments are
    // evaluated is unspecified (g++ and clang differ), and the nodes' ids follow
    // the order they are created in. This is the order g++ used to give.
    if (symmetric) {
      ValueRef amax = Reduce(r, v1::REDUCE_MAX, r.Unary(v1::UNARY_ABS, v), channel);
      const ValueRef fraction = r.Scalar(kMinRangeFraction, v1::DTYPE_F32);
      const ValueRef whole = Reduce(r, v1::REDUCE_MAX, amax, -1);
      amax = r.Binary(v1::BINARY_MAX, amax, r.Binary(v1::BINARY_MUL, whole, fraction));
      const ValueRef qmax = r.Scalar(grid.qmax, v1::DTYPE_F32);
      ValueRef s = r.Binary(v1::BINARY_DIV, Positive(r, amax), qmax);
      return r.Add(v1::OP_FAKE_QUANTIZE, {v, s}, FakeAttrs(channel, true));
    }
    const ValueRef zero = r.Scalar(0, v1::DTYPE_F32);
    ValueRef lo = r.Binary(v1::BINARY_MIN, Reduce(r, v1::REDUCE_MIN, v, channel), zero);
    ValueRef hi = r.Binary(v1::BINARY_MAX, Reduce(r, v1::REDUCE_MAX, v, channel), zero);
    ValueRef range = r.Binary(v1::BINARY_SUB, hi, lo);
    const ValueRef fraction = r.Scalar(kMinRangeFraction, v1::DTYPE_F32);
    const ValueRef whole = Reduce(r, v1::REDUCE_MAX, range, -1);
    range = r.Binary(v1::BINARY_MAX, range, r.Binary(v1::BINARY_MUL, whole, fraction));
    const ValueRef qmax = r.Scalar(grid.qmax, v1::DTYPE_F32);
    ValueRef s = r.Binary(v1::BINARY_DIV, Positive(r, range), qmax);
    // zp = round(-lo / s), on [0, qmax] since lo <= 0 <= hi; clamped against rounding.
    ValueRef zp = r.Unary(v1::UNARY_ROUND, r.Binary(v1::BINARY_DIV, r.Unary(v1::UNARY_NEG, lo), s));
    zp = r.Binary(v1::BINARY_MIN, zp, r.Scalar(grid.qmax, v1::DTYPE_F32));
    return r.Add(v1::OP_FAKE_QUANTIZE, {v, s, zp}, FakeAttrs(channel, false));
  }

  ValueRef Weight(ir::Rewriter& r, const ir::Node& n, ValueRef w, int64_t channel) {
    auto it = weights_.find(w);
    if (it != weights_.end()) return it->second;
    ValueRef q =
        spec_.lsq() ? Lsq(r, n, w, channel) : FromRange(r, w, channel, !spec_.weight_asymmetric());
    weights_[w] = q;
    return q;
  }

  ValueRef Activation(ir::Rewriter& r, ValueRef x) {
    auto it = activations_.find(x);
    if (it != activations_.end()) return it->second;
    ValueRef q = FromRange(r, x, -1, !spec_.activation_asymmetric());
    activations_[x] = q;
    return q;
  }

  // fake_quantize_lsq(w, s) with s a new trainable param that reads as LSQ's
  // initialisation 2 * mean|w| / sqrt(qmax) while it is not positive.
  ValueRef Lsq(ir::Rewriter& r, const ir::Node& n, ValueRef w, int64_t channel) {
    const Grid grid = GridOf(bits_, true);
    ir::TensorType st;
    st.dtype = v1::DTYPE_F32;
    if (channel >= 0) st.dims = {g_.TypeOf(w).dims[channel]};
    const ir::Node& wn = *g_.FindNode(w.node);
    std::string base = !wn.name.empty()  ? wn.name
                       : !n.name.empty() ? n.name
                                         : absl::StrCat("node", n.id);
    auto p = std::make_unique<ir::Node>();
    p->op = v1::OP_PARAM;
    p->name = absl::StrCat(base, kLsqScaleSuffix);
    p->outputs.push_back(st);
    const std::string name = p->name;
    ValueRef s = g_.AddNode(std::move(p))->out();
    ValueRef mean_abs = Reduce(r, v1::REDUCE_MEAN, r.Unary(v1::UNARY_ABS, w), channel);
    ValueRef init = Positive(
        r, r.Binary(v1::BINARY_MUL, mean_abs, r.Scalar(2 / std::sqrt(grid.qmax), v1::DTYPE_F32)));
    ValueRef set = r.Compare(v1::COMPARE_GT, s, r.Scalar(0, v1::DTYPE_F32));
    ValueRef eff = r.Where(set, s, init);
    if (lsq_ != nullptr) lsq_->push_back({name, init});
    v1::Attrs a;
    auto* f = a.mutable_fake_quantize_lsq();
    f->set_bits(bits_);
    f->set_symmetric(true);
    if (channel >= 0) f->set_axis(channel);
    return r.Add(v1::OP_FAKE_QUANTIZE_LSQ, {w, eff}, std::move(a));
  }

  ir::Graph& g_;
  const v1::QatSpec& spec_;
  const int bits_;
  std::vector<LsqScale>* lsq_;
  absl::flat_hash_map<ValueRef, ValueRef> weights_, activations_;
};

}  // namespace

absl::Status ValidateQat(const v1::QatSpec& s) {
  if (s.bits() != 0 && s.bits() != 8 && s.bits() != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("qat bits = ", s.bits(), " is not supported; use 8 or 4 (0 = 8)"));
  }
  if (s.lsq() && s.weight_asymmetric()) {
    return absl::InvalidArgumentError(
        "qat lsq learns symmetric weight scales; it cannot be combined with weight_asymmetric");
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ApplyQat(ir::Graph& g, const v1::QatSpec& spec,
                              std::vector<LsqScale>* lsq_scales) {
  std::vector<int32_t> targets;
  for (const auto& n : g.nodes()) {
    if ((n->op == v1::OP_MATMUL || n->op == v1::OP_CONV) && n->outputs.size() == 1 &&
        n->type().dtype == v1::DTYPE_F32) {
      targets.push_back(n->id);
    }
  }
  Qat qat(g, spec, lsq_scales);
  for (int32_t id : targets) KILN_RETURN_IF_ERROR(qat.Visit(id));
  if (targets.empty()) return false;
  KILN_RETURN_IF_ERROR(g.SortTopologically());
  return true;
}

}  // namespace kiln::passes
