// The ONNX importer (engine/io/onnx/onnx_import.h) on arbitrary bytes: a
// serialized ModelProto imported with small limits, and the same bytes read as a
// TensorProto. An error or a result, never a crash; the importer promises a
// verified graph, so what it returns must pass the verifier.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "engine/io/onnx/onnx_import.h"
#include "engine/ir/verifier.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  kiln::io::OnnxImportOptions options;
  options.max_model_bytes = int64_t{1} << 20;
  options.max_nodes = 4096;
  options.limits.max_rank = 8;
  options.limits.max_tensor_elements = int64_t{1} << 20;
  options.limits.max_tensor_bytes = int64_t{1} << 22;
  options.limits.max_subgraph_depth = 8;
  auto graph = kiln::io::ImportOnnx(bytes, options);
  if (graph.ok()) {
    kiln::ir::VerifyOptions verify;
    verify.limits = options.limits;
    verify.max_nodes = 1 << 20;
    if (auto imported = kiln::ir::ImportGraph(*graph, verify); !imported.ok()) {
      std::fprintf(stderr, "the importer returned a graph that does not verify: %s\n",
                   imported.status().ToString().c_str());
      std::abort();
    }
  }
  (void)kiln::io::ParseOnnxTensor(bytes);
  return 0;
}
