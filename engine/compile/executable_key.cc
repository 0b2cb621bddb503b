#include "engine/compile/executable_key.h"

#include "absl/strings/str_cat.h"
#include "base/deterministic_bytes.h"
#include "engine/compile/lower.h"
#include "engine/ir/verifier.h"

namespace kiln::compile {
namespace {}  // namespace

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
  // Only a graph that asks for transforms gets the component, so the keys of
  // every other graph stay what they were.
  if (options.transforms.ByteSizeLong() > 0) {
    key.Add("transforms", DeterministicBytes(options.transforms));
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
