// Every examples/*.kiln parses, verifies, round-trips through the printer and
// specializes at batch 2 to concrete shapes.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "engine/ir/text.h"
#include "engine/ir/verifier.h"
#include "gtest/gtest.h"

namespace kiln::ir {
namespace {

namespace fs = std::filesystem;

fs::path ExamplesDir() {
  const char* src = std::getenv("KILN_SOURCE_DIR");
  return fs::path(src != nullptr ? src : ".") / "examples";
}

std::vector<fs::path> ExampleFiles() {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(ExamplesDir(), ec)) {
    if (entry.path().extension() == ".kiln") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ExamplesTest, TheDocumentedExamplesExist) {
  std::vector<std::string> names;
  for (const auto& f : ExampleFiles()) names.push_back(f.filename().string());
  for (const char* want : {"mlp.kiln", "encoder_layer.kiln", "attention_causal.kiln",
                           "softmax_classifier.kiln", "conv_net.kiln"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end())
        << want << " missing from " << ExamplesDir() << " (is KILN_SOURCE_DIR set?)";
  }
}

TEST(ExamplesTest, EveryExampleParsesVerifiesAndSpecializes) {
  // Output types at batch 2 for the examples whose shapes we know by heart.
  const std::map<std::string, std::vector<std::string>> expected = {
      {"mlp.kiln", {"f32[2, 10]"}},
      {"encoder_layer.kiln", {"f32[2, 128, 768]"}},
      {"attention_causal.kiln", {"f32[2, 128, 768]"}},
      {"softmax_classifier.kiln", {"f32[2, 10]", "f32[]", "i64[2]"}},
      {"conv_net.kiln", {"f32[2, 10]"}},
  };
  const auto files = ExampleFiles();
  ASSERT_FALSE(files.empty()) << "no examples in " << ExamplesDir();
  for (const fs::path& file : files) {
    SCOPED_TRACE(file.string());
    auto g = ParseGraph(ReadFile(file));
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE(VerifyGraph(**g).ok());

    const std::string printed = PrintGraph(**g);
    auto again = ParseGraph(printed);
    ASSERT_TRUE(again.ok()) << again.status() << "\n" << printed;
    EXPECT_EQ(PrintGraph(**again), printed);

    // Every symbolic input dim (`batch`, `?`) becomes 2.
    std::vector<std::pair<std::string, Dims>> shapes;
    for (const Node* in : (*g)->Inputs()) {
      Dims dims;
      for (int64_t d : in->type().dims) dims.push_back(d >= 0 ? d : 2);
      shapes.emplace_back(in->name, dims);
    }
    auto specialized = (*g)->Clone();
    ASSERT_TRUE(Specialize(*specialized, shapes).ok());
    auto want = expected.find(file.filename().string());
    if (want == expected.end()) continue;
    std::vector<std::string> got;
    for (const GraphOutput& o : specialized->outputs()) {
      got.push_back(TypeToString(specialized->TypeOf(o.value)));
    }
    EXPECT_EQ(got, want->second);
  }
}

}  // namespace
}  // namespace kiln::ir
