#include "base/host_tensor.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/checked_int.h"
#include "base/host_arena.h"
#include "base/host_buffer_pool.h"
#include "base/half.h"

namespace kiln {

absl::StatusOr<int64_t> CheckedNumElements(std::span<const int64_t> dims) {
  CheckedInt n = 1;
  for (int64_t d : dims) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("negative dim ", d));
    n = n * d;
    if (!n.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("element count of ", DimsToString(dims), " overflows int64"));
    }
  }
  return n.get();
}

std::string DimsToString(std::span<const int64_t> dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

void HostTensor::FreeDeleter::operator()(void* p) const {
  // Large buffers came from the host arena or the pool (CreateUninitialized)
  // and go back there.
  if (HostArena* arena = HostArena::Made(); arena != nullptr && arena->Release(p)) return;
  if (!HostBufferPool::Default().Release(p)) std::free(p);
}

absl::StatusOr<HostTensor> HostTensor::Create(DType dtype, Dims dims) {
  auto t = CreateUninitialized(dtype, std::move(dims));
  if (t.ok() && t->num_bytes_ > 0) std::memset(t->data(), 0, static_cast<size_t>(t->num_bytes_));
  return t;
}

absl::StatusOr<HostTensor> HostTensor::CreateUninitialized(DType dtype, Dims dims) {
  if (!IsKnownDType(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", static_cast<int>(dtype)));
  }
  auto n = CheckedNumElements(dims);
  if (!n.ok()) return n.status();
  auto bytes = BytesFor(dtype, *n);
  if (!bytes) {
    return absl::InvalidArgumentError(absl::StrCat("cannot size ", *n, " elements of ",
                                                   DTypeName(dtype)));
  }
  HostTensor t;
  t.dtype_ = dtype;
  t.dims_ = std::move(dims);
  t.num_elements_ = *n;
  t.num_bytes_ = *bytes;
  const size_t alloc = (static_cast<size_t>(*bytes) + 63) / 64 * 64;
  // Large buffers from the shared host arena while device workers map one (a
  // copy to or from their device then crosses by reference), else the pool.
  void* p = nullptr;
  if (static_cast<int64_t>(alloc) >= HostArena::kMinBytes) {
    if (HostArena* arena = HostArena::ForHostTensors(); arena != nullptr) {
      p = arena->Allocate(static_cast<int64_t>(alloc));
    }
  }
  if (p == nullptr) {
    p = alloc >= HostBufferPool::kMinBytes ? HostBufferPool::Default().Allocate(alloc)
                                           : std::aligned_alloc(64, alloc == 0 ? 64 : alloc);
  }
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", *bytes, " bytes"));
  }
  t.data_.reset(p);
  return t;
}

absl::StatusOr<HostTensor> HostTensor::FromBytes(DType dtype, Dims dims, std::string_view bytes) {
  // Every byte is overwritten below (or the call fails): no zero-fill pass.
  auto t = CreateUninitialized(dtype, std::move(dims));
  if (!t.ok()) return t.status();
  if (static_cast<int64_t>(bytes.size()) != t->num_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", DTypeName(dtype),
                                                   DimsToString(t->dims()), " needs ",
                                                   t->num_bytes(), " bytes, got ", bytes.size()));
  }
  if (!bytes.empty()) std::memcpy(t->data(), bytes.data(), bytes.size());
  return t;
}

absl::StatusOr<HostTensor> HostTensor::FromProto(const v1::Tensor& proto) {
  return FromBytes(proto.dtype(), Dims(proto.dims().begin(), proto.dims().end()), proto.data());
}

HostTensor HostTensor::Clone() const {
  auto t = FromBytes(dtype_, dims_, bytes());
  return std::move(t).value();
}

void HostTensor::ToProto(v1::Tensor* proto) const {
  proto->set_dtype(dtype_);
  proto->clear_dims();
  for (int64_t d : dims_) proto->add_dims(d);
  proto->set_data(std::string(bytes()));
}

double HostTensor::GetAsDouble(int64_t i) const {
  const void* p = data();
  switch (dtype_) {
    case v1::DTYPE_F32: return static_cast<const float*>(p)[i];
    case v1::DTYPE_F64: return static_cast<const double*>(p)[i];
    case v1::DTYPE_F16: return HalfToFloat(static_cast<const uint16_t*>(p)[i]);
    case v1::DTYPE_BF16: return Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case v1::DTYPE_I8: return static_cast<const int8_t*>(p)[i];
    case v1::DTYPE_U8: return static_cast<const uint8_t*>(p)[i];
    case v1::DTYPE_I16: return static_cast<const int16_t*>(p)[i];
    case v1::DTYPE_I32: return static_cast<const int32_t*>(p)[i];
    case v1::DTYPE_I64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case v1::DTYPE_BOOL: return static_cast<const uint8_t*>(p)[i] != 0 ? 1.0 : 0.0;
    default: return 0.0;
  }
}

namespace {

// A double as an integer of type T: truncated toward zero and saturated to
// int64 (NaN -> 0), then wrapped to T's width as integer arithmetic wraps. A
// plain cast of an out-of-range double is undefined behaviour.
template <typename T>
T WrappingCast(double v) {
  int64_t whole = 0;
  if (std::isnan(v)) {
    whole = 0;
  } else if (v <= static_cast<double>(std::numeric_limits<int64_t>::min())) {
    whole = std::numeric_limits<int64_t>::min();
  } else if (v >= static_cast<double>(std::numeric_limits<int64_t>::max())) {
    // 2^63: INT64_MAX is not exact in a double, >= catches the rounded value.
    whole = std::numeric_limits<int64_t>::max();
  } else {
    whole = static_cast<int64_t>(v);
  }
  return static_cast<T>(whole);  // modular since C++20
}

}  // namespace

void HostTensor::SetFromDouble(int64_t i, double v) {
  void* p = data();
  switch (dtype_) {
    case v1::DTYPE_F32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case v1::DTYPE_F64: static_cast<double*>(p)[i] = v; break;
    case v1::DTYPE_F16: static_cast<uint16_t*>(p)[i] = FloatToHalf(static_cast<float>(v)); break;
    case v1::DTYPE_BF16: static_cast<uint16_t*>(p)[i] = FloatToBf16(static_cast<float>(v)); break;
    case v1::DTYPE_I8: static_cast<int8_t*>(p)[i] = WrappingCast<int8_t>(v); break;
    case v1::DTYPE_U8: static_cast<uint8_t*>(p)[i] = WrappingCast<uint8_t>(v); break;
    case v1::DTYPE_I16: static_cast<int16_t*>(p)[i] = WrappingCast<int16_t>(v); break;
    case v1::DTYPE_I32: static_cast<int32_t*>(p)[i] = WrappingCast<int32_t>(v); break;
    case v1::DTYPE_I64: static_cast<int64_t*>(p)[i] = WrappingCast<int64_t>(v); break;
    case v1::DTYPE_BOOL: static_cast<uint8_t*>(p)[i] = v != 0.0 ? 1 : 0; break;
    default: break;
  }
}

}  // namespace kiln
