// NumPy .npy files <-> kiln::HostTensor.
//
// Reads format versions 1.0, 2.0 and 3.0 (the header differs only in its
// length field and text encoding) with little-endian (or byte-order-free)
// f32, f16, f64, i8, u8, i16, i32, i64 and bool arrays in C order. Fortran
// order (of an array with two or more dims) and big-endian data are refused
// with an error that says how to re-save the array. NumPy has no bfloat16:
// u16 arrays ('<u2') are taken as bf16 bit patterns, and bf16 tensors are
// written as '<u2' (view them with `.view(ml_dtypes.bfloat16)`).
//
// Writes version 1.0 (2.0 when the header would not fit), header padded to
// 64 bytes as NumPy does. Pure functions; thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "base/host_tensor.h"

namespace kiln {

// `what` names the source in error messages (a path, "stdin").
absl::StatusOr<HostTensor> ParseNpy(std::string_view bytes, const std::string& what);
absl::StatusOr<std::string> SerializeNpy(const HostTensor& tensor);

absl::StatusOr<HostTensor> ReadNpy(const std::string& path);
absl::Status WriteNpy(const std::string& path, const HostTensor& tensor);

}  // namespace kiln
