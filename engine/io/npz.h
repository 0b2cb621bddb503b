// NumPy .npz archives (numpy.savez / savez_compressed): a zip of .npy files,
// one tensor per entry, named by the entry without its ".npy".
//
// Read with libzip, each entry through ParseNpy (engine/io/npy.h). The archive
// is hostile: entries are counted and their declared uncompressed sizes summed
// against NpzLimits before anything is inflated (a zip bomb is refused from its
// directory), an entry whose inflated bytes differ from its declared size is
// refused, as are entries that are not .npy files, directories, encrypted
// entries and names given twice. Errors name the archive and the entry
// (escaped). Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "base/host_tensor.h"

namespace kiln::io {

struct NpzLimits {
  int64_t max_entries = 1 << 16;
  int64_t max_total_bytes = int64_t{64} << 30;  // inflated, all entries together
};

// The archive's tensors in entry order. `what` names it in errors.
absl::StatusOr<std::vector<std::pair<std::string, HostTensor>>> ParseNpz(std::string_view bytes,
                                                                         const std::string& what,
                                                                         const NpzLimits& limits = {});
absl::StatusOr<std::vector<std::pair<std::string, HostTensor>>> ReadNpz(const std::string& path,
                                                                        const NpzLimits& limits = {});
// An archive of `tensors` (stored, not compressed: tensors rarely shrink),
// readable by numpy.load. Names must be unique and non-empty.
absl::StatusOr<std::string> SerializeNpz(const std::vector<std::pair<std::string, const HostTensor*>>& tensors);

}  // namespace kiln::io
