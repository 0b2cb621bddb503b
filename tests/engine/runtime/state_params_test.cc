// CompileOptions::state_updates and Engine::CreateStateParams (engine/engine.h):
// a bound output becomes an in-place update of its param after the run's last
// kernel (LIR param_updates), is not returned, and a run that fails in a kernel
// leaves the param as it was. kilnd's stateful sessions are built on this.
#include <gtest/gtest.h>

#include <vector>

#include "clients/cpp/graph_builder.h"
#include "engine/engine.h"

namespace kiln {
namespace {

// s_out = s + x (bound to s), y = x @ w (w read-only), loss over labels that
// can fail the run in a kernel.
v1::Graph Accumulator() {
  GraphBuilder g("acc");
  auto x = g.input("x", v1::DTYPE_F32, {int64_t{1}, int64_t{4}});
  auto labels = g.input("labels", v1::DTYPE_I32, {int64_t{1}});
  auto s = g.param("s", v1::DTYPE_F32, {1, 4});
  auto w = g.param("w", v1::DTYPE_F32, {4, 4});
  g.output("s_out", g.add(s, x));
  g.output("y", g.matmul(x, w));
  g.output("loss", g.softmax_cross_entropy(x, labels));
  return g.Build();
}

class StateParams : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = Engine::Create({});
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(e).value();
    CompileOptions o;
    o.device = "cpu:0";
    o.state_updates = {{"s_out", "s"}};
    auto c = engine_->Compile(Accumulator(), o, {});
    ASSERT_TRUE(c.ok()) << c.status();
    exe_ = c->executable;
    s_ = HostTensor::FromVector<float>(v1::DTYPE_F32, {1, 4}, {0, 0, 0, 0});
    std::vector<float> eye(16, 0);
    for (int i = 0; i < 4; ++i) eye[i * 5] = 1;
    w_ = HostTensor::FromVector<float>(v1::DTYPE_F32, {4, 4}, eye);
    x_ = HostTensor::FromVector<float>(v1::DTYPE_F32, {1, 4}, {1, 2, 3, 4});
  }
  std::vector<TensorRef> Params() const { return {TensorRef::Of("s", s_), TensorRef::Of("w", w_)}; }
  std::vector<TensorRef> Inputs(const HostTensor& labels) const {
    return {TensorRef::Of("x", x_), TensorRef::Of("labels", labels)};
  }
  std::vector<float> S(const ParamSet& set) const {
    auto t = set.Read("s");
    EXPECT_TRUE(t.ok()) << t.status();
    return std::vector<float>(t->data_as<float>(), t->data_as<float>() + 4);
  }

  std::unique_ptr<Engine> engine_;
  std::shared_ptr<Executable> exe_;
  HostTensor s_, w_, x_;
};

TEST_F(StateParams, BoundOutputUpdatesItsParamInPlaceAndIsNotReturned) {
  ASSERT_EQ(exe_->lir().param_updates_size(), 1);
  EXPECT_EQ(exe_->lir().param_updates(0).name(), "s");
  auto set = engine_->CreateStateParams(*exe_, Params());
  ASSERT_TRUE(set.ok()) << set.status();
  const HostTensor good = HostTensor::FromVector<int32_t>(v1::DTYPE_I32, {1}, {2});
  for (int round = 1; round <= 3; ++round) {
    auto r = engine_->Run(*exe_, Inputs(good), set->get(), {});
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->outputs.size(), 2u);
    EXPECT_EQ(r->outputs[0].first, "y");
    EXPECT_EQ(r->outputs[1].first, "loss");
    const float f = static_cast<float>(round);
    EXPECT_EQ(S(**set), (std::vector<float>{f, 2 * f, 3 * f, 4 * f}));
  }
  // The read-only param is untouched (and may be packed).
  auto w = (*set)->Read("w");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->data_as<float>()[5], 1.0f);
}

TEST_F(StateParams, RunFailingInAKernelLeavesTheStateUnchanged) {
  auto set = engine_->CreateStateParams(*exe_, Params());
  ASSERT_TRUE(set.ok()) << set.status();
  const HostTensor good = HostTensor::FromVector<int32_t>(v1::DTYPE_I32, {1}, {2});
  const HostTensor bad = HostTensor::FromVector<int32_t>(v1::DTYPE_I32, {1}, {9});  // of 4 classes
  ASSERT_TRUE(engine_->Run(*exe_, Inputs(good), set->get(), {}).ok());
  auto r = engine_->Run(*exe_, Inputs(bad), set->get(), {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kOutOfRange) << r.status();
  EXPECT_EQ(S(**set), (std::vector<float>{1, 2, 3, 4}));
}

TEST_F(StateParams, NeedsAStateSetWithEveryParam) {
  auto plain = engine_->CreateParams(Params());
  ASSERT_TRUE(plain.ok());
  const HostTensor good = HostTensor::FromVector<int32_t>(v1::DTYPE_I32, {1}, {2});
  auto r = engine_->Run(*exe_, Inputs(good), plain->get(), {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  const std::vector<TensorRef> only_s = {TensorRef::Of("s", s_)};
  auto missing = engine_->CreateStateParams(*exe_, only_s);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("param \"w\""), std::string::npos) << missing.status();
  const std::vector<TensorRef> swapped = {TensorRef::Of("s", w_), TensorRef::Of("w", w_)};
  auto wrong = engine_->CreateStateParams(*exe_, swapped);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument) << wrong.status();
}

TEST_F(StateParams, AnUnknownOutputOrATrainingSpecIsRefused) {
  CompileOptions o;
  o.state_updates = {{"nope", "s"}};
  auto c = engine_->Compile(Accumulator(), o, {});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("\"nope\""), std::string::npos) << c.status();
  o.state_updates = {{"s_out", "s"}};
  o.transforms.mutable_training()->set_loss("loss");
  c = engine_->Compile(Accumulator(), o, {});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
}

}  // namespace
}  // namespace kiln
