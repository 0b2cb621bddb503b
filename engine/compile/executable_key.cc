#include "engine/compile/executable_key.h"

#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/custom_ops.h"
#include "base/deterministic_bytes.h"
#include "engine/compile/lower.h"
#include "engine/ir/verifier.h"

namespace kiln::compile {
namespace {

void CollectCustomOps(const v1::Graph& g, std::set<std::string>& names);

void CollectCustomOps(const v1::Node& n, std::set<std::string>& names) {
  if (n.op() == v1::OP_CUSTOM) names.insert(n.attrs().custom().name());
  const v1::Attrs& a = n.attrs();
  if (a.has_scan()) CollectCustomOps(a.scan().body(), names);
  if (a.has_if_()) {
    CollectCustomOps(a.if_().then_branch(), names);
    CollectCustomOps(a.if_().else_branch(), names);
  }
  if (a.has_while_()) {
    CollectCustomOps(a.while_().cond(), names);
    CollectCustomOps(a.while_().body(), names);
  }
}

void CollectCustomOps(const v1::Graph& g, std::set<std::string>& names) {
  for (const v1::Node& n : g.nodes()) CollectCustomOps(n, names);
}

// The identity of every plugin op the graph names (subgraphs too), so a
// changed plugin (version or file bytes) misses the cache and recompiles; an
// op no plugin provides is recorded as such.
std::string CustomOpsComponent(const v1::Graph& canonical) {
  std::set<std::string> names;
  CollectCustomOps(canonical, names);
  std::string out;
  for (const std::string& name : names) {
    const CustomOp* op = CustomOpRegistry::Global().Find(name);
    absl::StrAppend(&out, op != nullptr ? op->Identity() : absl::StrCat(name, "|(none)"), "\n");
  }
  return out;
}

}  // namespace

std::string DevicesSignature(const runtime::DeviceRegistry& registry) {
  std::string out;
  for (const backend::Device* d : registry.devices()) {
    const backend::DeviceInfo& i = d->info();
    absl::StrAppend(&out, i.id, "|", i.backend, "|", i.arch, "|", i.driver_version, "|", i.identity,
                    "\n");
  }
  absl::StrAppend(&out, registry.BackendVersions());
  return out;
}

CacheKey ExecutableKey(const ir::Graph& graph, const CompileOptions& options,
                       std::string_view devices_signature) {
  CacheKey key;
  key.Add(kKeyKilnVersion, kCompilerVersion);
  key.Add(kKeyLirFormat, absl::StrCat(kLirFormatVersion));
  v1::Graph canonical;
  ir::ExportGraph(graph, &canonical, {.strip_names = true, .with_constants = true});
  key.Add("graph", DeterministicBytes(canonical));
  // ";tf32=1" only when on and ";graphs=..." only when not AUTO, so the keys of every f32-exact compile stay
  // what they were.
  key.Add("options",
          absl::StrCat("device=", options.device, ";common_ir=", options.prefer_common_ir,
                       ";fusion=", options.enable_fusion, options.allow_tf32 ? ";tf32=1" : "",
                       options.cuda_graphs == v1::CUDA_GRAPHS_ON    ? ";graphs=on"
                       : options.cuda_graphs == v1::CUDA_GRAPHS_OFF ? ";graphs=off"
                                                                    : ""));
  // Only a compile with int8 activations gets the component (other keys stay
  // as they were). The LIR does not record the option: the key is what keeps an
  // executable from being loaded for a request that did not ask for it.
  if (options.allow_int8_activations) key.Add("int8_activations", "1");
  // Only a graph that asks for transforms gets the component, so the keys of
  // every other graph stay what they were.
  if (options.transforms.ByteSizeLong() > 0) {
    key.Add("transforms", DeterministicBytes(options.transforms));
  }
  // Only a session with state bindings gets the component (others keep their keys).
  if (!options.state_updates.empty()) {
    std::string state;
    for (const auto& [output, param] : options.state_updates) {
      absl::StrAppend(&state, output.size(), ":", output, "->", param.size(), ":", param, ";");
    }
    key.Add("state", state);
  }
  // Only graphs with custom ops get the component (other keys stay as they were).
  if (std::string custom = CustomOpsComponent(canonical); !custom.empty()) {
    key.Add("custom_ops", custom);
  }
  key.Add("devices", devices_signature);
  std::string shape_sig;
  for (const ir::Node* in : graph.Inputs()) {
    absl::StrAppend(&shape_sig, in->name, ":", ir::TypeToString(in->type()), ";");
  }
  key.Add("input_shapes", shape_sig);
  return key;
}

}  // namespace kiln::compile
