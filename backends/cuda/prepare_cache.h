// What the CUDA backend keeps in the kernel level of the compile cache
// (PrepareContext::binaries) besides cubins (nvrtc_compiler.h): the choices
// that preparing a kernel makes by asking a library, so that a warm start
// (a new kilnd, a restarted worker) asks nothing again:
//   cudnn-plan   a finalized cuDNN execution plan, as the JSON cuDNN
//                serializes it (CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION;
//                its runtime-compiled kernels included), per plan key
//                (CudnnSdpaKey) and device model;
//   cublaslt-algo the cuBLASLt algorithm the heuristic chose
//                (cublasLtMatmulAlgo_t, which cuBLAS documents as trivially
//                serializable for the same cuBLAS version), per shape key,
//                device model and cuBLASLt version.
// Keys are content addresses: "<kind>-" + hex SHA-256 over the ordered,
// named, length-prefixed components, the entry format version among them.
// An entry repeats its kind, format version and full key in a header, so an
// entry of another kind, version or key (a foreign or damaged file that the
// disk cache's checksum let through) is refused by DecodePrepareEntry; the
// caller then asks the library again and overwrites the entry. The disk
// cache's own checksum catches torn and corrupted files before that.
//
// Host-only and pure (tested without a GPU); thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::cuda {

// Bumped when an entry's payload changes meaning.
inline constexpr int kPrepareEntryVersion = 1;

// "<kind>-<hex sha256>" over {kind, entry version, components...}.
std::string PrepareCacheKey(std::string_view kind,
                            const std::vector<std::pair<std::string, std::string>>& components);

// The stored bytes of `payload` under `key`: "kiln-<kind> <version>\n" +
// "<key>\n" + payload.
std::string EncodePrepareEntry(std::string_view kind, std::string_view key,
                               std::string_view payload);

// The payload of `entry` when it is an entry of `kind`, this version and
// exactly `key` with a non-empty payload; nullopt otherwise.
std::optional<std::string> DecodePrepareEntry(std::string_view kind, std::string_view key,
                                              std::string_view entry);

}  // namespace kiln::cuda
