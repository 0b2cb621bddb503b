#include "engine/passes/decompose.h"

#include <cmath>
#include <limits>
#include <numeric>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/custom_ops.h"
#include "base/status.h"
#include "engine/passes/autodiff_internal.h"
#include "engine/ir/infer.h"
#include "engine/ir/rewriter.h"
#include "engine/ir/verifier.h"

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
  ValueRef q = n.operands[0], k = n.operands[1], v = n.operands[2];
  // The packed layout ([B, S, H*D], heads from the attributes): split the
  // heads out, decompose as [B, H, S, D], merge them back.
  const bool packed = g.TypeOf(q).rank() == 3;
  if (packed) {
    const int64_t hq = a.heads(), hkv = a.kv_heads() != 0 ? a.kv_heads() : a.heads();
    auto split = [&](ValueRef x, int64_t heads) {
      const IrDims d = g.TypeOf(x).dims;
      return r.Transpose(r.Reshape(x, {d[0], d[1], heads, d[2] / heads}), {0, 2, 1, 3});
    };
    q = split(q, hq), k = split(k, hkv), v = split(v, hkv);
    if (!r.ok()) return ValueRef{};
  }
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
  if (packed) o = r.Reshape(r.Transpose(o, {0, 2, 1, 3}), {b, sq, hq * dv});
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

// GroupNorm over x [N, C, spatial...]: each of the `groups` groups of C/groups
// channels is normalized over its channels and spatial positions together
// (reshape to [N, G, C/G * spatial], mean and variance over the last axis),
// then the optional per-channel scale and bias. Needs concrete dims (compiles
// have them); a symbolic one fails the reshape with its own error.
ValueRef DecomposeGroupNorm(Rewriter& r, ir::Graph& g, const ir::Node& n) {
  const ValueRef x = n.operands[0];
  const ir::TensorType& t = g.TypeOf(x);
  const auto& a = n.attrs.group_norm();
  const double eps = a.has_epsilon() ? a.epsilon() : 1e-5;
  const int64_t groups = a.groups();
  int64_t per_group = t.dims[1] / groups;  // infer checked divisibility
  for (int64_t k = 2; k < t.rank(); ++k) per_group *= t.dims[k];  // <= the element count
  const ValueRef xs = r.Reshape(x, {t.dims[0], groups, per_group});
  const ValueRef mean = r.Reduce(v1::REDUCE_MEAN, xs, {2}, true);
  const ValueRef centered = r.Binary(v1::BINARY_SUB, xs, mean);
  const ValueRef var = r.Reduce(v1::REDUCE_MEAN, r.Binary(v1::BINARY_MUL, centered, centered), {2}, true);
  const ValueRef inv = r.Unary(v1::UNARY_RSQRT, r.Binary(v1::BINARY_ADD, var, r.Scalar(eps, t.dtype)));
  ValueRef y = r.Reshape(r.Binary(v1::BINARY_MUL, centered, inv), t.dims);
  IrDims per_channel(t.rank(), 1);
  per_channel[1] = t.dims[1];
  if (n.operands.size() > 1) y = r.Binary(v1::BINARY_MUL, y, r.Reshape(n.operands[1], per_channel));
  if (n.operands.size() > 2) y = r.Binary(v1::BINARY_ADD, y, r.Reshape(n.operands[2], per_channel));
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
    // One node per statement: the order of a call's arguments is unspecified
    // (g++ evaluates them right to left, clang left to right), and node ids,
    // hence the printed graph, follow creation order.
    case v1::UNARY_GELU: {  // 0.5 x (1 + erf(x / sqrt 2))
      const ValueRef e = r.Unary(v1::UNARY_ERF, r.Binary(v1::BINARY_MUL, x, c(M_SQRT1_2)));
      const ValueRef one_plus = r.Binary(v1::BINARY_ADD, e, c(1.0));
      const ValueRef half_x = r.Binary(v1::BINARY_MUL, x, c(0.5));
      return r.Binary(v1::BINARY_MUL, half_x, one_plus);
    }
    case v1::UNARY_GELU_TANH: {  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
      const ValueRef x3 = r.Binary(v1::BINARY_MUL, r.Binary(v1::BINARY_MUL, x, x), x);
      const ValueRef scale = c(std::sqrt(2.0 / M_PI));
      const ValueRef cubic = r.Binary(v1::BINARY_MUL, x3, c(0.044715));
      const ValueRef inner = r.Binary(v1::BINARY_MUL, r.Binary(v1::BINARY_ADD, x, cubic), scale);
      const ValueRef one = c(1.0);
      const ValueRef one_plus = r.Binary(v1::BINARY_ADD, r.Unary(v1::UNARY_TANH, inner), one);
      const ValueRef half_x = r.Binary(v1::BINARY_MUL, x, c(0.5));
      return r.Binary(v1::BINARY_MUL, half_x, one_plus);
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

// ---- control flow, lowered by inlining ------------------------------------
// Kiln graphs are pure, so an If computes both branches and selects each
// result with Where on the predicate, and a Scan whose length is known is
// unrolled: the body inlined once per step, xs sliced, ys stacked. Both cost
// what they compute (an If's untaken branch too) and need no runtime support,
// so they compile on every device. While (a data-dependent trip count) is not
// lowered.

// One lowering may inline at most this many nodes, and the graph may not grow
// past kMaxLoweredGraphNodes through lowerings (a Scan nested in a Scan's body
// lowers again once inlined: this bounds the product, not only each factor).
constexpr int64_t kMaxInlinedNodes = int64_t{1} << 16;
constexpr int64_t kMaxLoweredGraphNodes = int64_t{1} << 18;

// Inlines `body` with its inputs (in node order) bound to `args`; returns its
// outputs. `budget` counts the nodes inlined so far.
absl::StatusOr<std::vector<ValueRef>> Inline(Rewriter& r, const ir::Node& n, const v1::Graph& body,
                                             const std::vector<ValueRef>& args, int64_t* budget) {
  std::vector<ir::TensorType> types;
  for (ValueRef a : args) types.push_back(r.TypeOf(a));
  ir::VerifyOptions opts;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<ir::Graph> sub, ir::ImportGraph(body, opts, 1));
  // Rebind the inputs to the values they receive, as InferSubgraph does, and
  // re-infer so every inner type is concrete.
  std::vector<ir::Node*> inputs;
  for (const auto& m : sub->nodes()) {
    if (m->op == v1::OP_INPUT) inputs.push_back(m.get());
  }
  if (inputs.size() != args.size()) {
    return absl::InvalidArgumentError(absl::StrCat(ir::NodeLabel(n), ": a subgraph has ", inputs.size(),
                                                   " inputs but receives ", args.size(), " values"));
  }
  for (size_t i = 0; i < inputs.size(); ++i) inputs[i]->outputs[0] = types[i];
  KILN_RETURN_IF_ERROR(ir::VerifyGraph(*sub, opts, 1));
  *budget += static_cast<int64_t>(sub->nodes().size());
  if (*budget > kMaxInlinedNodes) {
    return absl::ResourceExhaustedError(absl::StrCat(ir::NodeLabel(n), ": lowering it would inline more than ",
                                                     kMaxInlinedNodes, " nodes"));
  }
  if (static_cast<int64_t>(r.graph().nodes().size() + sub->nodes().size()) > kMaxLoweredGraphNodes) {
    return absl::ResourceExhaustedError(absl::StrCat(ir::NodeLabel(n), ": lowering control flow would grow the graph past ",
                                                     kMaxLoweredGraphNodes, " nodes"));
  }
  absl::flat_hash_map<int32_t, int32_t> ids;  // sub node id -> parent node id
  absl::flat_hash_map<int32_t, ValueRef> bound;  // sub input id -> parent value
  for (size_t i = 0; i < inputs.size(); ++i) bound[inputs[i]->id] = args[i];
  auto map = [&](ValueRef v) -> ValueRef {
    if (auto b = bound.find(v.node); b != bound.end()) return b->second;
    return ValueRef{ids.at(v.node), v.output};
  };
  for (const auto& m : sub->nodes()) {
    if (m->op == v1::OP_INPUT) continue;
    if (m->op == v1::OP_PARAM) {
      return absl::InvalidArgumentError(absl::StrCat(ir::NodeLabel(n), ": a subgraph declares param \"", m->name,
                                                     "\"; pass it in as an operand"));
    }
    ValueRef made;
    if (m->op == v1::OP_CONSTANT) {
      made = r.Constant(m->value->Clone());
    } else {
      std::vector<ValueRef> ops;
      for (ValueRef o : m->operands) ops.push_back(map(o));
      made = r.Add(m->op, std::move(ops), m->attrs);
    }
    if (!r.ok()) return r.status();
    ids[m->id] = made.node;
  }
  std::vector<ValueRef> outs;
  for (const ir::GraphOutput& o : sub->outputs()) outs.push_back(map(o.value));
  return outs;
}

absl::StatusOr<std::vector<ValueRef>> LowerIf(Rewriter& r, const ir::Node& n) {
  const std::vector<ValueRef> args(n.operands.begin() + 1, n.operands.end());
  int64_t budget = 0;
  KILN_ASSIGN_OR_RETURN(std::vector<ValueRef> then_outs, Inline(r, n, n.attrs.if_().then_branch(), args, &budget));
  KILN_ASSIGN_OR_RETURN(std::vector<ValueRef> else_outs, Inline(r, n, n.attrs.if_().else_branch(), args, &budget));
  std::vector<ValueRef> outs;
  for (size_t i = 0; i < then_outs.size() && i < else_outs.size(); ++i) {
    outs.push_back(r.Where(n.operands[0], then_outs[i], else_outs[i]));
  }
  return outs;
}

absl::StatusOr<std::vector<ValueRef>> LowerScan(Rewriter& r, ir::Graph& g, const ir::Node& n) {
  const auto& a = n.attrs.scan();
  const int nc = a.num_carries();
  const int64_t len = a.length();
  std::vector<ValueRef> carries(n.operands.begin(), n.operands.begin() + nc);
  std::vector<std::vector<ValueRef>> ys(n.outputs.size() - nc, std::vector<ValueRef>(static_cast<size_t>(len)));
  int64_t budget = 0;
  for (int64_t k = 0; k < len; ++k) {
    const int64_t t = a.reverse() ? len - 1 - k : k;
    std::vector<ValueRef> args = carries;
    for (size_t i = nc; i < n.operands.size(); ++i) {
      const ir::TensorType& xt = g.TypeOf(n.operands[i]);
      v1::Attrs sa;
      sa.mutable_slice()->add_start(t);
      sa.mutable_slice()->add_stop(t + 1);
      sa.mutable_slice()->add_axes(0);
      const ValueRef row = r.Add(v1::OP_SLICE, {n.operands[i]}, sa);
      args.push_back(r.Reshape(row, IrDims(xt.dims.begin() + 1, xt.dims.end())));
    }
    if (!r.ok()) return r.status();
    KILN_ASSIGN_OR_RETURN(std::vector<ValueRef> outs, Inline(r, n, a.body(), args, &budget));
    for (int i = 0; i < nc; ++i) carries[i] = outs[i];
    for (size_t j = 0; j < ys.size(); ++j) {
      IrDims d = r.TypeOf(outs[nc + j]).dims;
      d.insert(d.begin(), 1);
      ys[j][t] = r.Reshape(outs[nc + j], d);
    }
  }
  std::vector<ValueRef> result = carries;
  for (size_t j = 0; j < ys.size(); ++j) {
    if (len == 0) {  // an empty stack: a [0, ...] constant
      absl::StatusOr<HostTensor> empty = HostTensor::Create(n.outputs[nc + j].dtype,
                                                            Dims(n.outputs[nc + j].dims.begin(), n.outputs[nc + j].dims.end()));
      if (!empty.ok()) return empty.status();
      result.push_back(r.Constant(*std::move(empty)));
      continue;
    }
    if (len == 1) {
      result.push_back(ys[j][0]);
      continue;
    }
    v1::Attrs ca;
    ca.mutable_concat()->set_axis(0);
    result.push_back(r.Add(v1::OP_CONCAT, std::vector<ValueRef>(ys[j].begin(), ys[j].end()), ca));
  }
  return result;
}

// kiln.max_pool_backward(x, y, g) as the composition autodiff writes where
// no device has the kernel.
absl::StatusOr<ValueRef> DecomposeMaxPoolBackward(ir::Graph& graph, const ir::Node& node) {
  v1::PoolAttrs pool;
  if (node.attrs.custom().name() != kMaxPoolBackwardOp || node.operands.size() != 3 ||
      !pool.ParseFromString(node.attrs.custom().payload())) {
    return absl::InvalidArgumentError(absl::StrCat(ir::NodeLabel(node), " has no decomposition"));
  }
  ad::Builder b(graph, node, v1::PATH_COMMON_IR);
  const ValueRef out =
      ad::MaxPoolVjpComposition(b, node.operands[0], node.operands[1], pool, node.operands[2]);
  if (!b.status().ok()) return b.status();
  if (out.node < 0 || !(graph.TypeOf(out) == node.outputs[0])) {
    return absl::InternalError(absl::StrCat(ir::NodeLabel(node), ": decomposition has the wrong type"));
  }
  return out;
}

// kiln.conv2d_backward_weights(x, g, w) as the transposes and conv autodiff
// writes where no device has the kernel.
absl::StatusOr<ValueRef> DecomposeConvBackwardWeights(ir::Graph& graph, const ir::Node& node) {
  v1::ConvAttrs conv;
  if (node.operands.size() != 3 || !conv.ParseFromString(node.attrs.custom().payload())) {
    return absl::InvalidArgumentError(absl::StrCat(ir::NodeLabel(node), " has no decomposition"));
  }
  ad::Builder b(graph, node, v1::PATH_COMMON_IR);
  const ValueRef out =
      ad::ConvWeightGradComposition(b, node.operands[0], node.operands[1], node.operands[2], conv);
  if (!b.status().ok()) return b.status();
  if (out.node < 0 || !(graph.TypeOf(out) == node.outputs[0])) {
    return absl::InternalError(absl::StrCat(ir::NodeLabel(node), ": decomposition has the wrong type"));
  }
  return out;
}

}  // namespace

bool HasDecomposition(const ir::Node& node) {
  switch (node.op) {
    case v1::OP_ATTENTION: case v1::OP_LAYER_NORM: case v1::OP_RMS_NORM: case v1::OP_SOFTMAX:
    case v1::OP_LOG_SOFTMAX: case v1::OP_DOT_GENERAL: case v1::OP_GROUP_NORM: case v1::OP_IF:
      return true;
    case v1::OP_SCAN:  // unrolled: the length must be known
      return node.attrs.scan().length() >= 0;
    case v1::OP_CUSTOM:  // the built-in max pool derivative (base/custom_ops.h)
      return node.attrs.custom().name() == kMaxPoolBackwardOp ||
             node.attrs.custom().name() == kConvBackwardWeightsOp;
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
  if (node.op == v1::OP_CUSTOM) {
    KILN_ASSIGN_OR_RETURN(ValueRef out, node.attrs.custom().name() == kConvBackwardWeightsOp
                                            ? DecomposeConvBackwardWeights(graph, node)
                                            : DecomposeMaxPoolBackward(graph, node));
    graph.ReplaceAllUses(node.out(), out);
    std::vector<int32_t> made;
    for (const auto& n : graph.nodes()) {
      if (n->id >= first_new) made.push_back(n->id);
    }
    return made;
  }
  Rewriter r(graph, node, DecompositionPath(node));
  if (node.op == v1::OP_IF || node.op == v1::OP_SCAN) {  // several results
    KILN_ASSIGN_OR_RETURN(std::vector<ValueRef> outs,
                          node.op == v1::OP_IF ? LowerIf(r, node) : LowerScan(r, graph, node));
    if (!r.ok()) return r.status();
    if (outs.size() != node.outputs.size()) {
      return absl::InternalError(absl::StrCat(ir::NodeLabel(node), ": lowered to ", outs.size(), " results, want ",
                                              node.outputs.size()));
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      if (!(graph.TypeOf(outs[i]) == node.outputs[i])) {
        return absl::InvalidArgumentError(absl::StrCat(ir::NodeLabel(node), ": result ", i, " is ",
                                                       ir::TypeToString(node.outputs[i]), " but its lowering yields ",
                                                       ir::TypeToString(graph.TypeOf(outs[i]))));
      }
    }
    for (size_t i = 0; i < outs.size(); ++i) graph.ReplaceAllUses(node.out(static_cast<int>(i)), outs[i]);
    std::vector<int32_t> made;
    for (const auto& n : graph.nodes()) {
      if (n->id >= first_new) made.push_back(n->id);
    }
    return made;
  }
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
