#include "engine/compile/lower.h"

#include "absl/strings/str_cat.h"
#include "engine/passes/kernel_spec.h"
#include "engine/runtime/cost_model.h"

namespace kiln::compile {
namespace {

void ExportType(const ir::TensorType& t, v1::TensorType* out) {
  out->set_dtype(t.dtype);
  for (int64_t d : t.dims) out->add_dims()->set_size(d);
}

std::string KernelName(const ir::Node& n) {
  switch (n.op) {
    case v1::OP_FUSED_ELEMENTWISE: return absl::StrCat("fused_ew_", n.id);
    case v1::OP_FUSED_MATMUL: return absl::StrCat("fused_matmul_", n.id);
    case v1::OP_FUSED_RESIDUAL_NORM: return absl::StrCat("fused_residual_norm_", n.id);
    case v1::OP_FUSED_CONV: return absl::StrCat("fused_conv_", n.id);
    default: return absl::StrCat(ir::OpName(n.op), "_", n.id);
  }
}

}  // namespace

absl::StatusOr<v1::Executable> Lower(const ir::Graph& g, const passes::PassContext& ctx,
                                     const absl::flat_hash_map<int32_t, OriginInfo>& origins) {
  v1::Executable exe;
  exe.set_format_version(kLirFormatVersion);
  exe.set_compiler_version(kCompilerVersion);
  exe.set_graph_name(g.name());
  *exe.mutable_placement() = ctx.placement_report;
  absl::flat_hash_map<ir::ValueRef, int> slot_of;
  const passes::MemoryPlan& plan = ctx.memory_plan;

  auto add_slot = [&](ir::ValueRef v, const ir::TensorType& t, v1::SlotStorage storage,
                      const std::string& device, int64_t offset, int index) {
    v1::Slot* s = exe.add_slots();
    ExportType(t, s->mutable_type());
    s->set_storage(storage);
    s->set_device(device);
    s->set_offset(offset);
    s->set_bytes(t.num_bytes());
    s->set_index(index);
    slot_of[v] = exe.slots_size() - 1;
    return exe.slots_size() - 1;
  };

  for (const auto& np : g.nodes()) {
    const ir::Node& n = *np;
    switch (n.op) {
      case v1::OP_INPUT: {
        const int slot = add_slot(n.out(), n.type(), v1::SLOT_INPUT, n.device, 0, exe.inputs_size());
        v1::LirNamedSlot* in = exe.add_inputs();
        in->set_name(n.name);
        in->set_slot(slot);
        continue;
      }
      case v1::OP_PARAM: {
        const int slot = add_slot(n.out(), n.type(), v1::SLOT_PARAM, n.device, 0, exe.params_size());
        v1::LirNamedSlot* p = exe.add_params();
        p->set_name(n.name);
        p->set_slot(slot);
        ExportType(n.type(), exe.add_param_types());
        continue;
      }
      case v1::OP_CONSTANT:
        add_slot(n.out(), n.type(), v1::SLOT_CONSTANT, n.device, 0, exe.constants_size());
        n.value->ToProto(exe.add_constants());
        continue;
      case v1::OP_RESHAPE: {  // a view: the operand's storage under a new type
        const v1::Slot src = exe.slots(slot_of.at(n.operands[0]));
        add_slot(n.out(), n.type(), src.storage(), src.device(), src.offset(), src.index());
        continue;
      }
      default:
        break;
    }
    v1::LirStep* step = exe.add_steps();
    step->set_kind(n.op == v1::OP_COPY ? v1::STEP_COPY : v1::STEP_KERNEL);
    step->set_device(n.device);
    for (const ir::ValueRef& v : n.operands) {
      auto it = slot_of.find(v);
      if (it == slot_of.end()) {
        return absl::InternalError(absl::StrCat(ir::NodeLabel(n), ": operand has no slot"));
      }
      step->add_inputs(it->second);
    }
    for (int k = 0; k < static_cast<int>(n.outputs.size()); ++k) {
      auto p = plan.values.find(n.out(k));
      if (p == plan.values.end() || !p->second.arena) {
        return absl::InternalError(absl::StrCat(ir::NodeLabel(n), ": output ", k, " was not planned"));
      }
      step->add_outputs(add_slot(n.out(k), n.outputs[k], v1::SLOT_ARENA, n.device,
                                 p->second.offset, 0));
    }
    v1::LirKernel* k = step->mutable_kernel();
    k->set_name(KernelName(n));
    v1::Node* pn = k->mutable_node();
    pn->set_id(n.id);
    pn->set_name(n.name);
    pn->set_op(n.op);
    *pn->mutable_attrs() = n.attrs;
    for (const ir::TensorType& t : n.outputs) ExportType(t, pn->add_outputs());
    for (const ir::ValueRef& v : n.operands) ExportType(g.TypeOf(v), k->add_input_types());
    k->set_path(n.path == v1::PATH_UNSPECIFIED ? v1::PATH_NATIVE : n.path);
    for (int32_t id : n.origins) {
      k->add_covered_node_ids(id);
      auto it = origins.find(id);
      k->add_covered_names(it == origins.end() ? "" : it->second.name);
      k->add_covered_ops(it == origins.end() ? n.op : it->second.op);
    }
    const runtime::Work work = runtime::EstimateWork(passes::SpecOf(g, n));
    k->set_flops(work.flops);
    k->set_bytes(work.bytes);
  }
  absl::flat_hash_map<std::string, std::string> updates(ctx.param_updates.begin(),
                                                        ctx.param_updates.end());
  for (const ir::GraphOutput& o : g.outputs()) {
    auto u = updates.find(o.name);
    v1::LirNamedSlot* out = u == updates.end() ? exe.add_outputs() : exe.add_param_updates();
    out->set_name(u == updates.end() ? o.name : u->second);
    out->set_slot(slot_of.at(o.value));
    if (u != updates.end()) updates.erase(u);
  }
  if (!updates.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("param update \"", updates.begin()->second,
                                                   "\" names output \"", updates.begin()->first,
                                                   "\", which the graph does not have"));
  }
  for (const auto& [device, bytes] : plan.arena_bytes) {
    v1::LirArena* a = exe.add_arenas();
    a->set_device(device);
    a->set_bytes(bytes);
  }
  return exe;
}

}  // namespace kiln::compile
