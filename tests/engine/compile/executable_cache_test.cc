// The executable cache's miss explanations (CompileReport::miss_reason),
// through the Engine: which key component differs from the nearest
// executable seen, an evicted key, a discarded disk entry, and none on a hit.
#include "engine/compile/executable_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "clients/cpp/graph_builder.h"
#include "engine/engine.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// y = relu(x @ w + b) (or tanh) with x f32[batch, 8].
v1::Graph Mlp(bool use_tanh = false) {
  GraphBuilder g(use_tanh ? "mlp_tanh" : "mlp");
  auto x = g.input("x", v1::DTYPE_F32, {std::string("batch"), int64_t{8}});
  auto w = g.param("w", v1::DTYPE_F32, {8, 4});
  auto b = g.param("b", v1::DTYPE_F32, {4});
  auto h = g.add(g.matmul(x, w), b);
  g.output("y", use_tanh ? g.tanh(h) : g.relu(h));
  return g.Build();
}

std::unique_ptr<Engine> MakeCacheEngine(const std::string& cache_dir = "",
                                        int64_t max_memory = 256) {
  EngineOptions o;
  o.cache_dir = cache_dir;
  o.max_memory_executables = max_memory;
  o.calibration = EngineOptions::Calibration::kNever;
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(e).value();
}

v1::CompileReport Compile(Engine& engine, const v1::Graph& graph, int64_t batch,
                          const CompileOptions& options = {}) {
  auto c = engine.Compile(graph, options, {{"x", {batch, 8}}});
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? c->report : v1::CompileReport();
}

TEST(ExecutableCacheTest, FirstCompileHasNothingToCompareWith) {
  auto engine = MakeCacheEngine();
  const v1::CompileReport r = Compile(*engine, Mlp(), 2);
  EXPECT_EQ(r.executable_cache(), v1::CACHE_DISABLED);
  EXPECT_EQ(r.miss_reason(), "no executable cached yet to compare with");
}

TEST(ExecutableCacheTest, HitsHaveNoMissReason) {
  auto engine = MakeCacheEngine();
  Compile(*engine, Mlp(), 2);
  const v1::CompileReport r = Compile(*engine, Mlp(), 2);
  EXPECT_EQ(r.executable_cache(), v1::CACHE_HIT_MEMORY);
  EXPECT_EQ(r.miss_reason(), "");
}

TEST(ExecutableCacheTest, AnotherBatchSizeNamesTheShapes) {
  auto engine = MakeCacheEngine();
  const v1::CompileReport first = Compile(*engine, Mlp(), 2);
  const v1::CompileReport r = Compile(*engine, Mlp(), 3);
  const std::string& why = r.miss_reason();
  EXPECT_EQ(
      why.rfind("against cached executable " + first.executable_key().substr(0, 12) + "..: ", 0),
      0u)
      << why;
  EXPECT_NE(why.find("input_shapes: \"x:f32[2, 8];\" -> \"x:f32[3, 8];\""), std::string::npos)
      << why;
  EXPECT_EQ(why.find("options"), std::string::npos) << why;
  EXPECT_EQ(why.find("devices"), std::string::npos) << why;
}

TEST(ExecutableCacheTest, AnotherOptionNamesTheOptions) {
  auto engine = MakeCacheEngine();
  Compile(*engine, Mlp(), 2);
  CompileOptions no_fusion;
  no_fusion.enable_fusion = false;
  const v1::CompileReport r = Compile(*engine, Mlp(), 2, no_fusion);
  EXPECT_EQ(r.miss_reason().find("graph"), std::string::npos) << r.miss_reason();
  EXPECT_EQ(r.miss_reason().find("input_shapes"), std::string::npos) << r.miss_reason();
  EXPECT_NE(r.miss_reason().find("options: \"device=auto;common_ir=0;fusion=1\" -> "
                                 "\"device=auto;common_ir=0;fusion=0\""),
            std::string::npos)
      << r.miss_reason();
}

TEST(ExecutableCacheTest, ExplainsAgainstTheNearestNotTheLatest) {
  auto engine = MakeCacheEngine();
  const v1::CompileReport relu2 = Compile(*engine, Mlp(), 2);
  const v1::CompileReport tanh4 = Compile(*engine, Mlp(/*use_tanh=*/true), 4);
  EXPECT_NE(tanh4.miss_reason().find("graph: "), std::string::npos) << tanh4.miss_reason();
  // relu at batch 4 differs from tanh4 in the graph alone, from relu2 in the
  // graph (specialized to other shapes) and the shapes.
  const v1::CompileReport relu4 = Compile(*engine, Mlp(), 4);
  EXPECT_EQ(
      relu4.miss_reason().rfind(
          "against cached executable " + tanh4.executable_key().substr(0, 12) + "..: graph: ", 0),
      0u)
      << relu4.miss_reason();
  EXPECT_EQ(relu4.miss_reason().find("input_shapes"), std::string::npos) << relu4.miss_reason();
  // tanh at batch 2 is nearest relu2 (the graph differs), not the latest
  // (relu4: graph and shapes differ).
  const v1::CompileReport tanh2 = Compile(*engine, Mlp(true), 2);
  EXPECT_EQ(
      tanh2.miss_reason().rfind(
          "against cached executable " + relu2.executable_key().substr(0, 12) + "..: graph: ", 0),
      0u)
      << tanh2.miss_reason();
  EXPECT_EQ(tanh2.miss_reason().find("input_shapes"), std::string::npos) << tanh2.miss_reason();
}

TEST(ExecutableCacheTest, AnEvictedKeySaysSo) {
  auto engine = MakeCacheEngine("", /*max_memory=*/1);
  Compile(*engine, Mlp(), 2);
  Compile(*engine, Mlp(), 3);  // evicts batch 2 (no disk level)
  const v1::CompileReport r = Compile(*engine, Mlp(), 2);
  EXPECT_EQ(r.executable_cache(), v1::CACHE_DISABLED);
  EXPECT_EQ(r.miss_reason(), "this executable was cached before and has been evicted");
}

TEST(ExecutableCacheTest, ADiscardedDiskEntrySaysWhy) {
  const fs::path dir =
      fs::temp_directory_path() / ("kiln_executable_cache_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::string key;
  {
    auto engine = MakeCacheEngine(dir.string());
    const v1::CompileReport r = Compile(*engine, Mlp(), 2);
    EXPECT_EQ(r.executable_cache(), v1::CACHE_MISS);
    key = r.executable_key();
  }
  int truncated = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().filename().string() != key) continue;
    fs::resize_file(e.path(), e.file_size() / 2);
    ++truncated;
  }
  ASSERT_EQ(truncated, 1);
  auto engine = MakeCacheEngine(dir.string());
  const v1::CompileReport r = Compile(*engine, Mlp(), 2);
  EXPECT_EQ(r.executable_cache(), v1::CACHE_CORRUPT);
  EXPECT_EQ(r.miss_reason().rfind("the disk entry was discarded: ", 0), 0u) << r.miss_reason();
  // Stored again: the next engine loads it, with nothing to explain.
  const v1::CompileReport again = Compile(*MakeCacheEngine(dir.string()), Mlp(), 2);
  EXPECT_EQ(again.executable_cache(), v1::CACHE_HIT_DISK);
  EXPECT_EQ(again.miss_reason(), "");
  fs::remove_all(dir);
}

// Where loading a program onto its device goes, in every report: the
// load.* sub-stages (Program::load_stages) after the stage that loaded it
// (lir when compiled, cache_load on a disk hit), one prepare stage per
// implementation family counting that family's kernels, the first of each
// family apart; none of them longer than the stage they are part of.
TEST(ExecutableCacheTest, ReportsTheLoadsParts) {
  const fs::path dir =
      fs::temp_directory_path() / ("kiln_executable_cache_load_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  for (const bool from_disk : {false, true}) {
    SCOPED_TRACE(from_disk ? "disk hit" : "compiled");
    auto engine = MakeCacheEngine(dir.string());
    const v1::CompileReport r = Compile(*engine, Mlp(), 2);
    EXPECT_EQ(r.executable_cache(), from_disk ? v1::CACHE_HIT_DISK : v1::CACHE_MISS);
    const std::string parent = from_disk ? "cache_load" : "lir";
    double parent_us = -1;
    int prepared = 0, firsts = 0;
    bool after_parent = false;
    for (const v1::StageTiming& st : r.stages()) {
      const std::string& name = st.stage();
      if (name == parent) {
        parent_us = st.micros();
        after_parent = true;
        continue;
      }
      if (name.rfind("load.", 0) != 0) continue;
      EXPECT_TRUE(after_parent) << name << " before " << parent;
      EXPECT_GE(st.micros(), 0) << name;
      EXPECT_LE(st.micros(), parent_us) << name;
      EXPECT_GE(st.nodes_after(), 1) << name;
      if (name.rfind("load.prepare.", 0) == 0) {
        if (name.size() > 6 && name.substr(name.size() - 6) == ".first") {
          ++firsts;
          EXPECT_EQ(st.nodes_after(), 1) << name;
        } else {
          prepared += st.nodes_after();
        }
      }
    }
    EXPECT_GE(parent_us, 0) << "no " << parent << " stage";
    EXPECT_EQ(prepared, r.kernels()) << "every kernel step prepared once";
    EXPECT_GE(firsts, 1);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln
