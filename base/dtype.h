// Element types: sizes, names, classes. The enum is the wire enum
// (kiln.v1.DType) so there is one source of truth.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "kiln/v1/tensor.pb.h"

namespace kiln {

using DType = v1::DType;

// Block layout of a quantized storage type (GGUF): elements per block and bytes
// per block. Dense types have block_elems == 1.
struct DTypeLayout {
  int64_t block_elems;
  int64_t block_bytes;
};

// REQUIRES: dtype is a known, specified value.
DTypeLayout LayoutOf(DType dtype);
// Bytes for `elements` elements, or nullopt when a quantized count is not a
// whole number of blocks or the product overflows.
std::optional<int64_t> BytesFor(DType dtype, int64_t elements);
// Size of one element of a dense type; 0 for quantized types.
int64_t ElementSize(DType dtype);

bool IsKnownDType(int value);
bool IsFloat(DType dtype);      // f32, f16, bf16, f64
bool IsInteger(DType dtype);    // i8, u8, i16, i32, i64
bool IsQuantized(DType dtype);  // q8_0, q4_0, q4_k, q5_k, q6_k
bool IsSignedInteger(DType dtype);

// "f32", "i64", "q4_k", ...; "unspecified" for 0, "dtype(N)" for unknown values.
std::string DTypeName(DType dtype);
std::optional<DType> ParseDType(std::string_view name);

}  // namespace kiln
