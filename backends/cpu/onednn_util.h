// Shared plumbing of the CPU kernels built on oneDNN 2.x (matmul, conv) and
// the storage-dtype conversions every f32-computing kernel needs.
//
// Thread safety: DnnlEngine() is safe from any thread (oneDNN engines are).
// The conversion helpers are pure functions of their arguments.
#pragma once

#include <cstdint>
#include <new>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/dtype.h"

namespace kiln::cpu {

// The process-wide oneDNN CPU engine, created on first use.
dnnl::engine& DnnlEngine();


// Runs `fn` (which may throw dnnl::error, as the C++ API does) and turns an
// exception into a status naming `what`: no exception leaves a kernel.
template <typename Fn>
absl::Status DnnlTry(const std::string& what, Fn&& fn) {
  try {
    fn();
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat(what, ": oneDNN: ", e.what()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of memory"));
  }
  return absl::OkStatus();
}

// The oneDNN data type of a Kiln dtype, when oneDNN has one.
std::optional<dnnl::memory::data_type> DnnlType(DType dtype);

// Builds a primitive descriptor for `op_desc` with `attr`, preferring the
// implementation whose name contains `prefer` (e.g. "gemm:") when oneDNN
// offers it, else oneDNN's first choice. Throws dnnl::error when there is none.
template <typename PrimitiveDesc, typename OpDesc>
PrimitiveDesc PickImplementation(const OpDesc& op_desc, const dnnl::primitive_attr& attr,
                                 const char* prefer);

// Storage conversions for kernels that compute in f32. `src`/`dst` hold `n`
// elements of `dtype` (f32, f16 or bf16); f32 is a plain copy. The Parallel
// variants split large arrays across the OpenMP pool; the plain ones run on the
// calling thread (for use inside a parallel region).
void ConvertToF32(DType dtype, const void* src, float* dst, int64_t n);
void ConvertFromF32(const float* src, DType dtype, void* dst, int64_t n);
void ParallelConvertToF32(DType dtype, const void* src, float* dst, int64_t n);
void ParallelConvertFromF32(const float* src, DType dtype, void* dst, int64_t n);

// One element of f32/f16/bf16 storage as float.
float LoadF32(DType dtype, const void* base, int64_t index);

// Whether kernels here accept `dtype` as a float storage type (f32, f16, bf16).
inline bool IsF32Storage(DType dtype) {
  return dtype == v1::DTYPE_F32 || dtype == v1::DTYPE_F16 || dtype == v1::DTYPE_BF16;
}

// ---- implementation of the template ----

template <typename PrimitiveDesc, typename OpDesc>
PrimitiveDesc PickImplementation(const OpDesc& op_desc, const dnnl::primitive_attr& attr,
                                 const char* prefer) {
  dnnl_primitive_desc_iterator_t it = nullptr;
  dnnl::error::wrap_c_api(dnnl_primitive_desc_iterator_create(&it, &op_desc.data, attr.get(),
                                                              DnnlEngine().get(), nullptr),
                          "could not create a primitive descriptor iterator");
  // oneDNN's first choice, unless a later entry is the preferred one. The C++
  // next_impl() of oneDNN 2.6 stops after the first entry, hence the C iterator.
  dnnl_primitive_desc_t chosen = dnnl_primitive_desc_iterator_fetch(it);
  auto matches = [prefer](dnnl_primitive_desc_t pd) {
    const char* name = nullptr;
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name);
    return name != nullptr && std::string(name).rfind(prefer, 0) == 0;
  };
  if (prefer != nullptr && prefer[0] != '\0' && !matches(chosen)) {
    while (dnnl_primitive_desc_iterator_next(it) == dnnl_success) {
      dnnl_primitive_desc_t pd = dnnl_primitive_desc_iterator_fetch(it);
      if (matches(pd)) {
        dnnl_primitive_desc_destroy(chosen);
        chosen = pd;
        break;
      }
      dnnl_primitive_desc_destroy(pd);
    }
  }
  dnnl_primitive_desc_iterator_destroy(it);
  return PrimitiveDesc(chosen);
}

}  // namespace kiln::cpu
