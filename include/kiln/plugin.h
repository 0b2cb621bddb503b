/* Kiln custom-op plugins: the C ABI between kilnd and a kernel plugin.
 *
 * A plugin is a shared library that kilnd's operator puts in --plugin_dir
 * (ServerConfig.plugin_dir). kilnd dlopen()s every *.so there once, at start,
 * and never again: clients can name the ops a plugin provides (OP_CUSTOM with
 * CustomAttrs.name) but can never load code.
 *
 * The plugin exports one symbol, KILN_PLUGIN_ENTRY_SYMBOL, a function that
 * returns a pointer to a static KilnPlugin. kilnd refuses the whole plugin
 * (logs why and starts without it) when the symbol is missing, the ABI
 * version or struct size differs from what kilnd was built with, a name is
 * empty or too long, an op lacks a shape function or a CPU kernel, or an op
 * name is already provided by another plugin (or twice by this one).
 *
 * Versioning (docs/plugins.md): KILN_PLUGIN_ABI_VERSION changes whenever a
 * struct below or a function's meaning changes; kilnd loads exactly its own
 * version. Dtype values are kiln.v1.DType's (append-only).
 *
 * GPU kernels: not yet. v1 plugins provide CPU kernels only; a graph whose
 * custom op is placed on a GPU device falls back to the CPU.
 *
 * Thread safety: kilnd calls the shape function and kernels from several
 * threads at once (different runs); they must not keep mutable global state.
 * Nothing kilnd passes outlives the call.
 */
#ifndef KILN_PLUGIN_H_
#define KILN_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_PLUGIN_ABI_VERSION 1u
#define KILN_PLUGIN_ENTRY_SYMBOL "kiln_plugin_v1"
#define KILN_PLUGIN_MAX_RANK 8
#define KILN_PLUGIN_MAX_OUTPUTS 16
#define KILN_PLUGIN_MAX_NAME 128 /* bytes of an op or plugin name, NUL excluded */

/* kiln.v1.DType values a plugin may see or produce. */
enum {
  KILN_DTYPE_F32 = 1,
  KILN_DTYPE_F16 = 2,
  KILN_DTYPE_BF16 = 3,
  KILN_DTYPE_F64 = 4,
  KILN_DTYPE_I8 = 5,
  KILN_DTYPE_U8 = 6,
  KILN_DTYPE_I16 = 7,
  KILN_DTYPE_I32 = 8,
  KILN_DTYPE_I64 = 9,
  KILN_DTYPE_BOOL = 10
};

/* A tensor type: dtype and dims. In a shape function a dim of -1 is unknown
 * until run time (a symbolic dim); kernels always see concrete dims. */
typedef struct KilnTensorType {
  int32_t dtype;
  int32_t rank; /* 0 .. KILN_PLUGIN_MAX_RANK */
  int64_t dims[KILN_PLUGIN_MAX_RANK];
} KilnTensorType;

/* A tensor as a kernel sees it: dense, row-major, 64-byte aligned host memory.
 * `bytes` is the exact size of `data`. Inputs are read-only. */
typedef struct KilnTensor {
  KilnTensorType type;
  void* data;
  int64_t bytes;
} KilnTensor;

/* Both functions return 0 on success. On failure they return nonzero and may
 * write a NUL-terminated reason (at most error_size bytes, NUL included) to
 * `error`; kilnd escapes it and names the node in the status it returns.
 * `payload` is CustomAttrs.payload: bytes from the client, opaque to kilnd,
 * to be validated by the plugin before use. */

/* Result types from operand types. Writes num_outputs (1 ..
 * KILN_PLUGIN_MAX_OUTPUTS) and outputs[0 .. num_outputs). kilnd validates what
 * comes back (rank, dims, dtype, element count overflow and limits). */
typedef int (*KilnShapeFn)(const void* payload, size_t payload_size, const KilnTensorType* inputs,
                           int32_t num_inputs, KilnTensorType* outputs, int32_t* num_outputs,
                           char* error, size_t error_size);

/* Computes the outputs (types as the shape function said, dims concrete). */
typedef int (*KilnCpuKernelFn)(const void* payload, size_t payload_size, const KilnTensor* inputs,
                               int32_t num_inputs, KilnTensor* outputs, int32_t num_outputs,
                               char* error, size_t error_size);

typedef struct KilnCustomOp {
  const char* name; /* unique across loaded plugins, e.g. "example.add_scaled" */
  KilnShapeFn shape;
  KilnCpuKernelFn cpu_kernel;
  void* reserved[4]; /* GPU kernels, later ABI versions: must be NULL */
} KilnCustomOp;

typedef struct KilnPlugin {
  uint32_t abi_version; /* KILN_PLUGIN_ABI_VERSION */
  uint32_t struct_size; /* sizeof(KilnPlugin) */
  const char* name;     /* the plugin's name, for logs and cache keys */
  const char* version;  /* the plugin's own version string */
  int32_t num_ops;
  const KilnCustomOp* ops;
} KilnPlugin;

/* The one exported symbol: returns a pointer valid until the library is
 * unloaded (kilnd never unloads). */
typedef const KilnPlugin* (*KilnPluginEntryFn)(void);

#ifdef __cplusplus
}
#endif

#endif /* KILN_PLUGIN_H_ */
