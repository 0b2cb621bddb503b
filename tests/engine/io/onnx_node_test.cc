// The ONNX backend node tests (Debian's libonnx-testdata, a peer suite we did
// not write) through the importer, the compiler and the CPU: every case whose
// ops the importer converts runs each of its test data sets and must match the
// expected outputs, unless tests/engine/io/onnx_known_failures.txt lists it
// with the reason. A listed case that passes fails the test too, so the list
// stays honest. Cases with ops the importer lacks must fail with the
// unsupported-node error naming the op. Prints pass counts per op.
//
// KILN_ONNX_TESTDATA overrides the data directory; KILN_ONNX_FILTER runs only
// the cases whose name contains it; KILN_ONNX_WRITE_FAILURES=path writes the
// failing cases as a new list (to review, not to copy blindly).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/engine.h"
#include "engine/io/onnx/onnx_import.h"
#include "engine/io/onnx/onnx_specialize.h"
#include "onnx/onnx_pb.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::map<std::string, std::string> ReadKnownFailures() {
  std::map<std::string, std::string> out;
  std::ifstream f(std::string(KILN_SOURCE_DIR) + "/tests/engine/io/onnx_known_failures.txt");
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.find_first_of(" \t");
    const std::string name = line.substr(0, sp);
    out[name] = sp == std::string::npos ? "" : line.substr(line.find_first_not_of(" \t", sp));
  }
  return out;
}

// Both NaN, both the same infinity, or within atol + rtol * |want|.
bool Close(double got, double want, double atol, double rtol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= atol + rtol * std::fabs(want);
}

std::string Compare(const HostTensor& got, const HostTensor& want) {
  if (got.dtype() != want.dtype()) {
    return absl::StrCat("dtype ", DTypeName(got.dtype()), ", expected ", DTypeName(want.dtype()));
  }
  if (got.dims() != want.dims()) {
    return absl::StrCat("shape ", DimsToString(got.dims()), ", expected ", DimsToString(want.dims()));
  }
  const bool half = got.dtype() == v1::DTYPE_F16 || got.dtype() == v1::DTYPE_BF16;
  const double atol = half ? 1e-2 : 1e-4, rtol = half ? 1e-2 : 1e-3;
  for (int64_t i = 0; i < got.num_elements(); ++i) {
    const double g = got.GetAsDouble(i), w = want.GetAsDouble(i);
    if (!Close(g, w, atol, rtol)) {
      return absl::StrCat("element ", i, ": ", g, ", expected ", w);
    }
  }
  return "";
}

// The op a case is about: the longest op type (of the importer's or the
// model's) whose name the case's name starts with ("test_layer_normalization_
// 2d_axis0_expanded" -> LayerNormalization), else its first node's.
std::string CaseOp(const std::string& case_name, const onnx::ModelProto& m,
                   const std::set<std::string>& supported) {
  std::string flat = absl::StrReplaceAll(case_name.substr(5), {{"_", ""}});
  for (char& ch : flat) ch = static_cast<char>(std::tolower(ch));
  std::string best;
  std::vector<std::string> candidates(supported.begin(), supported.end());
  for (const auto& n : m.graph().node()) candidates.push_back(n.op_type());
  for (const std::string& name : candidates) {
    std::string op = name;
    for (char& ch : op) ch = static_cast<char>(std::tolower(ch));
    if (flat.rfind(op, 0) == 0 && op.size() > best.size()) best = name;
  }
  if (!best.empty()) return best;
  // The two names the suite abbreviates.
  if (flat.rfind("sce", 0) == 0) return "SoftmaxCrossEntropyLoss";
  if (flat.rfind("nllloss", 0) == 0) return "NegativeLogLikelihoodLoss";
  return m.graph().node_size() > 0 ? m.graph().node(0).op_type() : "?";
}

struct CaseResult {
  bool covered = false;
  std::string failure;  // empty: passed
};

class OnnxNodeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    EngineOptions o;
    o.calibration = EngineOptions::Calibration::kNever;
    o.disabled_backends = {"vulkan", "cuda"};
    auto e = Engine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(e).value().release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }

  CaseResult RunCase(const fs::path& dir, const std::set<std::string>& supported,
                     const onnx::ModelProto& model, const std::string& bytes) {
    CaseResult r;
    r.covered = true;
    for (const auto& n : model.graph().node()) {
      if (!(n.domain().empty() || n.domain() == "ai.onnx") || !supported.contains(n.op_type())) {
        r.covered = false;
      }
    }
    // Opsets before 9 are outside what the importer reads.
    for (const auto& o : model.opset_import()) {
      if ((o.domain().empty() || o.domain() == "ai.onnx") && o.version() < 9) r.covered = false;
    }
    std::set<std::string> initializers;
    for (const auto& i : model.graph().initializer()) initializers.insert(i.name());
    std::vector<std::string> input_names;
    for (const auto& vi : model.graph().input()) {
      if (!initializers.contains(vi.name())) input_names.push_back(vi.name());
    }
    std::vector<fs::path> sets;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) {
        sets.push_back(e.path());
      }
    }
    std::sort(sets.begin(), sets.end());
    if (!r.covered) {
      auto g = io::ImportOnnx(bytes, {});
      if (g.ok()) {
        r.failure = "imported although it has an op the importer does not list";
      } else if (!absl::IsUnimplemented(g.status()) ||
                 (g.status().message().find("cannot import") == std::string::npos &&
                  g.status().message().find("Kiln imports opsets") == std::string::npos)) {
        r.failure = absl::StrCat("not the unsupported-node error: ", g.status().ToString());
      }
      return r;
    }
    if (sets.empty()) {
      r.failure = "no test data sets";
      return r;
    }
    for (const fs::path& set : sets) {
      std::vector<std::pair<std::string, HostTensor>> inputs;
      io::OnnxImportOptions options;
      for (size_t i = 0;; ++i) {
        const fs::path p = set / absl::StrCat("input_", i, ".pb");
        if (!fs::exists(p)) break;
        std::string name;
        auto t = io::ParseOnnxTensor(ReadFile(p), &name);
        if (!t.ok()) {
          r.failure = absl::StrCat(p.string(), ": ", t.status().ToString());
          return r;
        }
        if (name.empty() && i < input_names.size()) name = input_names[i];
        options.input_shapes.emplace_back(name, t->dims());
        inputs.emplace_back(name, std::move(t).value());
      }
      auto model_result = io::ImportOnnxModel(bytes, options);
      // Node tests feed axes, pads, shapes, trip counts and scalar bounds as
      // graph inputs; Kiln needs them at import. Such a case is first
      // specialised on the values of its small integer inputs
      // (io::OnnxSpecializer, what a server does with such a model), then
      // imports again with its integer and one-element inputs fixed, then
      // with all but its first.
      std::set<std::string> fixed;
      if (!model_result.ok() && absl::IsUnimplemented(model_result.status())) {
        io::OnnxSpecializer::Options so;
        so.import = options;
        auto sp = io::OnnxSpecializer::Create(bytes, so);
        if (sp.ok()) {
          std::vector<std::pair<std::string, const HostTensor*>> values;
          for (const auto& [name, t] : inputs) values.emplace_back(name, &t);
          auto m = (*sp)->For(values);
          if (m.ok()) {
            // The specializer keeps its model (shared, const); the case
            // takes its own copy (HostTensor is move-only: Clone()).
            io::OnnxModel copy;
            copy.graph = (*m)->graph;
            for (const auto& [pn, pt] : (*m)->params) copy.params.emplace_back(pn, pt.Clone());
            model_result = std::move(copy);
            for (const std::string& name : (*sp)->value_inputs()) fixed.insert(name);
          }
        }
      }
      if (!model_result.ok() && absl::IsUnimplemented(model_result.status())) {
        for (const auto& [name, t] : inputs) {
          if (IsInteger(t.dtype()) || t.num_elements() == 1) {
            options.input_values.emplace_back(name, &t);
            fixed.insert(name);
          }
        }
        if (!fixed.empty()) model_result = io::ImportOnnxModel(bytes, options);
      }
      // Then every input but the data (Resize's float scales).
      if (!model_result.ok() && absl::IsUnimplemented(model_result.status())) {
        for (size_t k = 1; k < inputs.size(); ++k) {
          if (fixed.insert(inputs[k].first).second) {
            options.input_values.emplace_back(inputs[k].first, &inputs[k].second);
          }
        }
        model_result = io::ImportOnnxModel(bytes, options);
      }
      if (!model_result.ok()) {
        r.failure = absl::StrCat("import: ", model_result.status().ToString());
        return r;
      }
      std::vector<TensorRef> refs;
      for (const auto& [name, t] : inputs) {
        if (!fixed.contains(name)) refs.push_back(TensorRef::Of(name, t));
      }
      auto result = engine_->RunGraph(model_result->graph, refs, nullptr, {}, {});
      if (!result.ok()) {
        r.failure = absl::StrCat("run: ", result.status().ToString());
        return r;
      }
      for (size_t i = 0;; ++i) {
        const fs::path p = set / absl::StrCat("output_", i, ".pb");
        if (!fs::exists(p)) break;
        std::string name;
        auto want = io::ParseOnnxTensor(ReadFile(p), &name);
        if (!want.ok()) {
          r.failure = absl::StrCat(p.string(), ": ", want.status().ToString());
          return r;
        }
        if (i >= result->outputs.size()) {
          r.failure = absl::StrCat("output ", i, " missing");
          return r;
        }
        const std::string diff = Compare(result->outputs[i].second, *want);
        if (!diff.empty()) {
          r.failure = absl::StrCat(set.filename().string(), " output ", i, " (",
                                   result->outputs[i].first, "): ", diff);
          return r;
        }
      }
    }
    return r;
  }

  static Engine* engine_;
};

Engine* OnnxNodeTest::engine_ = nullptr;

TEST_F(OnnxNodeTest, BackendNodeCases) {
  const char* env = std::getenv("KILN_ONNX_TESTDATA");
  const fs::path root = env ? env : "/usr/share/libonnx-testdata/data/node";
  ASSERT_TRUE(fs::is_directory(root)) << root << " is missing: install libonnx-testdata "
                                      << "(scripts/install-deps.sh)";
  const char* filter = std::getenv("KILN_ONNX_FILTER");
  const auto ops = io::SupportedOnnxOps();
  const std::set<std::string> supported(ops.begin(), ops.end());
  const auto known = ReadKnownFailures();
  std::vector<fs::path> cases;
  for (const auto& e : fs::directory_iterator(root)) {
    if (e.is_directory()) cases.push_back(e.path());
  }
  std::sort(cases.begin(), cases.end());
  struct OpCount {
    int passed = 0, total = 0;
  };
  std::map<std::string, OpCount> per_op;
  int covered = 0, passed = 0, uncovered = 0;
  std::vector<std::string> failing;
  std::set<std::string> seen;
  for (const fs::path& dir : cases) {
    const std::string name = dir.filename().string();
    if (filter && name.find(filter) == std::string::npos) continue;
    seen.insert(name);
    const std::string bytes = ReadFile(dir / "model.onnx");
    onnx::ModelProto model;
    ASSERT_TRUE(model.ParseFromString(bytes)) << name;
    const CaseResult r = RunCase(dir, supported, model, bytes);
    if (!r.covered) {
      ++uncovered;
      EXPECT_TRUE(r.failure.empty()) << name << ": " << r.failure;
      continue;
    }
    ++covered;
    OpCount& oc = per_op[CaseOp(name, model, supported)];
    ++oc.total;
    const bool listed = known.contains(name);
    if (r.failure.empty()) {
      ++passed;
      ++oc.passed;
      EXPECT_FALSE(listed) << name << " passes but onnx_known_failures.txt lists it ("
                           << known.at(name) << "): remove it from the list";
      continue;
    }
    failing.push_back(absl::StrCat(name, "  ", r.failure));
    EXPECT_TRUE(listed) << name << " fails and is not in onnx_known_failures.txt: " << r.failure;
  }
  for (const auto& [name, reason] : known) {
    if (!filter) {
      EXPECT_TRUE(seen.contains(name)) << "onnx_known_failures.txt lists " << name
                                       << ", which is not a case here";
    }
  }
  std::ostringstream report;
  report << "ONNX node cases: " << passed << " of " << covered << " covered cases pass ("
         << (covered ? 100.0 * passed / covered : 0) << "%); " << uncovered
         << " cases use ops the importer does not convert\n";
  for (const auto& [op, c] : per_op) report << "  " << op << ": " << c.passed << "/" << c.total << "\n";
  std::cout << report.str();
  if (const char* out = std::getenv("KILN_ONNX_WRITE_FAILURES")) {
    std::ofstream f(out);
    for (const auto& l : failing) f << l << "\n";
  }
  if (!filter) {
    EXPECT_GE(passed, covered * 9 / 10) << "below 90% of the covered node cases";
  }
}

}  // namespace
}  // namespace kiln
