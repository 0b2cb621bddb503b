// Plan memory (DESIGN.md section 3, stage 7): liveness over the schedule
// (node order), then best-fit by decreasing size into one arena per device.
// Views (reshape) share their operand's buffer; elementwise ops write in place
// over an operand whose last use they are. The report gives, per device, the
// arena size, the naive sum (every value in its own buffer) and the lower
// bound (the peak of simultaneously live bytes).
#include <algorithm>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/passes/pass.h"
#include "engine/passes/passes_internal.h"

namespace kiln::passes {
namespace {

// Every slot starts on a multiple of its device's buffer alignment, and at
// least of a cache line.
constexpr int64_t kMinAlignment = 64;

int64_t Align(int64_t bytes, int64_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

int64_t AlignmentOf(const PassContext& ctx, const std::string& device) {
  for (const backend::Device* d : ctx.devices) {
    if (d->info().id == device) return std::max(kMinAlignment, d->info().buffer_alignment);
  }
  return kMinAlignment;
}

// Ops whose kernels may write their output over an operand of the same shape
// and element size (each element is read before it is written).
bool AllowsInPlace(const ir::Node& n) {
  switch (n.op) {
    case v1::OP_UNARY: case v1::OP_BINARY: case v1::OP_CLAMP: case v1::OP_WHERE:
    case v1::OP_FUSED_ELEMENTWISE:
      return n.outputs.size() == 1;
    case v1::OP_CAST:
      return ElementSize(n.outputs[0].dtype) != 0 &&
             ElementSize(n.outputs[0].dtype) == ElementSize(n.attrs.cast().to());
    default:
      return false;
  }
}

struct Group {
  std::string device;
  int64_t bytes = 0;
  int first = 0;  // defining step
  int last = 0;   // last step that reads it
  int64_t offset = 0;
};

class PlanMemoryPass final : public Pass {
 public:
  std::string name() const override { return "plan_memory"; }

  absl::Status Run(ir::Graph& g, PassContext& ctx) const override {
    MemoryPlan& plan = ctx.memory_plan;
    plan = MemoryPlan();
    const int end = static_cast<int>(g.nodes().size());
    absl::flat_hash_map<ir::ValueRef, int> group_of;  // arena values only
    std::vector<Group> groups;
    absl::flat_hash_map<ir::ValueRef, int> last_use;
    for (int i = 0; i < end; ++i) {
      for (const ir::ValueRef& v : g.nodes()[i]->operands) last_use[v] = i;
    }
    for (const auto& o : g.outputs()) last_use[o.value] = end;
    auto group_last = [&](int gi) {
      int last = groups[gi].first;
      for (const auto& [v, idx] : group_of) {
        if (idx == gi) {
          auto it = last_use.find(v);
          if (it != last_use.end()) last = std::max(last, it->second);
        }
      }
      return last;
    };
    absl::flat_hash_map<std::string, int64_t> naive;
    absl::flat_hash_map<std::string, int> in_place_count, alias_count;
    for (int i = 0; i < end; ++i) {
      ir::Node& n = *g.nodes()[i];
      if (IsSource(n)) {
        for (int k = 0; k < static_cast<int>(n.outputs.size()); ++k) {
          plan.values[n.out(k)] = ValuePlacement{n.device, false, -1, n.outputs[k].num_bytes()};
        }
        continue;
      }
      if (n.op == v1::OP_RESHAPE) {
        const ir::ValueRef src = n.operands[0];
        ValuePlacement p = plan.values[src];
        p.alias = true;
        plan.values[n.out()] = p;
        if (auto it = group_of.find(src); it != group_of.end()) group_of[n.out()] = it->second;
        ++alias_count[n.device];
        continue;
      }
      for (int k = 0; k < static_cast<int>(n.outputs.size()); ++k) {
        const int64_t bytes = n.outputs[k].num_bytes();
        const int64_t alignment = AlignmentOf(ctx, n.device);
        naive[n.device] += Align(bytes, alignment);
        int reuse = -1;
        if (k == 0 && AllowsInPlace(n)) {
          for (const ir::ValueRef& v : n.operands) {
            auto it = group_of.find(v);
            if (it == group_of.end()) continue;
            const int gi = it->second;
            if (!(g.TypeOf(v).dims == n.outputs[0].dims) || g.TypeOf(v).num_bytes() != bytes ||
                groups[gi].device != n.device || group_last(gi) != i) {
              continue;
            }
            // An operand read twice by this node stays safe: every read of
            // an element precedes its write.
            reuse = gi;
            break;
          }
        }
        if (reuse >= 0) {
          group_of[n.out(k)] = reuse;
          plan.values[n.out(k)] = ValuePlacement{n.device, true, -1, bytes, true, false};
          ++in_place_count[n.device];
          continue;
        }
        groups.push_back(Group{n.device, Align(bytes, alignment), i, i, 0});
        group_of[n.out(k)] = static_cast<int>(groups.size()) - 1;
        plan.values[n.out(k)] = ValuePlacement{n.device, true, -1, bytes};
      }
    }
    for (int gi = 0; gi < static_cast<int>(groups.size()); ++gi) groups[gi].last = group_last(gi);

    // Best fit by decreasing size: each group takes the smallest gap, among
    // groups already placed whose lifetimes overlap its own, that holds it.
    std::vector<int> order(groups.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return groups[a].bytes > groups[b].bytes; });
    std::vector<int> placed;
    for (int gi : order) {
      Group& grp = groups[gi];
      if (grp.bytes == 0) continue;
      std::vector<std::pair<int64_t, int64_t>> busy;  // [offset, end)
      for (int pj : placed) {
        const Group& o = groups[pj];
        if (o.device != grp.device || o.last < grp.first || grp.last < o.first) continue;
        busy.emplace_back(o.offset, o.offset + o.bytes);
      }
      std::sort(busy.begin(), busy.end());
      int64_t best = -1, best_gap = INT64_MAX, cursor = 0;
      for (const auto& [b, e] : busy) {
        if (b > cursor && b - cursor >= grp.bytes && b - cursor < best_gap) {
          best = cursor;
          best_gap = b - cursor;
        }
        cursor = std::max(cursor, e);
      }
      grp.offset = best >= 0 ? best : cursor;
      placed.push_back(gi);
    }
    absl::flat_hash_map<std::string, int64_t> arena;
    for (const Group& grp : groups) {
      arena[grp.device] = std::max(arena[grp.device], grp.offset + grp.bytes);
    }
    for (auto& [v, p] : plan.values) {
      auto it = group_of.find(v);
      if (it != group_of.end()) {
        p.arena = true;
        p.offset = groups[it->second].offset;
      }
    }
    for (const auto& np : g.nodes()) {
      auto it = plan.values.find(np->out());
      np->offset = (it != plan.values.end() && it->second.arena) ? it->second.offset : -1;
    }
    // Lower bound: the peak over steps of the bytes live at once.
    absl::flat_hash_map<std::string, int64_t> lower;
    for (int step = 0; step <= end; ++step) {
      absl::flat_hash_map<std::string, int64_t> live;
      for (const Group& grp : groups) {
        if (grp.first <= step && step <= grp.last) live[grp.device] += grp.bytes;
      }
      for (const auto& [dev, bytes] : live) lower[dev] = std::max(lower[dev], bytes);
    }
    std::map<std::string, int64_t> devices(arena.begin(), arena.end());
    for (const auto& [dev, bytes] : naive) devices.emplace(dev, 0);
    for (const auto& [dev, bytes] : devices) {
      plan.arena_bytes[dev] = arena[dev];
      v1::MemoryPlanSummary s;
      s.set_device(dev);
      s.set_arena_bytes(arena[dev]);
      s.set_naive_bytes(naive[dev]);
      s.set_lower_bound_bytes(lower[dev]);
      s.set_in_place(in_place_count[dev]);
      s.set_aliases(alias_count[dev]);
      ctx.memory.push_back(s);
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakePlanMemoryPass() { return std::make_unique<PlanMemoryPass>(); }

}  // namespace kiln::passes
