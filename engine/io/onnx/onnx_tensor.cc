// ONNX TensorProto -> HostTensor, and the integer element helpers.
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/checked_int.h"
#include "base/status.h"
#include "engine/io/onnx/onnx_internal.h"

namespace kiln::io {
namespace onnx_internal {

std::optional<DType> DTypeFromOnnx(int32_t elem_type) {
  switch (elem_type) {
    case onnx::TensorProto::FLOAT: return v1::DTYPE_F32;
    case onnx::TensorProto::UINT8: return v1::DTYPE_U8;
    case onnx::TensorProto::INT8: return v1::DTYPE_I8;
    case onnx::TensorProto::INT16: return v1::DTYPE_I16;
    case onnx::TensorProto::INT32: return v1::DTYPE_I32;
    case onnx::TensorProto::INT64: return v1::DTYPE_I64;
    case onnx::TensorProto::BOOL: return v1::DTYPE_BOOL;
    case onnx::TensorProto::FLOAT16: return v1::DTYPE_F16;
    case onnx::TensorProto::DOUBLE: return v1::DTYPE_F64;
    case onnx::TensorProto::BFLOAT16: return v1::DTYPE_BF16;
    default: return std::nullopt;
  }
}

int64_t GetInt(const HostTensor& t, int64_t i) {
  switch (t.dtype()) {
    case v1::DTYPE_I64: return t.data_as<int64_t>()[i];
    case v1::DTYPE_I32: return t.data_as<int32_t>()[i];
    case v1::DTYPE_I16: return t.data_as<int16_t>()[i];
    case v1::DTYPE_I8: return t.data_as<int8_t>()[i];
    case v1::DTYPE_U8: return t.data_as<uint8_t>()[i];
    case v1::DTYPE_BOOL: return t.data_as<uint8_t>()[i] != 0;
    default: {
      // Floats (a shape computed in f32 by some exporters): truncate, saturating.
      const double d = t.GetAsDouble(i);
      if (!(d == d)) return 0;
      if (d >= 9.2e18) return kInt64Max;
      if (d <= -9.2e18) return -kInt64Max;
      return static_cast<int64_t>(d);
    }
  }
}

void SetInt(HostTensor& t, int64_t i, int64_t v) {
  switch (t.dtype()) {
    case v1::DTYPE_I64: t.data_as<int64_t>()[i] = v; return;
    case v1::DTYPE_I32: t.data_as<int32_t>()[i] = static_cast<int32_t>(v); return;
    case v1::DTYPE_I16: t.data_as<int16_t>()[i] = static_cast<int16_t>(v); return;
    case v1::DTYPE_I8: t.data_as<int8_t>()[i] = static_cast<int8_t>(v); return;
    case v1::DTYPE_U8: t.data_as<uint8_t>()[i] = static_cast<uint8_t>(v); return;
    case v1::DTYPE_BOOL: t.data_as<uint8_t>()[i] = v != 0; return;
    default: t.SetFromDouble(i, static_cast<double>(v)); return;
  }
}

namespace {

std::string TensorLabel(const onnx::TensorProto& p) {
  return p.name().empty() ? std::string("tensor") : absl::StrCat("tensor \"", p.name(), "\"");
}

absl::Status TensorError(const onnx::TensorProto& p, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(TensorLabel(p), ": ", what));
}

}  // namespace

absl::StatusOr<HostTensor> TensorFromProto(const onnx::TensorProto& p,
                                           const ir::InferLimits& limits) {
  if (p.data_location() == onnx::TensorProto::EXTERNAL || p.external_data_size() > 0) {
    return TensorError(p, "external data is not supported (save the model with its tensors inside)");
  }
  if (p.has_segment()) return TensorError(p, "segmented tensors are not supported");
  const std::optional<DType> dt = DTypeFromOnnx(p.data_type());
  if (!dt) {
    return absl::UnimplementedError(absl::StrCat(
        TensorLabel(p), ": element type ",
        onnx::TensorProto::DataType_Name(static_cast<onnx::TensorProto::DataType>(p.data_type())),
        " (", p.data_type(), ") has no Kiln dtype"));
  }
  if (p.dims_size() > limits.max_rank) {
    return TensorError(p, absl::StrCat("rank ", p.dims_size(), " exceeds the limit ", limits.max_rank));
  }
  Dims dims(p.dims().begin(), p.dims().end());
  CheckedInt n = 1;
  for (int64_t d : dims) {
    if (d < 0) return TensorError(p, absl::StrCat("negative dim in [", absl::StrJoin(dims, ", "), "]"));
    n = n * d;
  }
  if (!n.ok()) {
    return TensorError(p, absl::StrCat("dims [", absl::StrJoin(dims, ", "), "] overflow int64"));
  }
  if (n.get() > limits.max_tensor_elements) {
    return absl::ResourceExhaustedError(absl::StrCat(TensorLabel(p), ": ", n.get(),
                                                     " elements, over the limit of ",
                                                     limits.max_tensor_elements));
  }
  const int64_t count = n.get();
  const int64_t esize = ElementSize(*dt);
  if (p.has_raw_data()) {
    if (static_cast<int64_t>(p.raw_data().size()) != count * esize) {
      return TensorError(p, absl::StrCat("raw_data has ", p.raw_data().size(), " bytes; [",
                                         absl::StrJoin(dims, ", "), "] of ", DTypeName(*dt),
                                         " needs ", count * esize));
    }
    return HostTensor::FromBytes(*dt, std::move(dims), p.raw_data());
  }
  // The values present are counted before the storage is allocated: dims
  // alone may claim gigabytes (kiln_fuzz_onnx_import: a 198-byte TensorProto
  // made it zero-fill 764 MB).
  int64_t have = 0;
  const char* field = "int32_data";  // int32 and smaller, bool, f16 and bf16 bits
  switch (*dt) {
    case v1::DTYPE_F32:
      have = p.float_data_size(), field = "float_data";
      break;
    case v1::DTYPE_F64:
      have = p.double_data_size(), field = "double_data";
      break;
    case v1::DTYPE_I64:
      have = p.int64_data_size(), field = "int64_data";
      break;
    default:
      have = p.int32_data_size();
      break;
  }
  if (have != count) {
    return TensorError(p, absl::StrCat(field, " has ", have, " values; [",
                                       absl::StrJoin(dims, ", "), "] needs ", count));
  }
  KILN_ASSIGN_OR_RETURN(HostTensor t, HostTensor::Create(*dt, dims));
  switch (*dt) {
    case v1::DTYPE_F32:
      if (count > 0) std::memcpy(t.data(), p.float_data().data(), count * 4);
      break;
    case v1::DTYPE_F64:
      if (count > 0) std::memcpy(t.data(), p.double_data().data(), count * 8);
      break;
    case v1::DTYPE_I64:
      if (count > 0) std::memcpy(t.data(), p.int64_data().data(), count * 8);
      break;
    case v1::DTYPE_F16:
    case v1::DTYPE_BF16:
      // 16-bit floats travel as their bit patterns in int32_data.
      for (int64_t i = 0; i < count; ++i) {
        t.data_as<uint16_t>()[i] = static_cast<uint16_t>(p.int32_data(static_cast<int>(i)));
      }
      break;
    default:
      for (int64_t i = 0; i < count; ++i) SetInt(t, i, p.int32_data(static_cast<int>(i)));
      break;
  }
  return t;
}

}  // namespace onnx_internal

absl::StatusOr<HostTensor> ParseOnnxTensor(std::string_view bytes, std::string* name) {
  onnx::TensorProto p;
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !p.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError("not a serialized onnx.TensorProto");
  }
  if (name != nullptr) *name = p.name();
  return onnx_internal::TensorFromProto(p, ir::InferLimits{});
}

}  // namespace kiln::io
