// GGUF (llama.cpp's model file, versions 2 and 3): metadata, tensor infos and
// tensor data, quantized blocks kept as they are.
//
// The layout: magic "GGUF", version (u32), tensor count and metadata count
// (u64), the metadata key/value pairs, the tensor infos (name, dims with the
// fastest-varying first, ggml type, offset), padding to `general.alignment`
// (32 by default), then the data. Every number is little-endian.
//
// Kiln's view: dims are reversed into Kiln's row-major order (GGUF's ne[0], the
// contiguous dim, becomes the last), and ggml's types map to Kiln's dtypes:
// F32 F16 BF16 F64 I8 I16 I32 I64 and the block types Q8_0 Q4_0 Q4_K Q5_K Q6_K,
// which stay quantized (a DequantMatMul consumes them on the device). Other
// ggml block types (Q4_1, Q5_0, Q2_K, ...) are listed, with their sizes
// checked, but reading one is UNIMPLEMENTED naming the tensor and the type.
//
// The file is hostile: every count, length and offset is checked against the
// bytes that remain before anything is allocated from it; strings, arrays and
// the number of tensors and keys have limits; tensors must lie inside the file,
// aligned, not overlapping, and a quantized tensor's row must be whole blocks.
// Errors are INVALID_ARGUMENT (RESOURCE_EXHAUSTED for a limit) naming the key
// or tensor and the field, escaped so no name can forge a log line.
//
// Immutable after Open; thread-safe. A regular file only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "base/host_tensor.h"

namespace kiln::io {

struct GgufLimits {
  int64_t max_tensors = int64_t{1} << 20;
  int64_t max_metadata = int64_t{1} << 20;
  int64_t max_string_bytes = int64_t{16} << 20;   // one string (a tokenizer's merges can be long)
  int64_t max_array_elements = int64_t{1} << 24;  // one array
  int64_t max_file_bytes = int64_t{1} << 40;
};

// One metadata value. Integers are widened to int64 / uint64, floats to double;
// `type` keeps GGUF's own type id (0 u8 ... 12 f64).
struct GgufValue {
  uint32_t type = 0;
  int64_t i = 0;        // signed integers and bool
  uint64_t u = 0;       // unsigned integers
  double f = 0;         // floats
  std::string s;        // strings
  uint32_t array_type = 0;
  std::vector<GgufValue> array;

  bool is_string() const { return type == 8; }
  bool is_array() const { return type == 9; }
  bool is_integer() const;
  // The value as int64 when it is an integer that fits.
  std::optional<int64_t> AsInt() const;
};

struct GgufTensorInfo {
  std::string name;
  uint32_t ggml_type = 0;
  std::string type_name;  // "q4_k", "f32", ...
  DType dtype = v1::DTYPE_UNSPECIFIED;  // unspecified: a ggml type Kiln does not read
  Dims dims;              // Kiln order: GGUF's ne reversed
  int64_t offset = 0;     // in the data section
  int64_t size = 0;       // bytes
};

class GgufFile {
 public:
  static absl::StatusOr<GgufFile> Open(const std::string& path, const GgufLimits& limits = {});
  static absl::StatusOr<GgufFile> FromBytes(std::string bytes, const GgufLimits& limits = {});

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  uint32_t version() const { return version_; }
  int64_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const GgufValue* FindMetadata(std::string_view key) const;
  // In file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* Find(std::string_view name) const;
  std::string_view Bytes(const GgufTensorInfo& info) const;
  // A copy as a HostTensor of the mapped dtype (quantized stays quantized).
  absl::StatusOr<HostTensor> Read(std::string_view name) const;

 private:
  struct Mapping;
  GgufFile() = default;
  absl::Status Parse(const GgufLimits& limits);

  std::unique_ptr<Mapping> mapping_;
  uint32_t version_ = 0;
  int64_t alignment_ = 32;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> by_name_;
  std::string_view data_;
};

}  // namespace kiln::io
