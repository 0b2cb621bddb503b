/* An example Kiln kernel plugin (include/kiln/plugin.h, docs/plugins.md):
 * two f32 ops, built as libkiln_example_ops.so.
 *
 *   example.add_scaled(a, b) = a + alpha * b   a, b f32 of one shape; the
 *       payload is alpha as 4 little-endian IEEE-754 bytes (empty: alpha = 1)
 *   example.row_sum(x)       = x summed over its last axis (rank >= 1)
 *
 * Load it with `kilnd --plugin_dir=DIR` where DIR holds the .so; a graph then
 * names an op with OP_CUSTOM and CustomAttrs.name (`custom(a, b,
 * name="example.add_scaled")` in the text form).
 */
#include <stdio.h>
#include <string.h>

#include "kiln/plugin.h"

static int fail(char* error, size_t error_size, const char* message) {
  if (error_size > 0) snprintf(error, error_size, "%s", message);
  return 1;
}

static int read_alpha(const void* payload, size_t payload_size, float* alpha, char* error,
                      size_t error_size) {
  if (payload_size == 0) {
    *alpha = 1.0f;
    return 0;
  }
  if (payload_size != sizeof(float)) {
    return fail(error, error_size, "payload must be empty or alpha as 4 little-endian bytes");
  }
  memcpy(alpha, payload, sizeof(float));
  return 0;
}

static int add_scaled_shape(const void* payload, size_t payload_size, const KilnTensorType* inputs,
                            int32_t num_inputs, KilnTensorType* outputs, int32_t* num_outputs,
                            char* error, size_t error_size) {
  float alpha;
  if (read_alpha(payload, payload_size, &alpha, error, error_size) != 0) return 1;
  if (num_inputs != 2) return fail(error, error_size, "add_scaled takes 2 operands");
  if (inputs[0].dtype != KILN_DTYPE_F32 || inputs[1].dtype != KILN_DTYPE_F32) {
    return fail(error, error_size, "add_scaled takes f32 operands");
  }
  if (inputs[0].rank != inputs[1].rank) return fail(error, error_size, "operand ranks differ");
  for (int32_t i = 0; i < inputs[0].rank; ++i) {
    const int64_t a = inputs[0].dims[i], b = inputs[1].dims[i];
    if (a >= 0 && b >= 0 && a != b) return fail(error, error_size, "operand shapes differ");
  }
  outputs[0] = inputs[0];
  for (int32_t i = 0; i < inputs[0].rank; ++i) {
    if (outputs[0].dims[i] < 0) outputs[0].dims[i] = inputs[1].dims[i];
  }
  *num_outputs = 1;
  return 0;
}

static int add_scaled_cpu(const void* payload, size_t payload_size, const KilnTensor* inputs,
                          int32_t num_inputs, KilnTensor* outputs, int32_t num_outputs,
                          char* error, size_t error_size) {
  float alpha;
  if (read_alpha(payload, payload_size, &alpha, error, error_size) != 0) return 1;
  if (num_inputs != 2 || num_outputs != 1) return fail(error, error_size, "bad operand count");
  const float* a = (const float*)inputs[0].data;
  const float* b = (const float*)inputs[1].data;
  float* y = (float*)outputs[0].data;
  const int64_t n = outputs[0].bytes / (int64_t)sizeof(float);
  if (inputs[0].bytes != outputs[0].bytes || inputs[1].bytes != outputs[0].bytes) {
    return fail(error, error_size, "operand sizes differ");
  }
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + alpha * b[i];
  return 0;
}

static int row_sum_shape(const void* payload, size_t payload_size, const KilnTensorType* inputs,
                         int32_t num_inputs, KilnTensorType* outputs, int32_t* num_outputs,
                         char* error, size_t error_size) {
  (void)payload;
  if (payload_size != 0) return fail(error, error_size, "row_sum takes no payload");
  if (num_inputs != 1) return fail(error, error_size, "row_sum takes 1 operand");
  if (inputs[0].dtype != KILN_DTYPE_F32) return fail(error, error_size, "row_sum takes f32");
  if (inputs[0].rank < 1) return fail(error, error_size, "row_sum needs rank >= 1, got a scalar");
  outputs[0] = inputs[0];
  outputs[0].rank = inputs[0].rank - 1;
  *num_outputs = 1;
  return 0;
}

static int row_sum_cpu(const void* payload, size_t payload_size, const KilnTensor* inputs,
                       int32_t num_inputs, KilnTensor* outputs, int32_t num_outputs, char* error,
                       size_t error_size) {
  (void)payload;
  (void)payload_size;
  if (num_inputs != 1 || num_outputs != 1) return fail(error, error_size, "bad operand count");
  const KilnTensorType* t = &inputs[0].type;
  const int64_t cols = t->dims[t->rank - 1];
  const int64_t rows = outputs[0].bytes / (int64_t)sizeof(float);
  const float* x = (const float*)inputs[0].data;
  float* y = (float*)outputs[0].data;
  for (int64_t r = 0; r < rows; ++r) {
    float s = 0.0f;
    for (int64_t c = 0; c < cols; ++c) s += x[r * cols + c];
    y[r] = s;
  }
  return 0;
}

static const KilnCustomOp kOps[] = {
    {"example.add_scaled", add_scaled_shape, add_scaled_cpu, {0, 0, 0, 0}},
    {"example.row_sum", row_sum_shape, row_sum_cpu, {0, 0, 0, 0}},
};

static const KilnPlugin kPlugin = {
    KILN_PLUGIN_ABI_VERSION, sizeof(KilnPlugin), "kiln_example_ops", "1.0.0",
    (int32_t)(sizeof(kOps) / sizeof(kOps[0])), kOps,
};

__attribute__((visibility("default"))) const KilnPlugin* kiln_plugin_v1(void) { return &kPlugin; }
