// RunOptions::output_destinations (engine/engine.h): outputs written into
// memory the caller owns (kilnd: a client's shared-memory region), directly
// by the kernels when aligned, copied once otherwise; sizes and names checked.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "clients/cpp/graph_builder.h"
#include "engine/engine.h"

namespace kiln {
namespace {

// y = x * 2 and z = x + 1, x f32[4, 8].
v1::Graph TwoOutputs() {
  GraphBuilder g("two");
  auto x = g.input("x", v1::DTYPE_F32, {int64_t{4}, int64_t{8}});
  g.output("y", g.mul(x, g.scalar(2.0)));
  g.output("z", g.add(x, g.scalar(1.0)));
  return g.Build();
}

class OutputDestinations : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = Engine::Create({});
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(e).value();
    auto c = engine_->Compile(TwoOutputs(), {}, {});
    ASSERT_TRUE(c.ok()) << c.status();
    exe_ = c->executable;
    for (int i = 0; i < 32; ++i) xs_[i] = 0.5f * i - 3;
    x_ = HostTensor::FromVector<float>(v1::DTYPE_F32, {4, 8}, std::vector<float>(xs_, xs_ + 32));
  }
  std::vector<TensorRef> Inputs() const { return {TensorRef::Of("x", x_)}; }

  std::unique_ptr<Engine> engine_;
  std::shared_ptr<Executable> exe_;
  float xs_[32];
  HostTensor x_;
};

TEST_F(OutputDestinations, AlignedAndUnalignedBothLandInTheCallersMemory) {
  // y at a 64-byte boundary (kernels write it there), z 4 bytes past one
  // (copied there at the end).
  alignas(64) static char memory[4096];
  std::memset(memory, 0, sizeof(memory));
  RunOptions o;
  o.output_destinations = {{"y", memory, 128}, {"z", memory + 1024 + 4, 128}};
  for (int round = 0; round < 2; ++round) {
    auto r = engine_->Run(*exe_, Inputs(), nullptr, o);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->outputs.size(), 2u);
    EXPECT_EQ(r->in_destination, (std::vector<bool>{true, true}));
    EXPECT_EQ(r->outputs[0].first, "y");
    EXPECT_EQ(r->outputs[0].second.num_bytes(), 0);  // the bytes are in the destination
    float y[32], z[32];
    std::memcpy(y, memory, 128);
    std::memcpy(z, memory + 1028, 128);
    for (int i = 0; i < 32; ++i) {
      EXPECT_EQ(y[i], 2 * xs_[i]);
      EXPECT_EQ(z[i], xs_[i] + 1);
    }
    std::memset(memory, 0, sizeof(memory));
  }
  // One destination: the other output comes back as a tensor.
  RunOptions only_z;
  only_z.output_destinations = {{"z", memory + 64, 128}};
  auto r = engine_->Run(*exe_, Inputs(), nullptr, only_z);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->in_destination, (std::vector<bool>{false, true}));
  EXPECT_EQ(r->outputs[0].second.data_as<float>()[31], 2 * xs_[31]);
  EXPECT_EQ(reinterpret_cast<const float*>(memory + 64)[31], xs_[31] + 1);
  // None: as before.
  auto plain = engine_->Run(*exe_, Inputs(), nullptr, {});
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->in_destination.empty());
  EXPECT_EQ(plain->outputs[1].second.data_as<float>()[0], xs_[0] + 1);
}

TEST_F(OutputDestinations, WrongSizeOrNameIsInvalidArgument) {
  alignas(64) static char memory[256];
  RunOptions o;
  o.output_destinations = {{"y", memory, 124}};
  auto r = engine_->Run(*exe_, Inputs(), nullptr, o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("destination has 124 bytes"), std::string::npos)
      << r.status();
  o.output_destinations = {{"w", memory, 128}};
  r = engine_->Run(*exe_, Inputs(), nullptr, o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not an output"), std::string::npos) << r.status();
  o.output_destinations = {{"y", memory, 128}, {"y", memory + 128, 128}};
  r = engine_->Run(*exe_, Inputs(), nullptr, o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  o.output_destinations = {{"y", nullptr, 128}};
  r = engine_->Run(*exe_, Inputs(), nullptr, o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln
