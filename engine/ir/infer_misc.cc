// Inference for sources, quantization, control flow, losses, collectives,
// custom ops and the internal ops passes create.
#include "engine/ir/infer_internal.h"
#include "engine/ir/verifier.h"

#include <algorithm>

#include "base/custom_ops.h"

namespace kiln::ir::infer_internal {
namespace {

absl::Status InferSource(Ctx& c) {
  if (auto s = c.Arity(0, 0); !s.ok()) return s;
  if (c.node.op == v1::OP_CONSTANT) {
    if (!c.node.value) return c.Error("constant has no value");
    const HostTensor& v = *c.node.value;
    return c.Set(TensorType(v.dtype(), IrDims(v.dims().begin(), v.dims().end())));
  }
  if (c.node.outputs.size() != 1) {
    return c.Error("field outputs must declare exactly one type for an ",
                   c.node.op == v1::OP_INPUT ? "input" : "param");
  }
  if (c.node.name.empty()) return c.Error("field name is required for inputs and params");
  const TensorType& t = c.node.outputs[0];
  if (!IsKnownDType(t.dtype)) return c.Error("declared dtype ", static_cast<int>(t.dtype), " is unknown");
  if (c.node.op == v1::OP_PARAM && !t.is_static()) {
    return c.Error("param shapes must be concrete, got ", TypeToString(t, c.graph.symbols()));
  }
  if (IsQuantized(t.dtype) && t.is_static()) {
    // Counted with overflow checks: the dims are the client's (InferNode
    // reports an overflowing shape after this returns).
    auto n = CheckedNumElements(t.dims_vector());
    if (n.ok() && !BytesFor(t.dtype, *n)) {
      return c.Error(TypeToString(t, c.graph.symbols()), " is not a whole number of ",
                     LayoutOf(t.dtype).block_elems, "-element blocks");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckScale(Ctx& c, int operand, const TensorType& x, bool has_axis, int64_t axis_attr) {
  const TensorType& s = c.in(operand);
  if (!IsFloat(s.dtype)) return c.Error("scale (operand ", operand, ") must be float, got ", c.T(operand));
  if (!has_axis) {
    if (s.rank() != 0 && !(s.rank() == 1 && s.dims[0] == 1)) {
      return c.Error("per-tensor scale must be a scalar, got ", c.T(operand));
    }
    return absl::OkStatus();
  }
  int64_t axis;
  if (auto st = c.Axis(axis_attr, x.rank(), "axis", &axis); !st.ok()) return st;
  if (s.rank() != 1 || !DimsCompatible(s.dims[0], x.dims[axis])) {
    return c.Error("per-channel scale must be [", x.dims[axis], "], got ", c.T(operand));
  }
  return absl::OkStatus();
}

absl::Status CheckBits(Ctx& c, int32_t bits) {
  if (bits != 8 && bits != 4) return c.Error("attribute bits=", bits, " must be 8 or 4");
  return absl::OkStatus();
}

// A block-quantized tensor's rows (its last dim) must be whole blocks: the
// kernels decode row by row, as GGUF lays them out. The total alone being whole
// blocks (what InferSource checks for params) is not enough.
absl::Status CheckWholeBlockRows(Ctx& c, int operand) {
  const TensorType& t = c.in(operand);
  const int64_t block = LayoutOf(t.dtype).block_elems;
  if (t.rank() == 0) return c.Error("block-quantized operand ", operand, " cannot be a scalar");
  const int64_t last = t.dims.back();  // < 0: symbolic, checked once bound
  if (last >= 0 && last % block != 0) {
    return c.Error("operand ", operand, " ", c.T(operand), ": rows of ", last,
                   " elements are not whole ", block, "-element ", DTypeName(t.dtype), " blocks");
  }
  return absl::OkStatus();
}

absl::Status InferQuant(Ctx& c) {
  switch (c.node.op) {
    case v1::OP_QUANTIZE: {
      if (auto s = c.Arity(2, 3); !s.ok()) return s;
      if (auto s = c.NeedFloat(0); !s.ok()) return s;
      const auto& a = c.node.attrs.quantize();
      if (auto s = CheckBits(c, a.bits()); !s.ok()) return s;
      if (auto s = CheckScale(c, 1, c.in(0), a.has_axis(), a.axis()); !s.ok()) return s;
      const DType to = a.to() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_I8 : a.to();
      if (to != v1::DTYPE_I8 && to != v1::DTYPE_U8) return c.Error("attribute to must be i8 or u8");
      return c.Set(TensorType(to, c.in(0).dims));
    }
    case v1::OP_DEQUANTIZE: {
      const auto& a = c.node.attrs.dequantize();
      const DType to = a.to() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_F32 : a.to();
      if (!IsFloat(to)) return c.Error("attribute to must be a float type");
      // Before any operand is read (kiln_fuzz_graph_ingest: a dequantize with
      // no operands read operand 0).
      if (auto s = c.Arity(1, 3); !s.ok()) return s;
      if (IsQuantized(c.in(0).dtype)) {
        if (auto s = c.Arity(1, 1); !s.ok()) return s;
        if (auto s = CheckWholeBlockRows(c, 0); !s.ok()) return s;
        return c.Set(TensorType(to, c.in(0).dims));
      }
      if (auto s = c.Arity(2, 3); !s.ok()) return s;
      if (c.in(0).dtype != v1::DTYPE_I8 && c.in(0).dtype != v1::DTYPE_U8) {
        return c.Error("dequantize reads i8, u8 or block-quantized types, got ", c.T(0));
      }
      if (auto s = CheckScale(c, 1, c.in(0), a.has_axis(), a.axis()); !s.ok()) return s;
      return c.Set(TensorType(to, c.in(0).dims));
    }
    case v1::OP_FAKE_QUANTIZE:
    case v1::OP_FAKE_QUANTIZE_LSQ: {
      const bool lsq = c.node.op == v1::OP_FAKE_QUANTIZE_LSQ;
      if (auto s = lsq ? c.Arity(2, 2) : c.Arity(2, 3); !s.ok()) return s;
      if (auto s = c.NeedFloat(0); !s.ok()) return s;
      const int32_t bits = lsq ? c.node.attrs.fake_quantize_lsq().bits()
                               : c.node.attrs.fake_quantize().bits();
      const bool has_axis = lsq ? c.node.attrs.fake_quantize_lsq().has_axis()
                                : c.node.attrs.fake_quantize().has_axis();
      const int64_t axis = lsq ? c.node.attrs.fake_quantize_lsq().axis()
                               : c.node.attrs.fake_quantize().axis();
      if (auto s = CheckBits(c, bits); !s.ok()) return s;
      if (auto s = CheckScale(c, 1, c.in(0), has_axis, axis); !s.ok()) return s;
      return c.Set(c.in(0));
    }
    case v1::OP_DEQUANT_MATMUL: {
      if (auto s = c.Arity(2, 2); !s.ok()) return s;
      if (auto s = c.NeedFloat(0); !s.ok()) return s;
      const TensorType& a = c.in(0);
      const TensorType& w = c.in(1);
      if (!IsQuantized(w.dtype)) return c.Error("weights must be block-quantized, got ", c.T(1));
      if (a.rank() < 1 || w.rank() != 2) return c.Error("expects a [..., K] @ w [K, N] or [N, K]");
      if (auto s = CheckWholeBlockRows(c, 1); !s.ok()) return s;
      const bool tb = c.node.attrs.dequant_matmul().transpose_b();
      const int64_t k = tb ? w.dims[1] : w.dims[0];
      const int64_t n = tb ? w.dims[0] : w.dims[1];
      if (!DimsCompatible(a.dims.back(), k)) return c.Error("K differs: ", c.T(0), " vs ", c.T(1));
      IrDims out = a.dims;
      out.back() = n;
      return c.Set(TensorType(a.dtype, std::move(out)));
    }
    default:
      return c.Error("not a quantization op");
  }
}

// A subgraph's failure as this node's, keeping its code (a limit stays
// RESOURCE_EXHAUSTED however deep it was hit).
absl::Status InSubgraph(const Ctx& c, const char* where, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(NodeLabel(c.node), ": in ", where, ": ", s.message()));
}

absl::Status InferControlFlow(Ctx& c) {
  if (c.depth + 1 > c.limits.max_subgraph_depth) {
    return absl::ResourceExhaustedError(absl::StrCat(NodeLabel(c.node),
                                                     ": subgraph nesting exceeds the limit of ",
                                                     c.limits.max_subgraph_depth));
  }
  std::vector<TensorType> args;
  for (int i = 0; i < c.num_operands(); ++i) args.push_back(c.in(i));
  switch (c.node.op) {
    case v1::OP_SCAN: {
      const auto& a = c.node.attrs.scan();
      const int nc = a.num_carries();
      if (nc < 0 || nc > c.num_operands()) return c.Error("attribute num_carries out of range");
      if (a.length() < 0) return c.Error("attribute length must be >= 0");
      std::vector<TensorType> body_args(args.begin(), args.begin() + nc);
      for (int i = nc; i < c.num_operands(); ++i) {
        const TensorType& x = c.in(i);
        if (x.rank() < 1 || !DimsCompatible(x.dims[0], a.length())) {
          return c.Error("xs operand ", i, " must have leading dim length=", a.length(), ", got ",
                         c.T(i));
        }
        body_args.push_back(TensorType(x.dtype, IrDims(x.dims.begin() + 1, x.dims.end())));
      }
      auto outs = InferSubgraph(a.body(), body_args, c.limits, c.depth + 1);
      if (!outs.ok()) return InSubgraph(c, "scan body", outs.status());
      if (static_cast<int>(outs->size()) < nc) return c.Error("scan body returns fewer than num_carries values");
      c.node.outputs.clear();
      for (int i = 0; i < nc; ++i) {
        if (!((*outs)[i].dtype == args[i].dtype && (*outs)[i].rank() == args[i].rank())) {
          return c.Error("scan body carry ", i, " changes type from ", c.T(i));
        }
        c.node.outputs.push_back(args[i]);
      }
      for (size_t i = nc; i < outs->size(); ++i) {
        IrDims d = (*outs)[i].dims;
        d.insert(d.begin(), a.length());
        c.node.outputs.push_back(TensorType((*outs)[i].dtype, std::move(d)));
      }
      return absl::OkStatus();
    }
    case v1::OP_IF: {
      if (c.num_operands() < 1 || c.in(0).dtype != v1::DTYPE_BOOL || c.in(0).rank() != 0) {
        return c.Error("operand 0 must be a bool scalar predicate");
      }
      std::vector<TensorType> branch_args(args.begin() + 1, args.end());
      auto then_outs = InferSubgraph(c.node.attrs.if_().then_branch(), branch_args, c.limits, c.depth + 1);
      if (!then_outs.ok()) return InSubgraph(c, "then_branch", then_outs.status());
      auto else_outs = InferSubgraph(c.node.attrs.if_().else_branch(), branch_args, c.limits, c.depth + 1);
      if (!else_outs.ok()) return InSubgraph(c, "else_branch", else_outs.status());
      if (then_outs->size() != else_outs->size()) return c.Error("branches return different counts");
      for (size_t i = 0; i < then_outs->size(); ++i) {
        if (!((*then_outs)[i] == (*else_outs)[i])) return c.Error("branch result ", i, " types differ");
      }
      c.node.outputs.assign(then_outs->begin(), then_outs->end());
      return absl::OkStatus();
    }
    case v1::OP_WHILE: {
      const auto& a = c.node.attrs.while_();
      if (a.max_iterations() < 0) return c.Error("attribute max_iterations must be >= 0");
      auto cond = InferSubgraph(a.cond(), args, c.limits, c.depth + 1);
      if (!cond.ok()) return InSubgraph(c, "cond", cond.status());
      if (cond->size() != 1 || (*cond)[0].dtype != v1::DTYPE_BOOL || (*cond)[0].rank() != 0) {
        return c.Error("cond must return one bool scalar");
      }
      auto body = InferSubgraph(a.body(), args, c.limits, c.depth + 1);
      if (!body.ok()) return InSubgraph(c, "body", body.status());
      if (body->size() != args.size()) return c.Error("body must return one value per operand");
      for (size_t i = 0; i < args.size(); ++i) {
        if ((*body)[i].dtype != args[i].dtype) return c.Error("body changes the dtype of carry ", i);
      }
      c.node.outputs.assign(args.begin(), args.end());
      return absl::OkStatus();
    }
    default:
      return c.Error("not a control-flow op");
  }
}

absl::Status InferLoss(Ctx& c) {
  if (c.node.op == v1::OP_SOFTMAX_CROSS_ENTROPY) {
    if (auto s = c.Arity(2, 2); !s.ok()) return s;
    if (auto s = c.NeedFloat(0); !s.ok()) return s;
    const auto& a = c.node.attrs.softmax_cross_entropy();
    if (!v1::Reduction_IsValid(a.reduction())) return c.Error("unknown reduction");
    if (a.label_smoothing() < 0 || a.label_smoothing() > 1) {
      return c.Error("attribute label_smoothing must be in [0, 1]");
    }
    const TensorType& x = c.in(0);
    const TensorType& y = c.in(1);
    if (x.rank() < 1) return c.Error("logits need rank >= 1 (classes last)");
    const IrDims batch(x.dims.begin(), x.dims.end() - 1);
    if (IsInteger(y.dtype)) {
      bool ok = y.dims.size() == batch.size();
      for (size_t i = 0; ok && i < batch.size(); ++i) ok = DimsCompatible(y.dims[i], batch[i]);
      if (!ok) return c.Error("integer labels must be shaped like the logits without classes");
    } else if (IsFloat(y.dtype)) {
      if (auto s = c.SameDType(0, 1); !s.ok()) return s;
      bool ok = y.dims.size() == x.dims.size();
      for (size_t i = 0; ok && i < x.dims.size(); ++i) ok = DimsCompatible(y.dims[i], x.dims[i]);
      if (!ok) return c.Error("probability labels must be shaped like the logits");
    } else {
      return c.Error("labels must be integers or floats, got ", c.T(1));
    }
    return c.Set(TensorType(x.dtype, a.reduction() == v1::REDUCTION_NONE ? batch : IrDims{}));
  }
  if (auto s = c.Arity(2, 2); !s.ok()) return s;
  if (auto s = c.NeedFloat(0); !s.ok()) return s;
  if (auto s = c.SameDType(0, 1); !s.ok()) return s;
  const auto& a = c.node.attrs.mean_squared_error();
  if (!v1::Reduction_IsValid(a.reduction())) return c.Error("unknown reduction");
  IrDims d;
  if (!BroadcastDims(c.in(0).dims, c.in(1).dims, &d) || d.size() != c.in(0).dims.size()) {
    return c.Error("prediction and target shapes differ: ", c.T(0), " vs ", c.T(1));
  }
  return c.Set(TensorType(c.in(0).dtype, a.reduction() == v1::REDUCTION_NONE ? d : IrDims{}));
}

absl::Status InferCollective(Ctx& c) {
  if (auto s = c.Arity(1, 1); !s.ok()) return s;
  const TensorType& x = c.in(0);
  const v1::CollectiveAttrs& a = c.node.op == v1::OP_ALL_REDUCE   ? c.node.attrs.all_reduce()
                                 : c.node.op == v1::OP_ALL_GATHER ? c.node.attrs.all_gather()
                                                                  : c.node.attrs.reduce_scatter();
  if (c.node.op == v1::OP_ALL_REDUCE) return c.Set(x);
  if (x.rank() == 0) return c.Error("needs rank >= 1");
  int64_t axis;
  if (auto s = c.Axis(a.axis(), x.rank(), "axis", &axis); !s.ok()) return s;
  IrDims out = x.dims;
  const int64_t g = a.group_size();
  if (g == 0 || out[axis] < 0) {
    out[axis] = kDynamic;
  } else if (c.node.op == v1::OP_ALL_GATHER) {
    const CheckedInt gathered = CheckedInt(out[axis]) * g;
    if (!gathered.ok()) return c.Overflow("dim ", axis, " of ", out[axis], " * group size ", g);
    out[axis] = gathered.get();
  } else {
    if (out[axis] % g != 0) return c.Error("dim ", axis, " not divisible by the group size ", g);
    out[axis] /= g;
  }
  return c.Set(TensorType(x.dtype, std::move(out)));
}

absl::Status InferFused(Ctx& c) {
  switch (c.node.op) {
    case v1::OP_FUSED_ELEMENTWISE: {
      const auto& a = c.node.attrs.fused_elementwise();
      if (c.num_operands() < 1) return c.Error("fused region has no inputs");
      IrDims dims = c.in(0).dims;
      for (int i = 1; i < c.num_operands(); ++i) {
        IrDims next;
        if (!BroadcastDims(dims, c.in(i).dims, &next)) return c.Error("region inputs do not broadcast");
        dims = std::move(next);
      }
      const int n = c.num_operands();
      c.node.outputs.clear();
      for (int r : a.results()) {
        if (r < 0 || r >= a.instrs_size()) return c.Error("region result ", r, " out of range");
        c.node.outputs.push_back(TensorType(a.instrs(r).dtype(), dims));
      }
      for (int j = 0; j < a.instrs_size(); ++j) {
        for (int arg : a.instrs(j).args()) {
          if (arg < 0 || arg >= n + j) return c.Error("instruction ", j, " reads ", arg, " out of range");
        }
      }
      return absl::OkStatus();
    }
    case v1::OP_FUSED_MATMUL: {
      const auto& a = c.node.attrs.fused_matmul();
      const int want = 2 + a.has_bias() + a.has_residual();
      if (auto s = c.Arity(want, want); !s.ok()) return s;
      Node mm = c.node;
      mm.op = v1::OP_MATMUL;
      mm.operands.resize(2);
      mm.attrs.Clear();
      mm.attrs.mutable_matmul()->set_transpose_a(a.transpose_a());
      mm.attrs.mutable_matmul()->set_transpose_b(a.transpose_b());
      Ctx mc{c.graph, mm, c.limits, c.depth};
      if (auto s = InferLinalg(mc); !s.ok()) return s;
      const TensorType out = mm.outputs[0];
      int next = 2;
      if (a.has_bias()) {
        const TensorType& b = c.in(next++);
        if (out.rank() == 0) return c.Error("a bias needs a result of rank >= 1");
        if (b.rank() != 1 || !DimsCompatible(b.dims[0], out.dims.back())) {
          return c.Error("bias must be [N], got ", TypeToString(b, c.graph.symbols()));
        }
      }
      if (a.has_residual() && !(c.in(next).dims == out.dims)) {
        return c.Error("residual must match the result shape");
      }
      return c.Set(out);
    }
    case v1::OP_FUSED_RESIDUAL_NORM: {
      const auto& a = c.node.attrs.fused_residual_norm();
      const int want = 2 + a.has_scale() + a.has_bias();
      if (auto s = c.Arity(want, want); !s.ok()) return s;
      if (!(c.in(0) == c.in(1))) return c.Error("x and residual must match");
      c.node.outputs.clear();
      c.node.outputs.push_back(c.in(0));
      if (a.emit_sum()) c.node.outputs.push_back(c.in(0));
      return absl::OkStatus();
    }
    case v1::OP_FUSED_CONV: {
      const auto& a = c.node.attrs.fused_conv();
      const int want = 2 + a.has_bias() + a.has_scale() + a.has_shift();
      if (auto s = c.Arity(want, want); !s.ok()) return s;
      const TensorType& x = c.in(0);
      if (a.channels_last() && x.rank() != 4) {
        return c.Error("channels_last needs x [N, H, W, C], got ", c.T(0));
      }
      // The plain convolution on NCHW, then the epilogue operands against it.
      if (auto s = c.NeedFloat(0); !s.ok()) return s;
      if (auto s = c.SameDType(0, 1); !s.ok()) return s;
      TensorType nchw = x;
      if (a.channels_last()) nchw.dims = {x.dims[0], x.dims[3], x.dims[1], x.dims[2]};
      if (a.has_bias()) {
        if (auto s = c.SameDType(0, 2); !s.ok()) return s;
      }
      TensorType out;
      if (auto s = ConvResultType(c, nchw, c.in(1), a.has_bias() ? &c.in(2) : nullptr, a.conv(),
                                  &out);
          !s.ok()) {
        return s;
      }
      const int64_t o = out.dims[1];
      for (int i = 2 + a.has_bias(); i < want; ++i) {
        const TensorType& t = c.in(i);
        if (auto s = c.SameDType(0, i); !s.ok()) return s;
        // O elements along one axis: [O], [O, 1, ...] or [1, O, 1, ...].
        int64_t non_one = 0, count = 1;
        for (int64_t d : t.dims) {
          if (d < 0) return c.Error("scale and shift need static dims, got ", c.T(i));
          count *= d;
          non_one += d != 1;
        }
        if (t.rank() > out.rank() || non_one > 1 || (o >= 0 && count != o)) {
          return c.Error("scale and shift must hold one value per output channel (", o,
                         "), got ", c.T(i));
        }
      }
      if (a.channels_last()) out.dims = {out.dims[0], out.dims[2], out.dims[3], out.dims[1]};
      return c.Set(out);
    }
    case v1::OP_COPY:
      if (auto s = c.Arity(1, 1); !s.ok()) return s;
      return c.Set(c.in(0));
    default:
      return c.Error("not a fused op");
  }
}

// A custom op's results come from its plugin's shape function (base/custom_ops.h),
// checked here as strictly as any built-in rule: the plugin is code we did not
// write. An op no loaded plugin provides keeps the result types the graph
// declares (a test device may claim it); with none declared it is an error
// naming the op, and with no device claiming it legalize names it again.
absl::Status InferCustom(Ctx& c) {
  const std::string& name = c.node.attrs.custom().name();
  if (name.empty()) return c.Error("attribute name is required");
  const CustomOp* op = CustomOpRegistry::Global().Find(name);
  if (op == nullptr) {
    if (c.node.outputs.empty()) {
      return c.Error("custom op ", QuotePluginString(name),
                     " is not provided by any plugin kilnd loaded (--plugin_dir)");
    }
    return absl::OkStatus();
  }
  if (c.num_operands() > 64) return c.Error("custom ops take at most 64 operands");
  std::vector<KilnTensorType> ins;
  for (int i = 0; i < c.num_operands(); ++i) {
    const TensorType& t = c.in(i);
    if (IsQuantized(t.dtype)) return c.Error("custom ops do not take block-quantized operands (operand ", i, ")");
    if (t.rank() > KILN_PLUGIN_MAX_RANK) {
      return c.Error("operand ", i, " has rank ", t.rank(), "; plugins take rank <= ", KILN_PLUGIN_MAX_RANK);
    }
    KilnTensorType k{};
    k.dtype = static_cast<int32_t>(t.dtype);
    k.rank = static_cast<int32_t>(t.rank());
    for (int64_t d = 0; d < t.rank(); ++d) k.dims[d] = t.dims[d] >= 0 ? t.dims[d] : -1;
    ins.push_back(k);
  }
  auto outs = CallShapeFunction(*op, c.node.attrs.custom().payload(), ins);
  if (!outs.ok()) return c.Error(outs.status().message());
  std::vector<TensorType> results;
  for (size_t i = 0; i < outs->size(); ++i) {
    const KilnTensorType& k = (*outs)[i];
    const std::string what = absl::StrCat("custom op ", QuotePluginString(name), ": shape function result ", i);
    if (!IsKnownDType(k.dtype) || k.dtype == v1::DTYPE_UNSPECIFIED || IsQuantized(static_cast<DType>(k.dtype))) {
      return c.Error(what, " has dtype ", k.dtype, ", not one of kiln.v1.DType's dense types");
    }
    if (k.rank < 0 || k.rank > KILN_PLUGIN_MAX_RANK || k.rank > c.limits.max_rank) {
      return c.Error(what, " has rank ", k.rank, " (limit ",
                     std::min<int64_t>(KILN_PLUGIN_MAX_RANK, c.limits.max_rank), ")");
    }
    IrDims dims;
    CheckedInt elems(1);
    for (int32_t d = 0; d < k.rank; ++d) {
      if (k.dims[d] < -1) return c.Error(what, " dim ", d, " is ", k.dims[d], " (want >= 0, or -1 for unknown)");
      dims.push_back(k.dims[d] >= 0 ? k.dims[d] : kDynamic);
      if (k.dims[d] >= 0) elems = elems * k.dims[d];
    }
    if (!elems.ok()) return c.Overflow(what, "'s element count");
    if (elems.get() > c.limits.max_tensor_elements) {
      return c.Error(what, " has ", elems.get(), " elements, over the limit of ", c.limits.max_tensor_elements);
    }
    results.push_back(TensorType(static_cast<DType>(k.dtype), std::move(dims)));
  }
  c.node.outputs.assign(results.begin(), results.end());
  return absl::OkStatus();
}

}  // namespace

absl::Status InferMisc(Ctx& c) {
  switch (c.node.op) {
    case v1::OP_INPUT: case v1::OP_PARAM: case v1::OP_CONSTANT:
      return InferSource(c);
    case v1::OP_QUANTIZE: case v1::OP_DEQUANTIZE: case v1::OP_FAKE_QUANTIZE:
    case v1::OP_FAKE_QUANTIZE_LSQ: case v1::OP_DEQUANT_MATMUL:
      return InferQuant(c);
    case v1::OP_SCAN: case v1::OP_IF: case v1::OP_WHILE:
      return InferControlFlow(c);
    case v1::OP_SOFTMAX_CROSS_ENTROPY: case v1::OP_MEAN_SQUARED_ERROR:
      return InferLoss(c);
    case v1::OP_ALL_REDUCE: case v1::OP_ALL_GATHER: case v1::OP_REDUCE_SCATTER:
      return InferCollective(c);
    case v1::OP_CUSTOM:
      return InferCustom(c);
    case v1::OP_FUSED_ELEMENTWISE: case v1::OP_FUSED_MATMUL: case v1::OP_FUSED_RESIDUAL_NORM:
    case v1::OP_COPY: case v1::OP_FUSED_CONV:
      return InferFused(c);
    default:
      return c.Error("unknown op ", static_cast<int>(c.node.op));
  }
}

}  // namespace kiln::ir::infer_internal
