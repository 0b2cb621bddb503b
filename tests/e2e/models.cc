#include "tests/e2e/models.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "clients/cpp/graph_builder.h"

namespace kiln::models {
namespace {

using V = GraphBuilder::Value;

std::vector<double> ToF64(const HostTensor& t) {
  std::vector<double> v(t.num_elements());
  for (int64_t i = 0; i < t.num_elements(); ++i) v[i] = t.GetAsDouble(i);
  return v;
}

HostTensor FromF64(const std::vector<double>& v, const Dims& dims) {
  HostTensor t = std::move(HostTensor::Create(v1::DTYPE_F32, dims)).value();
  for (int64_t i = 0; i < t.num_elements(); ++i) t.SetFromDouble(i, v[i]);
  return t;
}

// y[m, n] = sum_k x[m, k] w[k, n] + b[n]
std::vector<double> Linear(const std::vector<double>& x, int64_t m, int64_t k,
                           const std::vector<double>& w, const std::vector<double>& b, int64_t n) {
  std::vector<double> y(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    double* row = &y[i * n];
    for (int64_t j = 0; j < n; ++j) row[j] = b.empty() ? 0.0 : b[j];
    for (int64_t kk = 0; kk < k; ++kk) {
      const double a = x[i * k + kk];
      const double* wr = &w[kk * n];
      for (int64_t j = 0; j < n; ++j) row[j] += a * wr[j];
    }
  }
  return y;
}

void LayerNormRows(std::vector<double>& x, int64_t rows, int64_t n, const std::vector<double>& g,
                   const std::vector<double>& b, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    double* v = &x[r * n];
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) mean += v[i];
    mean /= n;
    for (int64_t i = 0; i < n; ++i) var += (v[i] - mean) * (v[i] - mean);
    var /= n;
    const double inv = 1.0 / std::sqrt(var + eps);
    for (int64_t i = 0; i < n; ++i) v[i] = (v[i] - mean) * inv * g[i] + b[i];
  }
}

}  // namespace

HostTensor RandomF32(std::mt19937_64& rng, const Dims& dims, double scale) {
  HostTensor t = std::move(HostTensor::Create(v1::DTYPE_F32, dims)).value();
  std::uniform_real_distribution<float> u(static_cast<float>(-scale), static_cast<float>(scale));
  float* p = t.data_as<float>();
  for (int64_t i = 0; i < t.num_elements(); ++i) p[i] = u(rng);
  return t;
}

std::vector<TensorRef> ParamRefs(const Model& m) {
  std::vector<TensorRef> refs;
  for (const auto& [name, t] : m.params) refs.push_back(TensorRef::Of(name, t));
  return refs;
}

double WorstError(const HostTensor& got, const HostTensor& want, double atol, double rtol) {
  double worst = 0;
  for (int64_t i = 0; i < want.num_elements(); ++i) {
    const double g = got.GetAsDouble(i), w = want.GetAsDouble(i);
    const double e = std::fabs(g - w) / (atol + rtol * std::fabs(w));
    if (!(e <= worst)) worst = std::isnan(e) ? INFINITY : e;
  }
  return worst;
}

Model Mlp(uint64_t seed, const std::vector<int64_t>& widths) {
  std::mt19937_64 rng(seed);
  Model m;
  GraphBuilder g("mlp");
  V h = g.input("x", v1::DTYPE_F32, {std::string("batch"), widths[0]});
  for (size_t i = 1; i < widths.size(); ++i) {
    const std::string w = "w" + std::to_string(i), b = "b" + std::to_string(i);
    const double scale = 1.0 / std::sqrt(static_cast<double>(widths[i - 1]));
    m.params[w] = RandomF32(rng, {widths[i - 1], widths[i]}, scale);
    m.params[b] = RandomF32(rng, {widths[i]}, 0.1);
    h = g.add(g.matmul(h, g.param(w, v1::DTYPE_F32, {widths[i - 1], widths[i]})),
              g.param(b, v1::DTYPE_F32, {widths[i]}));
    if (i + 1 < widths.size()) h = g.relu(h);
    g.named("fc" + std::to_string(i));
  }
  g.output("logits", h);
  m.graph = g.Build();
  return m;
}

HostTensor MlpReference(const Model& m, const HostTensor& x) {
  int64_t rows = x.dims()[0], k = x.dims()[1];
  std::vector<double> h = ToF64(x);
  for (int i = 1;; ++i) {
    auto wi = m.params.find("w" + std::to_string(i));
    if (wi == m.params.end()) break;
    const int64_t n = wi->second.dims()[1];
    h = Linear(h, rows, k, ToF64(wi->second), ToF64(m.params.at("b" + std::to_string(i))), n);
    if (m.params.contains("w" + std::to_string(i + 1))) {
      for (double& v : h) v = std::max(v, 0.0);
    }
    k = n;
  }
  return FromF64(h, {rows, k});
}

namespace {

// Appends one post-LN encoder layer reading x to `g`; its params go to
// m.params named `prefix` + "wq" and so on, drawn from `rng` in a fixed order.
V AddEncoderLayer(GraphBuilder& g, Model& m, std::mt19937_64& rng, const EncoderConfig& c, V x,
                  const std::string& prefix) {
  const int64_t h = c.hidden, dh = c.hidden / c.heads;
  const double ws = 1.0 / std::sqrt(static_cast<double>(h));
  auto param = [&](const std::string& base, const Dims& dims, double scale, double offset = 0.0) {
    HostTensor t = RandomF32(rng, dims, scale);
    if (offset != 0) {
      for (int64_t i = 0; i < t.num_elements(); ++i)
        t.data_as<float>()[i] += static_cast<float>(offset);
    }
    const std::string name = prefix + base;
    m.params[name] = std::move(t);
    return g.param(name, v1::DTYPE_F32, dims);
  };
  auto heads = [&](V t) {
    return g.transpose(g.reshape(t, {-1, c.seq, c.heads, dh}), {0, 2, 1, 3});
  };
  V q = heads(g.add(g.matmul(x, param("wq", {h, h}, ws)), param("bq", {h}, 0.02)));
  V k = heads(g.add(g.matmul(x, param("wk", {h, h}, ws)), param("bk", {h}, 0.02)));
  V v = heads(g.add(g.matmul(x, param("wv", {h, h}, ws)), param("bv", {h}, 0.02)));
  v1::AttentionAttrs attn;
  attn.set_mask(v1::MASK_BIDIRECTIONAL);
  V a = g.attention(q, k, v, attn);
  g.named(prefix + "attention");
  V merged = g.reshape(g.transpose(a, {0, 2, 1, 3}), {-1, c.seq, h});
  V o = g.add(g.matmul(merged, param("wo", {h, h}, ws)), param("bo", {h}, 0.02));
  V h1 =
      g.layer_norm(g.add(o, x), param("ln1_g", {h}, 0.1, 1.0), param("ln1_b", {h}, 0.1), c.epsilon);
  g.named(prefix + "ln1");
  V f = g.gelu(g.add(g.matmul(h1, param("w1", {h, c.ffn}, ws)), param("b1", {c.ffn}, 0.02)));
  V f2 = g.add(g.matmul(f, param("w2", {c.ffn, h}, 1.0 / std::sqrt(static_cast<double>(c.ffn)))),
               param("b2", {h}, 0.02));
  V y = g.layer_norm(g.add(f2, h1), param("ln2_g", {h}, 0.1, 1.0), param("ln2_b", {h}, 0.1),
                     c.epsilon);
  g.named(prefix + "ln2");
  return y;
}

}  // namespace

Model EncoderLayer(const EncoderConfig& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Model m;
  GraphBuilder g("encoder_layer");
  V x = g.input("x", v1::DTYPE_F32, {std::string("batch"), c.seq, c.hidden});
  g.output("y", AddEncoderLayer(g, m, rng, c, x, ""));
  m.graph = g.Build();
  return m;
}

Model EncoderStack(const EncoderConfig& c, int layers, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Model m;
  GraphBuilder g(absl::StrCat("encoder_", layers, "_layers"));
  V y = g.input("x", v1::DTYPE_F32, {std::string("batch"), c.seq, c.hidden});
  for (int l = 0; l < layers; ++l) y = AddEncoderLayer(g, m, rng, c, y, absl::StrCat("l", l, "_"));
  g.output("y", y);
  m.graph = g.Build();
  return m;
}

HostTensor EncoderLayerReference(const Model& m, const EncoderConfig& c, const HostTensor& xt) {
  const int64_t b = xt.dims()[0], s = c.seq, h = c.hidden, nh = c.heads, dh = h / nh, rows = b * s;
  auto P = [&](const char* name) { return ToF64(m.params.at(name)); };
  const std::vector<double> x = ToF64(xt);
  const auto q = Linear(x, rows, h, P("wq"), P("bq"), h);
  const auto k = Linear(x, rows, h, P("wk"), P("bk"), h);
  const auto v = Linear(x, rows, h, P("wv"), P("bv"), h);
  std::vector<double> merged(rows * h, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  std::vector<double> scores(s);
  for (int64_t bb = 0; bb < b; ++bb) {
    for (int64_t head = 0; head < nh; ++head) {
      for (int64_t i = 0; i < s; ++i) {
        const double* qi = &q[(bb * s + i) * h + head * dh];
        double mx = -INFINITY;
        for (int64_t j = 0; j < s; ++j) {
          const double* kj = &k[(bb * s + j) * h + head * dh];
          double dot = 0;
          for (int64_t d = 0; d < dh; ++d) dot += qi[d] * kj[d];
          scores[j] = dot * scale;
          mx = std::max(mx, scores[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < s; ++j) sum += (scores[j] = std::exp(scores[j] - mx));
        double* out = &merged[(bb * s + i) * h + head * dh];
        for (int64_t j = 0; j < s; ++j) {
          const double p = scores[j] / sum;
          const double* vj = &v[(bb * s + j) * h + head * dh];
          for (int64_t d = 0; d < dh; ++d) out[d] += p * vj[d];
        }
      }
    }
  }
  auto o = Linear(merged, rows, h, P("wo"), P("bo"), h);
  for (int64_t i = 0; i < rows * h; ++i) o[i] += x[i];
  LayerNormRows(o, rows, h, P("ln1_g"), P("ln1_b"), c.epsilon);
  auto f = Linear(o, rows, h, P("w1"), P("b1"), c.ffn);
  for (double& t : f) t = 0.5 * t * (1.0 + std::erf(t / std::sqrt(2.0)));
  auto f2 = Linear(f, rows, c.ffn, P("w2"), P("b2"), h);
  for (int64_t i = 0; i < rows * h; ++i) f2[i] += o[i];
  LayerNormRows(f2, rows, h, P("ln2_g"), P("ln2_b"), c.epsilon);
  return FromF64(f2, {b, s, h});
}

v1::Graph MatMulChain(int64_t n, int depth) {
  GraphBuilder g("chain");
  auto x = g.input("x", v1::DTYPE_F32, {n, n});
  auto w = g.input("w", v1::DTYPE_F32, {n, n});
  auto y = x;
  for (int i = 0; i < depth; ++i) y = g.tanh(g.matmul(y, w));
  g.output("y", y);
  return g.Build();
}

}  // namespace kiln::models
