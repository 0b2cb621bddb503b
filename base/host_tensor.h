// HostTensor: a dense tensor in host memory, 64-byte aligned. Move-only; the
// buffer is owned. Thread-compatible (no internal locking).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/dtype.h"
#include "kiln/v1/tensor.pb.h"

namespace kiln {

using Dims = std::vector<int64_t>;

// Element count of `dims`, or an error when a dim is negative or the product
// overflows int64.
absl::StatusOr<int64_t> CheckedNumElements(std::span<const int64_t> dims);
std::string DimsToString(std::span<const int64_t> dims);

class HostTensor {
 public:
  HostTensor() = default;
  // Allocates zero-filled storage. Fails on negative dims or overflow.
  static absl::StatusOr<HostTensor> Create(DType dtype, Dims dims);
  // Like Create but leaves the contents undefined: for buffers about to be
  // overwritten whole (zero-filling a large output costs a pass over memory).
  static absl::StatusOr<HostTensor> CreateUninitialized(DType dtype, Dims dims);
  // Copies `bytes`; its size must match.
  static absl::StatusOr<HostTensor> FromBytes(DType dtype, Dims dims, std::string_view bytes);
  static absl::StatusOr<HostTensor> FromProto(const v1::Tensor& proto);
  template <typename T>
  static HostTensor FromVector(DType dtype, Dims dims, const std::vector<T>& values);

  HostTensor(HostTensor&&) noexcept = default;
  HostTensor& operator=(HostTensor&&) noexcept = default;
  HostTensor(const HostTensor&) = delete;
  HostTensor& operator=(const HostTensor&) = delete;

  HostTensor Clone() const;
  void ToProto(v1::Tensor* proto) const;

  DType dtype() const { return dtype_; }
  const Dims& dims() const { return dims_; }
  int64_t rank() const { return static_cast<int64_t>(dims_.size()); }
  int64_t num_elements() const { return num_elements_; }
  int64_t num_bytes() const { return num_bytes_; }
  void* data() { return data_.get(); }
  const void* data() const { return data_.get(); }
  template <typename T>
  T* data_as() { return static_cast<T*>(data()); }
  template <typename T>
  const T* data_as() const { return static_cast<const T*>(data()); }
  std::string_view bytes() const {
    return {static_cast<const char*>(data()), static_cast<size_t>(num_bytes_)};
  }

  // Element `i` converted to double (dense types only).
  double GetAsDouble(int64_t i) const;
  // Stores `v` converted to this tensor's dtype at element `i`. Integer dtypes
  // take v truncated toward zero, saturated to int64 (NaN: 0), then wrapped to
  // their width, as integer arithmetic wraps.
  void SetFromDouble(int64_t i, double v);

 private:
  struct FreeDeleter {
    void operator()(void* p) const;
  };
  DType dtype_ = v1::DTYPE_UNSPECIFIED;
  Dims dims_;
  int64_t num_elements_ = 0;
  int64_t num_bytes_ = 0;
  std::unique_ptr<void, FreeDeleter> data_;
};

template <typename T>
HostTensor HostTensor::FromVector(DType dtype, Dims dims, const std::vector<T>& values) {
  auto t = Create(dtype, std::move(dims));
  HostTensor out = std::move(t).value();
  for (int64_t i = 0; i < out.num_elements() && i < static_cast<int64_t>(values.size()); ++i) {
    out.SetFromDouble(i, static_cast<double>(values[i]));
  }
  return out;
}

}  // namespace kiln
