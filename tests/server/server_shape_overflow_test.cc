// Graphs whose shape arithmetic leaves int64 or the 32-bit conv geometry, sent
// to a real kilnd: a pad whose low + high overflowed crashed kilnd (SIGSEGV in
// ExportGraph) on Compile and on Run, and a conv with a huge stride reached
// oneDNN and came back INTERNAL. Each now gets INVALID_ARGUMENT naming the node,
// and kilnd keeps serving: good runs, conv at the geometry limits included,
// still succeed after every bad one.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "clients/cpp/graph_builder.h"
#include "tests/server/kilnd_process.h"
#include "tests/server/test_graphs.h"

namespace kiln {
namespace {

using testing::AddTensor;
using testing::Context;
using testing::KilndProcess;
using testing::TempDir;

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t k2e62 = int64_t{1} << 62;
constexpr int64_t kMaxSpatialAttr = (int64_t{1} << 30) - 1;

// x f32[2, 3] -> pad(x, low, high) named "p".
v1::Graph PadGraph(int64_t low, int64_t high) {
  GraphBuilder b("pad");
  auto x = b.input("x", v1::DTYPE_F32, {int64_t{2}, int64_t{3}});
  b.output("y", b.pad(x, {0, low}, {0, high}));
  b.named("p");
  return b.Build();
}

// x f32[1, 1, 8] (*) w f32[1, 1, 3] with `attrs`, named "c".
v1::Graph ConvGraph(const v1::ConvAttrs& attrs) {
  GraphBuilder b("conv");
  auto x = b.input("x", v1::DTYPE_F32, {int64_t{1}, int64_t{1}, int64_t{8}});
  auto w = b.input("w", v1::DTYPE_F32, {int64_t{1}, int64_t{1}, int64_t{3}});
  b.output("y", b.conv(x, w, std::nullopt, attrs));
  b.named("c");
  return b.Build();
}

v1::ConvAttrs Stride(int64_t s) {
  v1::ConvAttrs a;
  a.add_stride(s);
  return a;
}

class ServerShapeOverflow : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    kilnd_ = KilndProcess::Start({.cache_dir = cache_.path()}, &error);
    ASSERT_NE(kilnd_, nullptr) << error;
    stub_ = kilnd_->Stub();
  }

  grpc::Status Compile(const v1::Graph& g) {
    v1::CompileRequest req;
    *req.mutable_graph()->mutable_graph() = g;
    v1::CompileResponse resp;
    return stub_->Compile(Context().get(), req, &resp);
  }

  // Runs `g` with every input filled with ones; the outputs in `resp`.
  grpc::Status Run(const v1::Graph& g, v1::RunResponse* resp) {
    v1::RunRequest req;
    *req.mutable_graph()->mutable_graph() = g;
    for (const v1::Node& n : g.nodes()) {
      if (n.op() != v1::OP_INPUT) continue;
      Dims dims;
      int64_t count = 1;
      for (const v1::Dim& d : n.outputs(0).dims()) {
        dims.push_back(d.size());
        count *= d.size();
      }
      AddTensor(req.mutable_inputs(), n.name(), v1::DTYPE_F32, dims,
                std::vector<double>(count, 1.0));
    }
    return stub_->Run(Context().get(), req, resp);
  }

  void ExpectRejected(const v1::Graph& g, const std::vector<std::string>& needles) {
    for (const bool run : {false, true}) {
      v1::RunResponse resp;
      const grpc::Status s = run ? Run(g, &resp) : Compile(g);
      const std::string what = absl::StrCat(run ? "Run" : "Compile", " of graph ", g.name());
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << what << ": " << s.error_message() << "\nkilnd log:\n" << kilnd_->Log();
      for (const std::string& n : needles) {
        EXPECT_NE(s.error_message().find(n), std::string::npos)
            << what << ": \"" << n << "\" not in: " << s.error_message();
      }
      ExpectStillServing();
    }
  }

  void ExpectStillServing() {
    v1::RunResponse resp;
    const grpc::Status s = stub_->Run(Context().get(), testing::AffineRequest(), &resp);
    ASSERT_TRUE(s.ok()) << "kilnd stopped serving: " << s.error_message() << "\nkilnd log:\n"
                        << kilnd_->Log();
    ASSERT_EQ(resp.outputs_size(), 1);
  }

  TempDir cache_;
  std::unique_ptr<KilndProcess> kilnd_;
  std::unique_ptr<v1::Kiln::Stub> stub_;
};

TEST_F(ServerShapeOverflow, PadWhoseLowPlusHighOverflowsIsInvalidArgument) {
  ExpectRejected(PadGraph(k2e62, k2e62),
                 {"node 1 \"p\" (pad)", "low[1]=4611686018427387904 + high[1]=4611686018427387904",
                  "overflows int64"});
  // Wrapped to -2 before: a silently wrong shape.
  ExpectRejected(PadGraph(kMax, kMax), {"node 1 \"p\" (pad)", "overflows int64"});
  ExpectRejected(PadGraph(kMax - 1, 0), {"node 1 \"p\" (pad)", "dim 1 of size 3", "overflows int64"});
  // The text form goes through the same rule.
  v1::RunRequest req;
  req.mutable_graph()->set_text(
      absl::StrCat("input x: f32[2, 3]\nlet p = pad(x, low=[0, ", k2e62, "], high=[0, ", k2e62,
                   "])\nout p"));
  AddTensor(req.mutable_inputs(), "x", v1::DTYPE_F32, {2, 3}, {1, 2, 3, 4, 5, 6});
  v1::RunResponse resp;
  const grpc::Status s = stub_->Run(Context().get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("(pad)"), std::string::npos) << s.error_message();
  ExpectStillServing();

  // A pad in range runs and pads.
  ASSERT_TRUE(Run(PadGraph(1, 2), &resp).ok());
  ASSERT_EQ(resp.outputs_size(), 1);
  const HostTensor y = testing::FromProto(resp.outputs(0).tensor());
  EXPECT_EQ(y.dims(), (Dims{2, 6}));
}

TEST_F(ServerShapeOverflow, ConvWithHugeStrideDilationOrPaddingIsInvalidArgument) {
  ExpectRejected(ConvGraph(Stride(int64_t{1} << 31)),
                 {"node 2 \"c\" (conv)", "attribute stride[0]=2147483648 exceeds the limit 1073741823"});
  v1::ConvAttrs dilated;
  dilated.add_dilation(kMax);
  ExpectRejected(ConvGraph(dilated), {"node 2 \"c\" (conv)", "dilation[0]=", "exceeds the limit"});
  v1::ConvAttrs padded;
  padded.add_pad_low(kMaxSpatialAttr);
  padded.add_pad_high(kMaxSpatialAttr);
  padded.add_stride(kMaxSpatialAttr);
  ExpectRejected(ConvGraph(padded),
                 {"node 2 \"c\" (conv)", "padded by pad_low[0]=1073741823", "over the limit 2147483647"});

  // At the limits the conv runs through oneDNN: one output, the sum of 3 taps.
  v1::RunResponse resp;
  const grpc::Status s = Run(ConvGraph(Stride(kMaxSpatialAttr)), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message() << "\nkilnd log:\n" << kilnd_->Log();
  const HostTensor y = testing::FromProto(resp.outputs(0).tensor());
  ASSERT_EQ(y.dims(), (Dims{1, 1, 1}));
  EXPECT_EQ(y.data_as<float>()[0], 3.0f);
  v1::ConvAttrs edge;  // padded extent 8 + 1073741823 + 1073741816 = 2^31 - 1
  edge.add_pad_low(kMaxSpatialAttr);
  edge.add_pad_high(kMaxSpatialAttr - 7);
  edge.add_stride(kMaxSpatialAttr);
  ASSERT_TRUE(Run(ConvGraph(edge), &resp).ok()) << kilnd_->Log();
  EXPECT_EQ(testing::FromProto(resp.outputs(0).tensor()).dims(), (Dims{1, 1, 2}));
}

}  // namespace
}  // namespace kiln
