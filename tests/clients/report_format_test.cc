// The placement section of FormatReportTable and the placement in the Chrome
// trace, from hand-built reports (text in, checked text out): a device that
// cannot run the graph, a pinned choice, and a report with no estimates.
// kilnctl_test.cc checks the same section against a real kilnd.
#include "clients/cpp/report_format.h"

#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kiln {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::DispatchReport ReportFromText(const std::string& text) {
  v1::DispatchReport r;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &r)) << text;
  return r;
}

// The lines from "placement" up to the blank line after it.
std::string PlacementSection(const std::string& table) {
  const size_t begin = table.find("placement ");
  if (begin == std::string::npos) return "";
  const size_t end = table.find("\n\n", begin);
  return table.substr(begin, end == std::string::npos ? std::string::npos : end + 1 - begin);
}

TEST(ReportFormatTest, PlacementRowsChosenMarkerAndRunnerUp) {
  const v1::DispatchReport r = ReportFromText(R"pb(
    request_id: "r-1"
    placement {
      policy: "auto"
      estimates { device: "cpu:0" estimate_micros: 41.25 feasible: true reason: "dominated by h1" }
      estimates {
        device: "vulkan:0"
        estimate_micros: 1200
        feasible: true
        reason: "dominated by copy"
      }
      estimates { device: "cuda:0" feasible: false reason: "f64 matmul unsupported" }
      chosen: "cpu:0"
      why: "lowest estimate: 41 us"
    }
  )pb");
  EXPECT_EQ(PlacementSection(FormatReportTable(r)),
            "placement (policy auto)\n"
            "   device    estimate us  feasible  reason\n"
            "*  cpu:0            41.2  yes       dominated by h1\n"
            "   vulkan:0       1200.0  yes       dominated by copy\n"
            "   cuda:0              -  no        f64 matmul unsupported\n"
            "chosen: cpu:0 - lowest estimate: 41 us (41.2 us vs 1200.0 us on vulkan:0)\n");
}

TEST(ReportFormatTest, PinnedDeviceComparedWithTheBestOther) {
  const v1::DispatchReport r = ReportFromText(R"pb(
    placement {
      policy: "vulkan:0"
      estimates { device: "cpu:0" estimate_micros: 41 feasible: true }
      estimates { device: "vulkan:0" estimate_micros: 1200 feasible: true }
      chosen: "vulkan:0"
      why: "pinned by the request"
    }
  )pb");
  EXPECT_EQ(PlacementSection(FormatReportTable(r)),
            "placement (policy vulkan:0)\n"
            "   device    estimate us  feasible  reason\n"
            "   cpu:0            41.0  yes\n"
            "*  vulkan:0       1200.0  yes\n"
            "chosen: vulkan:0 - pinned by the request (1200.0 us vs 41.0 us on cpu:0)\n");
}

TEST(ReportFormatTest, OnlyDeviceHasNoComparison) {
  const v1::DispatchReport r = ReportFromText(R"pb(
    placement {
      policy: "auto"
      estimates { device: "cpu:0" estimate_micros: 7.5 feasible: true }
      chosen: "cpu:0"
      why: "the only device"
    }
  )pb");
  EXPECT_EQ(PlacementSection(FormatReportTable(r)),
            "placement (policy auto)\n"
            "   device  estimate us  feasible  reason\n"
            "*  cpu:0           7.5  yes\n"
            "chosen: cpu:0 - the only device\n");
}

TEST(ReportFormatTest, NoPlacementNoSection) {
  const std::string table = FormatReportTable(ReportFromText(R"pb(request_id: "r-2")pb"));
  EXPECT_THAT(table, Not(HasSubstr("placement")));
  EXPECT_THAT(table, Not(HasSubstr("chosen:")));
}

TEST(ReportFormatTest, TraceRequestEventCarriesThePlacement) {
  const v1::DispatchReport r = ReportFromText(R"pb(
    placement {
      policy: "auto"
      estimates { device: "cpu:0" estimate_micros: 41 feasible: true reason: "dominated by h1" }
      estimates { device: "cuda:0" feasible: false reason: "no driver" }
      chosen: "cpu:0"
      why: "lowest estimate: 41 us"
    }
  )pb");
  const nlohmann::json doc = nlohmann::json::parse(ReportsToChromeTrace({&r, 1}));
  const nlohmann::json* run = nullptr;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("name") == "run") run = &e;
  }
  ASSERT_NE(run, nullptr) << doc.dump(1);
  const nlohmann::json& p = run->at("args").at("placement");
  EXPECT_EQ(p.at("policy"), "auto");
  EXPECT_EQ(p.at("chosen"), "cpu:0");
  EXPECT_EQ(p.at("why"), "lowest estimate: 41 us");
  ASSERT_EQ(p.at("estimates").size(), 2u);
  EXPECT_EQ(p.at("estimates")[0].at("device"), "cpu:0");
  EXPECT_EQ(p.at("estimates")[0].at("estimate_micros"), 41.0);
  EXPECT_EQ(p.at("estimates")[0].at("feasible"), true);
  EXPECT_EQ(p.at("estimates")[1].at("device"), "cuda:0");
  EXPECT_EQ(p.at("estimates")[1].at("feasible"), false);
  EXPECT_EQ(p.at("estimates")[1].at("reason"), "no driver");
}

}  // namespace
}  // namespace kiln
