// The GGUF reader (engine/io/gguf.h) on arbitrary bytes: an error or a file,
// never a crash; every tensor of an accepted file reads (or is refused as a
// block type Kiln does not read) with exactly its stated size.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "engine/io/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::io::GgufLimits limits;
  limits.max_string_bytes = 1 << 16;
  limits.max_array_elements = 1 << 16;
  absl::StatusOr<kiln::io::GgufFile> file =
      kiln::io::GgufFile::FromBytes(std::string(reinterpret_cast<const char*>(data), size), limits);
  if (!file.ok()) return 0;
  for (const kiln::io::GgufTensorInfo& t : file->tensors()) {
    absl::StatusOr<kiln::HostTensor> v = file->Read(t.name);
    if (v.ok() ? v->num_bytes() != t.size : v.status().code() != absl::StatusCode::kUnimplemented) {
      std::fprintf(stderr, "tensor read disagrees with its info: %s\n", v.status().ToString().c_str());
      std::abort();
    }
  }
  return 0;
}
