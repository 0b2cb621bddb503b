// The ONNX recurrent ops (LSTM, GRU, RNN) on hand-built models: directions,
// layouts, initial states, peepholes, activations, clip, input_forget and
// sequence_lens, against f64 references or the equivalent one-direction and
// one-row nodes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "engine/engine.h"
#include "engine/io/onnx/onnx_import.h"
#include "onnx/onnx_pb.h"
#include "tests/engine/io/onnx_test_model.h"

namespace kiln {
namespace {

using onnx_test::Import;
using onnx_test::MakeEngine;
using onnx_test::Model;

// LSTM direction=reverse over X equals direction=forward over X reversed in
// time (the node tests cover forward only): Y_h alike, Y[t] = Y_fwd[T-1-t].
TEST(OnnxImport, ReverseLstmIsForwardOverReversedTime) {
  constexpr int64_t kT = 4, kB = 2, kIn = 3, kH = 5;
  auto model = [&](const std::string& direction) {
    Model m(14);
    m.Input("X", {kT, kB, kIn});
    std::vector<float> w(4 * kH * kIn), r(4 * kH * kH), b(8 * kH);
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.3f * std::sin(0.7f * i);
    for (size_t i = 0; i < r.size(); ++i) r[i] = 0.2f * std::cos(1.3f * i);
    for (size_t i = 0; i < b.size(); ++i) b[i] = 0.1f * std::sin(2.1f * i);
    m.Init("W", {1, 4 * kH, kIn}, w);
    m.Init("R", {1, 4 * kH, kH}, r);
    m.Init("B", {1, 8 * kH}, b);
    auto* n = m.Node("LSTM", {"X", "W", "R", "B"}, {"Y", "Y_h", "Y_c"}, "lstm");
    auto* hs = n->add_attribute();
    hs->set_name("hidden_size");
    hs->set_type(onnx::AttributeProto::INT);
    hs->set_i(kH);
    auto* d = n->add_attribute();
    d->set_name("direction");
    d->set_type(onnx::AttributeProto::STRING);
    d->set_s(direction);
    m.Output("Y");
    m.Output("Y_h");
    return m;
  };
  auto fwd = Import(model("forward"));
  auto rev = Import(model("reverse"));
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  ASSERT_TRUE(rev.ok()) << rev.status();
  HostTensor x = *HostTensor::Create(v1::DTYPE_F32, {kT, kB, kIn});
  HostTensor xr = *HostTensor::Create(v1::DTYPE_F32, {kT, kB, kIn});
  const int64_t step = kB * kIn;
  for (int64_t i = 0; i < kT * step; ++i) x.SetFromDouble(i, std::sin(0.37 * i));
  for (int64_t t = 0; t < kT; ++t) {
    for (int64_t k = 0; k < step; ++k)
      xr.SetFromDouble(t * step + k, x.GetAsDouble((kT - 1 - t) * step + k));
  }
  auto engine = MakeEngine();
  auto a =
      engine->RunGraph(rev->graph, std::vector<TensorRef>{TensorRef::Of("X", x)}, nullptr, {}, {});
  auto f =
      engine->RunGraph(fwd->graph, std::vector<TensorRef>{TensorRef::Of("X", xr)}, nullptr, {}, {});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(f.ok()) << f.status();
  const HostTensor& ya = a->outputs[0].second;
  const HostTensor& yf = f->outputs[0].second;
  ASSERT_EQ(ya.dims(), (Dims{kT, 1, kB, kH}));
  const int64_t ystep = kB * kH;
  for (int64_t t = 0; t < kT; ++t) {
    for (int64_t k = 0; k < ystep; ++k) {
      EXPECT_NEAR(ya.GetAsDouble(t * ystep + k), yf.GetAsDouble((kT - 1 - t) * ystep + k), 1e-5)
          << t;
    }
  }
  for (int64_t k = 0; k < ystep; ++k) {
    EXPECT_NEAR(a->outputs[1].second.GetAsDouble(k), f->outputs[1].second.GetAsDouble(k), 1e-5);
  }
}

// A bidirectional LSTM / GRU equals two one-direction nodes over each
// direction's slice of W, R, B, the initial states (and LSTM peepholes):
// Y[.., 0, ..] is the forward node's Y, Y[.., 1, ..] the reverse node's, Y_h
// and Y_c alike. Layout 1 (batch first), with initial states, peepholes and
// GRU's linear_before_reset, none of which the PyTorch exports use.
void CheckBidirectional(bool lstm) {
  constexpr int64_t kT = 4, kB = 2, kIn = 3, kH = 5;
  const int64_t g = lstm ? 4 : 3;
  // dirs: {0, 1} for the bidirectional node, {d} for one direction.
  auto model = [&](const std::vector<int64_t>& dirs, const std::string& direction) {
    const int64_t nd = static_cast<int64_t>(dirs.size());
    Model m(14);
    m.Input("X", {kB, kT, kIn});
    auto fill = [&](int64_t per_dir, double a, double f) {
      std::vector<float> v;
      for (int64_t d : dirs) {
        for (int64_t i = 0; i < per_dir; ++i)
          v.push_back(static_cast<float>(a * std::sin(f * i + d)));
      }
      return v;
    };
    m.Init("W", {nd, g * kH, kIn}, fill(g * kH * kIn, 0.3, 0.7));
    m.Init("R", {nd, g * kH, kH}, fill(g * kH * kH, 0.2, 1.3));
    m.Init("B", {nd, 2 * g * kH}, fill(2 * g * kH, 0.1, 2.1));
    // Initial states [batch, dirs, H] (layout 1).
    auto states = [&](double phase) {
      std::vector<float> v;
      for (int64_t b = 0; b < kB; ++b) {
        for (int64_t d : dirs) {
          for (int64_t k = 0; k < kH; ++k)
            v.push_back(static_cast<float>(0.5 * std::sin(0.3 * (b * 7 + d * 13 + k) + phase)));
        }
      }
      return v;
    };
    m.Init("H0", {kB, nd, kH}, states(0.0));
    std::vector<std::string> in = {"X", "W", "R", "B", "", "H0"};
    std::vector<std::string> out = {"Y", "Y_h"};
    if (lstm) {
      m.Init("C0", {kB, nd, kH}, states(1.0));
      m.Init("P", {nd, 3 * kH}, fill(3 * kH, 0.2, 0.9));
      in.insert(in.end(), {"C0", "P"});
      out.push_back("Y_c");
    }
    auto* n = m.Node(lstm ? "LSTM" : "GRU", in, out, "rnn");
    auto* hs = n->add_attribute();
    hs->set_name("hidden_size");
    hs->set_type(onnx::AttributeProto::INT);
    hs->set_i(kH);
    auto* layout = n->add_attribute();
    layout->set_name("layout");
    layout->set_type(onnx::AttributeProto::INT);
    layout->set_i(1);
    if (!lstm) {
      auto* lbr = n->add_attribute();
      lbr->set_name("linear_before_reset");
      lbr->set_type(onnx::AttributeProto::INT);
      lbr->set_i(1);
    }
    auto* d = n->add_attribute();
    d->set_name("direction");
    d->set_type(onnx::AttributeProto::STRING);
    d->set_s(direction);
    for (const auto& o : out) m.Output(o);
    return m;
  };
  HostTensor x = *HostTensor::Create(v1::DTYPE_F32, {kB, kT, kIn});
  for (int64_t i = 0; i < x.num_elements(); ++i) x.SetFromDouble(i, std::sin(0.37 * i));
  auto engine = MakeEngine();
  auto run = [&](const Model& m) {
    std::vector<HostTensor> outs;
    auto imported = Import(m);
    EXPECT_TRUE(imported.ok()) << imported.status();
    if (!imported.ok()) return outs;
    auto r = engine->RunGraph(imported->graph, std::vector<TensorRef>{TensorRef::Of("X", x)},
                              nullptr, {}, {});
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return outs;
    for (auto& [name, t] : r->outputs) outs.push_back(std::move(t));
    return outs;
  };
  const std::vector<HostTensor> bi = run(model({0, 1}, "bidirectional"));
  const std::vector<HostTensor> fwd = run(model({0}, "forward"));
  const std::vector<HostTensor> rev = run(model({1}, "reverse"));
  const size_t n_out = lstm ? 3 : 2;
  ASSERT_EQ(bi.size(), n_out);
  ASSERT_EQ(fwd.size(), n_out);
  ASSERT_EQ(rev.size(), n_out);
  ASSERT_EQ(bi[0].dims(), (Dims{kB, kT, 2, kH}));
  ASSERT_EQ(bi[1].dims(), (Dims{kB, 2, kH}));
  // Every output is [..., dirs, H] with the direction axis second to last.
  for (size_t o = 0; o < n_out; ++o) {
    const int64_t rows = bi[o].num_elements() / (2 * kH);
    ASSERT_EQ(fwd[o].num_elements(), rows * kH) << o;
    for (int64_t row = 0; row < rows; ++row) {
      for (int64_t k = 0; k < kH; ++k) {
        EXPECT_NEAR(bi[o].GetAsDouble((row * 2 + 0) * kH + k), fwd[o].GetAsDouble(row * kH + k),
                    1e-5)
            << "output " << o << " row " << row;
        EXPECT_NEAR(bi[o].GetAsDouble((row * 2 + 1) * kH + k), rev[o].GetAsDouble(row * kH + k),
                    1e-5)
            << "output " << o << " row " << row;
      }
    }
  }
}

TEST(OnnxImport, BidirectionalLstmIsForwardAndReverse) { CheckBidirectional(true); }
TEST(OnnxImport, BidirectionalGruIsForwardAndReverse) { CheckBidirectional(false); }

// ONNX's RNN activation functions, in f64 (alpha / beta as given).
double RefAct(const std::string& n, double a, double b, double x) {
  if (n == "Sigmoid") return 1 / (1 + std::exp(-x));
  if (n == "Tanh") return std::tanh(x);
  if (n == "Relu") return std::max(x, 0.0);
  if (n == "Affine") return a * x + b;
  if (n == "LeakyRelu") return x >= 0 ? x : a * x;
  if (n == "ScaledTanh") return a * std::tanh(b * x);
  if (n == "HardSigmoid") return std::clamp(a * x + b, 0.0, 1.0);
  if (n == "Elu") return x >= 0 ? x : a * (std::exp(x) - 1);
  if (n == "Softsign") return x / (1 + std::fabs(x));
  if (n == "Softplus") return std::log1p(std::exp(x));
  if (n == "ThresholdedRelu") return x >= a ? x : 0;
  ADD_FAILURE() << n;
  return 0;
}

struct ActCase {
  bool lstm;
  std::vector<std::string> names;
  std::vector<float> alpha, beta;
  // The (alpha, beta) each function gets: consumed in order by the functions
  // that take them.
  std::vector<std::pair<double, double>> expect;
  double clip = 0;            // > 0: the clip attribute
  bool write_names = true;    // false: the node has no activations attribute (the defaults)
  bool input_forget = false;  // LSTM: f = 1 - i
};

// A one-direction LSTM / GRU with custom activations against an f64
// reference of the ONNX equations (layout 0, biases, zero initial states).
void CheckActivations(const ActCase& k) {
  constexpr int64_t kT = 3, kB = 2, kIn = 3, kH = 4;
  const int64_t g = k.lstm ? 4 : 3;
  std::vector<float> w(g * kH * kIn), r(g * kH * kH), b(2 * g * kH);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.4f * std::sin(0.7f * i + 0.2f);
  for (size_t i = 0; i < r.size(); ++i) r[i] = 0.3f * std::cos(1.3f * i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = 0.2f * std::sin(2.1f * i);
  Model m(14);
  m.Input("X", {kT, kB, kIn});
  m.Init("W", {1, g * kH, kIn}, w);
  m.Init("R", {1, g * kH, kH}, r);
  m.Init("B", {1, 2 * g * kH}, b);
  auto* n = m.Node(k.lstm ? "LSTM" : "GRU", {"X", "W", "R", "B"}, {"Y"}, "rnn");
  auto* hs = n->add_attribute();
  hs->set_name("hidden_size");
  hs->set_type(onnx::AttributeProto::INT);
  hs->set_i(kH);
  if (k.write_names) {
    auto* acts = n->add_attribute();
    acts->set_name("activations");
    acts->set_type(onnx::AttributeProto::STRINGS);
    for (const auto& s : k.names) acts->add_strings(s);
  }
  if (k.clip > 0) Model::Float(n, "clip", static_cast<float>(k.clip));
  if (k.input_forget) {
    auto* a = n->add_attribute();
    a->set_name("input_forget");
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(1);
  }
  for (auto [name, v] :
       {std::pair{"activation_alpha", &k.alpha}, std::pair{"activation_beta", &k.beta}}) {
    if (v->empty()) continue;
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::FLOATS);
    for (float f : *v) a->add_floats(f);
  }
  m.Output("Y");
  auto imported = Import(m);
  ASSERT_TRUE(imported.ok()) << imported.status();
  HostTensor x = *HostTensor::Create(v1::DTYPE_F32, {kT, kB, kIn});
  for (int64_t i = 0; i < x.num_elements(); ++i) x.SetFromDouble(i, 1.5 * std::sin(0.37 * i + 0.1));
  auto engine = MakeEngine();
  auto out = engine->RunGraph(imported->graph, std::vector<TensorRef>{TensorRef::Of("X", x)},
                              nullptr, {}, {});
  ASSERT_TRUE(out.ok()) << out.status();
  const HostTensor& y = out->outputs[0].second;
  ASSERT_EQ(y.dims(), (Dims{kT, 1, kB, kH}));
  // clip: every activation's input clamped (ONNX: "applied to the input of
  // activations"; LSTM's cell state itself stays unclipped).
  auto act = [&](int j, double v) {
    if (k.clip > 0) v = std::clamp(v, -k.clip, k.clip);
    return RefAct(k.names[j], k.expect[j].first, k.expect[j].second, v);
  };
  for (int64_t bb = 0; bb < kB; ++bb) {
    std::vector<double> h(kH, 0.0), cs(kH, 0.0);
    for (int64_t t = 0; t < kT; ++t) {
      // pre[gate][j] = x W^T + Wb (+ h R^T + Rb, except GRU's hidden gate).
      std::vector<std::vector<double>> xw(g, std::vector<double>(kH)), hr = xw;
      for (int64_t q = 0; q < g; ++q) {
        for (int64_t j = 0; j < kH; ++j) {
          const int64_t row = q * kH + j;
          double sx = b[row], sh = b[g * kH + row];
          for (int64_t i = 0; i < kIn; ++i)
            sx += double{w[row * kIn + i]} * x.GetAsDouble((t * kB + bb) * kIn + i);
          for (int64_t i = 0; i < kH; ++i) sh += double{r[row * kH + i]} * h[i];
          xw[q][j] = sx;
          hr[q][j] = sh;
        }
      }
      std::vector<double> h1(kH);
      if (k.lstm) {  // gates i, o, f, c
        for (int64_t j = 0; j < kH; ++j) {
          const double gi = act(0, xw[0][j] + hr[0][j]), go = act(0, xw[1][j] + hr[1][j]);
          const double gf = k.input_forget ? 1 - gi : act(0, xw[2][j] + hr[2][j]);
          const double gc = act(1, xw[3][j] + hr[3][j]);
          cs[j] = gf * cs[j] + gi * gc;
          h1[j] = go * act(2, cs[j]);
        }
      } else {  // gates z, r, h; linear_before_reset = 0
        std::vector<double> z(kH), rg(kH);
        for (int64_t j = 0; j < kH; ++j) {
          z[j] = act(0, xw[0][j] + hr[0][j]);
          rg[j] = act(0, xw[1][j] + hr[1][j]);
        }
        for (int64_t j = 0; j < kH; ++j) {
          const int64_t row = 2 * kH + j;
          double s = b[g * kH + row];
          for (int64_t i = 0; i < kH; ++i) s += double{r[row * kH + i]} * rg[i] * h[i];
          const double nn = act(1, xw[2][j] + s);
          h1[j] = (1 - z[j]) * nn + z[j] * h[j];
        }
      }
      h = h1;
      for (int64_t j = 0; j < kH; ++j) {
        EXPECT_NEAR(y.GetAsDouble((t * kB + bb) * kH + j), h[j], 1e-5 + 1e-5 * std::fabs(h[j]))
            << "t " << t << " batch " << bb << " j " << j;
      }
    }
  }
}

TEST(OnnxImport, LstmCustomActivationsMatchF64Reference) {
  CheckActivations({true,
                    {"HardSigmoid", "LeakyRelu", "Softsign"},
                    {0.3f, 0.1f},
                    {0.4f},
                    {{0.3f, 0.4f}, {0.1f, 0}, {0, 0}}});
  CheckActivations({true, {"Sigmoid", "ScaledTanh", "Elu"}, {}, {}, {{0, 0}, {1, 1}, {1, 0}}});
}

TEST(OnnxImport, GruCustomActivationsMatchF64Reference) {
  CheckActivations({false, {"Affine", "Elu"}, {0.25f, 0.7f}, {0.5f}, {{0.25f, 0.5f}, {0.7f, 0}}});
  CheckActivations({false, {"Softplus", "Relu"}, {}, {}, {{0, 0}, {0, 0}}});
  CheckActivations({false, {"Sigmoid", "ThresholdedRelu"}, {0.2f}, {}, {{0, 0}, {0.2f, 0}}});
}

TEST(OnnxImport, RnnClipMatchesF64Reference) {
  const float clip = 0.5f;  // the inputs drive the gates and LSTM's cell state past it
  CheckActivations(
      {true, {"Sigmoid", "Tanh", "Tanh"}, {}, {}, {{0, 0}, {0, 0}, {0, 0}}, clip, false});
  CheckActivations({false, {"Sigmoid", "Tanh"}, {}, {}, {{0, 0}, {0, 0}}, clip, false});
  CheckActivations(
      {false, {"HardSigmoid", "Softsign"}, {0.5f}, {0.25f}, {{0.5f, 0.25f}, {0, 0}}, clip, true});
}

TEST(OnnxImport, LstmInputForgetMatchesF64Reference) {
  CheckActivations(
      {true, {"Sigmoid", "Tanh", "Tanh"}, {}, {}, {{0, 0}, {0, 0}, {0, 0}}, 0, false, true});
}

TEST(OnnxImport, RnnActivationListOfTheWrongLengthIsRefused) {
  Model m(14);
  m.Input("X", {2, 1, 3});
  m.Init("W", {1, 12, 3}, std::vector<float>(36, 0.1f));
  m.Init("R", {1, 12, 4}, std::vector<float>(48, 0.1f));
  auto* n = m.Node("GRU", {"X", "W", "R"}, {"Y"}, "gru");
  auto* hs = n->add_attribute();
  hs->set_name("hidden_size");
  hs->set_type(onnx::AttributeProto::INT);
  hs->set_i(4);
  auto* acts = n->add_attribute();
  acts->set_name("activations");
  acts->set_type(onnx::AttributeProto::STRINGS);
  acts->add_strings("Sigmoid");
  m.Output("Y");
  auto r = Import(m);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "2 per direction")) << r.status();
}

// sequence_lens shorter than the sequence: each row of a batched LSTM / GRU
// equals the same node run on that row alone, cut to its length (Y zero past
// it, Y_h / Y_c the state at its last step), in every direction.
void CheckSequenceLens(bool lstm, const std::string& direction) {
  constexpr int64_t kT = 4, kIn = 3, kH = 3;
  const std::vector<int32_t> lens = {4, 1, 3};
  const int64_t kB = static_cast<int64_t>(lens.size());
  const int64_t g = lstm ? 4 : 3, nd = direction == "bidirectional" ? 2 : 1;
  auto model = [&](int64_t t_len, int64_t batch, const std::vector<int32_t>* seq_lens) {
    Model m(14);
    m.Input("X", {t_len, batch, kIn});
    std::vector<float> w(nd * g * kH * kIn), r(nd * g * kH * kH), b(nd * 2 * g * kH);
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.4f * std::sin(0.7f * i + 0.2f);
    for (size_t i = 0; i < r.size(); ++i) r[i] = 0.3f * std::cos(1.3f * i);
    for (size_t i = 0; i < b.size(); ++i) b[i] = 0.2f * std::sin(2.1f * i);
    m.Init("W", {nd, g * kH, kIn}, w);
    m.Init("R", {nd, g * kH, kH}, r);
    m.Init("B", {nd, 2 * g * kH}, b);
    std::vector<std::string> in = {"X", "W", "R", "B"};
    if (seq_lens != nullptr) {
      auto* t = m.g().add_initializer();
      t->set_name("L");
      t->set_data_type(onnx::TensorProto::INT32);
      t->add_dims(static_cast<int64_t>(seq_lens->size()));
      for (int32_t v : *seq_lens) t->add_int32_data(v);
      in.push_back("L");
    }
    std::vector<std::string> out = {"Y", "Y_h"};
    if (lstm) out.push_back("Y_c");
    auto* n = m.Node(lstm ? "LSTM" : "GRU", in, out, "rnn");
    auto* hs = n->add_attribute();
    hs->set_name("hidden_size");
    hs->set_type(onnx::AttributeProto::INT);
    hs->set_i(kH);
    auto* d = n->add_attribute();
    d->set_name("direction");
    d->set_type(onnx::AttributeProto::STRING);
    d->set_s(direction);
    for (const auto& o : out) m.Output(o);
    return m;
  };
  auto engine = MakeEngine();
  auto run = [&](const Model& m, const HostTensor& x) {
    std::vector<HostTensor> outs;
    auto imported = Import(m);
    EXPECT_TRUE(imported.ok()) << imported.status();
    if (!imported.ok()) return outs;
    auto r = engine->RunGraph(imported->graph, std::vector<TensorRef>{TensorRef::Of("X", x)},
                              nullptr, {}, {});
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return outs;
    for (auto& [name, t] : r->outputs) outs.push_back(std::move(t));
    return outs;
  };
  HostTensor x = *HostTensor::Create(v1::DTYPE_F32, {kT, kB, kIn});
  for (int64_t i = 0; i < x.num_elements(); ++i) x.SetFromDouble(i, 1.2 * std::sin(0.37 * i + 0.1));
  const std::vector<HostTensor> all = run(model(kT, kB, &lens), x);
  const size_t n_out = lstm ? 3 : 2;
  ASSERT_EQ(all.size(), n_out);
  for (int64_t b = 0; b < kB; ++b) {
    const int64_t len = lens[b];
    HostTensor xb = *HostTensor::Create(v1::DTYPE_F32, {len, 1, kIn});
    for (int64_t t = 0; t < len; ++t) {
      for (int64_t i = 0; i < kIn; ++i)
        xb.SetFromDouble(t * kIn + i, x.GetAsDouble((t * kB + b) * kIn + i));
    }
    const std::vector<HostTensor> one = run(model(len, 1, nullptr), xb);
    ASSERT_EQ(one.size(), n_out);
    // Y [T, dirs, B, H]
    for (int64_t t = 0; t < kT; ++t) {
      for (int64_t d = 0; d < nd; ++d) {
        for (int64_t k = 0; k < kH; ++k) {
          const double got = all[0].GetAsDouble(((t * nd + d) * kB + b) * kH + k);
          const double want = t < len ? one[0].GetAsDouble((t * nd + d) * kH + k) : 0.0;
          EXPECT_NEAR(got, want, 1e-5) << direction << " Y b " << b << " t " << t << " d " << d;
        }
      }
    }
    // Y_h, Y_c [dirs, B, H]
    for (size_t o = 1; o < n_out; ++o) {
      for (int64_t d = 0; d < nd; ++d) {
        for (int64_t k = 0; k < kH; ++k) {
          EXPECT_NEAR(all[o].GetAsDouble((d * kB + b) * kH + k), one[o].GetAsDouble(d * kH + k),
                      1e-5)
              << direction << " output " << o << " b " << b << " d " << d;
        }
      }
    }
  }
}

TEST(OnnxImportHostile, RnnSequenceLensOutOfRangeIsRefused) {
  for (std::vector<int64_t> lens : {std::vector<int64_t>{2, 5}, {2}, {-1, 1}}) {
    Model m(14);
    m.Input("X", {3, 2, 3});
    m.Init("W", {1, 12, 3}, std::vector<float>(36, 0.1f));
    m.Init("R", {1, 12, 4}, std::vector<float>(48, 0.1f));
    m.InitInts("L", lens);
    auto* n = m.Node("GRU", {"X", "W", "R", "", "L"}, {"Y"}, "gru");
    auto* hs = n->add_attribute();
    hs->set_name("hidden_size");
    hs->set_type(onnx::AttributeProto::INT);
    hs->set_i(4);
    m.Output("Y");
    auto r = Import(m);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "sequence_lens")) << r.status();
  }
}

TEST(OnnxImport, LstmSequenceLensEachRowAsAlone) {
  for (const char* dir : {"forward", "reverse", "bidirectional"}) CheckSequenceLens(true, dir);
}
TEST(OnnxImport, GruSequenceLensEachRowAsAlone) {
  for (const char* dir : {"forward", "reverse", "bidirectional"}) CheckSequenceLens(false, dir);
}

// The simple RNN, bidirectional with a custom activation per direction,
// against an f64 reference: H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb).
TEST(OnnxImport, BidirectionalRnnMatchesF64Reference) {
  constexpr int64_t kT = 3, kB = 2, kIn = 3, kH = 4;
  const std::vector<std::string> acts = {"Tanh", "LeakyRelu"};
  const double alpha = 0.2;  // LeakyRelu's
  std::vector<float> w(2 * kH * kIn), r(2 * kH * kH), b(2 * 2 * kH);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5f * std::sin(0.7f * i + 0.2f);
  for (size_t i = 0; i < r.size(); ++i) r[i] = 0.3f * std::cos(1.3f * i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = 0.2f * std::sin(2.1f * i);
  Model m(14);
  m.Input("X", {kT, kB, kIn});
  m.Init("W", {2, kH, kIn}, w);
  m.Init("R", {2, kH, kH}, r);
  m.Init("B", {2, 2 * kH}, b);
  auto* n = m.Node("RNN", {"X", "W", "R", "B"}, {"Y", "Y_h"}, "rnn");
  auto* hs = n->add_attribute();
  hs->set_name("hidden_size");
  hs->set_type(onnx::AttributeProto::INT);
  hs->set_i(kH);
  auto* d = n->add_attribute();
  d->set_name("direction");
  d->set_type(onnx::AttributeProto::STRING);
  d->set_s("bidirectional");
  auto* a = n->add_attribute();
  a->set_name("activations");
  a->set_type(onnx::AttributeProto::STRINGS);
  for (const auto& s : acts) a->add_strings(s);
  auto* al = n->add_attribute();
  al->set_name("activation_alpha");
  al->set_type(onnx::AttributeProto::FLOATS);
  al->add_floats(static_cast<float>(alpha));
  m.Output("Y");
  m.Output("Y_h");
  auto imported = Import(m);
  ASSERT_TRUE(imported.ok()) << imported.status();
  HostTensor x = *HostTensor::Create(v1::DTYPE_F32, {kT, kB, kIn});
  for (int64_t i = 0; i < x.num_elements(); ++i) x.SetFromDouble(i, 1.3 * std::sin(0.37 * i + 0.1));
  auto engine = MakeEngine();
  auto out = engine->RunGraph(imported->graph, std::vector<TensorRef>{TensorRef::Of("X", x)},
                              nullptr, {}, {});
  ASSERT_TRUE(out.ok()) << out.status();
  const HostTensor& y = out->outputs[0].second;
  const HostTensor& yh = out->outputs[1].second;
  ASSERT_EQ(y.dims(), (Dims{kT, 2, kB, kH}));
  ASSERT_EQ(yh.dims(), (Dims{2, kB, kH}));
  for (int64_t dir = 0; dir < 2; ++dir) {
    for (int64_t bb = 0; bb < kB; ++bb) {
      std::vector<double> h(kH, 0.0);
      for (int64_t s = 0; s < kT; ++s) {
        const int64_t t = dir == 0 ? s : kT - 1 - s;
        std::vector<double> h1(kH);
        for (int64_t j = 0; j < kH; ++j) {
          double v = double{b[dir * 2 * kH + j]} + b[dir * 2 * kH + kH + j];
          for (int64_t i = 0; i < kIn; ++i)
            v += double{w[(dir * kH + j) * kIn + i]} * x.GetAsDouble((t * kB + bb) * kIn + i);
          for (int64_t i = 0; i < kH; ++i) v += double{r[(dir * kH + j) * kH + i]} * h[i];
          h1[j] = dir == 0 ? std::tanh(v) : (v >= 0 ? v : alpha * v);
        }
        h = h1;
        for (int64_t j = 0; j < kH; ++j) {
          EXPECT_NEAR(y.GetAsDouble(((t * 2 + dir) * kB + bb) * kH + j), h[j],
                      1e-5 + 1e-5 * std::fabs(h[j]))
              << "dir " << dir << " t " << t << " batch " << bb;
        }
      }
      for (int64_t j = 0; j < kH; ++j) {
        EXPECT_NEAR(yh.GetAsDouble((dir * kB + bb) * kH + j), h[j], 1e-5 + 1e-5 * std::fabs(h[j]))
            << dir;
      }
    }
  }
}

}  // namespace
}  // namespace kiln
