// kilnctl as a user runs it: a subprocess against a real kilnd, with .npy
// files in and out. The MLP (.kiln text, params from a directory) and the
// encoder layer (binary proto, params one by one) match tests/e2e/models.h;
// --report prints the table (with the placement: every device's estimate and
// the chosen one), --trace writes valid Chrome trace JSON; errors exit 1 with
// the server's message.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/io/npy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/clients/kilnd_child.h"
#include "tests/e2e/models.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;
using testing::ProcessResult;
using testing::ReadFileOrDie;
using testing::ScratchDir;
using testing::SharedKilnd;

ProcessResult Kilnctl(std::vector<std::string> args, std::vector<std::string> env = {}) {
  args.insert(args.begin(), KILNCTL_PATH);
  if (env.empty()) args.insert(args.begin() + 1, "--addr=" + SharedKilnd().addr());
  return testing::RunProcess(args, env);
}

std::string Example(const std::string& name) {
  return std::string(KILN_SOURCE_DIR) + "/examples/" + name;
}

void Write(const std::string& path, const HostTensor& t) {
  const absl::Status s = WriteNpy(path, t);
  ASSERT_TRUE(s.ok()) << s;
}

TEST(KilnctlTest, DevicesHealthAndCacheStats) {
  ProcessResult devices = Kilnctl({"devices"});
  ASSERT_EQ(devices.status, 0) << devices.err;
  EXPECT_THAT(devices.out, HasSubstr("cpu:0"));

  // The address from KILN_ADDR when --addr is not given.
  ProcessResult health = Kilnctl({"health"}, {"KILN_ADDR=" + SharedKilnd().addr()});
  ASSERT_EQ(health.status, 0) << health.err;
  EXPECT_EQ(health.out, "SERVING\n");

  ProcessResult stats = Kilnctl({"cache", "stats"});
  ASSERT_EQ(stats.status, 0) << stats.err;
  EXPECT_THAT(stats.out, HasSubstr("memory hits"));
  EXPECT_THAT(stats.out, HasSubstr("disk hits"));
}

TEST(KilnctlTest, RunMlpWithParamsDirReportAndTrace) {
  ScratchDir dir;
  models::Model m = models::Mlp();
  std::filesystem::create_directories(dir.path() + "/params");
  for (const auto& [name, t] : m.params) Write(dir.path() + "/params/" + name + ".npy", t);
  std::mt19937_64 rng(21);
  HostTensor x = models::RandomF32(rng, {2, 784}, 1.0);
  Write(dir.path() + "/x.npy", x);
  const std::string trace = dir.path() + "/trace.json";

  ProcessResult r =
      Kilnctl({"run", Example("mlp.kiln"), "--input", "x=" + dir.path() + "/x.npy", "--params-dir",
               dir.path() + "/params", "--out", dir.path() + "/out", "--report", "--trace", trace});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("logits: f32[2, 10] -> " + dir.path() + "/out/logits.npy"));
  auto logits = ReadNpy(dir.path() + "/out/logits.npy");
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_LE(models::WorstError(*logits, models::MlpReference(m, x), 1e-4, 1e-4), 1.0);

  // The table: its header, then one row per step on cpu:0.
  const std::vector<std::string> lines = absl::StrSplit(r.out, '\n');
  auto header = std::find_if(lines.begin(), lines.end(),
                             [](const std::string& l) { return l.rfind("kernel", 0) == 0; });
  ASSERT_NE(header, lines.end()) << r.out;
  for (const char* column :
       {"implementation", "path", "device", "nodes", "flops", "bytes", "start us", "duration us"}) {
    EXPECT_THAT(*header, HasSubstr(column));
  }
  int rows = 0;
  for (auto it = header + 1; it != lines.end() && !it->empty(); ++it) {
    EXPECT_THAT(*it, HasSubstr("cpu:0"));
    ++rows;
  }
  EXPECT_GE(rows, 3);  // three matmuls at least

  // The trace: valid JSON, one complete event per step plus the request.
  const nlohmann::json doc = nlohmann::json::parse(ReadFileOrDie(trace));
  int complete = 0;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") == "X") {
      ++complete;
      EXPECT_GE(e.at("dur").get<double>(), 0);
      EXPECT_TRUE(e.at("ts").is_number());
    }
  }
  EXPECT_EQ(complete, rows + 1);
}

TEST(KilnctlTest, RunEncoderLayerFromBinaryProtoWithParamFlags) {
  ScratchDir dir;
  const models::EncoderConfig config;
  models::Model m = models::EncoderLayer(config);
  const std::string graph = dir.path() + "/encoder.pb";
  {
    std::ofstream f(graph, std::ios::binary);
    f << m.graph.SerializeAsString();
  }
  std::vector<std::string> args = {"run", graph, "-o", dir.path(), "--device", "cpu:0"};
  for (const auto& [name, t] : m.params) {
    const std::string path = dir.path() + "/" + name + ".npy";
    Write(path, t);
    args.push_back("--param");
    args.push_back(name + "=" + path);
  }
  std::mt19937_64 rng(22);
  HostTensor x = models::RandomF32(rng, {1, config.seq, config.hidden}, 1.0);
  Write(dir.path() + "/x.npy", x);
  args.push_back("--input");
  args.push_back("x=" + dir.path() + "/x.npy");
  ProcessResult r = Kilnctl(args);
  ASSERT_EQ(r.status, 0) << r.err;
  auto y = ReadNpy(dir.path() + "/y.npy");
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_LE(models::WorstError(*y, models::EncoderLayerReference(m, config, x), 2e-4, 2e-4), 1.0);
}

TEST(KilnctlTest, OneShotCompileAndReports) {
  ScratchDir dir;
  const std::string graph = dir.path() + "/affine.kiln";
  {
    std::ofstream f(graph);
    f << "graph \"affine\"\ninput x: f32[n]\nlet y = x * 2.0 + 1.0\nout y\n";
  }
  Write(dir.path() + "/x.npy", HostTensor::FromVector<float>(v1::DTYPE_F32, {3}, {1, 2, 3}));
  // No params: one Run with the graph inline; no --out: a preview.
  ProcessResult r = Kilnctl({"run", graph, "--input", "x=" + dir.path() + "/x.npy"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "y: f32[3] [3, 5, 7]\n");

  ProcessResult verify = Kilnctl({"compile", Example("mlp.kiln")});
  ASSERT_EQ(verify.status, 0) << verify.err;
  EXPECT_THAT(verify.out, HasSubstr("input  x: f32[batch, 784]"));
  EXPECT_THAT(verify.out, HasSubstr("verified"));
  ProcessResult compile = Kilnctl({"compile", Example("mlp.kiln"), "--shape", "x=2,784"});
  ASSERT_EQ(compile.status, 0) << compile.err;
  EXPECT_THAT(compile.out, HasSubstr("executable "));
  EXPECT_THAT(compile.out, HasSubstr("CACHE_"));

  Kilnctl({"run", graph, "--input", "x=" + dir.path() + "/x.npy", "--report"});
  const std::string trace = dir.path() + "/reports.json";
  ProcessResult report = Kilnctl({"report", "--last", "2", "--trace", trace});
  ASSERT_EQ(report.status, 0) << report.err;
  EXPECT_THAT(report.out, HasSubstr("request "));
  const nlohmann::json doc = nlohmann::json::parse(ReadFileOrDie(trace));
  std::set<int> pids;
  for (const auto& e : doc.at("traceEvents")) pids.insert(e.at("pid").get<int>());
  EXPECT_EQ(pids.size(), 2u);
}

// --cuda-graphs reaches kilnd's compile options: each mode is its own
// executable (the key differs from auto's), the run's results are the same
// on a host whose devices do not capture, and a bad mode is refused by
// kilnctl before any call.
TEST(KilnctlTest, CudaGraphsOption) {
  ScratchDir dir;
  const std::string graph = dir.path() + "/affine.kiln";
  {
    std::ofstream f(graph);
    f << "graph \"affine\"\ninput x: f32[n]\nlet y = x * 2.0 + 1.0\nout y\n";
  }
  Write(dir.path() + "/x.npy", HostTensor::FromVector<float>(v1::DTYPE_F32, {3}, {1, 2, 3}));
  std::set<std::string> keys;
  for (const char* mode : {"auto", "on", "OFF"}) {
    SCOPED_TRACE(mode);
    ProcessResult run = Kilnctl(
        {"run", graph, "--input", "x=" + dir.path() + "/x.npy", "--cuda-graphs", mode});
    ASSERT_EQ(run.status, 0) << run.err;
    EXPECT_EQ(run.out, "y: f32[3] [3, 5, 7]\n");
    ProcessResult compile = Kilnctl({"compile", graph, "--shape", "x=3", "--cuda-graphs", mode});
    ASSERT_EQ(compile.status, 0) << compile.err;
    const size_t at = compile.out.find("executable ");
    ASSERT_NE(at, std::string::npos) << compile.out;
    keys.insert(compile.out.substr(at, compile.out.find('\n', at) - at));
  }
  EXPECT_EQ(keys.size(), 3u);
  ProcessResult bad = Kilnctl({"compile", graph, "--shape", "x=3", "--cuda-graphs", "always"});
  EXPECT_NE(bad.status, 0);
  EXPECT_THAT(bad.err + bad.out, HasSubstr("--cuda-graphs"));
}

// The device ids of `kilnctl devices` (the first column below its header).
std::vector<std::string> DeviceIds() {
  ProcessResult devices = Kilnctl({"devices"});
  EXPECT_EQ(devices.status, 0) << devices.err;
  std::vector<std::string> ids;
  const std::vector<std::string> lines = absl::StrSplit(devices.out, '\n', absl::SkipEmpty());
  // The table's rows; after it come notes ("unavailable: cuda: no driver",
  // "<id>: last fault: ..."), which name no device row.
  for (size_t i = 1; i < lines.size(); ++i) {
    if (lines[i].rfind("unavailable: ", 0) == 0 || lines[i].find(": last fault: ") != std::string::npos) continue;
    ids.push_back(std::string(lines[i].substr(0, lines[i].find(' '))));
  }
  return ids;
}

// The placement section of a report table: its device rows (below the column
// header) and its `chosen:` line. Fails the test when the section is missing.
struct PlacementSection {
  std::string policy_line;
  std::vector<std::string> rows;
  std::string chosen_line;
};
PlacementSection ParsePlacement(const std::string& out) {
  PlacementSection p;
  const std::vector<std::string> lines = absl::StrSplit(out, '\n');
  auto it = std::find_if(lines.begin(), lines.end(), [](const std::string& l) {
    return l.rfind("placement (policy ", 0) == 0;
  });
  EXPECT_NE(it, lines.end()) << out;
  if (it == lines.end()) return p;
  p.policy_line = *it++;
  EXPECT_TRUE(it != lines.end() && it->rfind("   device", 0) == 0) << out;
  for (++it; it != lines.end() && !it->empty(); ++it) {
    if (it->rfind("chosen: ", 0) == 0) {
      p.chosen_line = *it;
      break;
    }
    p.rows.push_back(*it);
  }
  EXPECT_FALSE(p.chosen_line.empty()) << out;
  return p;
}

// Each device once, exactly one marked chosen, and the `chosen:` line naming
// it; the chosen device's id.
std::string ExpectEveryDeviceOnceOneChosen(const PlacementSection& p,
                                           const std::vector<std::string>& devices) {
  EXPECT_EQ(p.rows.size(), devices.size()) << absl::StrJoin(p.rows, "\n");
  std::string chosen;
  for (const std::string& id : devices) {
    int found = 0;
    for (const std::string& row : p.rows) {
      const std::vector<std::string> cells = absl::StrSplit(row, ' ', absl::SkipEmpty());
      const bool marked = row[0] == '*';
      if (cells.size() < 3 || cells[marked ? 1 : 0] != id) continue;
      ++found;
      EXPECT_THAT(row, ::testing::ContainsRegex("  (yes|no)( |$)")) << row;
      if (marked) {
        EXPECT_TRUE(chosen.empty()) << "two devices marked chosen";
        chosen = id;
      }
    }
    EXPECT_EQ(found, 1) << id << " in\n" << absl::StrJoin(p.rows, "\n");
  }
  EXPECT_FALSE(chosen.empty()) << "no device marked chosen";
  EXPECT_EQ(p.chosen_line.rfind("chosen: " + chosen + " - ", 0), 0u) << p.chosen_line;
  return chosen;
}

TEST(KilnctlTest, ReportShowsPlacementEstimatesAndTheChoice) {
  ScratchDir dir;
  const std::vector<std::string> devices = DeviceIds();
  ASSERT_FALSE(devices.empty());
  const std::string graph = dir.path() + "/scale.kiln";
  {
    std::ofstream f(graph);
    f << "graph \"scale\"\ninput x: f32[n]\nlet y = x * 3.0 - 1.0\nout y\n";
  }
  Write(dir.path() + "/x.npy", HostTensor::FromVector<float>(v1::DTYPE_F32, {2}, {1, 2}));
  const std::string trace = dir.path() + "/trace.json";

  // auto: the server estimates every device and picks one.
  ProcessResult run = Kilnctl(
      {"run", graph, "--input", "x=" + dir.path() + "/x.npy", "--report", "--trace", trace});
  ASSERT_EQ(run.status, 0) << run.err;
  const PlacementSection placed = ParsePlacement(run.out);
  EXPECT_EQ(placed.policy_line, "placement (policy auto)");
  const std::string chosen = ExpectEveryDeviceOnceOneChosen(placed, devices);
  EXPECT_THAT(run.out, HasSubstr("placed on " + chosen));
  if (devices.size() == 1) {
    EXPECT_THAT(placed.chosen_line, HasSubstr("the only device"));
  }

  // The trace's request event carries the same estimates.
  const nlohmann::json doc = nlohmann::json::parse(ReadFileOrDie(trace));
  int requests = 0;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("name") != "run") continue;
    ++requests;
    const nlohmann::json& p = e.at("args").at("placement");
    EXPECT_EQ(p.at("chosen"), chosen);
    ASSERT_EQ(p.at("estimates").size(), devices.size());
    for (size_t i = 0; i < devices.size(); ++i) {
      EXPECT_EQ(p.at("estimates")[i].at("device"), devices[i]);
      EXPECT_GE(p.at("estimates")[i].at("estimate_micros").get<double>(), 0);
    }
  }
  EXPECT_EQ(requests, 1);

  // Pinned: the policy and the reason say so, and `kilnctl report` shows the
  // same section from the report kilnd kept.
  ProcessResult pinned = Kilnctl(
      {"run", graph, "--input", "x=" + dir.path() + "/x.npy", "--report", "--device", "cpu:0"});
  ASSERT_EQ(pinned.status, 0) << pinned.err;
  ProcessResult kept = Kilnctl({"report", "--last", "1"});
  ASSERT_EQ(kept.status, 0) << kept.err;
  for (const ProcessResult* r : {&pinned, &kept}) {
    const PlacementSection p = ParsePlacement(r->out);
    EXPECT_EQ(p.policy_line, "placement (policy cpu:0)");
    EXPECT_EQ(ExpectEveryDeviceOnceOneChosen(p, devices), "cpu:0");
    EXPECT_THAT(p.chosen_line, HasSubstr("pinned"));
  }
}

// An ONNX model exported by PyTorch (tests/engine/io/export_torch_models.py
// --models while_scan): a scripted while loop appending to a list, whose
// stacked output's length is known only at run time. kilnctl imports it,
// kilnd runs the While, and kilnctl writes y and ys cut to the rows the loop
// wrote (the length output stays internal): equal to PyTorch's.
TEST(KilnctlTest, RunsAnOnnxWhileLoopStackingAList) {
  ScratchDir dir;
  const std::string cmd =
      absl::StrCat("/usr/bin/python3 ", KILN_SOURCE_DIR, "/tests/engine/io/export_torch_models.py --out ",
                   dir.path(), " --models while_scan > ", dir.path(), "/export.log 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << ReadFileOrDie(dir.path() + "/export.log");
  for (const std::string c : {"few", "many"}) {
    SCOPED_TRACE(c);
    const std::string prefix = dir.path() + "/while_scan." + c;
    ProcessResult r = Kilnctl({"run", dir.path() + "/while_scan.onnx", "--input",
                               "x=" + prefix + ".x.npy", "--out", dir.path() + "/out_" + c});
    ASSERT_EQ(r.status, 0) << r.err;
    const int64_t rows = c == "few" ? 11 : 22;
    EXPECT_THAT(r.out, HasSubstr("ys: f32[" + std::to_string(rows) + ", 2, 3]"));
    EXPECT_THAT(r.out, ::testing::Not(HasSubstr("kiln.length")));
    for (const char* name : {"y", "ys"}) {
      auto got = ReadNpy(dir.path() + "/out_" + c + "/" + name + ".npy");
      auto want = ReadNpy(prefix + "." + name + ".npy");
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_TRUE(want.ok()) << want.status();
      ASSERT_EQ(got->dims(), want->dims()) << name;
      EXPECT_LE(models::WorstError(*got, *want, 1e-4, 1e-4), 1.0) << name;
    }
  }
}

TEST(KilnctlTest, ErrorsExitOneWithTheMessage) {
  ScratchDir dir;
  ProcessResult missing = Kilnctl({"run", Example("mlp.kiln"), "--input", "x=/nonexistent.npy"});
  EXPECT_EQ(missing.status, 1);
  EXPECT_THAT(missing.err, HasSubstr("kilnctl: NOT_FOUND: cannot open /nonexistent.npy"));

  const std::string bad = dir.path() + "/bad.kiln";
  {
    std::ofstream f(bad);
    f << "graph \"bad\"\ninput x: f32[4]\nlet y = frobnicate(x)\nout y\n";
  }
  Write(dir.path() + "/x.npy", HostTensor::FromVector<float>(v1::DTYPE_F32, {4}, {1, 2, 3, 4}));
  ProcessResult server_error = Kilnctl({"run", bad, "--input", "x=" + dir.path() + "/x.npy"});
  EXPECT_EQ(server_error.status, 1);
  EXPECT_THAT(server_error.err, HasSubstr("kilnctl: INVALID_ARGUMENT: "));
  EXPECT_THAT(server_error.err, HasSubstr("frobnicate"));

  models::Model m = models::Mlp();
  Write(dir.path() + "/bogus.npy", m.params.at("b1"));
  ProcessResult unknown_param =
      Kilnctl({"run", Example("mlp.kiln"), "--input", "x=" + dir.path() + "/x.npy", "--param",
               "bogus=" + dir.path() + "/bogus.npy"});
  EXPECT_EQ(unknown_param.status, 1);
  EXPECT_THAT(unknown_param.err, HasSubstr("the graph has no param 'bogus' (its params: "));

  ProcessResult usage = Kilnctl({"run"});
  EXPECT_EQ(usage.status, 2);
  ProcessResult nowhere =
      testing::RunProcess({KILNCTL_PATH, "--addr=127.0.0.1:1", "--timeout=5", "devices"});
  EXPECT_EQ(nowhere.status, 1);
  EXPECT_THAT(nowhere.err, HasSubstr("UNAVAILABLE"));
}

}  // namespace
}  // namespace kiln
