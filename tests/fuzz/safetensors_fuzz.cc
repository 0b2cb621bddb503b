// The safetensors reader (engine/io/safetensors.h) on arbitrary bytes: an error
// or a file, never a crash; every tensor of an accepted file reads back, and the
// file re-serializes to one that parses to the same tensors and metadata.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/io/safetensors.h"

namespace {
[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "%s\n", what);
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::io::SafetensorsLimits limits;
  limits.max_header_bytes = 1 << 20;
  absl::StatusOr<kiln::io::SafetensorsFile> file = kiln::io::SafetensorsFile::FromBytes(
      std::string(reinterpret_cast<const char*>(data), size), limits);
  if (!file.ok()) return 0;
  std::vector<kiln::HostTensor> values;
  values.reserve(file->tensors().size());
  for (const kiln::io::SafetensorsEntry& e : file->tensors()) {
    absl::StatusOr<kiln::HostTensor> t = file->Read(e.name);
    if (!t.ok()) Fail("an accepted tensor does not read");
    values.push_back(*std::move(t));
  }
  std::vector<kiln::io::SafetensorsItem> items;
  for (size_t i = 0; i < values.size(); ++i) items.emplace_back(file->tensors()[i].name, &values[i]);
  absl::StatusOr<std::string> again = kiln::io::SerializeSafetensors(items, file->metadata());
  if (!again.ok()) Fail("an accepted file does not serialize");
  absl::StatusOr<kiln::io::SafetensorsFile> back = kiln::io::SafetensorsFile::FromBytes(*again);
  if (!back.ok() || back->metadata() != file->metadata() ||
      back->tensors().size() != file->tensors().size()) {
    Fail("the round trip changed the file");
  }
  for (size_t i = 0; i < values.size(); ++i) {
    const kiln::io::SafetensorsEntry& e = back->tensors()[i];
    if (e.name != file->tensors()[i].name || e.dtype != values[i].dtype() ||
        e.dims != values[i].dims() || back->Bytes(e) != values[i].bytes()) {
      Fail("the round trip changed a tensor");
    }
  }
  return 0;
}
