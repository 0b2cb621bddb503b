// safetensors (https://huggingface.co/docs/safetensors): weights by name, and
// Kiln's checkpoints (params and optimizer state, with the step and schedule in
// `__metadata__`).
//
// The format: an 8-byte little-endian header length N, N bytes of JSON (an
// object: tensor name -> {"dtype", "shape", "data_offsets": [begin, end]}, plus
// an optional "__metadata__" object of string -> string), then the data buffer.
// Offsets are relative to the buffer's start.
//
// The reader treats the file as hostile. It refuses, with an INVALID_ARGUMENT
// naming the tensor and the field (or RESOURCE_EXHAUSTED for a limit):
//   - a header over SafetensorsLimits::max_header_bytes (100 MiB by default, as
//     the reference implementation) or running past the file;
//   - JSON that is not an object of objects, nested deeper than the format's
//     three levels, or with a name given twice;
//   - an unknown or unsupported dtype (F8_*, U16/U32/U64 have no Kiln type), a
//     negative dim, an element count or byte size that overflows int64;
//   - data_offsets whose length does not match dtype x shape, that run past the
//     file, overlap another tensor, or leave a gap: the buffer must be covered
//     exactly, as the format requires.
// Nothing is allocated from a size the file states before that size is checked
// against the file's real length.
//
// SafetensorsFile maps the file read-only (MAP_PRIVATE) and hands out views;
// it is immutable after Open and safe to share across threads. A regular file
// only: a FIFO or device node in its place is refused rather than read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "base/host_tensor.h"

namespace kiln::io {

struct SafetensorsLimits {
  int64_t max_header_bytes = int64_t{100} << 20;
  int64_t max_tensors = int64_t{1} << 20;
  int64_t max_file_bytes = int64_t{1} << 40;
};

struct SafetensorsEntry {
  std::string name;
  DType dtype = v1::DTYPE_UNSPECIFIED;
  Dims dims;
  int64_t offset = 0;  // in the data buffer
  int64_t size = 0;    // bytes
};

class SafetensorsFile {
 public:
  // Maps and validates the file at `path`.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path,
                                              const SafetensorsLimits& limits = {});
  // Validates bytes already in memory (a request body, a fuzz input). The
  // string is kept; views point into it.
  static absl::StatusOr<SafetensorsFile> FromBytes(std::string bytes,
                                                   const SafetensorsLimits& limits = {});

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  // Every tensor, in name order.
  const std::vector<SafetensorsEntry>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when there is no tensor of that name.
  const SafetensorsEntry* Find(std::string_view name) const;
  // The tensor's bytes (little-endian, row-major), a view into the file.
  std::string_view Bytes(const SafetensorsEntry& entry) const;
  // A copy of the tensor as a HostTensor; NOT_FOUND names a missing tensor.
  absl::StatusOr<HostTensor> Read(std::string_view name) const;

 private:
  struct Mapping;
  SafetensorsFile() = default;
  absl::Status Parse(const SafetensorsLimits& limits);

  std::unique_ptr<Mapping> mapping_;  // the file's bytes (mmap or owned string)
  std::string_view data_;             // the data buffer, after the header
  std::vector<SafetensorsEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: its name and its value (not owned).
using SafetensorsItem = std::pair<std::string, const HostTensor*>;

// The file's bytes: tensors sorted by name, laid out contiguously in that order
// with the header padded by spaces to a multiple of 8 bytes (so every tensor of
// an 8-byte type is aligned when the file is mapped). Deterministic: the same
// tensors and metadata give the same bytes. Quantized (GGUF block) tensors and
// duplicate or empty names are refused.
absl::StatusOr<std::string> SerializeSafetensors(std::span<const SafetensorsItem> tensors,
                                                 const std::map<std::string, std::string>& metadata);
// Writes SerializeSafetensors' bytes to `path` atomically: a temporary file in
// the same directory, fsync, rename. A reader never sees a half-written file.
absl::Status WriteSafetensors(const std::string& path, std::span<const SafetensorsItem> tensors,
                              const std::map<std::string, std::string>& metadata);

// "F32" <-> DTYPE_F32, ... (the format's names); nullopt / "" where Kiln's type
// has no safetensors name or the reverse.
std::optional<DType> SafetensorsDType(std::string_view name);
std::string_view SafetensorsDTypeName(DType dtype);

}  // namespace kiln::io
