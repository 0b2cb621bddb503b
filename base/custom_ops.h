// Custom ops from kernel plugins (include/kiln/plugin.h, docs/plugins.md).
//
// kilnd loads every plugin of its --plugin_dir once, at start, into the
// process-wide CustomOpRegistry; the engine asks it for an op's shape
// function (inference) and identity (the compile-cache key), the CPU backend
// for its kernel. Clients only name ops; nothing a client sends loads code.
//
// Thread safety: every method is thread-safe. Registered ops are never
// removed and plugins never unloaded, so a `const CustomOp*` from Find stays
// valid for the life of the process.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kiln/plugin.h"

namespace kiln {

// Ops Kiln itself provides through this registry: the in-process plugin
// "kiln" that the CPU backend registers at static init, holding kernels the
// passes emit where the IR has no op kind for them yet. Their names are taken
// before any plugin loads, so no plugin can provide them.
//
// kiln.max_pool_backward(x, y, g) -> dx: the derivative of y = max_pool(x)
// (payload: a serialized kiln.v1.PoolAttrs of kind POOL_MAX) with cotangent g,
// given to the first maximum of each window in row-major order (torch's
// rule), summed where windows overlap. The autodiff pass emits it; legalize
// turns it back into slices and compares for a device that does not claim it
// (passes/decompose.h).
inline constexpr char kMaxPoolBackwardOp[] = "kiln.max_pool_backward";

// kiln.conv2d_backward_weights(x, g, w) -> dw: the weight gradient of the
// 2-D conv y = conv(x, w) (groups 1; payload: a serialized kiln.v1.ConvAttrs)
// for the cotangent g of y; w is read for its type only (dw has it). The
// autodiff pass emits it for f32 / f16 / bf16 convs with 4 or more input
// channels; the CPU runs oneDNN's backward-weights on x and g as they are,
// and legalize decomposes it into the transposes and conv autodiff writes
// otherwise (passes/decompose.h).
inline constexpr char kConvBackwardWeightsOp[] = "kiln.conv2d_backward_weights";

struct CustomOp {
  std::string name;
  std::string plugin;          // the plugin's own name
  std::string plugin_version;  // its version string
  std::string path;            // the file it came from ("" when registered in-process)
  std::string file_sha256;     // of that file's bytes
  KilnShapeFn shape = nullptr;
  KilnCpuKernelFn cpu_kernel = nullptr;

  // What a compile-cache key records of this op, so that a changed plugin
  // (another version or other bytes) recompiles: name, plugin, version, hash.
  std::string Identity() const;
};

// Outcome of loading a plugin directory: the plugins loaded (one line each,
// "path: plugin version (op, op)") and one status per refused plugin, naming
// the file and why. Strings that came from a plugin are escaped.
struct PluginLoadReport {
  std::vector<std::string> loaded;
  std::vector<absl::Status> refused;
};

class CustomOpRegistry {
 public:
  // The process's registry (what kilnd loads and every compile consults).
  static CustomOpRegistry& Global();

  CustomOpRegistry() = default;
  CustomOpRegistry(const CustomOpRegistry&) = delete;
  CustomOpRegistry& operator=(const CustomOpRegistry&) = delete;

  // Loads every regular file named *.so in `dir`, in name order. A plugin
  // that fails (not loadable, no entry symbol, another ABI, bad or duplicate
  // op names, missing functions) is refused whole and the rest still load.
  // FAILED_PRECONDITION for the whole call when `dir` is not a readable
  // directory.
  absl::StatusOr<PluginLoadReport> LoadDirectory(const std::string& dir);

  // One plugin file; the status says why it was refused.
  absl::Status LoadFile(const std::string& path);

  // Registers a plugin's ops after validating them (LoadFile's checks); for
  // plugins linked into the process (tests). `path` and `file_sha256` may be "".
  absl::Status Register(const KilnPlugin& plugin, const std::string& path,
                        const std::string& file_sha256);

  // The op named `name`, or null.
  const CustomOp* Find(std::string_view name) const;
  // Every registered op name, sorted.
  std::vector<std::string> Names() const;

 private:
  mutable absl::Mutex ops_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<CustomOp>> ops_ ABSL_GUARDED_BY(ops_mu_);
};

// A string that came from a plugin or a client (an op name, a plugin's error
// text) as it may appear in one log line or status: quoted, non-printable
// bytes hex-escaped, cut after `max_bytes`.
std::string QuotePluginString(std::string_view s, size_t max_bytes = 128);

// Calls `op`'s shape function; the result types as it wrote them (unchecked:
// the engine validates ranks, dims and dtypes). The status names the op and
// carries the plugin's escaped reason.
absl::StatusOr<std::vector<KilnTensorType>> CallShapeFunction(const CustomOp& op,
                                                              std::string_view payload,
                                                              const std::vector<KilnTensorType>& inputs);

// Calls `op`'s CPU kernel. INVALID_ARGUMENT with the plugin's escaped reason
// when it reports a failure.
absl::Status CallCpuKernel(const CustomOp& op, std::string_view payload,
                           const std::vector<KilnTensor>& inputs, std::vector<KilnTensor>& outputs);

}  // namespace kiln
