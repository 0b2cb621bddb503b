/* Test plugins for ServerPlugins (tests/server/server_plugins_test.cc), one
 * source built once per variant (tests/server/CMakeLists.txt):
 *   TEST_GOOD       ops whose shape functions misbehave (a negative dim, an
 *                   element count past int64, rank 9, too many results) and a
 *                   kernel that fails with a message holding a newline
 *   TEST_GOOD_V2    the same ops as version "2" (the cache-key test)
 *   TEST_WRONG_ABI  abi_version 99
 *   TEST_DUPLICATE  provides example.add_scaled, which the example plugin has
 *   TEST_NO_SYMBOL  exports no kiln_plugin_v1
 *   TEST_NO_KERNEL  an op without a CPU kernel
 */
#include <stdio.h>
#include <string.h>

#include "kiln/plugin.h"

static int same_shape(const void* payload, size_t payload_size, const KilnTensorType* inputs,
                      int32_t num_inputs, KilnTensorType* outputs, int32_t* num_outputs,
                      char* error, size_t error_size) {
  (void)payload;
  (void)payload_size;
  if (num_inputs != 1) {
    snprintf(error, error_size, "takes 1 operand");
    return 1;
  }
  outputs[0] = inputs[0];
  *num_outputs = 1;
  return 0;
}

static int negative_dim_shape(const void* payload, size_t payload_size,
                              const KilnTensorType* inputs, int32_t num_inputs,
                              KilnTensorType* outputs, int32_t* num_outputs, char* error,
                              size_t error_size) {
  if (same_shape(payload, payload_size, inputs, num_inputs, outputs, num_outputs, error,
                 error_size) != 0) {
    return 1;
  }
  outputs[0].rank = 1;
  outputs[0].dims[0] = -5;
  return 0;
}

static int huge_shape(const void* payload, size_t payload_size, const KilnTensorType* inputs,
                      int32_t num_inputs, KilnTensorType* outputs, int32_t* num_outputs,
                      char* error, size_t error_size) {
  if (same_shape(payload, payload_size, inputs, num_inputs, outputs, num_outputs, error,
                 error_size) != 0) {
    return 1;
  }
  outputs[0].rank = 2;
  outputs[0].dims[0] = (int64_t)1 << 40;
  outputs[0].dims[1] = (int64_t)1 << 40;
  return 0;
}

static int rank9_shape(const void* payload, size_t payload_size, const KilnTensorType* inputs,
                       int32_t num_inputs, KilnTensorType* outputs, int32_t* num_outputs,
                       char* error, size_t error_size) {
  if (same_shape(payload, payload_size, inputs, num_inputs, outputs, num_outputs, error,
                 error_size) != 0) {
    return 1;
  }
  outputs[0].rank = 9;
  return 0;
}

static int many_results_shape(const void* payload, size_t payload_size,
                              const KilnTensorType* inputs, int32_t num_inputs,
                              KilnTensorType* outputs, int32_t* num_outputs, char* error,
                              size_t error_size) {
  if (same_shape(payload, payload_size, inputs, num_inputs, outputs, num_outputs, error,
                 error_size) != 0) {
    return 1;
  }
  *num_outputs = 1000;
  return 0;
}

static int copy_cpu(const void* payload, size_t payload_size, const KilnTensor* inputs,
                    int32_t num_inputs, KilnTensor* outputs, int32_t num_outputs, char* error,
                    size_t error_size) {
  (void)payload;
  (void)payload_size;
  (void)num_inputs;
  (void)num_outputs;
  (void)error;
  (void)error_size;
  memcpy(outputs[0].data, inputs[0].data, (size_t)outputs[0].bytes);
  return 0;
}

static int failing_cpu(const void* payload, size_t payload_size, const KilnTensor* inputs,
                       int32_t num_inputs, KilnTensor* outputs, int32_t num_outputs, char* error,
                       size_t error_size) {
  (void)payload;
  (void)payload_size;
  (void)inputs;
  (void)num_inputs;
  (void)outputs;
  (void)num_outputs;
  snprintf(error, error_size, "the input was rejected\nFORGED log line");
  return 7;
}

#if defined(TEST_GOOD) || defined(TEST_GOOD_V2)
static const KilnCustomOp kOps[] = {
    {"test.copy", same_shape, copy_cpu, {0, 0, 0, 0}},
    {"test.negative_dim", negative_dim_shape, copy_cpu, {0, 0, 0, 0}},
    {"test.huge", huge_shape, copy_cpu, {0, 0, 0, 0}},
    {"test.rank9", rank9_shape, copy_cpu, {0, 0, 0, 0}},
    {"test.many_results", many_results_shape, copy_cpu, {0, 0, 0, 0}},
    {"test.failing", same_shape, failing_cpu, {0, 0, 0, 0}},
};
#elif defined(TEST_DUPLICATE)
static const KilnCustomOp kOps[] = {
    {"test.dup_own", same_shape, copy_cpu, {0, 0, 0, 0}},
    {"example.add_scaled", same_shape, copy_cpu, {0, 0, 0, 0}},
};
#elif defined(TEST_NO_KERNEL)
static const KilnCustomOp kOps[] = {{"test.no_kernel", same_shape, 0, {0, 0, 0, 0}}};
#else
static const KilnCustomOp kOps[] = {{"test.other", same_shape, copy_cpu, {0, 0, 0, 0}}};
#endif

#if defined(TEST_WRONG_ABI)
#define ABI 99u
#else
#define ABI KILN_PLUGIN_ABI_VERSION
#endif
#if defined(TEST_GOOD_V2)
#define VERSION "2"
#else
#define VERSION "1"
#endif

static const KilnPlugin kPlugin = {
    ABI, sizeof(KilnPlugin), "kiln_test_plugin", VERSION,
    (int32_t)(sizeof(kOps) / sizeof(kOps[0])), kOps,
};

#if !defined(TEST_NO_SYMBOL)
__attribute__((visibility("default"))) const KilnPlugin* kiln_plugin_v1(void) { return &kPlugin; }
#else
__attribute__((visibility("default"))) const KilnPlugin* kiln_plugin_v0(void) { return &kPlugin; }
#endif
