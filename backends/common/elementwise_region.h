// Elementwise regions, decoded once: the one reading of a FusedElementwise
// region (v1::FusedElementwiseAttrs) and of a standalone elementwise op
// (Unary, Binary, Compare, Where, Cast, Clamp) as a one-instruction region.
// The fuse pass checks the regions it builds with it, every backend compiles
// from it, and the conformance references interpret it, so what a region
// means is decided here and nowhere else.
//
// Decode does every structural check the IR implies; what it returns is
// well-formed: each operand is defined before it is read, operands agree in
// dtype where the op needs it, every declared result dtype is the one the op
// computes, conditions are bool, clamp bounds are ordered numbers, and every
// value is of a dense dtype. A backend then checks only its capabilities
// (which kinds and dtypes it implements) on the decoded region.
//
// Pure functions and plain values; thread-safe. Decoding happens when a kernel
// is claimed or prepared, never per element.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"

namespace kiln::backend {

// One decoded instruction. `args[0 .. num_args)` index the region's values:
// inputs 0 .. n-1, then instruction j is value n + j (as FusedInstr's args).
struct RegionInstr {
  v1::OpKind op = v1::OP_KIND_UNSPECIFIED;  // UNARY, BINARY, COMPARE, WHERE, CAST, CLAMP, CONSTANT
  int kind = 0;                             // UNARY/BINARY/COMPARE: the Unary/Binary/CompareKind
  int args[3] = {-1, -1, -1};
  int num_args = 0;
  DType dtype = v1::DTYPE_UNSPECIFIED;      // result; for CAST the target
  DType arg_dtype = v1::DTYPE_UNSPECIFIED;  // operand 0's (cast source, compare operands)
  double scalar = 0;                        // CONSTANT: as written; converted to dtype as a cast
  bool has_lo = false, has_hi = false;      // CLAMP: bounds, never NaN, lo <= hi
  double lo = 0, hi = 0;
};

// A decoded, validated region. Immutable by convention once decoded.
struct ElementwiseRegion {
  std::vector<DType> inputs;  // dtype of each region input (values 0 .. n-1)
  std::vector<RegionInstr> instrs;
  std::vector<int> results;  // instruction index per output (non-empty)

  int num_values() const { return static_cast<int>(inputs.size() + instrs.size()); }
  // REQUIRES: 0 <= v < num_values().
  DType value_dtype(int v) const {
    const int n = static_cast<int>(inputs.size());
    return v < n ? inputs[v] : instrs[v - n].dtype;
  }
  // Whether instruction j is one of the region's outputs.
  bool is_result(int j) const;
};

// Decodes `region` over inputs of dtypes `inputs`, for outputs of dtypes
// `outputs` (one per region result). Fails with InvalidArgument naming the
// instruction index when the region is malformed.
absl::StatusOr<ElementwiseRegion> DecodeRegion(const v1::FusedElementwiseAttrs& region,
                                               std::span<const DType> inputs,
                                               std::span<const DType> outputs);

// Whether `op` is a standalone elementwise op (Unary .. Clamp), and its arity.
bool IsStandaloneElementwise(v1::OpKind op);
int StandaloneArity(v1::OpKind op);  // REQUIRES: IsStandaloneElementwise(op)

// The instruction a standalone elementwise op with `attrs` stands for, over
// values `args`, computing `dtype`. The fuse pass builds regions with it, and
// DecodeSpec reads standalone specs with it, so both mean the same.
// REQUIRES: IsStandaloneElementwise(op).
v1::FusedInstr InstrFor(v1::OpKind op, const v1::Attrs& attrs, std::span<const int> args,
                        DType dtype);

// The decoded region of an elementwise spec: FusedElementwise as is, a
// standalone op as its one-instruction region (what it computes unfused).
// Fails for other ops and for malformed regions.
absl::StatusOr<ElementwiseRegion> DecodeSpec(const KernelSpec& spec);

// "gelu", "add", "gt", "where", "cast_f32_to", "clamp", "constant".
std::string InstrName(const RegionInstr& instr);

// What every backend's elementwise code generator needs besides its own
// dialect (GLSL, CUDA C++): the language-neutral indexing.

// The dtypes of a region's values: its inputs, then one per instruction.
std::vector<DType> RegionValueDTypes(const ElementwiseRegion& region);

// The output's dims with runs that every input strides alike merged, and each
// input's stride per merged dim (0 where it broadcasts).
struct RegionIndexPlan {
  std::vector<int64_t> dims;
  std::vector<std::vector<int64_t>> strides;  // per input, per merged dim
};
RegionIndexPlan PlanRegionIndexing(const KernelSpec& spec);

// Input `input`'s flat index at the output coordinates c0, c1, ...: "i" for
// kind 0 (same shape as the output), otherwise the sum "c0 * 12<suffix> + c2"
// ("0<suffix>" when it broadcasts everywhere); `suffix` is the dialect's
// integer literal suffix for the index type ("u" for GLSL's uint).
std::string RegionIndexExpr(const RegionIndexPlan& plan, int input, int kind, const char* suffix);

}  // namespace kiln::backend
