#include "engine/passes/decompose.h"

#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "engine/ir/infer.h"
#include "engine/ir/rewriter.h"

namespace kiln::passes {
namespace {

using ir::IrDims;
using ir::Rewriter;
using ir::ValueRef;

std::vector<int64_t> TrailingAxes(int64_t axis, int64_t rank) {
  std::vector<int64_t> axes;
  for (int64_t i = axis; i < rank; ++i) axes.push_back(i);
  return axes;
}

int64_t NormAxis(int64_t axis, int64_t rank) { return axis < 0 ? axis + rank : axis; }

// Which keys each query may see, for the structural mask kinds, as a bool
// [Sq, Sk] constant (positions aligned at the end, as graph.proto documents).
HostTensor StructuralMask(const v1::AttentionAttrs& a, int64_t sq, int64_t sk) {
  HostTensor m = std::move(HostTensor::Create(v1::DTYPE_BOOL, {sq, sk})).value();
  auto* p = m.data_as<uint8_t>();
  for (int64_t i = 0; i < sq; ++i) {
    const int64_t pos = i + (sk - sq);
    for (int64_t j = 0; j < sk; ++j) {
      bool visible = j <= pos;
      if (a.mask() == v1::MASK_PREFIX) visible = visible || j < a.prefix();
      if (a.mask() == v1::MASK_SLIDING_WINDOW) visible = visible && pos - j < a.window();
      p[i * sk + j] = visible ? 1 : 0;
    }
  }
  return m;
}

ValueRef DecomposeAttention(Rewriter& r, ir::Graph& g, const ir::Node& n) {
  const auto& a = n.attrs.attention();
  const ValueRef q = n.operands[0], k = n.operands[1], v = n.operands[2];
  const IrDims qd = g.TypeOf(q).dims, kd = g.TypeOf(k).dims, vd = g.TypeOf(v).dims;
  const DType dt = g.TypeOf(q).dtype;
  const int64_t b = qd[0], hq = qd[1], sq = qd[2], d = qd[3];
  const int64_t hkv = kd[1], sk = kd[2], dv = vd[3];
  const int64_t group = hkv > 0 ? hq / hkv : 1;
  // GQA: the `group` query heads sharing a kv head are adjacent, so folding
  // them into the query axis gives [B, Hkv, G*Sq, D] against k [B, Hkv, Sk, D].
  ValueRef q2 = group == 1 ? q : r.Reshape(q, {b, hkv, group * sq, d});
  ValueRef s = r.MatMul(q2, k, false, true);
  if (group != 1) s = r.Reshape(s, {b, hq, sq, sk});
  const double scale = a.has_scale() ? a.scale() : 1.0 / std::sqrt(static_cast<double>(d));
  s = r.Binary(v1::BINARY_MUL, s, r.Scalar(scale, dt));
  if (a.softcap() > 0) {
    const ValueRef cap = r.Scalar(a.softcap(), dt);
    s = r.Binary(v1::BINARY_MUL, r.Unary(v1::UNARY_TANH, r.Binary(v1::BINARY_DIV, s, cap)), cap);
  }
  std::optional<ValueRef> mask;
  switch (a.mask()) {
    case v1::MASK_CAUSAL: case v1::MASK_PREFIX: case v1::MASK_SLIDING_WINDOW:
      mask = r.Constant(StructuralMask(a, sq, sk));
      break;
    case v1::MASK_CUSTOM: {
      const IrDims md = g.TypeOf(n.operands[3]).dims;
      mask = md.size() == 2 ? r.Reshape(n.operands[3], {md[0], 1, 1, md[1]})
                            : r.Reshape(n.operands[3], {md[0], 1, md[1], md[2]});
      break;
    }
    case v1::MASK_BIAS:
      s = r.Binary(v1::BINARY_ADD, s, n.operands[3]);
      break;
    default:
      break;
  }
  if (mask) {
    s = r.Where(*mask, s, r.Scalar(-std::numeric_limits<double>::infinity(), dt));
  }
  ValueRef p = r.Softmax(s, -1);
  // A query that sees no key softmaxes a row of -inf into NaN; the op's
  // contract is a zero output for it.
  if (mask) p = r.Where(*mask, p, r.Scalar(0.0, dt));
  if (group != 1) p = r.Reshape(p, {b, hkv, group * sq, sk});
  ValueRef o = r.MatMul(p, v);
  if (group != 1) o = r.Reshape(o, {b, hq, sq, dv});
  return o;
}

ValueRef DecomposeNorm(Rewriter& r, ir::Graph& g, const ir::Node& n, bool rms) {
  const ValueRef x = n.operands[0];
  const ir::TensorType& t = g.TypeOf(x);
  const auto& ln = n.attrs.layer_norm();
  const auto& rn = n.attrs.rms_norm();
  const int64_t axis = NormAxis(rms ? (rn.has_axis() ? rn.axis() : -1) : (ln.has_axis() ? ln.axis() : -1),
                                t.rank());
  const double eps = rms ? (rn.has_epsilon() ? rn.epsilon() : 1e-6)
                         : (ln.has_epsilon() ? ln.epsilon() : 1e-5);
  const std::vector<int64_t> axes = TrailingAxes(axis, t.rank());
  ValueRef centered = x;
  if (!rms) {
    const ValueRef mean = r.Reduce(v1::REDUCE_MEAN, x, axes, true);
    centered = r.Binary(v1::BINARY_SUB, x, mean);
  }
  const ValueRef var =
      r.Reduce(v1::REDUCE_MEAN, r.Binary(v1::BINARY_MUL, centered, centered), axes, true);
  const ValueRef inv =
      r.Unary(v1::UNARY_RSQRT, r.Binary(v1::BINARY_ADD, var, r.Scalar(eps, t.dtype)));
  ValueRef y = r.Binary(v1::BINARY_MUL, centered, inv);
  if (n.operands.size() > 1) y = r.Binary(v1::BINARY_MUL, y, n.operands[1]);
  if (!rms && n.operands.size() > 2) y = r.Binary(v1::BINARY_ADD, y, n.operands[2]);
  return y;
}

// x [N, C, ...] normalized over each group of C / groups channels (and every
// spatial position), then scaled and shifted per channel.
ValueRef DecomposeGroupNorm(Rewriter& r, ir::Graph& g, const ir::Node& n) {
  const ValueRef x = n.operands[0];
  const ir::TensorType& t = g.TypeOf(x);
  const auto& a = n.attrs.group_norm();
  const double eps = a.has_epsilon() ? a.epsilon() : 1e-5;
  int64_t rest = t.dims[1] / a.groups();
  for (int64_t i = 2; i < t.rank(); ++i) rest *= t.dims[i];
  const ValueRef grouped = r.Reshape(x, {t.dims[0], a.groups(), rest});
  const ValueRef mean = r.Reduce(v1::REDUCE_MEAN, grouped, {2}, true);
  const ValueRef centered = r.Binary(v1::BINARY_SUB, grouped, mean);
  const ValueRef var =
      r.Reduce(v1::REDUCE_MEAN, r.Binary(v1::BINARY_MUL, centered, centered), {2}, true);
  const ValueRef inv =
      r.Unary(v1::UNARY_RSQRT, r.Binary(v1::BINARY_ADD, var, r.Scalar(eps, t.dtype)));
  ValueRef y = r.Reshape(r.Binary(v1::BINARY_MUL, centered, inv), t.dims);
  ir::IrDims per_channel(t.rank(), 1);
  per_channel[1] = t.dims[1];
  if (n.operands.size() > 1) {
    y = r.Binary(v1::BINARY_MUL, y, r.Reshape(n.operands[1], per_channel));
  }
  if (n.operands.size() > 2) {
    y = r.Binary(v1::BINARY_ADD, y, r.Reshape(n.operands[2], per_channel));
  }
  return y;
}

ValueRef DecomposeSoftmax(Rewriter& r, ir::Graph& g, const ir::Node& n, bool log) {
  const ValueRef x = n.operands[0];
  const auto& attrs = log ? n.attrs.log_softmax() : n.attrs.softmax();
  const int64_t axis = NormAxis(attrs.has_axis() ? attrs.axis() : -1, g.TypeOf(x).rank());
  const ValueRef m = r.Reduce(v1::REDUCE_MAX, x, {axis}, true);
  const ValueRef shifted = r.Binary(v1::BINARY_SUB, x, m);
  const ValueRef e = r.Unary(v1::UNARY_EXP, shifted);
  const ValueRef sum = r.Reduce(v1::REDUCE_SUM, e, {axis}, true);
  if (log) return r.Binary(v1::BINARY_SUB, shifted, r.Unary(v1::UNARY_LOG, sum));
  return r.Binary(v1::BINARY_DIV, e, sum);
}

ValueRef DecomposeUnary(Rewriter& r, ir::Graph& g, const ir::Node& n) {
  const ValueRef x = n.operands[0];
  const DType dt = g.TypeOf(x).dtype;
  auto c = [&](double v) { return r.Scalar(v, dt); };
  switch (n.attrs.unary().kind()) {
    case v1::UNARY_GELU: {  // 0.5 x (1 + erf(x / sqrt 2))
      const ValueRef e = r.Unary(v1::UNARY_ERF, r.Binary(v1::BINARY_MUL, x, c(M_SQRT1_2)));
      return r.Binary(v1::BINARY_MUL, r.Binary(v1::BINARY_MUL, x, c(0.5)),
                      r.Binary(v1::BINARY_ADD, e, c(1.0)));
    }
    case v1::UNARY_GELU_TANH: {  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
      const ValueRef x3 = r.Binary(v1::BINARY_MUL, r.Binary(v1::BINARY_MUL, x, x), x);
      const ValueRef inner = r.Binary(
          v1::BINARY_MUL, r.Binary(v1::BINARY_ADD, x, r.Binary(v1::BINARY_MUL, x3, c(0.044715))),
          c(std::sqrt(2.0 / M_PI)));
      return r.Binary(v1::BINARY_MUL, r.Binary(v1::BINARY_MUL, x, c(0.5)),
                      r.Binary(v1::BINARY_ADD, r.Unary(v1::UNARY_TANH, inner), c(1.0)));
    }
    case v1::UNARY_SILU:
      return r.Binary(v1::BINARY_MUL, x, r.Unary(v1::UNARY_SIGMOID, x));
    default:
      return ValueRef{};
  }
}

// lax.dot_general as transpose + reshape + batched matmul + reshape.
ValueRef DecomposeDotGeneral(Rewriter& r, ir::Graph& g, const ir::Node& n) {
  const auto& dg = n.attrs.dot_general();
  const ValueRef lhs = n.operands[0], rhs = n.operands[1];
  const IrDims ld = g.TypeOf(lhs).dims, rd = g.TypeOf(rhs).dims;
  auto split = [](const IrDims& dims, const google::protobuf::RepeatedField<int64_t>& batch,
                  const google::protobuf::RepeatedField<int64_t>& contract,
                  std::vector<int64_t>* free) {
    std::vector<bool> used(dims.size());
    for (int64_t b : batch) used[b] = true;
    for (int64_t c : contract) used[c] = true;
    for (size_t i = 0; i < dims.size(); ++i) {
      if (!used[i]) free->push_back(static_cast<int64_t>(i));
    }
  };
  std::vector<int64_t> lfree, rfree;
  split(ld, dg.lhs_batch(), dg.lhs_contracting(), &lfree);
  split(rd, dg.rhs_batch(), dg.rhs_contracting(), &rfree);
  auto prod = [](const IrDims& dims, const std::vector<int64_t>& axes) {
    int64_t p = 1;
    for (int64_t a : axes) p *= dims[a];
    return p;
  };
  std::vector<int64_t> lbatch(dg.lhs_batch().begin(), dg.lhs_batch().end());
  std::vector<int64_t> rbatch(dg.rhs_batch().begin(), dg.rhs_batch().end());
  std::vector<int64_t> lcon(dg.lhs_contracting().begin(), dg.lhs_contracting().end());
  std::vector<int64_t> rcon(dg.rhs_contracting().begin(), dg.rhs_contracting().end());
  auto arrange = [&](ValueRef x, const IrDims& dims, std::vector<int64_t> perm, int64_t b,
                     int64_t m, int64_t k) {
    bool identity = true;
    for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
    if (!identity) x = r.Transpose(x, perm);
    if (r.TypeOf(x).dims == IrDims{b, m, k}) return x;
    return r.Reshape(x, {b, m, k});
  };
  const int64_t batch = prod(ld, lbatch), m = prod(ld, lfree), k = prod(ld, lcon),
                nn = prod(rd, rfree);
  std::vector<int64_t> lperm = lbatch;
  lperm.insert(lperm.end(), lfree.begin(), lfree.end());
  lperm.insert(lperm.end(), lcon.begin(), lcon.end());
  std::vector<int64_t> rperm = rbatch;
  rperm.insert(rperm.end(), rcon.begin(), rcon.end());
  rperm.insert(rperm.end(), rfree.begin(), rfree.end());
  const ValueRef a3 = arrange(lhs, ld, lperm, batch, m, k);
  const ValueRef b3 = arrange(rhs, rd, rperm, batch, k, nn);
  const ValueRef out = r.MatMul(a3, b3);
  IrDims final_dims;
  for (int64_t bb : lbatch) final_dims.push_back(ld[bb]);
  for (int64_t f : lfree) final_dims.push_back(ld[f]);
  for (int64_t f : rfree) final_dims.push_back(rd[f]);
  if (!r.ok() || r.TypeOf(out).dims == final_dims) return out;
  return r.Reshape(out, final_dims);
}

}  // namespace

bool HasDecomposition(const ir::Node& node) {
  switch (node.op) {
    case v1::OP_ATTENTION: case v1::OP_LAYER_NORM: case v1::OP_RMS_NORM: case v1::OP_SOFTMAX:
    case v1::OP_LOG_SOFTMAX: case v1::OP_DOT_GENERAL: case v1::OP_GROUP_NORM:
      return true;
    case v1::OP_UNARY: {
      const auto k = node.attrs.unary().kind();
      return k == v1::UNARY_GELU || k == v1::UNARY_GELU_TANH || k == v1::UNARY_SILU;
    }
    default:
      return false;
  }
}

v1::Path DecompositionPath(const ir::Node& node) {
  return node.op == v1::OP_DOT_GENERAL ? v1::PATH_REWRITTEN : v1::PATH_COMMON_IR;
}

absl::StatusOr<std::vector<int32_t>> Decompose(ir::Graph& graph, const ir::Node& node) {
  const int32_t first_new = graph.NextId();
  Rewriter r(graph, node, DecompositionPath(node));
  ValueRef out;
  switch (node.op) {
    case v1::OP_ATTENTION: out = DecomposeAttention(r, graph, node); break;
    case v1::OP_LAYER_NORM: out = DecomposeNorm(r, graph, node, false); break;
    case v1::OP_RMS_NORM: out = DecomposeNorm(r, graph, node, true); break;
    case v1::OP_GROUP_NORM: out = DecomposeGroupNorm(r, graph, node); break;
    case v1::OP_SOFTMAX: out = DecomposeSoftmax(r, graph, node, false); break;
    case v1::OP_LOG_SOFTMAX: out = DecomposeSoftmax(r, graph, node, true); break;
    case v1::OP_UNARY: out = DecomposeUnary(r, graph, node); break;
    case v1::OP_DOT_GENERAL: out = DecomposeDotGeneral(r, graph, node); break;
    default:
      return absl::InternalError(absl::StrCat(ir::NodeLabel(node), " has no decomposition"));
  }
  if (!r.ok()) return r.status();
  if (out.node < 0) return absl::InternalError(absl::StrCat(ir::NodeLabel(node), ": empty decomposition"));
  if (!(graph.TypeOf(out) == node.outputs[0])) {
    return absl::InternalError(absl::StrCat(ir::NodeLabel(node), ": decomposition yields ",
                                            ir::TypeToString(graph.TypeOf(out)), ", want ",
                                            ir::TypeToString(node.outputs[0])));
  }
  graph.ReplaceAllUses(node.out(), out);
  std::vector<int32_t> made;
  for (const auto& n : graph.nodes()) {
    if (n->id >= first_new) made.push_back(n->id);
  }
  return made;
}

}  // namespace kiln::passes
