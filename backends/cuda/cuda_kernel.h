// The CUDA backend's kernel plumbing: the per-op registry that the kernel
// family files fill at static init (CudaOpRegistration, as the Vulkan and
// CPU backends do), the CudaKernel base that validates a launch's views and
// resolves them to device addresses, and helpers shared by the families.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "backends/capture.h"
#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_stream.h"
#include "backends/cuda/nvrtc_compiler.h"

namespace kiln::cuda {

// One op kind's entry: the honest claim and the kernel factory. `create` is
// only called after `supports` said yes.
struct CudaOpEntry {
  v1::OpKind op;
  backend::Claim (*supports)(const CudaDevice& device, const backend::KernelSpec& spec);
  absl::StatusOr<std::unique_ptr<backend::Kernel>> (*create)(CudaDevice& device,
                                                             const backend::KernelSpec& spec,
                                                             backend::PrepareContext& context);
};

struct CudaOpRegistration {
  explicit CudaOpRegistration(std::initializer_list<CudaOpEntry> entries);
};

// The entry for `op`, or nullptr.
const CudaOpEntry* FindCudaOp(v1::OpKind op);

// A kernel of one spec on one device. Launch checks the views against the
// spec, resolves them to device addresses (0 for empty tensors) and calls
// Enqueue unless every output is empty.
class CudaKernel : public backend::Kernel, public backend::CapturableKernel {
 public:
  CudaKernel(CudaDevice& device, const backend::KernelSpec& spec, std::string implementation)
      : device_(device), spec_(spec), implementation_(std::move(implementation)) {}
  std::string implementation() const override { return implementation_; }
  // Launches are device work on the views alone (CUDA graphs capture them);
  // kernels with per-launch host state (error slots, temporaries) say no.
  bool capturable() const override { return true; }
  absl::Status Launch(backend::Stream& stream, std::span<const backend::BufferView> inputs,
                      std::span<const backend::BufferView> outputs) final;

 protected:
  virtual absl::Status Enqueue(CudaStream& stream, std::span<const CUdeviceptr> in,
                               std::span<const CUdeviceptr> out) = 0;

  CudaDevice& device_;
  const backend::KernelSpec spec_;

 private:
  std::string implementation_;
};

// A function of an NVRTC-compiled module, kept alive with its module.
struct LoadedFunction {
  std::shared_ptr<const Module> module;
  CUfunction fn = nullptr;
};

// `function` of the module compiled from `source` (the embedded prelude is
// prepended by the caller where needed).
absl::StatusOr<LoadedFunction> LoadFunction(CudaDevice& device, const std::string& name,
                                            const std::string& source, const std::string& function,
                                            backend::PrepareContext& context);

// Launches `fn` on `stream` with `args` (pointers to each argument).
absl::Status LaunchKernel(CudaStream& stream, CUfunction fn, unsigned grid_x, unsigned grid_y,
                          unsigned grid_z, unsigned block_x, unsigned shared_bytes, void** args);

// Blocks for a grid-stride kernel over `count` items at `block` threads each:
// enough to fill the device a few times over, capped by the grid limit.
unsigned GridFor(const DeviceCaps& caps, int64_t count, unsigned block);

// How many blocks of `block` threads (and `dynamic_shared` bytes of dynamic
// shared memory each) of `fn` the whole device holds at once (the driver's
// occupancy for one SM times the SMs): the grid of a persistent kernel whose
// blocks stride over work.
absl::StatusOr<unsigned> ResidentBlocks(CudaDevice& device, CUfunction fn, unsigned block,
                                        size_t dynamic_shared = 0);

// f32, f16 and bf16: the float types the hand-written kernels serve.
bool IsFloat(DType dtype);
backend::Claim FloatDType(DType dtype, const char* what);

// "f32", "f16", ... for implementation and kernel names.
std::string DTypeSuffix(DType dtype);

// Row-major element strides of `dims`.
std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& dims);

// The embedded CUDA source `name` ("common.cuh", "norm.cu", ...); empty if none.
std::string_view EmbeddedSource(std::string_view name);
// Every embedded source's name (the NVRTC compile test walks them).
std::vector<std::string> EmbeddedSourceNames();
// common.cuh followed by the embedded source `name`, each of its lines
// `#include "x.cuh"` that names an embedded header replaced by that header:
// what the families compile.
std::string KernelSource(std::string_view name);

}  // namespace kiln::cuda
