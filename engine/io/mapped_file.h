// What the weight-file readers (safetensors, GGUF) share: a file's bytes mapped
// read-only, or owned bytes already in memory, and the quoting of names that
// come from those bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kiln::io {

// Move-only. The view stays valid for the object's life.
class MappedFile {
 public:
  // Maps `path` read-only (MAP_PRIVATE). Refuses what is not a regular file (a
  // FIFO would block the open) and a file over `max_bytes`; `format` names the
  // reader in errors ("safetensors", "gguf"). NOT_FOUND for a missing file.
  static absl::StatusOr<MappedFile> Open(const std::string& path, int64_t max_bytes,
                                         std::string_view format);
  static MappedFile FromString(std::string bytes);

  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::string_view bytes() const { return bytes_; }

 private:
  MappedFile() = default;
  void Reset();
  std::string owned_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::string_view bytes_;
};

// A name read from a file, fit for an error message or a log line: C-escaped
// (a newline in it cannot start a forged line), cut at 120 bytes, in quotes.
std::string QuotedName(std::string_view name);

}  // namespace kiln::io
