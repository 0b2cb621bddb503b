// The .npy reader (engine/io/npy.h) on arbitrary bytes: an error or a tensor,
// never a crash, and a tensor it accepts survives SerializeNpy -> ParseNpy intact.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <string_view>

#include "engine/io/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kiln::HostTensor> tensor = kiln::ParseNpy(bytes, "fuzz");
  if (!tensor.ok()) return 0;
  absl::StatusOr<std::string> again = kiln::SerializeNpy(*tensor);
  if (!again.ok()) {
    std::fprintf(stderr, "accepted tensor does not serialize: %s\n",
                 again.status().ToString().c_str());
    std::abort();
  }
  absl::StatusOr<kiln::HostTensor> back = kiln::ParseNpy(*again, "round trip");
  if (!back.ok() || back->dtype() != tensor->dtype() || back->dims() != tensor->dims() ||
      back->bytes() != tensor->bytes()) {
    std::fprintf(stderr, "round trip changed the tensor: %s\n",
                 back.ok() ? "different dtype, dims or bytes" : back.status().ToString().c_str());
    std::abort();
  }
  return 0;
}
