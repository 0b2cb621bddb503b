// Place (DESIGN.md section 3, stage 6): fixes each node's device and inserts a
// Copy node wherever a value produced on one device is consumed on another.
// Legalize already chose the target and the CPU fallbacks; here views
// (reshape) follow their operand so they never force a copy, sources live on
// the device of their first consumer, and each (value, device) pair is copied
// once.
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/ir/infer.h"
#include "engine/passes/kernel_spec.h"
#include "engine/passes/pass.h"
#include "engine/passes/passes_internal.h"

namespace kiln::passes {
namespace {

class PlacePass final : public Pass {
 public:
  std::string name() const override { return "place"; }

  absl::Status Run(ir::Graph& g, PassContext& ctx) const override {
    if (ctx.devices.empty()) return absl::FailedPreconditionError("no devices");
    const std::string fallback = ctx.devices[0]->info().id;
    const std::string target =
        ctx.placement_report.chosen().empty() ? fallback : ctx.placement_report.chosen();
    // Unset devices (nodes made after legalize) go to the target.
    for (const auto& n : g.nodes()) {
      if (n->device.empty()) n->device = target;
      if (FindDevice(ctx.devices, n->device) == nullptr) {
        return absl::InternalError(absl::StrCat(ir::NodeLabel(*n), ": unknown device ", n->device));
      }
    }
    // Sources live where they are first used; views where their operand is.
    absl::flat_hash_map<int32_t, std::string> first_use;
    for (const auto& n : g.nodes()) {
      for (const ir::ValueRef& v : n->operands) first_use.try_emplace(v.node, n->device);
    }
    for (const auto& n : g.nodes()) {
      if (IsSource(*n)) {
        auto it = first_use.find(n->id);
        if (it != first_use.end()) n->device = it->second;
      } else if (n->op == v1::OP_RESHAPE) {
        n->device = g.FindNode(n->operands[0].node)->device;
      }
    }
    absl::flat_hash_map<std::pair<ir::ValueRef, std::string>, ir::ValueRef> copies;
    std::vector<ir::Node*> nodes;
    for (const auto& n : g.nodes()) nodes.push_back(n.get());
    int made = 0;
    for (ir::Node* n : nodes) {
      for (ir::ValueRef& v : n->operands) {
        const ir::Node* producer = g.FindNode(v.node);
        if (producer->device == n->device) continue;
        auto key = std::make_pair(v, n->device);
        auto it = copies.find(key);
        if (it == copies.end()) {
          auto copy = std::make_unique<ir::Node>();
          copy->id = g.NextId();
          copy->op = v1::OP_COPY;
          copy->operands = {v};
          copy->attrs.mutable_copy()->set_from_device(producer->device);
          copy->attrs.mutable_copy()->set_to_device(n->device);
          copy->device = n->device;
          copy->path = v1::PATH_NATIVE;
          copy->origins = producer->origins;
          KILN_RETURN_IF_ERROR(ir::InferNode(g, *copy));
          ir::Node* added = g.AddNode(std::move(copy));
          it = copies.emplace(key, added->out()).first;
          ++made;
        }
        v = it->second;
      }
    }
    if (made > 0) ctx.notes.push_back(absl::StrCat("place inserted ", made, " copies"));
    return g.SortTopologically();
  }
};

}  // namespace

std::unique_ptr<Pass> MakePlacePass() { return std::make_unique<PlacePass>(); }

}  // namespace kiln::passes
