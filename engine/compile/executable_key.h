// The executable key (DESIGN.md section 4): every input that can change a
// compiled executable, as an ordered list of named components, versions first:
//   kiln_version   the compiler version (kCompilerVersion)
//   lir_format     the LIR format version (kLirFormatVersion)
//   graph          the canonical graph bytes: deterministic serialization, debug
//                  names stripped, constants kept
//   options        the compile options that change the result (not dump_dir)
//   devices        the target device signature (DevicesSignature)
//   input_shapes   each input's name and concrete type, in graph order
// The order and the names are part of the key: changing either invalidates
// every cached executable, like bumping kCompilerVersion.
#pragma once

#include <string>
#include <string_view>

#include "engine/compile/cache_key.h"
#include "engine/engine.h"
#include "engine/ir/graph.h"
#include "engine/runtime/device_registry.h"

namespace kiln::compile {

// Each device's id, backend, arch, driver version and identity (one line
// each, in registry order), then the backends' versions.
std::string DevicesSignature(const runtime::DeviceRegistry& registry);

// The key of the executable compiled from `graph` (specialized to concrete
// input shapes) with `options` for the devices of `devices_signature`.
CacheKey ExecutableKey(const ir::Graph& graph, const CompileOptions& options,
                       std::string_view devices_signature);

}  // namespace kiln::compile
