#include "base/dtype.h"

#include <limits>

#include "base/checked_int.h"

namespace kiln {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  DTypeLayout layout;
};

constexpr DTypeInfo kDTypes[] = {
    {v1::DTYPE_F32, "f32", {1, 4}},    {v1::DTYPE_F16, "f16", {1, 2}},
    {v1::DTYPE_BF16, "bf16", {1, 2}},  {v1::DTYPE_F64, "f64", {1, 8}},
    {v1::DTYPE_I8, "i8", {1, 1}},      {v1::DTYPE_U8, "u8", {1, 1}},
    {v1::DTYPE_I16, "i16", {1, 2}},    {v1::DTYPE_I32, "i32", {1, 4}},
    {v1::DTYPE_I64, "i64", {1, 8}},    {v1::DTYPE_BOOL, "bool", {1, 1}},
    {v1::DTYPE_Q8_0, "q8_0", {32, 34}}, {v1::DTYPE_Q4_0, "q4_0", {32, 18}},
    {v1::DTYPE_Q4_K, "q4_k", {256, 144}}, {v1::DTYPE_Q5_K, "q5_k", {256, 176}},
    {v1::DTYPE_Q6_K, "q6_k", {256, 210}},
};

const DTypeInfo* Find(DType dtype) {
  for (const auto& info : kDTypes) {
    if (info.dtype == dtype) return &info;
  }
  return nullptr;
}

}  // namespace

DTypeLayout LayoutOf(DType dtype) {
  const DTypeInfo* info = Find(dtype);
  return info ? info->layout : DTypeLayout{1, 0};
}

std::optional<int64_t> BytesFor(DType dtype, int64_t elements) {
  const DTypeLayout layout = LayoutOf(dtype);
  if (elements < 0 || layout.block_bytes == 0) return std::nullopt;
  if (elements % layout.block_elems != 0) return std::nullopt;
  const int64_t blocks = elements / layout.block_elems;
  return (CheckedInt(blocks) * layout.block_bytes).value();
}

int64_t ElementSize(DType dtype) {
  const DTypeLayout layout = LayoutOf(dtype);
  return layout.block_elems == 1 ? layout.block_bytes : 0;
}

bool IsKnownDType(int value) {
  return value != v1::DTYPE_UNSPECIFIED && Find(static_cast<DType>(value)) != nullptr;
}

bool IsFloat(DType d) {
  return d == v1::DTYPE_F32 || d == v1::DTYPE_F16 || d == v1::DTYPE_BF16 || d == v1::DTYPE_F64;
}

bool IsSignedInteger(DType d) {
  return d == v1::DTYPE_I8 || d == v1::DTYPE_I16 || d == v1::DTYPE_I32 || d == v1::DTYPE_I64;
}

bool IsInteger(DType d) { return IsSignedInteger(d) || d == v1::DTYPE_U8; }

bool IsQuantized(DType d) {
  return d == v1::DTYPE_Q8_0 || d == v1::DTYPE_Q4_0 || d == v1::DTYPE_Q4_K ||
         d == v1::DTYPE_Q5_K || d == v1::DTYPE_Q6_K;
}

std::string DTypeName(DType dtype) {
  if (dtype == v1::DTYPE_UNSPECIFIED) return "unspecified";
  const DTypeInfo* info = Find(dtype);
  return info ? std::string(info->name) : "dtype(?)";
}

std::optional<DType> ParseDType(std::string_view name) {
  for (const auto& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

}  // namespace kiln
