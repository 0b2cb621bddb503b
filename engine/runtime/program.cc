#include "engine/runtime/program.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "backends/capture.h"
#include "base/status.h"
#include "engine/runtime/while_kernel.h"

namespace kiln::runtime {
namespace {

// A caller-owned host range seen as a Buffer (inputs on host-memory devices
// are read in place, never copied).
class ExternalHostBuffer final : public backend::Buffer {
 public:
  ExternalHostBuffer(const void* data, int64_t size) : data_(const_cast<void*>(data)), size_(size) {}
  int64_t size() const override { return size_; }
  void* host_ptr() const override { return data_; }

 private:
  void* data_;
  int64_t size_;
};

Dims DimsOf(const v1::TensorType& t) {
  Dims d;
  for (const auto& dim : t.dims()) d.push_back(dim.size());
  return d;
}

std::string TypeString(const v1::TensorType& t) {
  return absl::StrCat(DTypeName(t.dtype()), DimsToString(DimsOf(t)));
}

backend::TensorDesc DescOf(const v1::TensorType& t) { return {t.dtype(), DimsOf(t)}; }

using LoadClock = std::chrono::steady_clock;

double LoadMicrosSince(LoadClock::time_point t) {
  return std::chrono::duration<double, std::micro>(LoadClock::now() - t).count();
}

// Adds `micros` to the stage `name` of `stages` (appended when new), and
// `count` to its count (nodes_after). No-op without `stages`.
void AddStage(std::vector<v1::StageTiming>* stages, const std::string& name, double micros,
              int count = 1) {
  if (stages == nullptr) return;
  for (v1::StageTiming& st : *stages) {
    if (st.stage() == name) {
      st.set_micros(st.micros() + micros);
      st.set_nodes_after(st.nodes_after() + count);
      return;
    }
  }
  v1::StageTiming& st = stages->emplace_back();
  st.set_stage(name);
  st.set_micros(micros);
  st.set_nodes_after(count);
}

// The family of a kernel implementation name: what precedes its first ':'
// ("cublasLt" of "cublasLt:gemm_bf16+bias"), or the whole name.
std::string ImplementationFamily(const std::string& implementation) {
  return implementation.substr(0, implementation.find(':'));
}

// A caller's input on a host-memory device is bound where it lies when its
// address is a multiple of the device's buffer alignment (kilnd receives
// tensor data into 64-byte aligned memory for this, server/rpc_run.cc), and
// copied once into aligned memory kept in `copies` otherwise: kernels may
// assume aligned views (backend::DeviceInfo::buffer_alignment).
absl::StatusOr<const void*> AlignedInput(const TensorRef& t, const backend::DeviceInfo& device,
                                         std::vector<HostTensor>& copies) {
  const auto alignment = static_cast<uintptr_t>(std::max<int64_t>(1, device.buffer_alignment));
  if (t.bytes == 0 || reinterpret_cast<uintptr_t>(t.data) % alignment == 0) return t.data;
  KILN_ASSIGN_OR_RETURN(HostTensor copy, HostTensor::CreateUninitialized(v1::DTYPE_U8, {t.bytes}));
  std::memcpy(copy.data(), t.data, static_cast<size_t>(t.bytes));
  copies.push_back(std::move(copy));
  return copies.back().data();
}

// RunOptions::output_destinations by output index (null: none), checked
// against the outputs' names and sizes.
absl::StatusOr<std::vector<const RunOptions::OutputDestination*>> OutputDestinations(
    const v1::Executable& lir_, const RunOptions& options) {
  std::vector<const RunOptions::OutputDestination*> by_output(lir_.outputs_size(), nullptr);
  for (const RunOptions::OutputDestination& d : options.output_destinations) {
    int o = 0;
    while (o < lir_.outputs_size() && lir_.outputs(o).name() != d.name) ++o;
    if (o == lir_.outputs_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("an output destination names \"", d.name, "\", not an output of the graph"));
    }
    if (by_output[o] != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("output \"", d.name, "\" has two destinations"));
    }
    const v1::TensorType& type = lir_.slots(lir_.outputs(o).slot()).type();
    const std::optional<int64_t> bytes = BytesFor(
        type.dtype(), CheckedNumElements(DimsOf(type)).value_or(-1));
    if (!bytes || *bytes != d.bytes || (d.bytes > 0 && d.data == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "output \"", d.name, "\" is ", TypeString(type), " (", bytes.value_or(-1),
          " bytes) but its destination has ", d.bytes, " bytes"));
    }
    by_output[o] = &d;
  }
  return by_output;
}

}  // namespace

// The mutable half of a run (program.h): per device a stream, the arena and
// input staging, and the kernels prepared for this context alone.
class RunContext {
 public:
  struct DeviceState {
    backend::Device* device = nullptr;
    std::unique_ptr<backend::Stream> stream;
    std::unique_ptr<backend::Buffer> arena;
    // Device copies of inputs for devices without host memory, by slot.
    std::map<int, std::unique_ptr<backend::Buffer>> input_staging;
  };
  std::map<std::string, DeviceState> devices;
  std::vector<std::unique_ptr<backend::Kernel>> kernels;  // per step; null for copies
  // The kernels that take inputs packed (backends/packing.h), with each
  // packable input's slot and the cache key of its packed copy.
  struct PackedInput {
    int input = 0;
    int slot = 0;
    std::string key;  // the kernel's packing key
  };
  struct Packer {
    backend::PackingKernel* kernel = nullptr;
    std::vector<PackedInput> inputs;
  };
  std::vector<Packer> packers;
  std::map<std::string, uint64_t> generations;  // of its devices when it was made
  std::map<std::string, int64_t> bytes;         // its arena and staging, by device

  // CUDA graphs (Program::graph_device_): runs so far; whether a capture
  // failed (the context then launches kernel by kernel); the captured
  // kernel steps with the bindings (buffer serial, offset per slot) they
  // were captured with. Declared last: destroyed before the kernels.
  struct Captured {
    std::vector<std::pair<uint64_t, int64_t>> binding;
    bool events = false;  // an event before and after each step
    std::unique_ptr<backend::Event> origin;
    std::vector<std::unique_ptr<backend::Event>> before, after;
    std::unique_ptr<backend::CapturedWork> work;  // last: destroyed before its events
  };
  int64_t runs = 0;
  bool graphs_failed = false;
  std::unique_ptr<Captured> graph;
};

bool UseCapturedGraphs(v1::CudaGraphs mode, bool capturable, int kernels,
                       double estimated_run_micros, double launch_micros) {
  if (mode == v1::CUDA_GRAPHS_OFF || !capturable || kernels <= 0) return false;
  if (mode == v1::CUDA_GRAPHS_ON) return true;
  const double saved = kernels * std::max(0.0, launch_micros);
  return saved >= kMinGraphSaving * std::max(0.0, estimated_run_micros);
}

Program::Program(v1::Executable lir, std::shared_ptr<const DeviceRegistry> registry,
                 std::shared_ptr<backend::KernelBinaryCache> binaries,
                 const ProgramOptions& options)
    : registry_(std::move(registry)),
      binaries_(std::move(binaries)),
      options_(options),
      lir_(std::move(lir)) {}

Program::~Program() = default;

absl::StatusOr<std::unique_ptr<Program>> Program::Load(
    v1::Executable lir, std::shared_ptr<const DeviceRegistry> registry,
    std::shared_ptr<backend::KernelBinaryCache> binaries, backend::PrepareContext* prepare_stats,
    const ProgramOptions& options) {
  auto p = std::unique_ptr<Program>(
      new Program(std::move(lir), std::move(registry), std::move(binaries), options));
  v1::Executable& l = p->lir_;
  for (const v1::DeviceEstimate& e : l.placement().estimates()) {
    if (e.device() == l.placement().chosen() && e.feasible()) {
      p->estimated_run_micros_ = std::max(0.0, e.estimate_micros());
    }
  }
  p->wait_timeout_ =
      std::max(options.device_wait_floor,
               absl::Microseconds(p->estimated_run_micros_ * std::max(0.0, options.device_wait_slack)));
  for (int i = 0; i < l.slots_size(); ++i) {
    if (p->registry_->Find(l.slots(i).device()) == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "executable needs device ", l.slots(i).device(), ", which this process does not have"));
    }
  }
  // Constants go to the device of the slot that reads them, once per program
  // (and again after that device restarts).
  std::vector<v1::StageTiming>& stages = p->load_stages_;
  {
    const auto t = LoadClock::now();
    KILN_ASSIGN_OR_RETURN(auto constants, p->UploadConstants());
    absl::MutexLock lock(&p->constants_mu_);
    p->constants_ = std::move(constants);
    if (l.constants_size() > 0) AddStage(&stages, "load.constants", LoadMicrosSince(t));
  }
  // A While step's cond and body, each its own program (while_kernel.h).
  p->while_programs_.resize(l.steps_size());
  for (int i = 0; i < l.steps_size(); ++i) {
    const v1::LirStep& step = l.steps(i);
    if (step.kind() != v1::STEP_KERNEL || step.kernel().node().op() != v1::OP_WHILE) continue;
    const auto& subs = step.kernel().subprograms();
    if (subs.size() != 2) {
      return absl::FailedPreconditionError(absl::StrCat(
          "kernel ", step.kernel().name(), ": a While step needs its cond and body programs, has ",
          subs.size()));
    }
    for (int j = 0; j < 2; ++j) {
      auto sub = Program::Load(subs[j], p->registry_, p->binaries_, prepare_stats, options);
      if (!sub.ok()) {
        return StatusBuilder(sub.status()) << "while loading the " << (j == 0 ? "cond" : "body")
                                           << " of kernel " << step.kernel().name();
      }
      for (const v1::StageTiming& st : (*sub)->load_stages()) {
        AddStage(&stages, st.stage(), st.micros(), st.nodes_after());
      }
      p->while_programs_[i][j] = std::move(sub).value();
    }
  }
  backend::PrepareContext ctx;
  ctx.binaries = p->binaries_.get();
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<RunContext> first, p->CreateContext(ctx, &stages));
  if (!first->packers.empty()) {
    // Constants are packed now, once for the program (params on the first
    // run with each set); the step names below then say which kernels read
    // a packed constant.
    const auto t = LoadClock::now();
    std::vector<std::shared_ptr<const backend::PackedOperand>> hold;
    absl::MutexLock lock(&p->constants_mu_);
    KILN_RETURN_IF_ERROR(p->BindPacked(*first, *p->constants_, nullptr, &hold));
    AddStage(&stages, "load.bind", LoadMicrosSince(t));
  }
  for (int i = 0; i < l.steps_size(); ++i) {
    if (first->kernels[i]) {
      l.mutable_steps(i)->mutable_kernel()->set_implementation(first->kernels[i]->implementation());
    }
  }
  if (prepare_stats != nullptr) {
    prepare_stats->kernel_cache_hits += ctx.kernel_cache_hits;
    prepare_stats->kernel_cache_misses += ctx.kernel_cache_misses;
  }
  {
    // CUDA graphs: every step a capturable kernel on one device that captures.
    bool capturable = l.steps_size() > 0;
    const std::string device = capturable ? l.steps(0).device() : "";
    for (int i = 0; i < l.steps_size() && capturable; ++i) {
      const auto* kernel = dynamic_cast<const backend::CapturableKernel*>(first->kernels[i].get());
      capturable = l.steps(i).kind() == v1::STEP_KERNEL && l.steps(i).device() == device &&
                   kernel != nullptr && kernel->capturable();
    }
    double launch_micros = 0;
    if (capturable) {
      const backend::DeviceInfo& info = p->registry_->Find(device)->info();
      capturable =
          std::find(info.features.begin(), info.features.end(), "graphs") != info.features.end();
      const auto calibrated = options.launch_overhead_us.find(device);
      launch_micros = calibrated != options.launch_overhead_us.end()
                          ? calibrated->second
                          : info.profile.launch_overhead_us;
    }
    if (UseCapturedGraphs(l.cuda_graphs(), capturable, l.steps_size(), p->estimated_run_micros_,
                          launch_micros)) {
      p->graph_device_ = device;
    }
  }
  p->direct_output_.assign(l.slots_size(), false);
  {
    std::vector<int> writers(l.slots_size(), 0);
    for (const v1::LirStep& step : l.steps()) {
      if (step.kind() != v1::STEP_KERNEL) continue;
      for (int slot : step.outputs()) ++writers[slot];
    }
    std::vector<int> outputs_per_slot(l.slots_size(), 0);
    for (const auto& out : l.outputs()) ++outputs_per_slot[out.slot()];
    for (const auto& out : l.outputs()) {
      const int i = out.slot();
      const v1::Slot& slot = l.slots(i);
      if (slot.storage() != v1::SLOT_ARENA || slot.bytes() <= 0 || writers[i] != 1 ||
          outputs_per_slot[i] != 1 || !p->registry_->Find(slot.device())->info().host_memory) {
        continue;
      }
      bool alone = true;
      for (int j = 0; j < l.slots_size() && alone; ++j) {
        const v1::Slot& other = l.slots(j);
        if (j == i || other.storage() != v1::SLOT_ARENA || other.device() != slot.device()) continue;
        alone = other.offset() + other.bytes() <= slot.offset() ||
                slot.offset() + slot.bytes() <= other.offset();
      }
      p->direct_output_[i] = alone;
    }
  }
  {
    // A param update written in place: one kernel step writes its slot (an
    // arena slot on the device that holds the params), and no view slot
    // made after it (a reshape of it: a later reader or an output) shares
    // its bytes, since a view would still read the arena. Every other
    // update is copied after the kernels.
    std::vector<int> writers(l.slots_size(), 0);
    for (const v1::LirStep& step : l.steps()) {
      for (int slot : step.outputs()) {
        writers[slot] += step.kind() == v1::STEP_KERNEL ? 1 : 2;
      }
    }
    std::vector<int> updates_per_slot(l.slots_size(), 0);
    for (const auto& u : l.param_updates()) ++updates_per_slot[u.slot()];
    for (const auto& u : l.param_updates()) {
      const int i = u.slot();
      const v1::Slot& slot = l.slots(i);
      bool ok = slot.storage() == v1::SLOT_ARENA && slot.bytes() > 0 && writers[i] == 1 &&
                updates_per_slot[i] == 1 && !p->direct_output_[i] &&
                slot.device() != p->graph_device_;
      for (int j = i + 1; j < l.slots_size() && ok; ++j) {
        const v1::Slot& other = l.slots(j);
        if (writers[j] != 0 || other.storage() != v1::SLOT_ARENA ||
            other.device() != slot.device()) {
          continue;
        }
        ok = other.offset() + other.bytes() <= slot.offset() ||
             slot.offset() + slot.bytes() <= other.offset();
      }
      p->update_in_place_.push_back(ok);
    }
  }
  for (const auto& in : l.inputs()) {
    p->signature_.inputs.push_back({in.name(), l.slots(in.slot()).type()});
  }
  for (int i = 0; i < l.params_size(); ++i) {
    p->signature_.params.push_back({l.params(i).name(), l.slots(l.params(i).slot()).type()});
  }
  for (const auto& out : l.outputs()) {
    p->signature_.outputs.push_back({out.name(), l.slots(out.slot()).type()});
  }
  {
    absl::MutexLock lock(&p->contexts_mu_);
    p->idle_contexts_.push_back(std::move(first));
    p->live_contexts_ = 1;
    p->contexts_created_ = 1;
  }
  return p;
}

absl::StatusOr<std::shared_ptr<const Program::Constants>> Program::UploadConstants() const {
  const v1::Executable& l = lir_;
  auto c = std::make_shared<Constants>();
  c->buffers.resize(l.constants_size());
  std::map<std::string, std::unique_ptr<backend::Stream>> upload;
  for (int i = 0; i < l.slots_size(); ++i) {
    const v1::Slot& slot = l.slots(i);
    if (slot.storage() != v1::SLOT_CONSTANT || c->buffers[slot.index()]) continue;
    backend::Device* d = registry_->Find(slot.device());
    if (!c->generations.contains(slot.device())) c->generations[slot.device()] = d->generation();
    std::unique_ptr<backend::Stream>& stream = upload[slot.device()];
    if (!stream) {
      KILN_ASSIGN_OR_RETURN(stream, d->CreateStream());
    }
    const v1::Tensor& t = l.constants(slot.index());
    KILN_ASSIGN_OR_RETURN(auto buf, d->Allocate(static_cast<int64_t>(t.data().size())));
    if (!t.data().empty()) {
      KILN_RETURN_IF_ERROR(d->CopyToDevice(
          *stream, t.data().data(),
          backend::BufferView{buf.get(), 0, static_cast<int64_t>(t.data().size())}));
    }
    c->buffers[slot.index()] = std::move(buf);
  }
  for (auto& [id, stream] : upload) {
    KILN_RETURN_IF_ERROR(stream->SynchronizeFor(wait_timeout_)) << "while uploading constants";
  }
  return std::shared_ptr<const Constants>(std::move(c));
}

bool Program::Stale(const std::map<std::string, uint64_t>& generations) const {
  for (const auto& [id, generation] : generations) {
    if (registry_->Find(id)->generation() != generation) return true;
  }
  return false;
}

absl::StatusOr<std::shared_ptr<const Program::Constants>> Program::CurrentConstants() {
  absl::MutexLock lock(&constants_mu_);
  if (Stale(constants_->generations)) {
    KILN_ASSIGN_OR_RETURN(constants_, UploadConstants());
  }
  return constants_;
}

absl::StatusOr<std::unique_ptr<RunContext>> Program::CreateContext(
    backend::PrepareContext& prepare, std::vector<v1::StageTiming>* stages) {
  const v1::Executable& l = lir_;
  auto c = std::make_unique<RunContext>();
  auto state = [&](const std::string& id) -> absl::StatusOr<RunContext::DeviceState*> {
    auto it = c->devices.find(id);
    if (it != c->devices.end()) return &it->second;
    backend::Device* d = registry_->Find(id);
    if (d == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("executable needs device ", id,
                                                        ", which this process does not have"));
    }
    RunContext::DeviceState s;
    s.device = d;
    c->generations[id] = d->generation();
    const auto t = LoadClock::now();
    KILN_ASSIGN_OR_RETURN(s.stream, d->CreateStream());
    AddStage(stages, "load.streams", LoadMicrosSince(t));
    return &c->devices.emplace(id, std::move(s)).first->second;
  };
  for (const v1::LirArena& a : l.arenas()) {
    KILN_ASSIGN_OR_RETURN(RunContext::DeviceState * s, state(a.device()));
    const auto t = LoadClock::now();
    KILN_ASSIGN_OR_RETURN(s->arena, s->device->Allocate(a.bytes()));
    AddStage(stages, "load.allocate", LoadMicrosSince(t));
  }
  for (int i = 0; i < l.slots_size(); ++i) {
    const v1::Slot& slot = l.slots(i);
    KILN_ASSIGN_OR_RETURN(RunContext::DeviceState * s, state(slot.device()));
    if (slot.storage() == v1::SLOT_INPUT && !s->device->info().host_memory &&
        !s->input_staging.contains(i)) {
      const auto t = LoadClock::now();
      KILN_ASSIGN_OR_RETURN(s->input_staging[i], s->device->Allocate(slot.bytes()));
      AddStage(stages, "load.allocate", LoadMicrosSince(t));
    }
  }
  std::set<std::string> families_seen;
  for (const auto& [id, s] : c->devices) {
    int64_t n = s.arena ? s.arena->size() : 0;
    for (const auto& [slot, buf] : s.input_staging) n += buf->size();
    if (n > 0) c->bytes[id] = n;
  }
  c->kernels.resize(l.steps_size());
  for (int i = 0; i < l.steps_size(); ++i) {
    const v1::LirStep& step = l.steps(i);
    KILN_ASSIGN_OR_RETURN(RunContext::DeviceState * s, state(step.device()));
    if (step.kind() != v1::STEP_KERNEL) continue;
    const v1::LirKernel& k = step.kernel();
    backend::KernelSpec spec;
    spec.name = k.name();
    spec.label = absl::StrCat("kernel ", k.name());
    spec.op = k.node().op();
    spec.attrs = k.node().attrs();
    spec.allow_int8_activations = options_.allow_int8_activations;
    for (const auto& t : k.input_types()) spec.inputs.push_back(DescOf(t));
    for (const auto& t : k.node().outputs()) spec.outputs.push_back(DescOf(t));
    if (spec.op == v1::OP_WHILE) {
      c->kernels[i] = MakeWhileKernel(i, std::move(spec));
      continue;
    }
    const auto t_prepare = LoadClock::now();
    auto kernel = s->device->PrepareKernel(spec, prepare);
    if (!kernel.ok()) {
      return StatusBuilder(kernel.status()) << "while preparing " << k.name() << " on "
                                            << step.device();
    }
    if (stages != nullptr) {
      const double us = LoadMicrosSince(t_prepare);
      const std::string family =
          absl::StrCat("load.prepare.", ImplementationFamily((*kernel)->implementation()));
      AddStage(stages, family, us);
      if (families_seen.insert(family).second) AddStage(stages, family + ".first", us);
    }
    c->kernels[i] = std::move(kernel).value();
    if (auto* packing = dynamic_cast<backend::PackingKernel*>(c->kernels[i].get())) {
      RunContext::Packer packer;
      packer.kernel = packing;
      for (int input : packing->packable_inputs()) {
        if (input < 0 || input >= step.inputs_size()) continue;
        packer.inputs.push_back({input, step.inputs(input), packing->packing_key(input)});
      }
      if (!packer.inputs.empty()) c->packers.push_back(std::move(packer));
    }
  }
  const auto t_sync = LoadClock::now();
  for (auto& [id, s] : c->devices) KILN_RETURN_IF_ERROR(s.stream->SynchronizeFor(wait_timeout_));
  if (!c->devices.empty()) AddStage(stages, "load.sync", LoadMicrosSince(t_sync));
  return c;
}

absl::Status Program::BindPacked(
    RunContext& context, const Constants& constants, const ParamSetImpl* params,
    std::vector<std::shared_ptr<const backend::PackedOperand>>* hold) {
  for (RunContext::Packer& packer : context.packers) {
    for (const RunContext::PackedInput& in : packer.inputs) {
      const v1::Slot& slot = lir_.slots(in.slot);
      std::shared_ptr<const backend::PackedOperand> packed;
      auto pack = [&](const backend::BufferView& value)
          -> absl::StatusOr<std::shared_ptr<const backend::PackedOperand>> {
        packs_made_.fetch_add(1, std::memory_order_relaxed);
        return packer.kernel->Pack(in.input, value);
      };
      if (slot.storage() == v1::SLOT_CONSTANT) {
        const std::string key = absl::StrCat(slot.index(), "/", in.key);
        absl::MutexLock lock(&constants.packed_mu);
        auto it = constants.packed.find(key);
        if (it != constants.packed.end()) {
          packed = it->second;
        } else {
          const backend::BufferView value{constants.buffers[slot.index()].get(), 0, slot.bytes()};
          absl::StatusOr<std::shared_ptr<const backend::PackedOperand>> made = pack(value);
          if (!made.ok()) {
            return StatusBuilder(made.status()) << "while packing constant " << slot.index();
          }
          packed = constants.packed[key] = *made;
        }
      } else if (slot.storage() == v1::SLOT_PARAM && params != nullptr) {
        KILN_ASSIGN_OR_RETURN(packed,
                              params->Packed(lir_.params(slot.index()).name(),
                                             *registry_->Find(slot.device()), in.key, pack));
      }
      packer.kernel->UsePacked(in.input, packed.get());
      if (packed != nullptr) hold->push_back(std::move(packed));
    }
  }
  return absl::OkStatus();
}

std::unique_ptr<backend::Kernel> Program::MakeWhileKernel(int step, backend::KernelSpec spec) const {
  const v1::LirKernel& k = lir_.steps(step).kernel();
  std::string label = absl::StrCat("kernel ", k.name());
  if (k.covered_node_ids_size() > 0) {
    const std::string name = k.covered_names_size() > 0 ? k.covered_names(0) : "";
    label = name.empty() ? absl::StrCat("node ", k.covered_node_ids(0), " (while)")
                         : absl::StrCat("node ", k.covered_node_ids(0), " \"", name, "\" (while)");
  }
  int64_t limit = std::max<int64_t>(1, options_.max_while_iterations);
  std::string source = absl::StrCat("limits.max_while_iterations = ", limit);
  const int64_t own = k.node().attrs().while_().max_iterations();
  if (own > 0 && own < limit) {
    limit = own;
    source = absl::StrCat("its max_iterations attribute = ", own);
  }
  return std::make_unique<WhileKernel>(std::move(label), std::move(spec), while_programs_[step][0],
                                       while_programs_[step][1], limit, std::move(source));
}

absl::StatusOr<std::unique_ptr<RunContext>> Program::AcquireContext() {
  {
    absl::MutexLock lock(&contexts_mu_);
    auto can_go = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(contexts_mu_) {
      return !idle_contexts_.empty() || live_contexts_ < std::max(1, options_.max_contexts);
    };
    contexts_mu_.Await(absl::Condition(&can_go));
    while (!idle_contexts_.empty()) {
      std::unique_ptr<RunContext> c = std::move(idle_contexts_.back());
      idle_contexts_.pop_back();
      if (!Stale(c->generations)) return c;
      // Made before one of its devices restarted: its memory, streams and
      // kernels there are gone (releasing them costs nothing there).
      --live_contexts_;
      ++contexts_discarded_;
    }
    if (live_contexts_ >= std::max(1, options_.max_contexts)) {
      // Every context is busy after all; wait as above.
      auto can_take = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(contexts_mu_) {
        return !idle_contexts_.empty() || live_contexts_ < std::max(1, options_.max_contexts);
      };
      contexts_mu_.Await(absl::Condition(&can_take));
      if (!idle_contexts_.empty()) {
        std::unique_ptr<RunContext> c = std::move(idle_contexts_.back());
        idle_contexts_.pop_back();
        return c;
      }
    }
    ++live_contexts_;  // reserved; created below, outside the lock
  }
  backend::PrepareContext prepare;
  prepare.binaries = binaries_.get();
  absl::StatusOr<std::unique_ptr<RunContext>> c = CreateContext(prepare);
  absl::MutexLock lock(&contexts_mu_);
  if (!c.ok()) {
    --live_contexts_;
    return c.status();
  }
  ++contexts_created_;
  return c;
}

void Program::ReleaseContext(std::unique_ptr<RunContext> context,
                             const std::optional<std::string>& faulted_device) {
  if (faulted_device) {
    // The faulted device may still be running this context's work: its
    // memory (arena, staging, what its kernels own) is abandoned, never
    // returned to a pool another run could be handed. Its stream leaks what
    // its unfinished batches use by itself.
    auto it = context->devices.find(*faulted_device);
    if (it != context->devices.end()) {
      (void)it->second.arena.release();
      for (auto& [slot, buf] : it->second.input_staging) (void)buf.release();
    }
    for (int i = 0; i < lir_.steps_size(); ++i) {
      if (lir_.steps(i).device() == *faulted_device) (void)context->kernels[i].release();
    }
    if (graph_device_ == *faulted_device) (void)context->graph.release();
    context.reset();
  }
  absl::MutexLock lock(&contexts_mu_);
  if (faulted_device) {
    --live_contexts_;
    ++contexts_discarded_;
    return;
  }
  idle_contexts_.push_back(std::move(context));
}

Program::ParamUpdateStats Program::param_update_stats() const {
  ParamUpdateStats s;
  s.in_place = updates_in_place_.load(std::memory_order_relaxed);
  s.copied = updates_copied_.load(std::memory_order_relaxed);
  s.copied_bytes = update_bytes_copied_.load(std::memory_order_relaxed);
  return s;
}

Program::ContextStats Program::context_stats() const {
  absl::MutexLock lock(&contexts_mu_);
  ContextStats s;
  s.live = live_contexts_;
  s.idle = static_cast<int>(idle_contexts_.size());
  s.created = contexts_created_;
  s.discarded = contexts_discarded_;
  s.graph_captures = graph_captures_.load();
  s.graph_replays = graph_replays_.load();
  s.graph_failures = graph_failures_.load();
  return s;
}

absl::Status Program::CheckInputs(std::span<const TensorRef> inputs,
                                           std::vector<const TensorRef*>* by_index) const {
  by_index->assign(lir_.inputs_size(), nullptr);
  for (const TensorRef& t : inputs) {
    int found = -1;
    for (int i = 0; i < lir_.inputs_size(); ++i) {
      if (lir_.inputs(i).name() == t.name) found = i;
    }
    if (found < 0) {
      std::string names;
      for (const auto& in : lir_.inputs()) absl::StrAppend(&names, names.empty() ? "" : ", ", in.name());
      return absl::InvalidArgumentError(absl::StrCat("unknown input \"", t.name, "\"; the graph's inputs: ",
                                                     names.empty() ? "(none)" : names));
    }
    if ((*by_index)[found] != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("input \"", t.name, "\" given twice"));
    }
    const v1::Slot& slot = lir_.slots(lir_.inputs(found).slot());
    if (t.dtype != slot.type().dtype() || t.dims != DimsOf(slot.type())) {
      return absl::InvalidArgumentError(absl::StrCat("input \"", t.name, "\" must be ",
                                                     TypeString(slot.type()), ", got ",
                                                     DTypeName(t.dtype), DimsToString(t.dims)));
    }
    if (t.bytes != slot.bytes() || (t.bytes > 0 && t.data == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("input \"", t.name, "\" needs ", slot.bytes(),
                                                     " bytes, got ", t.bytes));
    }
    (*by_index)[found] = &t;
  }
  for (int i = 0; i < lir_.inputs_size(); ++i) {
    if ((*by_index)[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("missing input \"", lir_.inputs(i).name(), "\" (",
                                                     TypeString(lir_.slots(lir_.inputs(i).slot()).type()),
                                                     ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status Program::CheckParams(const ParamSetImpl* params) const {
  for (int i = 0; i < lir_.params_size(); ++i) {
    const std::string& name = lir_.params(i).name();
    const v1::TensorType& want = lir_.slots(lir_.params(i).slot()).type();
    const ParamSetImpl::Entry* e = params ? params->Find(name) : nullptr;
    if (e == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("param \"", name, "\" (", TypeString(want),
                                                        ") is not set"));
    }
    if (e->dtype != want.dtype() || e->dims != DimsOf(want)) {
      return absl::InvalidArgumentError(absl::StrCat("param \"", name, "\" must be ", TypeString(want),
                                                     ", is ", DTypeName(e->dtype), DimsToString(e->dims)));
    }
  }
  return absl::OkStatus();
}

// Why a run must stop before step `step` of `steps`, if it must.
// (A client whose deadline passed is also cancelled: the deadline is named.)
absl::Status StopBetweenKernels(const RunOptions& options, int step, int steps) {
  const bool cancelled =
      options.cancelled != nullptr && options.cancelled->load(std::memory_order_relaxed);
  const bool late = options.deadline != absl::InfiniteFuture() && absl::Now() >= options.deadline;
  if (late) {
    return absl::DeadlineExceededError(absl::StrCat(
        "the run's deadline passed; it stopped between kernels after ", step, " of ", steps,
        " steps"));
  }
  if (cancelled) {
    return absl::CancelledError(absl::StrCat(
        "the run was cancelled (the client went away); it stopped between kernels after ", step,
        " of ", steps, " steps"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RunResult> Program::Run(std::span<const TensorRef> inputs,
                                       const ParamSetImpl* params, const RunOptions& options) {
  std::vector<const TensorRef*> by_index;
  KILN_RETURN_IF_ERROR(CheckInputs(inputs, &by_index));
  KILN_RETURN_IF_ERROR(CheckParams(params));
  // A training step writes its param set: one step at a time per set, and
  // only into a training set on the step's own device.
  std::optional<absl::MutexLock> step_lock;
  if (lir_.param_updates_size() > 0) {
    if (params == nullptr || !params->training()) {
      return absl::FailedPreconditionError(
          "this executable updates its params (a training step, or state bindings): its "
          "params must be a training set or a state set (Engine::CreateTrainingParams or "
          "CreateStateParams; a training or stateful session)");
    }
    for (const v1::LirNamedSlot& u : lir_.param_updates()) {
      const std::string& device = lir_.slots(u.slot()).device();
      if (device != params->home().info().id) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the training step updates param \"", u.name(), "\" on ", device,
            " but its training set lives on ", params->home().info().id));
      }
    }
    step_lock.emplace(&params->step_mu());
  }
  // A run that only reads a training set sees whole steps.
  std::optional<absl::ReaderMutexLock> read_lock;
  if (lir_.param_updates_size() == 0 && params != nullptr && params->training()) {
    read_lock.emplace(&params->step_mu());
  }
  KILN_RETURN_IF_ERROR(StopBetweenKernels(options, 0, lir_.steps_size()));
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<const Constants> constants, CurrentConstants());
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<RunContext> context, AcquireContext());
  // The context's memory is the run's tenant's while the run holds it.
  const std::map<std::string, int64_t> held = context->bytes;
  if (options_.ledger) options_.ledger->Charge(options.tenant, held);
  absl::StatusOr<RunResult> result = RunOn(*context, *constants, by_index, params, options);
  std::optional<std::string> faulted = backend::FaultedDevice(result.status());
  if (!result.ok() && !faulted) {
    // A run stopped part-way may leave work queued: finish it before the
    // context serves another run (and surface a device that hung meanwhile).
    for (auto& [id, s] : context->devices) {
      absl::Status drained = s.stream->SynchronizeFor(wait_timeout_);
      if (auto f = backend::FaultedDevice(drained); f && !faulted) {
        faulted = f;
        result = drained;
      }
    }
  }
  ReleaseContext(std::move(context), faulted);
  if (options_.ledger) options_.ledger->Release(options.tenant, held);
  return result;
}

absl::Status Program::Capture(RunContext& context, backend::Stream& stream,
                              backend::CapturingStream& capturing,
                              const std::vector<backend::BufferView>& views, bool events) {
  auto c = std::make_unique<RunContext::Captured>();
  c->events = events;
  KILN_RETURN_IF_ERROR(capturing.BeginCapture());
  absl::Status launched = [&]() -> absl::Status {
    if (events) {
      KILN_ASSIGN_OR_RETURN(c->origin, stream.Record());
      c->before.resize(lir_.steps_size());
      c->after.resize(lir_.steps_size());
    }
    for (int i = 0; i < lir_.steps_size(); ++i) {
      const v1::LirStep& step = lir_.steps(i);
      std::vector<backend::BufferView> ins, outs;
      for (int slot : step.inputs()) ins.push_back(views[slot]);
      for (int slot : step.outputs()) outs.push_back(views[slot]);
      if (events) {
        KILN_ASSIGN_OR_RETURN(c->before[i], stream.Record());
      }
      KILN_RETURN_IF_ERROR(context.kernels[i]->Launch(stream, ins, outs))
          << "while capturing " << step.kernel().name() << " on " << step.device();
      if (events) {
        KILN_ASSIGN_OR_RETURN(c->after[i], stream.Record());
      }
    }
    return absl::OkStatus();
  }();
  absl::StatusOr<std::unique_ptr<backend::CapturedWork>> work = capturing.EndCapture();
  KILN_RETURN_IF_ERROR(launched);
  KILN_RETURN_IF_ERROR(work.status()) << "while capturing a graph of " << lir_.steps_size()
                                      << " kernels";
  c->work = std::move(work).value();
  context.graph = std::move(c);
  return absl::OkStatus();
}

absl::StatusOr<RunResult> Program::RunOn(RunContext& context, const Constants& constants,
                                         const std::vector<const TensorRef*>& by_index,
                                         const ParamSetImpl* params, const RunOptions& options) {
  auto& devices_ = context.devices;
  auto& kernels_ = context.kernels;
  const auto wall_start = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<backend::Buffer>> external;
  std::vector<HostTensor> realigned;  // copies of inputs not aligned for their device
  std::vector<backend::BufferView> views(lir_.slots_size());
  std::map<int, HostTensor> direct;  // slot -> the result tensor kernels write
  KILN_ASSIGN_OR_RETURN(std::vector<const RunOptions::OutputDestination*> destination,
                        OutputDestinations(lir_, options));
  std::set<int> direct_to_destination;  // slots kernels write in the caller's memory
  for (int i = 0; i < lir_.slots_size(); ++i) {
    const v1::Slot& slot = lir_.slots(i);
    RunContext::DeviceState& s = devices_.at(slot.device());
    switch (slot.storage()) {
      case v1::SLOT_ARENA:
        if (direct_output_[i]) {
          // A direct output is its slot's only output: kernels write it in
          // its destination when that is aligned as arena memory is, and
          // holds floats (the caller may write its memory during the run:
          // an integer there could be an index a later kernel checks and
          // then reads again; those are copied out at the end instead).
          const RunOptions::OutputDestination* d = nullptr;
          for (int o = 0; o < lir_.outputs_size(); ++o) {
            if (lir_.outputs(o).slot() == i && destination[o] != nullptr) d = destination[o];
          }
          if (d != nullptr && IsFloat(slot.type().dtype()) &&
              reinterpret_cast<uintptr_t>(d->data) % 64 == 0) {
            external.push_back(std::make_unique<ExternalHostBuffer>(d->data, d->bytes));
            views[i] = backend::BufferView{external.back().get(), 0, slot.bytes()};
            direct_to_destination.insert(i);
            break;
          }
          KILN_ASSIGN_OR_RETURN(HostTensor t, HostTensor::CreateUninitialized(
                                                  slot.type().dtype(), DimsOf(slot.type())));
          external.push_back(std::make_unique<ExternalHostBuffer>(t.data(), t.num_bytes()));
          views[i] = backend::BufferView{external.back().get(), 0, slot.bytes()};
          direct.emplace(i, std::move(t));
          break;
        }
        views[i] = backend::BufferView{s.arena.get(), slot.offset(), slot.bytes()};
        break;
      case v1::SLOT_CONSTANT:
        views[i] = backend::BufferView{constants.buffers[slot.index()].get(), 0, slot.bytes()};
        break;
      case v1::SLOT_PARAM: {
        KILN_ASSIGN_OR_RETURN(views[i], params->On(lir_.params(slot.index()).name(), *s.device));
        views[i].bytes = slot.bytes();
        break;
      }
      case v1::SLOT_INPUT: {
        const TensorRef& t = *by_index[slot.index()];
        if (s.device->info().host_memory) {
          KILN_ASSIGN_OR_RETURN(const void* data, AlignedInput(t, s.device->info(), realigned));
          external.push_back(std::make_unique<ExternalHostBuffer>(data, t.bytes));
          views[i] = backend::BufferView{external.back().get(), 0, slot.bytes()};
        } else {
          auto it = s.input_staging.find(i);
          views[i] = backend::BufferView{it->second.get(), 0, slot.bytes()};
          if (slot.bytes() > 0) KILN_RETURN_IF_ERROR(s.device->CopyToDevice(*s.stream, t.data, views[i]));
        }
        break;
      }
      default:
        return absl::InternalError("slot with unknown storage");
    }
  }
  // A training step's updates written in place go into its param set's
  // spare buffers (made current below once every device finished).
  std::vector<bool> spare_bound(lir_.param_updates_size(), false);
  if (params != nullptr && params->training_step_set()) {
    for (int k = 0; k < lir_.param_updates_size(); ++k) {
      if (!update_in_place_[k]) continue;
      const v1::LirNamedSlot& u = lir_.param_updates(k);
      const v1::Slot& slot = lir_.slots(u.slot());
      const ParamSetImpl::Entry* e = params->Find(u.name());
      if (e == nullptr || e->bytes != slot.bytes()) continue;  // the copy below says why
      KILN_ASSIGN_OR_RETURN(views[u.slot()], params->Spare(u.name()));
      spare_bound[k] = true;
    }
  }
  std::vector<std::shared_ptr<const backend::PackedOperand>> packed;  // bound for this run
  KILN_RETURN_IF_ERROR(BindPacked(context, constants, params, &packed));
  struct Timing {
    std::unique_ptr<backend::Event> before, after;
  };
  std::vector<Timing> timings(options.report ? lir_.steps_size() : 0);
  std::map<std::string, std::unique_ptr<backend::Event>> origin;  // first event per device
  std::map<std::string, double> origin_wall;                      // its wall offset, us
  std::vector<double> enqueue_wall(lir_.steps_size(), 0);
  // CUDA graphs: capture on a context's second run (the first one sized
  // every workspace), replay after; a binding that changed (another param
  // set) or a report from a capture without events captures again.
  std::string graph_state;
  if (!graph_device_.empty() && !context.graphs_failed) {
    ++context.runs;
    RunContext::DeviceState& s = devices_.at(graph_device_);
    // What a replay reads and writes: each slot's memory (the device's
    // binding id of its buffer) and offset. A buffer without one (not the
    // device's) is never captured.
    std::vector<std::pair<uint64_t, int64_t>> binding;
    binding.reserve(views.size());
    bool bindable = true;
    for (const backend::BufferView& v : views) {
      const auto* b = dynamic_cast<const backend::CaptureBinding*>(v.buffer);
      bindable = bindable && (v.buffer == nullptr || b != nullptr);
      binding.emplace_back(b ? b->binding_id() : 0, v.offset);
    }
    if (!bindable) context.graph.reset();
    if (context.graph &&
        (context.graph->binding != binding || (options.report && !context.graph->events))) {
      context.graph.reset();
    }
    if (!context.graph && context.runs >= 2 && bindable) {
      KILN_RETURN_IF_ERROR(StopBetweenKernels(options, 0, lir_.steps_size()));
      auto* capturing = dynamic_cast<backend::CapturingStream*>(s.stream.get());
      absl::Status captured =
          capturing == nullptr ? absl::UnimplementedError("the stream cannot capture")
                               : Capture(context, *s.stream, *capturing, views, options.report);
      if (captured.ok()) {
        context.graph->binding = std::move(binding);
        ++graph_captures_;
        graph_state = "captured";
      } else if (backend::FaultedDevice(captured)) {
        return captured;
      } else {
        // Launch kernel by kernel from now on (this run included).
        context.graph.reset();
        context.graphs_failed = true;
        ++graph_failures_;
      }
    }
    if (context.graph && bindable) {
      KILN_RETURN_IF_ERROR(StopBetweenKernels(options, 0, lir_.steps_size()));
      origin_wall[graph_device_] =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - wall_start)
              .count();
      KILN_RETURN_IF_ERROR(context.graph->work->Replay(*s.stream))
          << "while replaying the captured graph on " << graph_device_;
      ++graph_replays_;
      if (graph_state.empty()) graph_state = "replayed";
    }
  }
  for (int i = 0; i < lir_.steps_size() && graph_state.empty(); ++i) {
    KILN_RETURN_IF_ERROR(StopBetweenKernels(options, i, lir_.steps_size()));
    const v1::LirStep& step = lir_.steps(i);
    RunContext::DeviceState& s = devices_.at(step.device());
    std::vector<backend::BufferView> ins, outs;
    for (int slot : step.inputs()) ins.push_back(views[slot]);
    for (int slot : step.outputs()) outs.push_back(views[slot]);
    if (options.report) {
      // The device's origin comes first: step starts are measured from it
      // (recorded after the first step's start, the difference was negative
      // and wrapped to ~1.8e19 us on devices with modular timestamps).
      if (!origin.contains(step.device())) {
        KILN_ASSIGN_OR_RETURN(origin[step.device()], s.stream->Record());
        origin_wall[step.device()] =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - wall_start)
                .count();
      }
      KILN_ASSIGN_OR_RETURN(timings[i].before, s.stream->Record());
    }
    if (step.kind() == v1::STEP_KERNEL) {
      if (auto* w = dynamic_cast<WhileKernel*>(kernels_[i].get())) w->BindRun(&options);
      KILN_RETURN_IF_ERROR(kernels_[i]->Launch(*s.stream, ins, outs))
          << "while running " << step.kernel().name() << " on " << step.device();
    } else {
      const backend::BufferView& src = ins[0];
      const backend::BufferView& dst = outs[0];
      const v1::Slot& src_slot = lir_.slots(step.inputs(0));
      RunContext::DeviceState& from = devices_.at(src_slot.device());
      if (src.bytes > 0) {
        if (from.device->info().host_memory && s.device->info().host_memory) {
          std::memcpy(dst.host(), src.host(), src.bytes);
        } else if (from.device->info().host_memory) {
          KILN_RETURN_IF_ERROR(s.device->CopyToDevice(*s.stream, src.host(), dst));
        } else if (s.device->info().host_memory) {
          KILN_RETURN_IF_ERROR(from.stream->SynchronizeFor(wait_timeout_));
          KILN_RETURN_IF_ERROR(from.device->CopyToHost(*from.stream, src, dst.host()));
          KILN_RETURN_IF_ERROR(from.stream->SynchronizeFor(wait_timeout_));
        } else if (absl::Status peer = s.device->CopyFromPeer(*s.stream, *from.device,
                                                                *from.stream, src, dst);
                   peer.code() != absl::StatusCode::kUnimplemented) {
          KILN_RETURN_IF_ERROR(peer) << "while copying from " << src_slot.device() << " to "
                                     << step.device();
        } else {
          // No direct path between the two: through host memory.
          std::vector<char> staging(src.bytes);
          KILN_RETURN_IF_ERROR(from.stream->SynchronizeFor(wait_timeout_));
          KILN_RETURN_IF_ERROR(from.device->CopyToHost(*from.stream, src, staging.data()));
          KILN_RETURN_IF_ERROR(from.stream->SynchronizeFor(wait_timeout_));
          KILN_RETURN_IF_ERROR(s.device->CopyToDevice(*s.stream, staging.data(), dst));
        }
      }
    }
    if (options.report) {
      KILN_ASSIGN_OR_RETURN(timings[i].after, s.stream->Record());
    }
  }
  // Outputs in host memory are read once their device finished; the others
  // are copied out in stream order after the kernels, so one wait per device
  // covers both (one submission and one round trip to a device worker, not two).
  for (auto& [id, s] : devices_) {
    if (s.device->info().host_memory) KILN_RETURN_IF_ERROR(s.stream->SynchronizeFor(wait_timeout_));
  }

  RunResult result;
  // Copies out of a device worker land in `result`'s tensors (and the
  // caller's destinations) only when their stream is synchronized. If this
  // returns an error after queueing some (a later output's allocation, a
  // param update, another device's failed sync), they must land before
  // `result` is freed: the caller's drain would otherwise write into freed
  // memory. Declared after `result`, so it runs first.
  bool outputs_landed = false;
  absl::Cleanup land_outputs = [&] {
    if (outputs_landed) return;
    for (auto& [id, s] : devices_) {
      if (!s.device->info().host_memory) (void)s.stream->SynchronizeFor(wait_timeout_);
    }
  };
  if (!options.output_destinations.empty()) result.in_destination.assign(lir_.outputs_size(), false);
  for (int o = 0; o < lir_.outputs_size(); ++o) {
    const v1::LirNamedSlot& out = lir_.outputs(o);
    const v1::Slot& slot = lir_.slots(out.slot());
    if (const RunOptions::OutputDestination* d = destination[o]; d != nullptr) {
      result.in_destination[o] = true;
      result.outputs.emplace_back(out.name(), HostTensor());
      if (direct_to_destination.contains(out.slot()) || d->bytes == 0) continue;
      RunContext::DeviceState& s = devices_.at(slot.device());
      if (s.device->info().host_memory) {
        std::memcpy(d->data, views[out.slot()].host(), d->bytes);
      } else {
        KILN_RETURN_IF_ERROR(s.device->CopyToHost(*s.stream, views[out.slot()], d->data));
      }
      continue;
    }
    if (auto it = direct.find(out.slot()); it != direct.end()) {
      result.outputs.emplace_back(out.name(), std::move(it->second));
      continue;
    }
    KILN_ASSIGN_OR_RETURN(HostTensor t,
                          HostTensor::CreateUninitialized(slot.type().dtype(), DimsOf(slot.type())));
    RunContext::DeviceState& s = devices_.at(slot.device());
    if (t.num_bytes() > 0) {
      if (s.device->info().host_memory) {
        std::memcpy(t.data(), views[out.slot()].host(), t.num_bytes());
      } else {
        KILN_RETURN_IF_ERROR(s.device->CopyToHost(*s.stream, views[out.slot()], t.data()));
      }
    }
    result.outputs.emplace_back(out.name(), std::move(t));
  }
  // A training step's new params and optimizer state (a session's state)
  // go into its param set on the device, in stream order after the kernels
  // and after the outputs are read, so an output that is a view of an
  // updated param (a reshape of it) has the value the run read.
  int64_t copied = 0, copied_bytes = 0;
  for (int k = 0; k < lir_.param_updates_size(); ++k) {
    if (spare_bound[k]) continue;
    const v1::LirNamedSlot& u = lir_.param_updates(k);
    const v1::Slot& slot = lir_.slots(u.slot());
    RunContext::DeviceState& s = devices_.at(slot.device());
    KILN_ASSIGN_OR_RETURN(backend::BufferView dst, params->On(u.name(), *s.device));
    const backend::BufferView& src = views[u.slot()];
    if (slot.bytes() == 0 || (src.buffer == dst.buffer && src.offset == dst.offset)) continue;
    if (src.bytes != dst.bytes) {
      return absl::InternalError(absl::StrCat("param update of \"", u.name(), "\" has ",
                                              src.bytes, " bytes for ", dst.bytes));
    }
    KILN_RETURN_IF_ERROR(s.device->CopyOnDevice(*s.stream, src, dst))
        << "while writing param \"" << u.name() << "\"";
    ++copied;
    copied_bytes += src.bytes;
  }
  for (auto& [id, s] : devices_) KILN_RETURN_IF_ERROR(s.stream->SynchronizeFor(wait_timeout_));
  outputs_landed = true;
  // Every kernel and copy finished: the step's new values become the set's
  // (under its step lock, held since Run began).
  int64_t in_place = 0;
  for (int k = 0; k < lir_.param_updates_size(); ++k) {
    if (!spare_bound[k]) continue;
    params->CommitSpare(lir_.param_updates(k).name());
    ++in_place;
  }
  if (in_place > 0) updates_in_place_.fetch_add(in_place, std::memory_order_relaxed);
  if (copied > 0) {
    updates_copied_.fetch_add(copied, std::memory_order_relaxed);
    update_bytes_copied_.fetch_add(copied_bytes, std::memory_order_relaxed);
  }
  const double total_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - wall_start).count();

  if (options.report) {
    v1::DispatchReport& r = result.report;
    r.set_request_id(options.request_id);
    r.set_tenant(options.tenant);
    r.set_executable_key(lir_.key());
    *r.mutable_placement() = lir_.placement();
    r.set_run_micros(total_us);
    r.set_start_unix_micros(absl::ToUnixMicros(absl::Now()) - static_cast<int64_t>(total_us));
    r.set_cuda_graph(graph_state);
    std::map<std::string, v1::DeviceTotals> totals;
    for (int i = 0; i < lir_.steps_size(); ++i) {
      const v1::LirStep& step = lir_.steps(i);
      v1::DispatchStep* d = r.add_steps();
      d->set_kind(step.kind());
      d->set_device(step.device());
      if (step.kind() == v1::STEP_KERNEL) {
        const v1::LirKernel& k = step.kernel();
        d->set_kernel(k.name());
        // The kernel's own name for this run (whether it read a packed
        // operand depends on the run's params), else the name from Load.
        d->set_implementation(kernels_[i] ? kernels_[i]->implementation() : k.implementation());
        d->set_path(k.path());
        for (int id : k.covered_node_ids()) d->add_node_ids(id);
        for (const auto& n : k.covered_names()) d->add_node_names(n);
        for (int op : k.covered_ops()) d->add_ops(static_cast<v1::OpKind>(op));
        d->set_flops(k.flops());
        d->set_bytes(k.bytes());
      } else {
        d->set_kernel(absl::StrCat("copy_", i));
        d->set_implementation(absl::StrCat("copy:", lir_.slots(step.inputs(0)).device(), "->",
                                           step.device()));
        d->set_path(v1::PATH_NATIVE);
        d->set_bytes(static_cast<double>(lir_.slots(step.inputs(0)).bytes()));
      }
      const bool from_graph = !graph_state.empty();
      const backend::Event& before =
          from_graph ? *context.graph->before[i] : *timings[i].before;
      const backend::Event& after = from_graph ? *context.graph->after[i] : *timings[i].after;
      const backend::Event& first =
          from_graph ? *context.graph->origin : *origin.at(step.device());
      auto start = before.MicrosSince(first);
      auto dur = after.MicrosSince(before);
      d->set_start_micros((start.ok() ? *start : 0) + origin_wall[step.device()]);
      d->set_duration_micros(dur.ok() ? *dur : 0);
      v1::DeviceTotals& t = totals[step.device()];
      t.set_device(step.device());
      t.set_busy_micros(t.busy_micros() + d->duration_micros());
      if (step.kind() == v1::STEP_KERNEL) t.set_kernels(t.kernels() + 1);
    }
    for (auto& [id, t] : totals) {
      const RunContext::DeviceState& s = devices_.at(id);
      t.set_peak_bytes(s.arena ? s.arena->size() : 0);
      *r.add_totals() = t;
    }
  }
  return result;
}

}  // namespace kiln::runtime
