// Fuse (DESIGN.md section 3, stage 5): matmul epilogues (bias, activation,
// residual) into FusedMatMul, conv epilogues (a folded BatchNorm's per-channel
// multiply-add, activation) into FusedConv, chains of 2-D convs kept
// channels-last between them, residual + norm into FusedResidualNorm, and
// chains of elementwise ops into FusedElementwise regions (their instructions
// built and checked by backends/common/elementwise_region.h, as every backend
// reads them). An attention between head transposes ([B, S, H, D] <-> [B, H,
// S, D]) reads and writes the packed [B, S, H*D] layout instead, where its
// device claims that. A fusion is made only when the device claims the fused
// kernel and the cost model estimates it cheaper than the separate kernels.
#include <algorithm>
#include <optional>
#include <span>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "backends/common/elementwise_region.h"
#include "base/status.h"
#include "engine/ir/infer.h"
#include "engine/ir/rewriter.h"
#include "engine/passes/kernel_spec.h"
#include "engine/passes/pass.h"
#include "engine/passes/passes_internal.h"
#include "engine/runtime/cost_model.h"

namespace kiln::passes {
namespace {

using ir::Graph;
using ir::Node;
using ir::ValueRef;

// Users of each value, in node order.
absl::flat_hash_map<ValueRef, std::vector<Node*>> Users(const Graph& g) {
  absl::flat_hash_map<ValueRef, std::vector<Node*>> users;
  for (const auto& n : g.nodes()) {
    for (const ValueRef& v : n->operands) users[v].push_back(n.get());
  }
  return users;
}

bool IsGraphOutput(const Graph& g, ValueRef v) {
  for (const auto& o : g.outputs()) {
    if (o.value == v) return true;
  }
  return false;
}

struct Fuser {
  Graph& g;
  PassContext& ctx;
  const runtime::CostModel& model;
  absl::flat_hash_map<ValueRef, std::vector<Node*>> users;

  // The single consumer of v (not a graph output), or nullptr.
  Node* SoleUser(ValueRef v) {
    auto it = users.find(v);
    if (it == users.end() || it->second.size() != 1 || IsGraphOutput(g, v)) return nullptr;
    return it->second[0];
  }

  backend::Device* DeviceOf(const Node& n) { return FindDevice(ctx.devices, n.device); }

  double SeparateMicros(const std::vector<const Node*>& nodes, const backend::DeviceInfo& info) {
    double us = 0;
    for (const Node* n : nodes) us += model.KernelMicros(SpecOf(g, *n), info);
    return us;
  }

  // Adds `fused` if its device claims it and it is estimated cheaper than
  // `replaced`; rewires `replaced.back()`'s uses. Returns the new node or null.
  Node* Commit(std::unique_ptr<Node> fused, const std::vector<const Node*>& replaced,
               const std::vector<std::pair<ValueRef, int>>& rewires) {
    backend::Device* device = DeviceOf(*fused);
    if (device == nullptr) return nullptr;
    if (auto s = ir::InferNode(g, *fused); !s.ok()) {
      ctx.notes.push_back(absl::StrCat("fusion skipped (", s.message(), ")"));
      return nullptr;
    }
    const backend::KernelSpec spec = SpecOf(g, *fused);
    const backend::Claim claim = device->Supports(spec);
    if (!claim.native) return nullptr;
    const double fused_us = model.KernelMicros(spec, device->info());
    const double separate_us = SeparateMicros(replaced, device->info());
    if (fused_us >= separate_us) {
      ctx.notes.push_back(absl::StrCat("fusion of ", ir::NodeLabel(*replaced.back()),
                                       " rejected by the cost model (", fused_us, " >= ",
                                       separate_us, " us)"));
      return nullptr;
    }
    std::vector<int32_t> origins;
    for (const Node* n : replaced) origins.insert(origins.end(), n->origins.begin(), n->origins.end());
    std::sort(origins.begin(), origins.end());
    origins.erase(std::unique(origins.begin(), origins.end()), origins.end());
    fused->origins = std::move(origins);
    fused->path = v1::PATH_NATIVE;
    for (const Node* n : replaced) {
      if (n->path == v1::PATH_COMMON_IR || n->path == v1::PATH_REWRITTEN) fused->path = n->path;
    }
    Node* made = g.AddNode(std::move(fused));
    for (const auto& [from, output] : rewires) g.ReplaceAllUses(from, ValueRef{made->id, output});
    users = Users(g);
    return made;
  }

  bool TryMatMul(Node& mm) {
    if (mm.op != v1::OP_MATMUL) return false;
    const ir::TensorType& out = mm.outputs[0];
    if (out.rank() < 1) return false;
    enum class Role { kMatMul, kBias, kActivation, kResidual };
    struct Link {
      const Node* node;
      Role role;
      ValueRef operand;  // the bias or residual operand
    };
    std::vector<Link> chain = {{&mm, Role::kMatMul, {}}};
    ValueRef cur = mm.out();
    auto other_operand = [](const Node& add, ValueRef v) {
      return add.operands[0] == v ? add.operands[1] : add.operands[0];
    };
    auto next_add = [&](ValueRef v) -> Node* {
      Node* u = SoleUser(v);
      if (u == nullptr || u->device != mm.device || u->op != v1::OP_BINARY ||
          u->attrs.binary().kind() != v1::BINARY_ADD || u->operands[0] == u->operands[1]) {
        return nullptr;
      }
      return u;
    };
    if (Node* u = next_add(cur)) {
      const ValueRef b = other_operand(*u, cur);
      const ir::TensorType& bt = g.TypeOf(b);
      if (bt.rank() == 1 && bt.dims[0] == out.dims.back() && bt.dtype == out.dtype &&
          u->outputs[0] == out) {
        chain.push_back({u, Role::kBias, b});
        cur = u->out();
      }
    }
    if (Node* u = SoleUser(cur); u && u->device == mm.device && u->op == v1::OP_UNARY &&
                                 u->attrs.unary().kind() != v1::UNARY_IDENTITY) {
      chain.push_back({u, Role::kActivation, {}});
      cur = u->out();
    }
    if (Node* u = next_add(cur)) {
      const ValueRef r = other_operand(*u, cur);
      if (g.TypeOf(r) == out) {
        chain.push_back({u, Role::kResidual, r});
        cur = u->out();
      }
    }
    // Try the longest epilogue first, then shorter ones the device may claim.
    while (chain.size() > 1) {
      auto fused = std::make_unique<Node>();
      fused->id = g.NextId();
      fused->op = v1::OP_FUSED_MATMUL;
      fused->device = mm.device;
      auto* a = fused->attrs.mutable_fused_matmul();
      a->set_transpose_a(mm.attrs.matmul().transpose_a());
      a->set_transpose_b(mm.attrs.matmul().transpose_b());
      fused->operands = {mm.operands[0], mm.operands[1]};
      std::optional<ValueRef> residual;
      std::vector<const Node*> replaced;
      for (const Link& l : chain) {
        replaced.push_back(l.node);
        switch (l.role) {
          case Role::kBias:
            a->set_has_bias(true);
            fused->operands.push_back(l.operand);
            break;
          case Role::kActivation:
            a->set_activation(l.node->attrs.unary().kind());
            break;
          case Role::kResidual:
            a->set_has_residual(true);
            residual = l.operand;
            break;
          case Role::kMatMul:
            break;
        }
      }
      if (residual) fused->operands.push_back(*residual);
      if (Commit(std::move(fused), replaced, {{chain.back().node->out(), 0}})) return true;
      chain.pop_back();
    }
    return false;
  }

  // One value per output channel of a conv result `out` ([N, O, ...]) that a
  // binary op broadcasts along the channel axis: [O], [O, 1, ...] or
  // [1, O, 1, ...] right-aligned against the result, O static.
  bool IsPerChannel(ValueRef v, const ir::TensorType& out) {
    const ir::TensorType& t = g.TypeOf(v);
    if (t.dtype != out.dtype || t.rank() > out.rank() || out.dims[1] < 0) return false;
    const size_t lead = out.rank() - t.rank();
    for (size_t i = 0; i < t.dims.size(); ++i) {
      const size_t axis = lead + i;
      if (t.dims[i] != (axis == 1 ? out.dims[1] : 1)) return false;
    }
    return lead <= 1;  // the channel axis is present in t
  }

  // conv [-> * per-channel scale] [-> + per-channel shift] [-> activation]
  // into FusedConv (the folded BatchNorm + ReLU after a conv).
  bool TryConv(Node& conv) {
    if (conv.op != v1::OP_CONV) return false;
    const ir::TensorType& out = conv.outputs[0];
    if (out.rank() < 3 || out.dims[1] < 0) return false;
    enum class Role { kConv, kScale, kShift, kActivation };
    struct Link {
      const Node* node;
      Role role;
      ValueRef operand;
    };
    std::vector<Link> chain = {{&conv, Role::kConv, {}}};
    ValueRef cur = conv.out();
    auto per_channel_binary = [&](ValueRef v, v1::BinaryKind kind) -> std::optional<ValueRef> {
      Node* u = SoleUser(v);
      if (u == nullptr || u->device != conv.device || u->op != v1::OP_BINARY ||
          u->attrs.binary().kind() != kind || u->operands[0] == u->operands[1] ||
          !(u->outputs[0] == out)) {
        return std::nullopt;
      }
      const ValueRef other = u->operands[0] == v ? u->operands[1] : u->operands[0];
      if (!IsPerChannel(other, out)) return std::nullopt;
      return other;
    };
    if (auto s = per_channel_binary(cur, v1::BINARY_MUL)) {
      Node* u = SoleUser(cur);
      chain.push_back({u, Role::kScale, *s});
      cur = u->out();
    }
    if (auto s = per_channel_binary(cur, v1::BINARY_ADD)) {
      Node* u = SoleUser(cur);
      chain.push_back({u, Role::kShift, *s});
      cur = u->out();
    }
    if (Node* u = SoleUser(cur); u && u->device == conv.device && u->op == v1::OP_UNARY &&
                                 u->attrs.unary().kind() != v1::UNARY_IDENTITY) {
      chain.push_back({u, Role::kActivation, {}});
    }
    while (chain.size() > 1) {
      auto fused = std::make_unique<Node>();
      fused->id = g.NextId();
      fused->op = v1::OP_FUSED_CONV;
      fused->device = conv.device;
      auto* a = fused->attrs.mutable_fused_conv();
      *a->mutable_conv() = conv.attrs.conv();
      fused->operands = conv.operands;
      a->set_has_bias(conv.operands.size() == 3);
      std::vector<const Node*> replaced;
      for (const Link& l : chain) {
        replaced.push_back(l.node);
        switch (l.role) {
          case Role::kScale:
            a->set_has_scale(true);
            fused->operands.push_back(l.operand);
            break;
          case Role::kShift:
            a->set_has_shift(true);
            fused->operands.push_back(l.operand);
            break;
          case Role::kActivation:
            a->set_activation(l.node->attrs.unary().kind());
            break;
          case Role::kConv:
            break;
        }
      }
      if (Commit(std::move(fused), replaced, {{chain.back().node->out(), 0}})) return true;
      chain.pop_back();
    }
    return false;
  }

  static bool IsConv2d(const Node& n) {
    if (n.op == v1::OP_CONV) return n.outputs[0].rank() == 4;
    return n.op == v1::OP_FUSED_CONV && n.outputs[0].rank() == 4 &&
           !n.attrs.fused_conv().channels_last();
  }

  // `n` (a 2-D Conv or FusedConv) as a channels-last FusedConv: the spec its
  // device would be asked to claim, and the attributes.
  static v1::FusedConvAttrs ChannelsLastAttrs(const Node& n) {
    v1::FusedConvAttrs a;
    if (n.op == v1::OP_FUSED_CONV) {
      a = n.attrs.fused_conv();
    } else {
      *a.mutable_conv() = n.attrs.conv();
      a.set_has_bias(n.operands.size() == 3);
    }
    a.set_channels_last(true);
    return a;
  }

  static Dims ToNhwc(const Dims& d) { return {d[0], d[2], d[3], d[1]}; }

  // Chains of 2-D convolutions (one's result the next one's input) keep their
  // activations channels-last (NHWC) between them where the device claims
  // channels-last convs: a transpose into NHWC before the chain's first conv
  // and back to NCHW after each conv whose result is used by anything else
  // than a chained conv. A conv with no chained neighbour is left alone (its
  // kernel's own reorders cost no more than the two transposes would).
  void ChannelsLastChains() {
    std::vector<Node*> convs;
    absl::flat_hash_set<int32_t> claimed;
    for (const auto& n : g.nodes()) {
      if (!IsConv2d(*n)) continue;
      backend::Device* device = DeviceOf(*n);
      if (device == nullptr) continue;
      bool static_dims = true;
      for (int64_t d : g.TypeOf(n->operands[0]).dims) static_dims &= d >= 0;
      for (int64_t d : n->outputs[0].dims) static_dims &= d >= 0;
      if (!static_dims) continue;
      backend::KernelSpec spec = SpecOf(g, *n);
      spec.op = v1::OP_FUSED_CONV;
      spec.attrs.Clear();
      *spec.attrs.mutable_fused_conv() = ChannelsLastAttrs(*n);
      spec.inputs[0].dims = ToNhwc(spec.inputs[0].dims);
      spec.outputs[0].dims = ToNhwc(spec.outputs[0].dims);
      if (!device->Supports(spec).native) continue;
      convs.push_back(n.get());
      claimed.insert(n->id);
    }
    // Chained: the input comes from a claimed conv, or the result feeds one.
    absl::flat_hash_set<int32_t> chained;
    for (Node* n : convs) {
      const ValueRef x = n->operands[0];
      if (claimed.contains(x.node) && g.FindNode(x.node)->device == n->device) {
        chained.insert(n->id);
        chained.insert(x.node);
      }
    }
    if (chained.empty()) return;
    // In node (topological) order. A converted conv's uses read the transpose
    // back to NCHW; a chained conv reads the NHWC result before it instead.
    absl::flat_hash_map<ValueRef, ValueRef> nhwc_of;
    for (Node* n : convs) {
      if (!chained.contains(n->id)) continue;
      auto fused = std::make_unique<Node>();
      fused->id = -1;  // AddNode numbers it (the input transpose may be added first)
      fused->op = v1::OP_FUSED_CONV;
      fused->device = n->device;
      fused->path = n->path;
      fused->origins = n->origins;
      *fused->attrs.mutable_fused_conv() = ChannelsLastAttrs(*n);
      fused->operands = n->operands;
      const ValueRef x = n->operands[0];
      if (auto it = nhwc_of.find(x); it != nhwc_of.end()) {
        fused->operands[0] = it->second;
      } else {
        fused->operands[0] = AddTranspose(*n, x, {0, 2, 3, 1});
      }
      if (auto s = ir::InferNode(g, *fused); !s.ok()) {
        ctx.notes.push_back(absl::StrCat("channels-last ", ir::NodeLabel(*n), " skipped (",
                                         s.message(), ")"));
        continue;
      }
      Node* made = g.AddNode(std::move(fused));
      const ValueRef back = AddTranspose(*n, made->out(), {0, 3, 1, 2});
      g.ReplaceAllUses(n->out(), back);
      nhwc_of[back] = made->out();
    }
    g.RemoveDeadNodes();
    users = Users(g);
  }

  // A transpose of `v` by `perm` placed and attributed like `like`.
  ValueRef AddTranspose(const Node& like, ValueRef v, std::initializer_list<int64_t> perm) {
    auto t = std::make_unique<Node>();
    t->id = -1;
    t->op = v1::OP_TRANSPOSE;
    t->device = like.device;
    t->path = like.path;
    t->origins = like.origins;
    t->operands = {v};
    for (int64_t p : perm) t->attrs.mutable_transpose()->add_perm(p);
    // A 4-D permutation of a value with a type: inference cannot fail.
    (void)ir::InferNode(g, *t);
    return g.AddNode(std::move(t))->out();
  }

  // A transpose by {0, 2, 1, 3} (heads <-> sequence) on `device`.
  bool IsHeadSwap(const Node* n, const std::string& device) const {
    if (n == nullptr || n->op != v1::OP_TRANSPOSE || n->device != device) return false;
    const auto& p = n->attrs.transpose().perm();
    return p.size() == 4 && p[0] == 0 && p[1] == 2 && p[2] == 1 && p[3] == 3;
  }

  // merge(attention(split(q), split(k), split(v))), where split is the head
  // transpose [B, S, H, D] -> [B, H, S, D] and merge its inverse, becomes the
  // attention in the packed layout (AttentionAttrs: rank-3 operands, heads
  // named): it reads the projections' [B, S, H*D] rows strided per head and
  // writes [B, S, H*Dv], so the four transposes (one copy of q, k, v and the
  // result each) go. Reshapes between the layouts alias. Made only where the
  // attention's device claims the packed spec (the CPU; backends that do not
  // keep the transposes) and the cost model agrees.
  bool TryPackedAttention(Node& attn) {
    if (attn.op != v1::OP_ATTENTION || attn.outputs[0].rank() != 4) return false;
    backend::Device* device = DeviceOf(attn);
    if (device == nullptr) return false;
    const Node* split[3];
    for (int i = 0; i < 3; ++i) {
      split[i] = g.FindNode(attn.operands[i].node);
      if (!IsHeadSwap(split[i], attn.device)) return false;
    }
    Node* merge = SoleUser(attn.out());
    if (!IsHeadSwap(merge, attn.device)) return false;
    auto packed = [](const ir::IrDims& d) { return ir::IrDims{d[0], d[1], d[2] * d[3]}; };
    ValueRef source[3];
    ir::IrDims source_dims[3];
    bool needs_reshape[3];
    for (int i = 0; i < 3; ++i) {
      source[i] = split[i]->operands[0];
      const ir::TensorType& t = g.TypeOf(source[i]);  // [B, S, H, D]
      for (int64_t d : t.dims) {
        if (d < 0) return false;
      }
      source_dims[i] = packed(t.dims);
      // The usual producer: a reshape of the projection's [B, S, H*D].
      const Node* p = g.FindNode(source[i].node);
      needs_reshape[i] = true;
      if (p->op == v1::OP_RESHAPE && g.TypeOf(p->operands[0]).dims == source_dims[i] &&
          g.TypeOf(p->operands[0]).dtype == t.dtype) {
        source[i] = p->operands[0];
        needs_reshape[i] = false;
      }
    }
    const ir::IrDims& q4 = g.TypeOf(attn.operands[0]).dims;  // [B, Hq, Sq, D]
    const ir::IrDims& k4 = g.TypeOf(attn.operands[1]).dims;
    const ir::IrDims& o4 = attn.outputs[0].dims;  // [B, Hq, Sq, Dv]
    for (int64_t d : o4) {
      if (d < 0) return false;
    }
    v1::AttentionAttrs attrs = attn.attrs.attention();
    attrs.set_heads(q4[1]);
    attrs.set_kv_heads(k4[1]);
    backend::KernelSpec spec = SpecOf(g, attn);
    *spec.attrs.mutable_attention() = attrs;
    for (int i = 0; i < 3; ++i) spec.inputs[i].dims = Dims(source_dims[i].begin(), source_dims[i].end());
    const ir::IrDims out3 = {o4[0], o4[2], o4[1] * o4[3]};
    spec.outputs[0].dims = Dims(out3.begin(), out3.end());
    if (!device->Supports(spec).native) return false;
    const double fused_us = model.KernelMicros(spec, device->info());
    const double separate_us =
        SeparateMicros({split[0], split[1], split[2], &attn, merge}, device->info());
    if (fused_us >= separate_us) {
      ctx.notes.push_back(absl::StrCat("packed layout for ", ir::NodeLabel(attn),
                                       " rejected by the cost model (", fused_us, " >= ",
                                       separate_us, " us)"));
      return false;
    }
    ir::Rewriter r(g, attn, attn.path);
    std::vector<ValueRef> operands;
    for (int i = 0; i < 3; ++i) {
      operands.push_back(needs_reshape[i] ? r.Reshape(source[i], source_dims[i]) : source[i]);
    }
    for (size_t i = 3; i < attn.operands.size(); ++i) operands.push_back(attn.operands[i]);
    v1::Attrs a;
    *a.mutable_attention() = attrs;
    const ValueRef out = r.Add(v1::OP_ATTENTION, operands, a);
    Node* made = r.last();
    const ValueRef back = r.Reshape(out, merge->outputs[0].dims);
    if (!r.ok()) {
      ctx.notes.push_back(absl::StrCat("packed layout for ", ir::NodeLabel(attn), " skipped (",
                                       r.status().message(), ")"));
      g.RemoveDeadNodes();
      return false;
    }
    made->name = attn.name;
    std::vector<int32_t> origins;
    for (const Node* n : {split[0], split[1], split[2], static_cast<const Node*>(&attn),
                          static_cast<const Node*>(merge)}) {
      origins.insert(origins.end(), n->origins.begin(), n->origins.end());
    }
    std::sort(origins.begin(), origins.end());
    origins.erase(std::unique(origins.begin(), origins.end()), origins.end());
    made->origins = std::move(origins);
    // A reshape of the merged heads back to [B, S, H*Dv] (the usual next
    // step) reads the result itself; anything else reads it as [B, S, H, Dv].
    for (Node* u : users[merge->out()]) {
      if (u->op == v1::OP_RESHAPE && u->outputs[0].dims == out3 &&
          u->outputs[0].dtype == made->outputs[0].dtype) {
        g.ReplaceAllUses(u->out(), out);
      }
    }
    g.ReplaceAllUses(merge->out(), back);
    users = Users(g);
    return true;
  }

  bool TryResidualNorm(Node& norm) {
    if (norm.op != v1::OP_LAYER_NORM && norm.op != v1::OP_RMS_NORM) return false;
    Node* add = g.FindNode(norm.operands[0].node);
    if (add->op != v1::OP_BINARY || add->attrs.binary().kind() != v1::BINARY_ADD ||
        add->device != norm.device) {
      return false;
    }
    if (!(g.TypeOf(add->operands[0]) == g.TypeOf(add->operands[1]))) return false;
    const bool rms = norm.op == v1::OP_RMS_NORM;
    auto fused = std::make_unique<Node>();
    fused->id = g.NextId();
    fused->op = v1::OP_FUSED_RESIDUAL_NORM;
    fused->device = norm.device;
    auto* a = fused->attrs.mutable_fused_residual_norm();
    a->set_rms(rms);
    if (rms) {
      if (norm.attrs.rms_norm().has_axis()) a->set_axis(norm.attrs.rms_norm().axis());
      if (norm.attrs.rms_norm().has_epsilon()) a->set_epsilon(norm.attrs.rms_norm().epsilon());
    } else {
      if (norm.attrs.layer_norm().has_axis()) a->set_axis(norm.attrs.layer_norm().axis());
      if (norm.attrs.layer_norm().has_epsilon()) a->set_epsilon(norm.attrs.layer_norm().epsilon());
    }
    a->set_has_scale(norm.operands.size() > 1);
    a->set_has_bias(norm.operands.size() > 2);
    fused->operands = {add->operands[0], add->operands[1]};
    for (size_t i = 1; i < norm.operands.size(); ++i) fused->operands.push_back(norm.operands[i]);
    const bool sum_used_elsewhere = SoleUser(add->out()) != &norm;
    a->set_emit_sum(sum_used_elsewhere);
    std::vector<std::pair<ValueRef, int>> rewires = {{norm.out(), 0}};
    if (sum_used_elsewhere) rewires.push_back({add->out(), 1});
    return Commit(std::move(fused), {add, &norm}, rewires) != nullptr;
  }

  static bool IsElementwise(const Node& n) {
    return backend::IsStandaloneElementwise(n.op) && n.outputs.size() == 1;
  }

  bool IsScalarConstant(ValueRef v) {
    const Node* n = g.FindNode(v.node);
    return n->op == v1::OP_CONSTANT && n->value && n->value->num_elements() == 1 &&
           !IsQuantized(n->value->dtype());
  }

  bool TryElementwiseRegion(Node& root, absl::flat_hash_set<int32_t>& claimed) {
    if (!IsElementwise(root) || claimed.contains(root.id)) return false;
    const ir::IrDims& shape = root.outputs[0].dims;
    absl::flat_hash_set<int32_t> members = {root.id};
    std::vector<Node*> stack = {&root};
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (const ValueRef& v : n->operands) {
        Node* p = g.FindNode(v.node);
        if (members.contains(p->id) || claimed.contains(p->id) || !IsElementwise(*p)) continue;
        if (p->device != root.device || p->outputs[0].dims != shape) continue;
        // A graph output inside the region becomes one of its results (an
        // optimizer's new param and moments: one pass over them, not one per
        // output); its other users must all be inside.
        bool all_inside = true;
        for (Node* u : users[p->out()]) all_inside = all_inside && members.contains(u->id);
        if (!all_inside) continue;
        members.insert(p->id);
        stack.push_back(p);
      }
    }
    if (members.size() < 2) return false;
    // Members in graph (topological) order.
    std::vector<const Node*> ordered;
    for (const auto& n : g.nodes()) {
      if (members.contains(n->id)) ordered.push_back(n.get());
    }
    auto fused = std::make_unique<Node>();
    fused->id = g.NextId();
    fused->op = v1::OP_FUSED_ELEMENTWISE;
    fused->device = root.device;
    auto* region = fused->attrs.mutable_fused_elementwise();
    // Region inputs first (deduplicated), scalars inlined as constants.
    absl::flat_hash_map<ValueRef, int> input_index;
    for (const Node* n : ordered) {
      for (const ValueRef& v : n->operands) {
        if (members.contains(v.node) || input_index.contains(v) || IsScalarConstant(v)) continue;
        input_index[v] = static_cast<int>(fused->operands.size());
        fused->operands.push_back(v);
      }
    }
    if (fused->operands.empty()) return false;  // all-constant: constant folding's job
    const int num_inputs = static_cast<int>(fused->operands.size());
    absl::flat_hash_map<ValueRef, int> slot = input_index;
    auto arg_of = [&](ValueRef v) -> int {
      auto it = slot.find(v);
      if (it != slot.end()) return it->second;
      const Node* c = g.FindNode(v.node);  // scalar constant: a CONSTANT instruction
      v1::FusedInstr* in = region->add_instrs();
      in->set_op(v1::OP_CONSTANT);
      in->set_dtype(c->value->dtype());
      in->set_scalar(c->value->GetAsDouble(0));
      in->set_origin_node(c->id);
      const int index = num_inputs + region->instrs_size() - 1;
      slot[v] = index;
      return index;
    };
    for (const Node* n : ordered) {
      std::vector<int> args;
      for (const ValueRef& v : n->operands) args.push_back(arg_of(v));
      v1::FusedInstr* in = region->add_instrs();
      *in = backend::InstrFor(n->op, n->attrs, args, n->outputs[0].dtype);
      in->set_origin_node(n->id);
      slot[n->out()] = num_inputs + region->instrs_size() - 1;
    }
    // Results: the root, then the members that are graph outputs.
    std::vector<std::pair<ValueRef, int>> rewires = {{root.out(), 0}};
    std::vector<DType> out_dtypes = {root.outputs[0].dtype};
    region->add_results(slot[root.out()] - num_inputs);
    for (const Node* n : ordered) {
      if (n == &root || !IsGraphOutput(g, n->out())) continue;
      rewires.push_back({n->out(), region->results_size()});
      out_dtypes.push_back(n->outputs[0].dtype);
      region->add_results(slot[n->out()] - num_inputs);
    }
    // The region must read as every backend will read it (the shared
    // decoder); one that does not stays unfused, with a note saying why.
    std::vector<DType> input_dtypes;
    for (const ValueRef& v : fused->operands) input_dtypes.push_back(g.TypeOf(v).dtype);
    if (auto decoded = backend::DecodeRegion(*region, input_dtypes, out_dtypes); !decoded.ok()) {
      ctx.notes.push_back(absl::StrCat("fusion of ", ir::NodeLabel(root), " skipped (",
                                       decoded.status().message(), ")"));
      return false;
    }
    if (!Commit(std::move(fused), ordered, rewires)) return false;
    for (int32_t id : members) claimed.insert(id);
    return true;
  }
};

class FusePass final : public Pass {
 public:
  std::string name() const override { return "fuse"; }

  absl::Status Run(Graph& g, PassContext& ctx) const override {
    if (!ctx.enable_fusion) return absl::OkStatus();
    const runtime::CostModel default_model;
    Fuser f{g, ctx, ctx.cost_model ? *ctx.cost_model : default_model, Users(g)};
    std::vector<int32_t> ids;
    for (const auto& n : g.nodes()) ids.push_back(n->id);
    for (int32_t id : ids) {
      if (Node* n = g.FindNode(id); n != nullptr) f.TryMatMul(*n) || f.TryConv(*n);
    }
    g.RemoveDeadNodes();
    f.users = Users(g);
    ids.clear();
    for (const auto& n : g.nodes()) ids.push_back(n->id);
    bool packed_any = false;
    for (int32_t id : ids) {
      if (Node* n = g.FindNode(id); n != nullptr) packed_any |= f.TryPackedAttention(*n);
    }
    if (packed_any) {
      g.RemoveDeadNodes();
      KILN_RETURN_IF_ERROR(g.SortTopologically());
      f.users = Users(g);
    }
    ids.clear();
    for (const auto& n : g.nodes()) ids.push_back(n->id);
    for (int32_t id : ids) {
      if (Node* n = g.FindNode(id); n != nullptr) f.TryResidualNorm(*n);
    }
    g.RemoveDeadNodes();
    f.users = Users(g);
    f.ChannelsLastChains();
    KILN_RETURN_IF_ERROR(g.SortTopologically());
    f.users = Users(g);
    // Elementwise regions grow from their last node backwards.
    absl::flat_hash_set<int32_t> claimed;
    ids.clear();
    for (const auto& n : g.nodes()) ids.push_back(n->id);
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
      if (Node* n = g.FindNode(*it); n != nullptr) f.TryElementwiseRegion(*n, claimed);
    }
    g.RemoveDeadNodes();
    return g.SortTopologically();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFusePass() { return std::make_unique<FusePass>(); }

}  // namespace kiln::passes
