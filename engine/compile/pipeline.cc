#include "engine/compile/pipeline.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/compile/executable_key.h"
#include "engine/compile/lower.h"
#include "engine/compile/stage_clock.h"
#include "engine/ir/text.h"
#include "engine/passes/pass.h"
#include "spdlog/spdlog.h"

namespace kiln::compile {
namespace {

// CompileOptions.allow_tf32: marks every f32 MatMul / FusedMatMul (after
// fusion, so fused products are marked too); the attribute travels in the
// node to each device's KernelSpec, in and out of device workers and the
// executable cache.
void AllowTf32(ir::Graph& g) {
  for (const auto& n : g.nodes()) {
    if (n->outputs.empty() || n->type().dtype != v1::DTYPE_F32) continue;
    if (n->op == v1::OP_MATMUL) n->attrs.mutable_matmul()->set_allow_tf32(true);
    if (n->op == v1::OP_FUSED_MATMUL) n->attrs.mutable_fused_matmul()->set_allow_tf32(true);
  }
}

// Writes the graph's text form after a stage when dumping is on.
void Dump(const std::string& dir, const ir::Graph& g, int index, const std::string& stage) {
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string name = g.name().empty() ? "graph" : g.name();
  const std::string path = absl::StrCat(dir, "/", name, ".", index, "_", stage, ".kiln");
  std::ofstream out(path);
  ir::PrintOptions opts;
  opts.annotations = true;
  out << ir::PrintGraph(g, opts);
  if (!out) spdlog::warn("KILN_DUMP: cannot write {}", path);
}

}  // namespace

Pipeline::Pipeline(PipelineOptions options)
    : options_(std::move(options)), devices_signature_(DevicesSignature(*options_.registry)) {}

absl::StatusOr<HirGraph> Pipeline::Hir(const v1::Graph& graph, const CompileOptions& options,
                                       const std::vector<std::pair<std::string, Dims>>& shapes,
                                       v1::CompileReport& report) const {
  const auto t0 = Clock::now();
  report.set_compiler_version(kCompilerVersion);
  HirGraph hir;
  KILN_ASSIGN_OR_RETURN(hir.graph, ir::ImportGraph(graph, options_.verify));
  KILN_RETURN_IF_ERROR(ir::Specialize(*hir.graph, shapes, options_.verify));
  const runtime::DeviceRegistry& registry = *options_.registry;
  if (options.device != "auto" && !options.device.empty() &&
      registry.Find(options.device) == nullptr) {
    std::string ids;
    for (backend::Device* d : registry.devices()) {
      absl::StrAppend(&ids, ids.empty() ? "" : ", ", d->info().id);
    }
    return absl::InvalidArgumentError(
        absl::StrCat("device \"", options.device, "\" does not exist; devices: ", ids));
  }
  if (!v1::CudaGraphs_IsValid(options.cuda_graphs)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compile option cuda_graphs has no value ", static_cast<int>(options.cuda_graphs),
        " (CUDA_GRAPHS_AUTO = 0, CUDA_GRAPHS_ON = 1, CUDA_GRAPHS_OFF = 2)"));
  }
  const CacheKey key = ExecutableKey(*hir.graph, options, devices_signature_);
  hir.key = key.Hex();
  hir.key_components = key.Components();
  report.set_executable_key(hir.key);
  for (const v1::KeyComponent& c : hir.key_components) *report.add_key_components() = c;
  v1::StageTiming* st = report.add_stages();
  st->set_stage("hir");
  st->set_micros(MicrosSince(t0));
  st->set_nodes_after(static_cast<int32_t>(hir.graph->nodes().size()));
  return hir;
}

absl::StatusOr<v1::Executable> Pipeline::CompileSubgraph(const v1::Graph& subgraph,
                                                        const std::vector<v1::TensorType>& carries,
                                                        const std::string& device,
                                                        const CompileOptions& options,
                                                        const std::string& where) const {
  v1::Graph g = subgraph;
  size_t next = 0;
  for (v1::Node& n : *g.mutable_nodes()) {
    if (n.op() == v1::OP_PARAM) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " declares param \"", n.name(), "\"; pass it in as a carry"));
    }
    if (n.op() != v1::OP_INPUT) continue;
    if (next < carries.size()) {
      // Inputs bind to the carries in node order, by position; the names
      // are the While kernel's (while_kernel.h).
      n.set_name(absl::StrCat("c", next));
      n.clear_outputs();
      *n.add_outputs() = carries[next];
    }
    ++next;
  }
  if (next != carries.size()) {
    return absl::InvalidArgumentError(absl::StrCat(where, " has ", next, " inputs but the While has ",
                                                   carries.size(), " carries"));
  }
  CompileOptions sub = options;
  sub.device = device;
  sub.transforms.Clear();
  sub.state_updates.clear();
  sub.dump_dir.clear();
  v1::CompileReport report;
  absl::StatusOr<HirGraph> hir = Hir(g, sub, {}, report);
  if (!hir.ok()) return StatusBuilder(hir.status()) << "in " << where;
  absl::StatusOr<v1::Executable> lir = CompileToLir(std::move(hir->graph), sub, hir->key, report);
  if (!lir.ok()) return StatusBuilder(lir.status()) << "in " << where;
  return lir;
}

absl::Status Pipeline::CompileWhileSteps(v1::Executable& lir, const CompileOptions& options) const {
  for (v1::LirStep& step : *lir.mutable_steps()) {
    if (step.kind() != v1::STEP_KERNEL || step.kernel().node().op() != v1::OP_WHILE) continue;
    v1::LirKernel& k = *step.mutable_kernel();
    const std::string node = k.covered_node_ids_size() > 0
                                 ? absl::StrCat("node ", k.covered_node_ids(0),
                                                k.covered_names_size() > 0 && !k.covered_names(0).empty()
                                                    ? absl::StrCat(" \"", k.covered_names(0), "\"")
                                                    : "",
                                                " (while)")
                                 : absl::StrCat("kernel ", k.name());
    const std::vector<v1::TensorType> carries(k.input_types().begin(), k.input_types().end());
    const auto& attrs = k.node().attrs().while_();
    KILN_ASSIGN_OR_RETURN(v1::Executable cond, CompileSubgraph(attrs.cond(), carries, step.device(),
                                                               options, node + ": cond"));
    if (cond.outputs_size() != 1 || cond.slots(cond.outputs(0).slot()).type().dtype() != v1::DTYPE_BOOL ||
        cond.slots(cond.outputs(0).slot()).type().dims_size() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(node, ": cond must return one bool scalar"));
    }
    KILN_ASSIGN_OR_RETURN(v1::Executable body, CompileSubgraph(attrs.body(), carries, step.device(),
                                                               options, node + ": body"));
    if (body.outputs_size() != static_cast<int>(carries.size())) {
      return absl::InvalidArgumentError(absl::StrCat(node, ": body returns ", body.outputs_size(),
                                                     " values for ", carries.size(), " carries"));
    }
    for (size_t i = 0; i < carries.size(); ++i) {
      const v1::TensorType& t = body.slots(body.outputs(static_cast<int>(i)).slot()).type();
      if (t.SerializeAsString() != carries[i].SerializeAsString()) {
        return absl::InvalidArgumentError(absl::StrCat(
            node, ": body changes carry ", i, " from ", DTypeName(carries[i].dtype()),
            carries[i].dims_size(), "-d to ", DTypeName(t.dtype()), t.dims_size(),
            "-d or its dims (a While's carries keep their shapes)"));
      }
    }
    *k.add_subprograms() = std::move(cond);
    *k.add_subprograms() = std::move(body);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<runtime::Program>> Pipeline::Compile(
    std::unique_ptr<ir::Graph> g, const CompileOptions& options, const std::string& key,
    v1::CompileReport& report) const {
  KILN_ASSIGN_OR_RETURN(v1::Executable lir, CompileToLir(std::move(g), options, key, report));
  const auto t_lir = Clock::now();
  backend::PrepareContext prep;
  runtime::ProgramOptions program_options = options_.program_options;
  program_options.allow_int8_activations = options.allow_int8_activations;
  KILN_ASSIGN_OR_RETURN(auto program, runtime::Program::Load(std::move(lir), options_.registry,
                                                             options_.kernel_binaries, &prep,
                                                             program_options));
  report.set_kernel_cache_hits(prep.kernel_cache_hits);
  report.set_kernel_cache_misses(prep.kernel_cache_misses);
  // The lir stage: lowering (timed in CompileToLir) plus loading.
  for (v1::StageTiming& st : *report.mutable_stages()) {
    if (st.stage() == "lir") st.set_micros(st.micros() + MicrosSince(t_lir));
  }
  // The loading's parts (Program::load_stages), within the lir stage.
  for (const v1::StageTiming& phase : program->load_stages()) *report.add_stages() = phase;
  return program;
}

absl::StatusOr<v1::Executable> Pipeline::CompileToLir(std::unique_ptr<ir::Graph> g,
                                                      const CompileOptions& options,
                                                      const std::string& key,
                                                      v1::CompileReport& report) const {
  const char* env_dump = std::getenv("KILN_DUMP");
  const std::string dump =
      !options.dump_dir.empty() ? options.dump_dir : (env_dump ? env_dump : "");
  Dump(dump, *g, 0, "hir");
  absl::flat_hash_map<int32_t, OriginInfo> origins;
  for (const auto& n : g->nodes()) origins[n->id] = {n->name, n->op};

  passes::PassContext ctx;
  ctx.devices = options_.registry->devices();
  ctx.placement = options.device;
  ctx.prefer_common_ir = options.prefer_common_ir;
  ctx.enable_fusion = options.enable_fusion;
  ctx.cost_model = options_.cost_model;
  ctx.transforms = options.transforms;
  if (!options.state_updates.empty()) {
    if (options.transforms.has_training()) {
      return absl::InvalidArgumentError(
          "state bindings and a training spec cannot be combined: a training step updates its "
          "params itself");
    }
    ctx.param_updates = options.state_updates;
  }
  int index = 1;
  for (const std::string& stage : passes::PipelineStages()) {
    const auto t = Clock::now();
    KILN_ASSIGN_OR_RETURN(auto pass, passes::CreatePass(stage));
    KILN_RETURN_IF_ERROR(pass->Run(*g, ctx)) << "in stage " << stage;
    v1::StageTiming* st = report.add_stages();
    st->set_stage(stage == "canonicalize" ? "mir" : stage);
    st->set_micros(MicrosSince(t));
    st->set_nodes_after(static_cast<int32_t>(g->nodes().size()));
    Dump(dump, *g, index++, stage);
  }
  if (options.allow_tf32) AllowTf32(*g);
  const auto t_lir = Clock::now();
  KILN_ASSIGN_OR_RETURN(v1::Executable lir, Lower(*g, ctx, origins));
  lir.set_key(key);
  KILN_RETURN_IF_ERROR(CompileWhileSteps(lir, options));

  lir.set_cuda_graphs(options.cuda_graphs);
  for (const v1::MemoryPlanSummary& m : ctx.memory) *report.add_memory() = m;
  for (const std::string& note : ctx.notes) report.add_notes(note);
  std::map<v1::Path, int> paths;
  int kernels = 0, copies = 0;
  for (const v1::LirStep& s : lir.steps()) {
    if (s.kind() == v1::STEP_COPY) {
      ++copies;
      continue;
    }
    ++kernels;
    ++paths[s.kernel().path()];
  }
  for (const auto& [path, count] : paths) {
    v1::PathCount* pc = report.add_paths();
    pc->set_path(path);
    pc->set_nodes(count);
  }
  report.set_kernels(kernels);
  report.set_copies(copies);
  v1::StageTiming* st = report.add_stages();
  st->set_stage("lir");
  st->set_micros(MicrosSince(t_lir));
  st->set_nodes_after(kernels + copies);
  return lir;
}

absl::Status Pipeline::WarmUp() const {
  static constexpr char kGraph[] =
      "graph \"kiln_warmup\"\n"
      "input x: f32[2, 8]\n"
      "param w: f32[8, 8]\n"
      "param b: f32[8]\n"
      "let y = gelu(x @ w + b)\n"
      "out y\n";
  KILN_ASSIGN_OR_RETURN(v1::Graph proto, ir::ParseGraphProto(kGraph));
  KILN_ASSIGN_OR_RETURN(auto g, ir::ImportGraph(proto, options_.verify));
  KILN_RETURN_IF_ERROR(ir::Specialize(*g, {}, options_.verify));
  CompileOptions co;
  co.device = options_.registry->cpu()->info().id;
  v1::CompileReport report;
  return Compile(std::move(g), co, "warmup", report).status();
}

}  // namespace kiln::compile
