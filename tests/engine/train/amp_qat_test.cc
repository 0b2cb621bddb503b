// Mixed precision and quantization-aware training in the engine
// (passes/amp.h, passes/qat.h, train/train_step.h): the straight-through and
// LSQ gradient rules of fake_quantize / fake_quantize_lsq against their
// formulas, finite differences of LSQ's surrogate and the vjp/jvp inner
// product identity; f16 dynamic loss scaling (skip and halve on overflow,
// grow after N good steps, a bit-exact resume from the state read back); QAT
// and AMP training steps that lower a loss; and the statuses for bad specs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/ir/text.h"
#include "engine/train/train_step.h"

namespace kiln {
namespace {

Engine& SharedAmpQatEngine() {
  static std::unique_ptr<Engine> engine = [] {
    EngineOptions o;
    o.calibration = EngineOptions::Calibration::kNever;
    return std::move(Engine::Create(o)).value();
  }();
  return *engine;
}

HostTensor AmpQatUniform(const Dims& dims, double lo, double hi, std::mt19937& rng) {
  HostTensor t = HostTensor::Create(v1::DTYPE_F32, dims).value();
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < t.num_elements(); ++i) t.SetFromDouble(i, u(rng));
  return t;
}

const HostTensor& Output(const RunResult& r, const std::string& name) {
  for (const auto& [n, t] : r.outputs) {
    if (n == name) return t;
  }
  ADD_FAILURE() << "no output " << name;
  static HostTensor none;
  return none;
}

absl::StatusOr<RunResult> CompileAndRun(const std::string& text, const v1::TransformSpec& spec,
                                        const std::map<std::string, const HostTensor*>& inputs) {
  auto graph = ir::ParseGraphProto(text);
  if (!graph.ok()) return graph.status();
  CompileOptions co;
  co.device = "cpu:0";
  co.transforms = spec;
  auto exe = SharedAmpQatEngine().Compile(*graph, co, {});
  if (!exe.ok()) return exe.status();
  std::vector<TensorRef> refs;
  for (const auto& [n, t] : inputs) refs.push_back(TensorRef::Of(n, *t));
  return SharedAmpQatEngine().Run(*exe->executable, refs, nullptr, {});
}

// x [3, 5] quantized per channel (axis 1) on the signed 8-bit grid with scales
// s; some values fall off the grid (|x| up to 2, s * 127 about 1.3).
constexpr char kLsq[] = R"(graph "lsq"
input x: f32[3, 5]
input s: f32[5]
input c: f32[3, 5]
let y = fake_quantize_lsq(x, s, bits=8, axis=1, symmetric=true)
let loss = reduce_sum(y * c)
out y
out loss
)";

struct LsqReference {
  std::vector<double> dx, ds;
};

// LSQ (Esser et al. 2020): dy/dx = 1 on the grid, else 0; dy/ds = round(v) - v
// on the grid, the clamped end off it (v = x / s).
LsqReference LsqGrad(const HostTensor& x, const HostTensor& s, const HostTensor& c) {
  LsqReference r{std::vector<double>(15), std::vector<double>(5)};
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 5; ++j) {
      const double v = x.GetAsDouble(i * 5 + j) / s.GetAsDouble(j);
      const double q = std::nearbyint(v);
      const double g = c.GetAsDouble(i * 5 + j);
      const bool on = q >= -128 && q <= 127;
      r.dx[i * 5 + j] = on ? g : 0;
      r.ds[j] += g * (on ? q - v : std::clamp(q, -128.0, 127.0));
    }
  }
  return r;
}

TEST(FakeQuantGrad, LsqMatchesThePublishedGradient) {
  std::mt19937 rng(5);
  HostTensor x = AmpQatUniform({3, 5}, -2, 2, rng), s = AmpQatUniform({5}, 0.008, 0.012, rng);
  HostTensor c = AmpQatUniform({3, 5}, -1, 1, rng);
  v1::TransformSpec spec;
  spec.mutable_autodiff()->set_mode(v1::AUTODIFF_GRAD);
  spec.mutable_autodiff()->set_output("loss");
  spec.mutable_autodiff()->add_wrt("x");
  spec.mutable_autodiff()->add_wrt("s");
  auto r = CompileAndRun(kLsq, spec, {{"x", &x}, {"s", &s}, {"c", &c}});
  ASSERT_TRUE(r.ok()) << r.status();
  const LsqReference want = LsqGrad(x, s, c);
  int off_grid = 0;
  for (int k = 0; k < 15; ++k) {
    EXPECT_NEAR(Output(*r, "grad/x").GetAsDouble(k), want.dx[k], 1e-6) << "x[" << k << "]";
    off_grid += want.dx[k] == 0;
  }
  EXPECT_GT(off_grid, 0) << "the case should clamp some values";
  for (int j = 0; j < 5; ++j) {
    EXPECT_NEAR(Output(*r, "grad/s").GetAsDouble(j), want.ds[j], 1e-3 * (1 + std::abs(want.ds[j])))
        << "s[" << j << "]";
  }
  // Finite differences of LSQ's surrogate s * (clamp(x / s) + d), with d =
  // round(v) - v frozen at the point (the STE): its derivative is the rule.
  for (int j = 0; j < 5; ++j) {
    auto f = [&](double sj) {
      double sum = 0;
      for (int i = 0; i < 3; ++i) {
        const double xv = x.GetAsDouble(i * 5 + j), s0 = s.GetAsDouble(j);
        const double v0 = xv / s0, q0 = std::nearbyint(v0);
        const bool on = q0 >= -128 && q0 <= 127;
        const double frozen = on ? q0 - v0 : 0;
        const double v = on ? xv / sj : std::clamp(q0, -128.0, 127.0);
        sum += c.GetAsDouble(i * 5 + j) * sj * (v + frozen);
      }
      return sum;
    };
    const double h = 1e-7, s0 = s.GetAsDouble(j);
    const double fd = (f(s0 + h) - f(s0 - h)) / (2 * h);
    EXPECT_NEAR(Output(*r, "grad/s").GetAsDouble(j), fd, 1e-3 * (1 + std::abs(fd)))
        << "finite differences of s[" << j << "]";
  }
}

// <u, J t> = <J^T u, t> for fake_quantize_lsq (x and s) and fake_quantize
// (x; its scale and zero point carry no gradient).
TEST(FakeQuantGrad, VjpAndJvpAgree) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"lsq", "fake_quantize_lsq(x, s, bits=8, axis=1, symmetric=true)"},
      {"fq_sym", "fake_quantize(x, s, bits=8, axis=1, symmetric=true)"},
      {"fq_asym", "fake_quantize(x, s, zp, bits=4, axis=1)"},
  };
  for (const auto& [name, call] : cases) {
    SCOPED_TRACE(name);
    const std::string text = absl::StrCat(R"(graph "fq"
input x: f32[3, 5]
input s: f32[5]
const zp: f32[5] = [0, 3, 7, 8, 15]
let y = )",
                                          call, R"(
out y
)");
    std::mt19937 rng(11);
    HostTensor x = AmpQatUniform({3, 5}, -0.3, 0.3, rng), s = AmpQatUniform({5}, 0.02, 0.03, rng);
    HostTensor u = AmpQatUniform({3, 5}, -1, 1, rng), tx = AmpQatUniform({3, 5}, -1, 1, rng);
    HostTensor ts = AmpQatUniform({5}, -1, 1, rng);
    v1::TransformSpec vjp;
    vjp.mutable_autodiff()->set_mode(v1::AUTODIFF_VJP);
    vjp.mutable_autodiff()->set_output("y");
    vjp.mutable_autodiff()->add_wrt("x");
    vjp.mutable_autodiff()->add_wrt("s");
    auto vr = CompileAndRun(text, vjp, {{"x", &x}, {"s", &s}, {"cotangent/y", &u}});
    ASSERT_TRUE(vr.ok()) << vr.status();
    v1::TransformSpec jvp = vjp;
    jvp.mutable_autodiff()->set_mode(v1::AUTODIFF_JVP);
    auto jr =
        CompileAndRun(text, jvp, {{"x", &x}, {"s", &s}, {"tangent/x", &tx}, {"tangent/s", &ts}});
    ASSERT_TRUE(jr.ok()) << jr.status();
    double lhs = 0, rhs = 0, gs = 0;
    const HostTensor& jt = Output(*jr, "tangent/y");
    for (int k = 0; k < 15; ++k) lhs += u.GetAsDouble(k) * jt.GetAsDouble(k);
    const HostTensor& gx = Output(*vr, "grad/x");
    const HostTensor& gsv = Output(*vr, "grad/s");
    for (int k = 0; k < 15; ++k) rhs += gx.GetAsDouble(k) * tx.GetAsDouble(k);
    for (int j = 0; j < 5; ++j) {
      rhs += gsv.GetAsDouble(j) * ts.GetAsDouble(j);
      gs += std::abs(gsv.GetAsDouble(j));
    }
    EXPECT_NEAR(lhs, rhs, 1e-4 * (1 + std::abs(lhs)));
    if (name == "lsq") {
      EXPECT_GT(gs, 0);
    } else {
      EXPECT_EQ(gs, 0) << "fake_quantize's scale takes no gradient";
    }
  }
}

constexpr char kSmall[] = R"(graph "small"
input x: f32[8, 6]
input y: i64[8]
param w1: f32[6, 16]
param b1: f32[16]
param w2: f32[16, 3]
param b2: f32[3]
let h = relu(layer_norm(x @ w1 + b1, axis=-1))
let logits = h @ w2 + b2
let loss = softmax_cross_entropy(logits, y)
out loss
)";

absl::StatusOr<std::shared_ptr<Executable>> CompileStep(const std::string& text,
                                                        const v1::TransformSpec& spec) {
  auto graph = ir::ParseGraphProto(text);
  if (!graph.ok()) return graph.status();
  CompileOptions co;
  co.device = "cpu:0";
  co.transforms = spec;
  auto exe = SharedAmpQatEngine().Compile(*graph, co, {});
  if (!exe.ok()) return exe.status();
  return exe->executable;
}

std::map<std::string, HostTensor> SmallInit(std::mt19937& rng) {
  std::map<std::string, HostTensor> p;
  p.emplace("w1", AmpQatUniform({6, 16}, -0.5, 0.5, rng));
  p.emplace("b1", AmpQatUniform({16}, -0.1, 0.1, rng));
  p.emplace("w2", AmpQatUniform({16, 3}, -0.5, 0.5, rng));
  p.emplace("b2", AmpQatUniform({3}, -0.1, 0.1, rng));
  return p;
}

std::vector<std::pair<HostTensor, HostTensor>> SmallBatches(int n, std::mt19937& rng) {
  std::vector<std::pair<HostTensor, HostTensor>> out;
  for (int i = 0; i < n; ++i) {
    HostTensor x = AmpQatUniform({8, 6}, -1, 1, rng);
    HostTensor y = HostTensor::Create(v1::DTYPE_I64, {8}).value();
    // A learnable rule: the class is the argmax of the first three features.
    for (int r = 0; r < 8; ++r) {
      int best = 0;
      for (int k = 1; k < 3; ++k) {
        if (x.GetAsDouble(r * 6 + k) > x.GetAsDouble(r * 6 + best)) best = k;
      }
      y.SetFromDouble(r, best);
    }
    out.emplace_back(std::move(x), std::move(y));
  }
  return out;
}

absl::StatusOr<std::shared_ptr<ParamSet>> Params(const Executable& exe,
                                                 const std::map<std::string, HostTensor>& p) {
  std::vector<TensorRef> refs;
  for (const auto& [n, t] : p) refs.push_back(TensorRef::Of(n, t));
  return SharedAmpQatEngine().CreateTrainingParams(exe, refs);
}

absl::StatusOr<double> Step(Executable& exe, ParamSet& set,
                            const std::pair<HostTensor, HostTensor>& batch) {
  std::vector<TensorRef> in = {TensorRef::Of("x", batch.first), TensorRef::Of("y", batch.second)};
  auto r = SharedAmpQatEngine().Run(exe, in, &set, {});
  if (!r.ok()) return r.status();
  return r->outputs[0].second.GetAsDouble(0);
}

bool SameBits(const HostTensor& a, const HostTensor& b) {
  return a.dtype() == b.dtype() && a.dims() == b.dims() &&
         std::memcmp(a.data(), b.data(), a.num_bytes()) == 0;
}

v1::TransformSpec F16Step(double init_scale, int64_t interval) {
  v1::TransformSpec spec;
  spec.mutable_training()->set_loss("loss");
  spec.mutable_training()->mutable_optimizer()->set_kind(v1::OPTIMIZER_ADAM);
  spec.mutable_training()->mutable_optimizer()->set_lr(0.01);
  spec.mutable_amp()->set_compute(v1::DTYPE_F16);
  spec.mutable_amp()->set_init_scale(init_scale);
  spec.mutable_amp()->set_growth_interval(interval);
  return spec;
}

// GradScaler's rule, step by step: a step whose f16 backward overflows
// changes no param or state but the scale (halved) and the skip count; after
// `interval` good steps in a row the scale doubles.
TEST(AmpTraining, F16LossScalingSkipsHalvesAndGrows) {
  auto exe = CompileStep(kSmall, F16Step(std::ldexp(1.0, 40), 3));
  ASSERT_TRUE(exe.ok()) << exe.status();
  std::mt19937 rng(3);
  auto init = SmallInit(rng);
  auto set = Params(**exe, init);
  ASSERT_TRUE(set.ok()) << set.status();
  const auto batches = SmallBatches(40, rng);
  auto read = [&](const std::string& n) { return (*set)->Read(n).value(); };
  int skips = 0, grows = 0, good_in_a_row = 0;
  double scale = std::ldexp(1.0, 40);
  double first_loss = 0, last_loss = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("step ", i + 1));
    HostTensor w1 = read("w1"), m = read("opt/w1/m"), step = read(train::kStepParam);
    auto loss = Step(**exe, **set, batches[i]);
    ASSERT_TRUE(loss.ok()) << loss.status();
    if (i == 0) first_loss = *loss;
    last_loss = *loss;
    const double skipped = read(train::kSkippedStepsParam).GetAsDouble(0);
    const double now = read(train::kLossScaleParam).GetAsDouble(0);
    const double good = read(train::kGoodStepsParam).GetAsDouble(0);
    if (skipped > skips) {  // overflow: nothing moved, the scale halved
      ++skips;
      good_in_a_row = 0;
      EXPECT_TRUE(SameBits(w1, read("w1")));
      EXPECT_TRUE(SameBits(m, read("opt/w1/m")));
      EXPECT_TRUE(SameBits(step, read(train::kStepParam)));
      EXPECT_EQ(now, scale / 2);
      EXPECT_EQ(good, 0);
    } else {
      ++good_in_a_row;
      EXPECT_FALSE(SameBits(w1, read("w1")));
      EXPECT_EQ(read(train::kStepParam).GetAsDouble(0), step.GetAsDouble(0) + 1);
      if (good_in_a_row == 3) {
        ++grows;
        good_in_a_row = 0;
        EXPECT_EQ(now, scale * 2);
        EXPECT_EQ(good, 0);
      } else {
        EXPECT_EQ(now, scale);
        EXPECT_EQ(good, good_in_a_row);
      }
    }
    scale = now;
  }
  EXPECT_GE(skips, 10) << "2^40 overflows f16 until the scale falls below ~2^16";
  EXPECT_GE(grows, 2);
  EXPECT_TRUE(std::isfinite(first_loss) && std::isfinite(last_loss));
}

// Training continued from the params and state read back (a checkpoint)
// equals the uninterrupted run bit for bit, loss scale included.
TEST(AmpTraining, F16ResumeIsBitExact) {
  const v1::TransformSpec spec = F16Step(std::ldexp(1.0, 24), 2);
  auto exe = CompileStep(kSmall, spec);
  ASSERT_TRUE(exe.ok()) << exe.status();
  std::mt19937 rng(9);
  auto init = SmallInit(rng);
  const auto batches = SmallBatches(16, rng);
  auto whole = Params(**exe, init);
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (const auto& b : batches) ASSERT_TRUE(Step(**exe, **whole, b).ok());
  auto first = Params(**exe, init);
  ASSERT_TRUE(first.ok());
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(Step(**exe, **first, batches[i]).ok());
  std::map<std::string, HostTensor> saved;
  for (const std::string& n : (*first)->names()) saved.emplace(n, (*first)->Read(n).value());
  ASSERT_TRUE(saved.contains(train::kLossScaleParam));
  ASSERT_TRUE(saved.contains(train::kSkippedStepsParam));
  EXPECT_GT(saved.at(train::kSkippedStepsParam).GetAsDouble(0), 0) << "2^24 overflows at first";
  auto resumed = Params(**exe, saved);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  for (int i = 8; i < 16; ++i) ASSERT_TRUE(Step(**exe, **resumed, batches[i]).ok());
  for (const std::string& n : (*whole)->names()) {
    EXPECT_TRUE(SameBits((*whole)->Read(n).value(), (*resumed)->Read(n).value())) << n;
  }
}

// bf16 AMP, QAT (per-tensor and per-channel, symmetric and asymmetric, and
// LSQ) training steps compile, run and lower the loss of a small problem.
TEST(AmpTraining, MixedAndQuantizedStepsLearn) {
  struct Case {
    std::string name;
    std::function<void(v1::TransformSpec&)> edit;
  };
  const std::vector<Case> cases = {
      {"bf16", [](auto& s) { s.mutable_amp()->set_compute(v1::DTYPE_BF16); }},
      {"qat_tensor_sym", [](auto& s) { s.mutable_qat(); }},
      {"qat_channel_asym",
       [](auto& s) {
         s.mutable_qat()->set_weight_per_channel(true);
         s.mutable_qat()->set_weight_asymmetric(true);
         s.mutable_qat()->set_activation_asymmetric(true);
       }},
      {"qat_lsq_channel",
       [](auto& s) {
         s.mutable_qat()->set_lsq(true);
         s.mutable_qat()->set_weight_per_channel(true);
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::TransformSpec spec;
    spec.mutable_training()->set_loss("loss");
    spec.mutable_training()->mutable_optimizer()->set_kind(v1::OPTIMIZER_ADAM);
    spec.mutable_training()->mutable_optimizer()->set_lr(0.01);
    c.edit(spec);
    auto exe = CompileStep(kSmall, spec);
    ASSERT_TRUE(exe.ok()) << exe.status();
    std::mt19937 rng(17);
    auto init = SmallInit(rng);
    auto set = Params(**exe, init);
    ASSERT_TRUE(set.ok()) << set.status();
    const auto batches = SmallBatches(60, rng);
    double early = 0, late = 0;
    for (size_t i = 0; i < batches.size(); ++i) {
      auto loss = Step(**exe, **set, batches[i]);
      ASSERT_TRUE(loss.ok()) << loss.status();
      ASSERT_TRUE(std::isfinite(*loss));
      if (i < 10) early += *loss;
      if (i >= batches.size() - 10) late += *loss;
    }
    EXPECT_LT(late, 0.8 * early);
    if (c.name == "qat_lsq_channel") {
      HostTensor s = (*set)->Read("w1/lsq_scale").value();
      ASSERT_EQ(s.num_elements(), 16);
      for (int64_t k = 0; k < 16; ++k) EXPECT_GT(s.GetAsDouble(k), 0) << "scale " << k;
    }
  }
}

TEST(AmpTraining, BadSpecsAreNamed) {
  struct Bad {
    std::function<void(v1::TransformSpec&)> edit;
    std::string needle;
  };
  const std::vector<Bad> bad = {
      {[](auto& s) { s.mutable_amp()->set_compute(v1::DTYPE_I8); }, "amp compute dtype i8"},
      {[](auto& s) {
         s.mutable_amp()->set_compute(v1::DTYPE_F16), s.mutable_amp()->set_init_scale(-1);
       },
       "amp init_scale = -1"},
      {[](auto& s) {
         s.mutable_amp()->set_compute(v1::DTYPE_F16), s.mutable_amp()->set_growth_factor(1);
       },
       "amp growth_factor = 1"},
      {[](auto& s) {
         s.mutable_amp()->set_compute(v1::DTYPE_F16), s.mutable_amp()->set_backoff_factor(1);
       },
       "amp backoff_factor = 1"},
      {[](auto& s) {
         s.mutable_amp()->set_compute(v1::DTYPE_F16), s.mutable_amp()->set_growth_interval(0);
       },
       "amp growth_interval = 0"},
      {[](auto& s) { s.mutable_amp()->set_compute(v1::DTYPE_BF16), s.mutable_qat(); },
       "both AMP and QAT"},
      {[](auto& s) { s.mutable_qat()->set_bits(3); }, "qat bits = 3"},
      {[](auto& s) {
         s.mutable_qat()->set_lsq(true), s.mutable_qat()->set_weight_asymmetric(true);
       },
       "weight_asymmetric"},
  };
  for (const Bad& b : bad) {
    v1::TransformSpec s;
    s.mutable_training()->set_loss("loss");
    s.mutable_training()->mutable_optimizer()->set_kind(v1::OPTIMIZER_SGD);
    s.mutable_training()->mutable_optimizer()->set_lr(0.1);
    b.edit(s);
    absl::Status st = CompileStep(kSmall, s).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << b.needle << ": " << st;
    EXPECT_NE(st.message().find(b.needle), std::string::npos) << b.needle << ": " << st;
  }
}

}  // namespace
}  // namespace kiln
