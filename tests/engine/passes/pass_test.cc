// Pass tests: IR text in, checked IR text out (DESIGN.md section 10).
//
// Every tests/engine/passes/testdata/*.kiln holds cases separated by a line
// `# -----`. A case is
//
//   # RUN: <pass> [<pass> ...] [--devices=cpu[,vulkan...]] [--placement=<id>]
//          [--prefer-common-ir] [--no-fusion]
//   <input graph in the .kiln text form>
//   # CHECK:
//   <the graph printed after the passes ran, with annotations>
//
// Passes come from kiln::passes::CreatePass and run in order on one
// PassContext whose devices are those of every registered backend (or the
// backends --devices names). `# RUN: none` runs nothing: the case checks that
// parse + print is the identity. Trailing whitespace and leading/trailing
// blank lines are ignored; a mismatch prints a unified diff and the whole
// actual output to paste. A case whose pass CreatePass does not know is
// skipped, saying so. Parse errors give line:col in the .kiln file itself.
#include "engine/passes/pass.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "backends/backend.h"
#include "engine/ir/text.h"
#include "gtest/gtest.h"

namespace kiln::passes {
namespace {

namespace fs = std::filesystem;

struct PassCase {
  std::string file;  // file name, for messages and test names
  int line = 0;      // 1-based line of the RUN line
  std::vector<std::string> passes;
  std::vector<std::string> backends;  // --devices; empty = every backend
  std::string placement = "auto";
  bool prefer_common_ir = false;
  bool enable_fusion = true;
  std::string input;  // padded with newlines: parse errors give file lines
  std::string expected;
  std::string error;  // a malformed case: why
};

// How gtest names a case in failure messages.
void PrintTo(const PassCase& c, std::ostream* os) { *os << c.file << ":" << c.line; }

// Lines without trailing whitespace, without leading and trailing blank lines.
std::vector<std::string> NormalizedLines(const std::string& text) {
  std::vector<std::string> lines;
  for (absl::string_view l : absl::StrSplit(text, '\n')) {
    lines.emplace_back(absl::StripTrailingAsciiWhitespace(l));
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  auto first = std::find_if(lines.begin(), lines.end(), [](const auto& l) { return !l.empty(); });
  lines.erase(lines.begin(), first);
  return lines;
}

// A unified diff (3 lines of context) from `want` to `got`; empty when equal.
std::string UnifiedDiff(const std::vector<std::string>& want, const std::vector<std::string>& got) {
  const size_t n = want.size(), m = got.size();
  // lcs[i][j]: longest common subsequence of want[i..] and got[j..].
  std::vector<std::vector<int>> lcs(n + 1, std::vector<int>(m + 1, 0));
  for (size_t i = n; i-- > 0;) {
    for (size_t j = m; j-- > 0;) {
      lcs[i][j] =
          want[i] == got[j] ? lcs[i + 1][j + 1] + 1 : std::max(lcs[i + 1][j], lcs[i][j + 1]);
    }
  }
  struct Edit {
    char op;      // ' ', '-', '+'
    size_t a, b;  // positions in want, got before this edit
    std::string text;
  };
  std::vector<Edit> edits;
  size_t i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && want[i] == got[j]) {
      edits.push_back({' ', i, j, want[i]});
      ++i, ++j;
    } else if (i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1])) {
      edits.push_back({'-', i, j, want[i]});  // deletions first, as diff -u does
      ++i;
    } else {
      edits.push_back({'+', i, j, got[j]});
      ++j;
    }
  }
  // Hunks: changes closer than 2 * kContext share one, with kContext lines
  // of context around.
  constexpr size_t kContext = 3;
  std::vector<size_t> changes;
  for (size_t t = 0; t < edits.size(); ++t) {
    if (edits[t].op != ' ') changes.push_back(t);
  }
  std::string out;
  for (size_t c = 0; c < changes.size();) {
    size_t last = c;
    while (last + 1 < changes.size() && changes[last + 1] - changes[last] <= 2 * kContext) ++last;
    const size_t begin = changes[c] >= kContext ? changes[c] - kContext : 0;
    const size_t end = std::min(edits.size(), changes[last] + kContext + 1);
    size_t a_len = 0, b_len = 0;
    for (size_t t = begin; t < end; ++t) {
      a_len += edits[t].op != '+';
      b_len += edits[t].op != '-';
    }
    // As diff -u: an empty side starts at the line before it.
    absl::StrAppend(&out, "@@ -", edits[begin].a + (a_len > 0), ",", a_len, " +",
                    edits[begin].b + (b_len > 0), ",", b_len, " @@\n");
    for (size_t t = begin; t < end; ++t) {
      absl::StrAppend(&out, std::string(1, edits[t].op), edits[t].text, "\n");
    }
    c = last + 1;
  }
  return out;
}

// Splits one testdata file into cases.
std::vector<PassCase> SplitCases(const std::string& file, const std::string& text) {
  std::vector<PassCase> cases;
  const std::vector<std::string> lines = absl::StrSplit(text, '\n');
  size_t i = 0;
  while (i < lines.size()) {
    // One case: lines [i, end).
    size_t end = i;
    while (end < lines.size() && absl::StripAsciiWhitespace(lines[end]) != "# -----") {
      ++end;
    }
    // Blank and comment lines may precede the RUN line.
    size_t run = i;
    while (run < end) {
      absl::string_view l = absl::StripAsciiWhitespace(lines[run]);
      if (absl::StartsWith(l, "# RUN:") || (!l.empty() && l[0] != '#')) break;
      ++run;
    }
    if (run < end) {
      PassCase c;
      c.file = file;
      c.line = static_cast<int>(run) + 1;
      absl::string_view head = absl::StripAsciiWhitespace(lines[run]);
      if (!absl::ConsumePrefix(&head, "# RUN:")) {
        c.error = absl::StrCat("a case must start with `# RUN: <passes>`, got `", head, "`");
      } else {
        for (absl::string_view word : absl::StrSplit(head, ' ', absl::SkipWhitespace())) {
          if (absl::ConsumePrefix(&word, "--devices=")) {
            c.backends = absl::StrSplit(word, ',', absl::SkipEmpty());
          } else if (absl::ConsumePrefix(&word, "--placement=")) {
            c.placement = std::string(word);
          } else if (word == "--prefer-common-ir") {
            c.prefer_common_ir = true;
          } else if (word == "--no-fusion") {
            c.enable_fusion = false;
          } else if (absl::StartsWith(word, "--")) {
            c.error = absl::StrCat("unknown RUN option `", word, "`");
          } else if (word != "none") {
            c.passes.emplace_back(word);
          }
        }
      }
      size_t check = run + 1;
      while (check < end && absl::StripAsciiWhitespace(lines[check]) != "# CHECK:") ++check;
      if (check == end && c.error.empty()) c.error = "the case has no `# CHECK:` line";
      // Newlines in front keep the parser's line numbers equal to the file's.
      c.input = std::string(run + 1, '\n');
      for (size_t k = run + 1; k < check; ++k) absl::StrAppend(&c.input, lines[k], "\n");
      for (size_t k = check + 1; k < end; ++k) absl::StrAppend(&c.expected, lines[k], "\n");
      cases.push_back(std::move(c));
    }
    i = end + 1;
  }
  return cases;
}

fs::path TestdataDir() {
  const char* src = std::getenv("KILN_SOURCE_DIR");
  return fs::path(src != nullptr ? src : ".") / "tests" / "engine" / "passes" / "testdata";
}

std::vector<PassCase> LoadCases() {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(TestdataDir(), ec)) {
    if (entry.path().extension() == ".kiln") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  std::vector<PassCase> all;
  for (const fs::path& path : files) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    for (PassCase& c : SplitCases(path.filename().string(), ss.str())) all.push_back(std::move(c));
  }
  return all;
}

// Every registered backend, created once for the whole binary (backends are
// costly to start and their devices must outlive every PassContext).
struct Backends {
  std::vector<std::unique_ptr<backend::Backend>> owned;
};

const Backends& AllBackends() {
  static const Backends* backends = [] {
    auto* b = new Backends();
    backend::BackendOptions options;
    options.cpu_threads = 1;  // passes only ask devices questions
    for (const backend::RegisteredBackend& r : backend::RegisteredBackends()) {
      auto created = r.factory(options);
      if (created.ok()) b->owned.push_back(std::move(created).value());
    }
    return b;
  }();
  return *backends;
}

std::vector<backend::Device*> DevicesFor(const PassCase& c) {
  std::vector<backend::Device*> devices;
  for (const auto& b : AllBackends().owned) {
    if (!c.backends.empty() &&
        std::find(c.backends.begin(), c.backends.end(), b->name()) == c.backends.end()) {
      continue;
    }
    for (backend::Device* d : b->devices()) devices.push_back(d);
  }
  return devices;
}

std::string CaseName(const testing::TestParamInfo<PassCase>& info) {
  std::string name = absl::StrCat(info.param.file, "_line", info.param.line);
  for (char& ch : name) {
    if (!absl::ascii_isalnum(ch)) ch = '_';
  }
  return name;
}

class PassFileTest : public testing::TestWithParam<PassCase> {};

TEST_P(PassFileTest, OutputMatchesCheck) {
  const PassCase& c = GetParam();
  const std::string where = absl::StrCat(c.file, ":", c.line);
  ASSERT_TRUE(c.error.empty()) << where << ": " << c.error;

  std::vector<std::unique_ptr<Pass>> passes;
  for (const std::string& name : c.passes) {
    auto pass = CreatePass(name);
    if (!pass.ok()) {
      GTEST_SKIP() << where << ": pass \"" << name << "\" is not available yet (" << pass.status()
                   << "); the case is skipped";
    }
    passes.push_back(std::move(pass).value());
  }

  ir::ParseOptions parse;
  parse.allow_internal_ops = true;  // inputs may hold what earlier passes made
  auto graph = ir::ParseGraph(c.input, parse);
  ASSERT_TRUE(graph.ok()) << c.file << ":" << graph.status().message();

  PassContext context;
  context.devices = DevicesFor(c);
  context.placement = c.placement;
  context.prefer_common_ir = c.prefer_common_ir;
  context.enable_fusion = c.enable_fusion;
  ASSERT_FALSE(context.devices.empty())
      << where << ": no devices for --devices=" << absl::StrJoin(c.backends, ",");
  for (const auto& pass : passes) {
    absl::Status s = pass->Run(**graph, context);
    ASSERT_TRUE(s.ok()) << where << ": pass " << pass->name() << " failed: " << s;
  }

  ir::PrintOptions print;
  print.annotations = true;
  const std::string actual = ir::PrintGraph(**graph, print);
  const std::string diff = UnifiedDiff(NormalizedLines(c.expected), NormalizedLines(actual));
  EXPECT_TRUE(diff.empty()) << where
                            << ": output differs from the CHECK block\n--- expected\n+++ actual\n"
                            << diff << "\nactual output:\n"
                            << actual;
}

INSTANTIATE_TEST_SUITE_P(Testdata, PassFileTest, testing::ValuesIn(LoadCases()), CaseName);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(PassFileTest);

// ---- the harness itself ----

TEST(PassHarnessTest, FindsTheTestdata) {
  const auto cases = LoadCases();
  EXPECT_TRUE(std::any_of(cases.begin(), cases.end(),
                          [](const PassCase& c) { return c.file == "identity.kiln"; }))
      << "no identity.kiln under " << TestdataDir() << " (is KILN_SOURCE_DIR set?)";
}

TEST(PassHarnessTest, SplitsCasesAndReadsRunLines) {
  const auto cases = SplitCases("t.kiln", R"(
# RUN: cse dce --devices=cpu --placement=cpu:0 --no-fusion
input x: f32[2]
out x
# CHECK:
input x: f32[2]   
out x

# -----
# RUN: none
input y: f32[3]
out y
# CHECK:
input y: f32[3]
out y
# -----
# RUN: fuse
input z: f32[3]
)");
  ASSERT_EQ(cases.size(), 3u);
  EXPECT_EQ(cases[0].line, 2);
  EXPECT_EQ(cases[0].passes, (std::vector<std::string>{"cse", "dce"}));
  EXPECT_EQ(cases[0].backends, (std::vector<std::string>{"cpu"}));
  EXPECT_EQ(cases[0].placement, "cpu:0");
  EXPECT_FALSE(cases[0].enable_fusion);
  EXPECT_EQ(NormalizedLines(cases[0].expected),
            (std::vector<std::string>{"input x: f32[2]", "out x"}));
  // The input keeps its file line numbers: `input x` is line 3.
  EXPECT_TRUE(absl::StartsWith(cases[0].input, "\n\ninput x")) << cases[0].input;
  EXPECT_TRUE(cases[1].passes.empty());
  EXPECT_EQ(cases[1].line, 10);
  EXPECT_EQ(cases[2].error, "the case has no `# CHECK:` line");
  EXPECT_EQ(SplitCases("t.kiln", "input x: f32[2]\n")[0].error.substr(0, 30),
            "a case must start with `# RUN:");
  // Comments may precede a RUN line; a part with only comments is no case.
  EXPECT_EQ(SplitCases("t.kiln", "# about\n\n# RUN: dce\nout x\n# CHECK:\n")[0].line, 3);
  EXPECT_TRUE(SplitCases("t.kiln", "# just notes\n# -----\n").empty());
}

TEST(PassHarnessTest, UnifiedDiffShowsChangedLinesWithContext) {
  EXPECT_EQ(UnifiedDiff({"a", "b"}, {"a", "b"}), "");
  EXPECT_EQ(UnifiedDiff({}, {"new"}), "@@ -0,0 +1,1 @@\n+new\n");
  std::vector<std::string> want;
  for (int i = 1; i <= 14; ++i) want.push_back(absl::StrCat(i));
  std::vector<std::string> got = want;
  got[4] = "five";
  got.push_back("15");
  EXPECT_EQ(UnifiedDiff(want, got),
            "@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n"
            "@@ -12,3 +12,4 @@\n 12\n 13\n 14\n+15\n");
  // Changes closer than twice the context share a hunk.
  EXPECT_EQ(UnifiedDiff({"a", "b", "c"}, {"x", "b", "y"}), "@@ -1,3 +1,3 @@\n-a\n+x\n b\n-c\n+y\n");
}

}  // namespace
}  // namespace kiln::passes
