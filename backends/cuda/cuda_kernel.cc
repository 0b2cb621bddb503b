#include "backends/cuda/cuda_kernel.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "backends/cuda/embedded_sources.h"
#include "base/status.h"

namespace kiln::cuda {
namespace {

absl::flat_hash_map<int, CudaOpEntry>& OpTable() {
  static auto* table = new absl::flat_hash_map<int, CudaOpEntry>();
  return *table;
}

}  // namespace

CudaOpRegistration::CudaOpRegistration(std::initializer_list<CudaOpEntry> entries) {
  for (const CudaOpEntry& e : entries) OpTable()[e.op] = e;
}

const CudaOpEntry* FindCudaOp(v1::OpKind op) {
  auto it = OpTable().find(op);
  return it == OpTable().end() ? nullptr : &it->second;
}

absl::Status CudaKernel::Launch(backend::Stream& stream,
                                std::span<const backend::BufferView> inputs,
                                std::span<const backend::BufferView> outputs) {
  KILN_ASSIGN_OR_RETURN(CudaStream * cs, AsCudaStream(stream, device_));
  KILN_RETURN_IF_ERROR(cs->failed());
  if (inputs.size() != spec_.inputs.size() || outputs.size() != spec_.outputs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec_.label, ": ", implementation_, " takes ", spec_.inputs.size(), " inputs and ",
        spec_.outputs.size(), " outputs, got ", inputs.size(), " and ", outputs.size()));
  }
  std::vector<CUdeviceptr> in(inputs.size()), out(outputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(in[i], device_.Resolve(inputs[i], spec_.inputs[i].num_bytes(),
                                                 absl::StrCat(spec_.label, ": input ", i)));
  }
  bool empty = true;
  for (size_t i = 0; i < outputs.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(out[i], device_.Resolve(outputs[i], spec_.outputs[i].num_bytes(),
                                                  absl::StrCat(spec_.label, ": output ", i)));
    empty = empty && spec_.outputs[i].num_elements() == 0;
  }
  if (empty && !outputs.empty()) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(cs->Note(device_.Enter()));
  absl::Status s = cs->Note(Enqueue(*cs, in, out));
  if (!s.ok()) return StatusBuilder(std::move(s)) << spec_.label;
  return absl::OkStatus();
}

absl::StatusOr<LoadedFunction> LoadFunction(CudaDevice& device, const std::string& name,
                                            const std::string& source, const std::string& function,
                                            backend::PrepareContext& context) {
  LoadedFunction f;
  KILN_ASSIGN_OR_RETURN(f.module, device.modules().Get(name, source, context));
  KILN_ASSIGN_OR_RETURN(f.fn, f.module->Function(function));
  return f;
}

absl::Status LaunchKernel(CudaStream& stream, CUfunction fn, unsigned grid_x, unsigned grid_y,
                          unsigned grid_z, unsigned block_x, unsigned shared_bytes, void** args) {
  return stream.device().Check(
      Driver().cuLaunchKernel(fn, grid_x, grid_y, grid_z, block_x, 1, 1, shared_bytes,
                              stream.stream(), args, nullptr),
      "cuLaunchKernel");
}

unsigned GridFor(const DeviceCaps& caps, int64_t count, unsigned block) {
  const int64_t want = (count + block - 1) / block;
  const int64_t cap = std::min<int64_t>(caps.max_grid_x, int64_t{caps.sm_count} * 32);
  return static_cast<unsigned>(std::clamp<int64_t>(want, 1, std::max<int64_t>(cap, 1)));
}

absl::StatusOr<unsigned> ResidentBlocks(CudaDevice& device, CUfunction fn, unsigned block,
                                        size_t dynamic_shared) {
  int per_sm = 0;
  KILN_RETURN_IF_ERROR(device.Check(Driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(
                                        &per_sm, fn, static_cast<int>(block), dynamic_shared),
                                    "cuOccupancyMaxActiveBlocksPerMultiprocessor"));
  const int64_t blocks = int64_t{std::max(per_sm, 1)} * std::max(device.caps().sm_count, 1);
  return static_cast<unsigned>(std::min<int64_t>(blocks, device.caps().max_grid_x));
}

bool IsFloat(DType dtype) {
  return dtype == v1::DTYPE_F32 || dtype == v1::DTYPE_F16 || dtype == v1::DTYPE_BF16;
}

backend::Claim FloatDType(DType dtype, const char* what) {
  if (IsFloat(dtype)) return backend::Claim::Yes();
  return backend::Claim::No(
      absl::StrCat("cuda ", what, " runs f32, f16 and bf16, not ", DTypeName(dtype)));
}

std::string DTypeSuffix(DType dtype) { return DTypeName(dtype); }

std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (int64_t i = static_cast<int64_t>(dims.size()) - 2; i >= 0; --i)
    s[i] = s[i + 1] * dims[i + 1];
  return s;
}

std::string_view EmbeddedSource(std::string_view name) {
  for (const EmbeddedCudaSource& s : kEmbeddedCudaSources) {
    if (name == s.name) return s.text;
  }
  return {};
}

std::vector<std::string> EmbeddedSourceNames() {
  std::vector<std::string> out;
  for (const EmbeddedCudaSource& s : kEmbeddedCudaSources) out.emplace_back(s.name);
  return out;
}

std::string KernelSource(std::string_view name) {
  std::string out(EmbeddedSource("common.cuh"));
  out += '\n';
  // A line `#include "x.cuh"` naming an embedded header is replaced by the
  // header (NVRTC is given one source, with no include path).
  constexpr std::string_view kInclude = "#include \"";
  for (std::string_view rest = EmbeddedSource(name); !rest.empty();) {
    const size_t eol = rest.find('\n');
    std::string_view line = rest.substr(0, eol == std::string_view::npos ? rest.size() : eol + 1);
    rest.remove_prefix(line.size());
    if (line.starts_with(kInclude)) {
      const std::string_view header = line.substr(kInclude.size(), line.find('"', kInclude.size()) -
                                                                       kInclude.size());
      if (std::string_view text = EmbeddedSource(header); !text.empty()) {
        out += text;
        out += '\n';
        continue;
      }
    }
    out += line;
  }
  return out;
}

}  // namespace kiln::cuda
