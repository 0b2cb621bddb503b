// Elementwise programs and their block interpreter.
//
// Every elementwise kernel of the CPU backend (Unary, Binary, Compare, Where,
// Cast, Clamp and the FusedElementwise regions the fuse pass makes) is one
// Program: a list of instructions over the region's inputs, all broadcast to
// one output shape (NumPy rules). The Executor runs it over blocks of up to
// kBlock output elements; each instruction is one vectorized loop over the
// block, so intermediate values stay in L1 and never touch memory.
//
// Inputs reach a block through the cheapest path the shapes allow: a pointer
// straight into the input (same shape, or a broadcast row such as a bias [N]
// over [M, N], when the storage is the compute type), a fill (scalars and
// stride-0 runs), or a converting copy over the collapsed broadcast strides.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "backends/common/elementwise_region.h"
#include "backends/cpu/elementwise_ops.h"

namespace kiln::cpu::ew {

// A program is a decoded elementwise region (backends/common/elementwise_region.h):
// instructions with resolved operands, checked once when the kernel is claimed
// or prepared.
using Instr = backend::RegionInstr;
using Program = backend::ElementwiseRegion;

// The program of a Unary, Binary, Compare, Where, Cast, Clamp or
// FusedElementwise spec: the shared decoding, then what the CPU implements.
// Fails with the reason (used verbatim as the claim's reason) when an
// instruction is malformed or not implemented for its dtypes.
absl::StatusOr<Program> ProgramFromSpec(const backend::KernelSpec& spec);

// "gelu_f32", "add_f16", "fused_elementwise_4" — for implementation names.
std::string ProgramName(const Program& program);

// Runs a Program for fixed shapes. Immutable after Create; Run is thread-safe
// (each call and each worker thread uses its own scratch).
class Executor {
 public:
  static constexpr int64_t kBlock = 1024;

  // input_dims[i] must broadcast to out_dims; out_dtypes[k] (the storage of
  // output k) must be of the register class of result k.
  static absl::StatusOr<std::unique_ptr<Executor>> Create(Program program,
                                                          const std::vector<Dims>& input_dims,
                                                          const Dims& out_dims,
                                                          std::vector<DType> out_dtypes);

  // REQUIRES: inputs and outputs hold the shapes and dtypes given to Create.
  // An output may alias an input of the same shape (in-place).
  void Run(std::span<const void* const> inputs, std::span<void* const> outputs) const;

  int64_t num_elements() const { return total_; }

 private:
  enum class Fetch : uint8_t { kContiguous, kScalar, kStrided, kUnused };
  struct InputPlan {
    Fetch fetch = Fetch::kUnused;
    DType dtype = v1::DTYPE_UNSPECIFIED;
    bool native = false;          // storage is the register type: may be read in place
    int slot = -1;                // scratch slot when converted or gathered
    std::vector<int64_t> stride;  // kStrided: per collapsed dim, 0 = broadcast
  };
  struct Block {
    int64_t offset, len;
  };

  Executor() = default;
  Block UnitAt(int64_t u) const;
  const void* FetchInput(const InputPlan& in, const void* base, int64_t offset, int64_t len,
                         void* slot) const;
  void RunUnits(int64_t begin, int64_t end, std::span<const void* const> inputs,
                std::span<void* const> outputs) const;

  Program program_;
  std::vector<DType> out_dtypes_;
  std::vector<InputPlan> inputs_;
  std::vector<int> instr_slot_;     // -1 = writes straight into an output
  std::vector<int> direct_output_;  // per instr: output index it writes in place, or -1
  int num_slots_ = 0;
  Dims dims_;  // collapsed output dims (rank >= 1)
  int64_t total_ = 0;
  int64_t row_ = 1;             // last collapsed dim
  int64_t chunks_per_row_ = 0;  // > 0: blocks never cross a row
  int64_t chunk_ = kBlock;
  int64_t units_ = 0;
  int64_t grain_units_ = 1;
};

}  // namespace kiln::cpu::ew
