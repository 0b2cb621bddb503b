// Autodiff (engine/passes/autodiff.h) through the whole engine on the CPU:
// every VJP rule against central finite differences of the forward graph, the
// JVP against finite differences along a random tangent, and the vjp/jvp
// inner-product identity <c, J t> = <J^T c, t>, on small random shapes with
// broadcasting and size-1 dims. Cases run in f64 when the CPU runs every op
// of the graph in f64 (budget 1e-6), else in f32 (the CPU's matmul is f32-only;
// the finite differences then take a larger step, budget 5e-3 relative).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "base/status.h"
#include "engine/engine.h"
#include "engine/ir/text.h"

namespace kiln {
namespace {

struct AutodiffCase {
  std::string name;
  std::string text;  // "T" stands for the float dtype
  std::vector<std::string> wrt;
  std::map<std::string, std::pair<double, double>> ranges = {};  // default: |v| in [0.1, 1]
  bool f32_only = false;  // the op computes in f32 whatever the dtype (rope's tables)
};

std::unique_ptr<Engine> MakeAutodiffEngine() {
  EngineOptions o;
  o.calibration = EngineOptions::Calibration::kNever;
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(e).value();
}

Engine& SharedAutodiffEngine() {
  static std::unique_ptr<Engine> engine = MakeAutodiffEngine();
  return *engine;
}

v1::Graph Parse(const std::string& text, DType dt) {
  const std::string s = absl::StrReplaceAll(text, {{"T[", dt == v1::DTYPE_F64 ? "f64[" : "f32["}});
  auto g = ir::ParseGraphProto(s);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << s;
  return g.ok() ? *g : v1::Graph();
}

Dims DimsOf(const v1::TensorType& t) {
  Dims d;
  for (const auto& x : t.dims()) d.push_back(x.size());
  return d;
}

class Harness {
 public:
  explicit Harness(const AutodiffCase& c) : c_(c), rng_(std::hash<std::string>()(c.name)) {}

  // Picks the dtype, makes the inputs; false (with a failure) when the
  // graph does not run at all.
  bool SetUp() {
    for (DType dt : {v1::DTYPE_F64, v1::DTYPE_F32}) {
      if (c_.f32_only && dt == v1::DTYPE_F64) continue;
      dt_ = dt;
      graph_ = Parse(c_.text, dt);
      auto sig = SharedAutodiffEngine().Inspect(graph_);
      if (!sig.ok()) {
        ADD_FAILURE() << sig.status();
        return false;
      }
      inputs_.clear();
      for (const auto& in : sig->inputs) inputs_.emplace(in.name, Random(in.name, in.type));
      // f64 only where the CPU runs the forward and both transforms in f64.
      auto y = Forward(inputs_);
      absl::Status s = y.status();
      for (v1::AutodiffMode mode : {v1::AUTODIFF_VJP, v1::AUTODIFF_JVP}) {
        if (!s.ok()) break;
        CompileOptions co;
        co.device = "cpu:0";
        co.transforms.mutable_autodiff()->set_mode(mode);
        co.transforms.mutable_autodiff()->set_output("y");
        for (const auto& w : c_.wrt) co.transforms.mutable_autodiff()->add_wrt(w);
        s = SharedAutodiffEngine().Compile(graph_, co, {}).status();
      }
      if (s.ok()) {
        y_ = std::move(y).value();
        return true;
      }
      if (dt == v1::DTYPE_F32 || s.code() != absl::StatusCode::kUnimplemented ||
          s.message().find("stage legalize") == std::string::npos) {
        ADD_FAILURE() << s;
        return false;
      }
    }
    return false;
  }

  DType dtype() const { return dt_; }
  double eps() const { return dt_ == v1::DTYPE_F64 ? 1e-6 : 4e-3; }
  double budget() const { return dt_ == v1::DTYPE_F64 ? 1e-6 : 5e-3; }

  HostTensor Random(const std::string& name, const v1::TensorType& t) {
    HostTensor h = HostTensor::Create(t.dtype(), DimsOf(t)).value();
    auto r = c_.ranges.find(name);
    for (int64_t i = 0; i < h.num_elements(); ++i) {
      double v;
      if (r != c_.ranges.end()) {
        v = std::uniform_real_distribution<double>(r->second.first, r->second.second)(rng_);
        if (IsInteger(t.dtype()) || t.dtype() == v1::DTYPE_BOOL) v = std::floor(v);
      } else {
        v = std::uniform_real_distribution<double>(0.1, 1.0)(rng_);
        if (rng_() % 2) v = -v;
      }
      h.SetFromDouble(i, v);
    }
    return h;
  }

  absl::StatusOr<HostTensor> Forward(const std::map<std::string, HostTensor>& in) {
    KILN_ASSIGN_OR_RETURN(RunResult r, Run(graph_, in, {}));
    return std::move(r.outputs[0].second);
  }

  absl::StatusOr<RunResult> Run(const v1::Graph& g, const std::map<std::string, HostTensor>& in,
                                const v1::AutodiffSpec& spec) {
    std::vector<TensorRef> refs;
    for (const auto& [name, t] : in) refs.push_back(TensorRef::Of(name, t));
    CompileOptions co;
    co.device = "cpu:0";
    *co.transforms.mutable_autodiff() = spec;
    return SharedAutodiffEngine().RunGraph(g, refs, nullptr, co, {});
  }

  static double Dot(const HostTensor& a, const HostTensor& b) {
    double s = 0;
    for (int64_t i = 0; i < a.num_elements(); ++i) s += a.GetAsDouble(i) * b.GetAsDouble(i);
    return s;
  }

  static const HostTensor& Output(const RunResult& r, const std::string& name) {
    for (const auto& [n, t] : r.outputs) {
      if (n == name) return t;
    }
    ADD_FAILURE() << "no output " << name;
    static HostTensor none;
    return none;
  }

  void Check() {
    const HostTensor ct = Random("__ct", TypeOf(y_));
    std::map<std::string, HostTensor> with_ct;
    for (const auto& [n, t] : inputs_) with_ct.emplace(n, t.Clone());
    with_ct.emplace("cotangent/y", ct.Clone());
    v1::AutodiffSpec vjp;
    vjp.set_mode(v1::AUTODIFF_VJP);
    vjp.set_output("y");
    for (const auto& w : c_.wrt) vjp.add_wrt(w);
    auto vr = Run(graph_, with_ct, vjp);
    ASSERT_TRUE(vr.ok()) << vr.status();

    // Reverse mode against central differences, element by element.
    for (const std::string& w : c_.wrt) {
      const HostTensor& grad = Output(*vr, "grad/" + w);
      ASSERT_EQ(grad.dims(), inputs_.at(w).dims()) << w;
      for (int64_t i = 0; i < grad.num_elements(); ++i) {
        std::map<std::string, HostTensor> plus, minus;
        for (const auto& [n, t] : inputs_) plus.emplace(n, t.Clone()), minus.emplace(n, t.Clone());
        const double x = inputs_.at(w).GetAsDouble(i);
        plus.at(w).SetFromDouble(i, x + eps());
        minus.at(w).SetFromDouble(i, x - eps());
        auto yp = Forward(plus), ym = Forward(minus);
        ASSERT_TRUE(yp.ok() && ym.ok());
        const double fd = (Dot(ct, *yp) - Dot(ct, *ym)) / (2 * eps());
        const double got = grad.GetAsDouble(i);
        EXPECT_NEAR(got, fd, budget() * std::max(1.0, std::abs(fd)))
            << c_.name << ": d/d" << w << "[" << i << "] (" << DTypeName(dt_) << ")";
      }
    }

    // Forward mode along a random tangent, and the inner-product identity.
    v1::AutodiffSpec jvp = vjp;
    jvp.set_mode(v1::AUTODIFF_JVP);
    std::map<std::string, HostTensor> with_t, plus, minus;
    for (const auto& [n, t] : inputs_) {
      with_t.emplace(n, t.Clone()), plus.emplace(n, t.Clone()), minus.emplace(n, t.Clone());
    }
    double rhs = 0;
    for (const std::string& w : c_.wrt) {
      HostTensor t = Random("__t", TypeOf(inputs_.at(w)));
      for (int64_t i = 0; i < t.num_elements(); ++i) {
        const double x = inputs_.at(w).GetAsDouble(i), d = t.GetAsDouble(i);
        plus.at(w).SetFromDouble(i, x + eps() * d);
        minus.at(w).SetFromDouble(i, x - eps() * d);
      }
      rhs += Dot(Output(*vr, "grad/" + w), t);
      with_t.emplace("tangent/" + w, std::move(t));
    }
    auto jr = Run(graph_, with_t, jvp);
    ASSERT_TRUE(jr.ok()) << jr.status();
    const HostTensor& ty = Output(*jr, "tangent/y");
    ASSERT_EQ(ty.dims(), y_.dims());
    auto yp = Forward(plus), ym = Forward(minus);
    ASSERT_TRUE(yp.ok() && ym.ok());
    for (int64_t i = 0; i < ty.num_elements(); ++i) {
      const double fd = (yp->GetAsDouble(i) - ym->GetAsDouble(i)) / (2 * eps());
      EXPECT_NEAR(ty.GetAsDouble(i), fd, budget() * std::max(1.0, std::abs(fd)))
          << c_.name << ": tangent/y[" << i << "] (" << DTypeName(dt_) << ")";
    }
    const double lhs = Dot(ct, ty);
    const double ip_budget = dt_ == v1::DTYPE_F64 ? 1e-10 : 1e-4;
    EXPECT_NEAR(lhs, rhs, ip_budget * std::max(1.0, std::abs(lhs)))
        << c_.name << ": <c, J t> vs <J^T c, t>";
  }

 private:
  static v1::TensorType TypeOf(const HostTensor& t) {
    v1::TensorType out;
    out.set_dtype(t.dtype());
    for (int64_t d : t.dims()) out.add_dims()->set_size(d);
    return out;
  }

  const AutodiffCase& c_;
  std::mt19937_64 rng_;
  DType dt_ = v1::DTYPE_F64;
  v1::Graph graph_;
  std::map<std::string, HostTensor> inputs_;
  HostTensor y_;
};

std::string Unary(const std::string& op) {
  return "graph \"u\"\ninput x: T[2, 3]\nlet y = " + op + "(x)\nout y\n";
}

std::vector<AutodiffCase> Cases() {
  std::vector<AutodiffCase> cases;
  for (const char* op :
       {"identity", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "exp", "neg", "abs",
        "sin", "cos", "erf", "floor", "ceil", "round", "sign", "reciprocal", "softplus"}) {
    cases.push_back({std::string("unary_") + op, Unary(op), {"x"}});
  }
  for (const char* op : {"log", "sqrt", "rsqrt"}) {
    cases.push_back({std::string("unary_") + op, Unary(op), {"x"}, {{"x", {0.2, 2.0}}}});
  }
  // Binary ops with broadcasting (a [2, 1, 3] against b [4, 1]) and size-1 dims.
  for (const char* op : {"add", "sub", "mul", "div", "max", "min"}) {
    cases.push_back({std::string("binary_") + op,
                     std::string("graph \"b\"\ninput a: T[2, 1, 3]\ninput b: T[4, 1]\nlet y = ") +
                         op + "(a, b)\nout y\n",
                     {"a", "b"}});
  }
  cases.push_back({"binary_pow",
                   "graph \"p\"\ninput a: T[2, 3]\ninput b: T[3]\nlet y = pow(a, b)\nout y\n",
                   {"a", "b"},
                   {{"a", {0.3, 2.0}}, {"b", {-1.5, 2.0}}}});
  cases.push_back({"where_compare",
                   "graph \"w\"\ninput a: T[2, 3]\ninput b: T[3]\nlet c = gt(a, b)\n"
                   "let y = where(c, a * a, b)\nout y\n",
                   {"a", "b"}});
  cases.push_back(
      {"cast_clamp",
       "graph \"c\"\ninput x: T[2, 4]\nlet y = clamp(x, min=-0.5, max=0.6) * 3.0\nout y\n",
       {"x"}});
  cases.push_back({"matmul",
                   "graph \"m\"\ninput a: T[3, 4]\ninput b: T[4, 2]\nlet y = a @ b\nout y\n",
                   {"a", "b"}});
  cases.push_back({"matmul_batch_broadcast",
                   "graph \"m\"\ninput a: T[2, 1, 3, 4]\ninput b: T[3, 2, 4]\n"
                   "let y = matmul(a, b, transpose_b=true)\nout y\n",
                   {"a", "b"}});
  // A batched x with a shared (rank-2) weight: dW is one product over the
  // flattened batch rows (MatMulVjp), plain and with transpose_b.
  cases.push_back({"matmul_shared_weight",
                   "graph \"m\"\ninput a: T[2, 3, 5, 4]\ninput b: T[4, 3]\ninput c: T[3, 4]\n"
                   "let y = (a @ b) + matmul(a, c, transpose_b=true)\nout y\n",
                   {"a", "b", "c"}});
  cases.push_back({"matmul_transpose_a_vector",
                   "graph \"m\"\ninput a: T[4, 3]\ninput v: T[4]\n"
                   "let y = matmul(a, v, transpose_a=true) + matmul(v, a)\nout y\n",
                   {"a", "v"}});
  cases.push_back({"dot_general",
                   "graph \"d\"\ninput a: T[2, 3, 4]\ninput b: T[2, 4, 5]\n"
                   "let y = dot_general(a, b, lhs_contracting=[2], rhs_contracting=[1], "
                   "lhs_batch=[0], rhs_batch=[0])\nout y\n",
                   {"a", "b"}});
  cases.push_back({"reshape_transpose",
                   "graph \"r\"\ninput x: T[2, 3, 4]\n"
                   "let y = transpose(reshape(x, shape=[6, 4]), perm=[1, 0]) * 2.0\nout y\n",
                   {"x"}});
  cases.push_back({"slice_steps",
                   "graph \"s\"\ninput x: T[5, 7]\n"
                   "let y = slice(x, start=[1, -6], stop=[5, 7], step=[2, 3])\nout y\n",
                   {"x"}});
  cases.push_back({"concat",
                   "graph \"c\"\ninput a: T[2, 3]\ninput b: T[2, 1]\n"
                   "let y = concat(a, b * b, axis=1)\nout y\n",
                   {"a", "b"}});
  cases.push_back({"expand",
                   "graph \"e\"\ninput x: T[3, 1]\n"
                   "let y = expand(x, shape=[2, 3, 4])\nout y\n",
                   {"x"}});
  cases.push_back({"pad",
                   "graph \"p\"\ninput x: T[2, 3]\n"
                   "let y = pad(x, low=[1, 0], high=[0, 2], value=0.5)\nout y\n",
                   {"x"}});
  cases.push_back({"pad_edge",
                   "graph \"p\"\ninput x: T[3, 4]\n"
                   "let y = pad(x, low=[2, 0], high=[1, 3], mode=edge)\nout y\n",
                   {"x"}});
  cases.push_back({"pad_reflect",
                   "graph \"p\"\ninput x: T[4, 5]\n"
                   "let y = pad(x, low=[1, 3], high=[2, 1], mode=reflect)\nout y\n",
                   {"x"}});
  cases.push_back({"gather",
                   "graph \"g\"\ninput x: T[4, 3]\ninput i: i64[2, 2]\n"
                   "let y = gather(x, i, axis=0)\nout y\n",
                   {"x"},
                   {{"i", {-4, 4}}}});
  cases.push_back({"gather_axis1",
                   "graph \"g\"\ninput x: T[2, 5, 2]\ninput i: i32[3]\n"
                   "let y = gather(x, i, axis=1)\nout y\n",
                   {"x"},
                   {{"i", {0, 5}}}});
  for (const char* kind : {"sum", "mean", "max", "min"}) {
    cases.push_back({std::string("reduce_") + kind,
                     std::string("graph \"r\"\ninput x: T[2, 3, 4]\nlet y = reduce_") + kind +
                         "(x, axes=[0, 2], keepdims=false)\nout y\n",
                     {"x"}});
  }
  cases.push_back({"reduce_prod",
                   "graph \"r\"\ninput x: T[3, 4]\nlet y = reduce_prod(x, axes=[1])\nout y\n",
                   {"x"}});
  // Rows with no zero, one zero and two zeros (x * (x > c) zeroes some).
  cases.push_back({"reduce_prod_zeros",
                   "graph \"r\"\ninput x: T[3, 3]\nconst m: T[3, 3] = [1, 1, 1, 1, 0, 1, 0, 1, 0]\n"
                   "let y = reduce_prod(x * m, axes=[1], keepdims=true)\nout y\n",
                   {"x"}});
  cases.push_back({"reduce_all_keepdims",
                   "graph \"r\"\ninput x: T[3, 4]\n"
                   "let y = reduce_sum(x * x, keepdims=true)\nout y\n",
                   {"x"}});
  cases.push_back(
      {"softmax", "graph \"s\"\ninput x: T[3, 4]\nlet y = softmax(x, axis=0)\nout y\n", {"x"}});
  cases.push_back({"log_softmax",
                   "graph \"s\"\ninput x: T[3, 4]\nlet y = log_softmax(x, axis=-1)\nout y\n",
                   {"x"}});
  cases.push_back({"layer_norm",
                   "graph \"l\"\ninput x: T[3, 4]\ninput s: T[4]\ninput b: T[4]\n"
                   "let y = layer_norm(x, s, b)\nout y\n",
                   {"x", "s", "b"}});
  cases.push_back({"rms_norm",
                   "graph \"l\"\ninput x: T[2, 1, 5]\ninput s: T[5]\n"
                   "let y = rms_norm(x, s)\nout y\n",
                   {"x", "s"}});
  cases.push_back({"softmax_cross_entropy",
                   "graph \"x\"\ninput z: T[4, 3]\ninput l: i64[4]\n"
                   "let y = softmax_cross_entropy(z, l, label_smoothing=0.1)\nout y\n",
                   {"z"},
                   {{"l", {0, 3}}}});
  cases.push_back({"softmax_cross_entropy_ignore_none",
                   "graph \"x\"\ninput z: T[2, 2, 3]\ninput l: i32[2, 2]\n"
                   "let y = softmax_cross_entropy(z, l, reduction=none, ignore_index=1)\nout y\n",
                   {"z"},
                   {{"l", {0, 3}}}});
  cases.push_back({"softmax_cross_entropy_probs",
                   "graph \"x\"\ninput z: T[3, 4]\ninput q: T[3, 4]\n"
                   "let y = softmax_cross_entropy(z, softmax(q), reduction=sum)\nout y\n",
                   {"z", "q"}});
  cases.push_back({"mean_squared_error",
                   "graph \"m\"\ninput p: T[3, 4]\ninput t: T[4]\n"
                   "let y = mean_squared_error(p, t)\nout y\n",
                   {"p", "t"}});
  cases.push_back({"mean_squared_error_none",
                   "graph \"m\"\ninput p: T[2, 3]\ninput t: T[2, 3]\n"
                   "let y = mean_squared_error(p, t, reduction=none)\nout y\n",
                   {"p", "t"}});
  cases.push_back(
      {"cumsum",
       "graph \"c\"\ninput x: T[3, 4]\n"
       "let y = cumsum(x, axis=1, exclusive=true) + cumsum(x, axis=0, reverse=true)\nout y\n",
       {"x"}});
  for (const char* mask : {"none", "causal", "sliding_window, window=2", "prefix, prefix=2"}) {
    cases.push_back(
        {std::string("attention_") + std::string(mask).substr(0, std::string(mask).find(',')),
         std::string("graph \"a\"\ninput q: T[1, 2, 3, 4]\ninput k: T[1, 1, 3, 4]\n"
                     "input v: T[1, 1, 3, 4]\nlet y = attention(q, k, v, mask=") +
             mask + ")\nout y\n",
         {"q", "k", "v"}});
  }
  cases.push_back(
      {"conv1d_stride_dilation_padding",
       "graph \"c\"\ninput x: T[2, 2, 9]\ninput w: T[3, 2, 3]\n"
       "let y = conv(x, w, stride=[2], dilation=[2], pad_low=[1], pad_high=[2])\nout y\n",
       {"x", "w"}});
  cases.push_back({"conv2d_bias_strides",
                   "graph \"c\"\ninput x: T[1, 2, 5, 4]\ninput w: T[3, 2, 2, 3]\ninput b: T[3]\n"
                   "let y = conv(x, w, b, stride=[2, 1], pad_low=[1, 0], pad_high=[0, 1])\nout y\n",
                   {"x", "w", "b"}});
  cases.push_back({"conv2d_groups",
                   "graph \"c\"\ninput x: T[2, 4, 4, 4]\ninput w: T[6, 2, 3, 3]\n"
                   "let y = conv(x, w, groups=2, pad_low=[1, 1], pad_high=[1, 1])\nout y\n",
                   {"x", "w"}});
  // A 2-D conv's input gradient is a conv_transpose2d: with an output
  // padding (rows the stride skipped at the end) and dilation.
  cases.push_back({"conv2d_stride_dilation_output_padding",
                   "graph \"c\"\ninput x: T[1, 2, 7, 5]\ninput w: T[3, 2, 3, 2]\n"
                   "let y = conv(x, w, stride=[2, 2], dilation=[2, 1], pad_low=[1, 0])\nout y\n",
                   {"x", "w"}});
  cases.push_back({"conv_transpose2d_groups_bias_output_padding",
                   "graph \"c\"\ninput x: T[1, 4, 3, 3]\ninput w: T[4, 3, 3, 2]\ninput b: T[6]\n"
                   "let y = conv_transpose2d(x, w, b, stride=[2, 1], pad_low=[1, 0], "
                   "pad_high=[0, 1], output_padding=[1, 0], groups=2)\nout y\n",
                   {"x", "w", "b"}});
  cases.push_back(
      {"max_pool_tiles_crop",
       "graph \"p\"\ninput x: T[2, 2, 5, 4]\nlet y = max_pool(x, window=[2, 2])\nout y\n",
       {"x"}});
  cases.push_back(
      {"max_pool_overlapping_padding",
       "graph \"p\"\ninput x: T[1, 2, 5, 5]\n"
       "let y = max_pool(x, window=[3, 2], stride=[2, 1], pad_low=[1, 0], pad_high=[1, 1])\n"
       "out y\n",
       {"x"}});
  cases.push_back(
      {"max_pool_1d_overlapping",
       "graph \"p\"\ninput x: T[2, 1, 7]\nlet y = max_pool(x, window=[3], stride=[2])\nout y\n",
       {"x"}});
  cases.push_back({"max_pool_1d",
                   "graph \"p\"\ninput x: T[1, 3, 6]\nlet y = max_pool(x, window=[3])\nout y\n",
                   {"x"}});
  cases.push_back(
      {"avg_pool_overlapping_padding",
       "graph \"p\"\ninput x: T[1, 2, 5, 5]\n"
       "let y = avg_pool(x, window=[3, 2], stride=[2, 1], pad_low=[1, 0], pad_high=[1, 1])\n"
       "out y\n",
       {"x"}});
  cases.push_back({"avg_pool_exclude_pad",
                   "graph \"p\"\ninput x: T[2, 1, 6]\n"
                   "let y = avg_pool(x, window=[3], stride=[2], pad_low=[1], pad_high=[1], "
                   "count_include_pad=false)\nout y\n",
                   {"x"}});
  cases.push_back({"attention_custom_mask_softcap",
                   "graph \"a\"\ninput q: T[1, 2, 3, 4]\ninput k: T[1, 2, 4, 4]\n"
                   "input v: T[1, 2, 4, 4]\ninput m: bool[1, 3, 4]\n"
                   "let y = attention(q, k, v, m, mask=custom, softcap=2.5, scale=0.7)\nout y\n",
                   {"q", "k", "v"},
                   {{"m", {0.0, 1.999}}}});
  cases.push_back({"attention_bias",
                   "graph \"a\"\ninput q: T[1, 2, 3, 4]\ninput k: T[1, 1, 3, 4]\n"
                   "input v: T[1, 1, 3, 4]\ninput bias: T[1, 2, 3, 3]\n"
                   "let y = attention(q, k, v, bias, mask=bias)\nout y\n",
                   {"q", "k", "v", "bias"}});
  cases.push_back({"group_norm",
                   "graph \"g\"\ninput x: T[2, 4, 3]\ninput s: T[4]\ninput b: T[4]\n"
                   "let y = group_norm(x, s, b, groups=2, epsilon=0.01)\nout y\n",
                   {"x", "s", "b"}});
  AutodiffCase rope{
      "rope",
      "graph \"r\"\ninput x: T[1, 2, 3, 6]\nlet y = rope(x, rotary_dim=4, position_offset=2)\n"
      "out y\n",
      {"x"}};
  rope.f32_only = true;
  cases.push_back(rope);
  AutodiffCase rope_positions{"rope_positions_interleaved",
                              "graph \"r\"\ninput x: T[2, 1, 3, 4]\ninput p: i32[2, 3]\n"
                              "let y = rope(x, p, interleaved=true, theta=100)\nout y\n",
                              {"x"},
                              {{"p", {-3, 9}}}};
  rope_positions.f32_only = true;
  cases.push_back(rope_positions);
  cases.push_back(
      {"mlp_fan_out",
       "graph \"mlp\"\ninput x: T[3, 4]\ninput w1: T[4, 5]\ninput b1: T[5]\n"
       "input w2: T[5, 2]\nlet h = tanh(x @ w1 + b1)\nlet y = (h @ w2) * reduce_mean(h)\nout y\n",
       {"w1", "b1", "w2", "x"}});
  return cases;
}

void PrintTo(const AutodiffCase& c, std::ostream* os) { *os << c.name; }

class AutodiffRule : public ::testing::TestWithParam<AutodiffCase> {};

TEST_P(AutodiffRule, MatchesFiniteDifferences) {
  Harness h(GetParam());
  if (!h.SetUp()) return;
  RecordProperty("dtype", DTypeName(h.dtype()));
  h.Check();
}

INSTANTIATE_TEST_SUITE_P(Rules, AutodiffRule, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<AutodiffCase>& i) {
                           return i.param.name;
                         });

absl::Status CompileWith(const std::string& text, const v1::TransformSpec& spec) {
  auto g = ir::ParseGraphProto(text);
  if (!g.ok()) return g.status();
  CompileOptions co;
  co.device = "cpu:0";
  co.transforms = spec;
  return SharedAutodiffEngine().Compile(*g, co, {}).status();
}

v1::TransformSpec Grad(const std::string& output, std::vector<std::string> wrt) {
  v1::TransformSpec s;
  s.mutable_autodiff()->set_mode(v1::AUTODIFF_GRAD);
  s.mutable_autodiff()->set_output(output);
  for (auto& w : wrt) s.mutable_autodiff()->add_wrt(w);
  return s;
}

TEST(Autodiff, NonDifferentiableNodeIsNamed) {
  const std::string text =
      "graph \"nd\"\ninput x: f32[1, 1, 4, 4]\nparam w: f32[1, 1, 4, 4]\n"
      "let (c, ci) = topk(x * w, k=2)\nlet y = reduce_sum(c)\nout y\n";
  absl::Status s = CompileWith(text, Grad("y", {"w"}));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("(topk)"), std::string::npos) << s;
  EXPECT_NE(s.message().find("is not differentiable"), std::string::npos) << s;
}

TEST(Autodiff, BadRequestsAreNamed) {
  const std::string text =
      "graph \"b\"\ninput x: f32[2]\ninput i: i64[2]\nparam w: f32[2]\n"
      "let v = x * w\nlet y = reduce_sum(v)\nout y\nout v\n";
  absl::Status s = CompileWith(text, Grad("y", {"nope"}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("\"nope\""), std::string::npos) << s;
  s = CompileWith(text, Grad("v", {"w"}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("must be a scalar"), std::string::npos) << s;
  s = CompileWith(text, Grad("y", {"i"}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not a float"), std::string::npos) << s;
  s = CompileWith(text, Grad("missing", {"w"}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("no output named \"missing\""), std::string::npos) << s;
}

TEST(Autodiff, GradWithLossAndTheKeyDiffers) {
  const std::string text =
      "graph \"g\"\ninput x: f32[3]\nparam w: f32[3]\nlet y = reduce_sum(x * w * w)\nout y\n";
  auto g = ir::ParseGraphProto(text).value();
  CompileOptions plain;
  plain.device = "cpu:0";
  CompileOptions co = plain;
  co.transforms = Grad("y", {"w"});
  co.transforms.mutable_autodiff()->set_mode(v1::AUTODIFF_GRAD_WITH_LOSS);
  auto a = SharedAutodiffEngine().Compile(g, plain, {});
  auto b = SharedAutodiffEngine().Compile(g, co, {});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->executable->key(), b->executable->key());
  HostTensor x = HostTensor::FromVector<float>(v1::DTYPE_F32, {3}, {1, 2, 3});
  HostTensor w = HostTensor::FromVector<float>(v1::DTYPE_F32, {3}, {0.5, -1, 2});
  std::vector<TensorRef> params = {TensorRef::Of("w", w)};
  auto ps = SharedAutodiffEngine().CreateParams(params);
  ASSERT_TRUE(ps.ok());
  std::vector<TensorRef> in = {TensorRef::Of("x", x)};
  auto r = SharedAutodiffEngine().Run(*b->executable, in, ps->get(), {});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->outputs.size(), 2u);
  EXPECT_EQ(r->outputs[0].first, "y");
  EXPECT_FLOAT_EQ(r->outputs[0].second.GetAsDouble(0), 0.25 + 2 + 12);
  EXPECT_EQ(r->outputs[1].first, "grad/w");
  EXPECT_FLOAT_EQ(r->outputs[1].second.GetAsDouble(0), 1.0);  // 2 x w
  EXPECT_FLOAT_EQ(r->outputs[1].second.GetAsDouble(1), -4.0);
  EXPECT_FLOAT_EQ(r->outputs[1].second.GetAsDouble(2), 12.0);
}

// GroupNorm (the CPU's native kernel, f64): the values of a hand-computed
// case.
// The weight gradient of a batched x @ W (every linear layer of a
// transformer) is one product over the batch's rows, x[-1, K]^T @ g[-1, N]:
// no batched [B, K, N] product and no reduction over B (what the char GPT's
// step ran, 12 times, on every device). Checked in the kernels run and
// against the f64 sum.
TEST(Autodiff, SharedWeightGradientIsOneProductOverTheBatch) {
  const std::string text =
      "graph \"w\"\ninput x: f32[8, 6, 4]\ninput w: f32[4, 3]\nlet y = x @ w\nout y\n";
  auto g = ir::ParseGraphProto(text);
  ASSERT_TRUE(g.ok()) << g.status();
  std::vector<float> xs(8 * 6 * 4), cs(8 * 6 * 3), ws(4 * 3, 0.5f);
  for (size_t i = 0; i < xs.size(); ++i)
    xs[i] = static_cast<float>(static_cast<int>(i % 7) - 3) / 4;
  for (size_t i = 0; i < cs.size(); ++i)
    cs[i] = static_cast<float>(static_cast<int>(i % 5) - 2) / 2;
  HostTensor x = HostTensor::FromVector<float>(v1::DTYPE_F32, {8, 6, 4}, xs);
  HostTensor w = HostTensor::FromVector<float>(v1::DTYPE_F32, {4, 3}, ws);
  HostTensor c = HostTensor::FromVector<float>(v1::DTYPE_F32, {8, 6, 3}, cs);
  std::vector<TensorRef> in = {TensorRef::Of("x", x), TensorRef::Of("w", w),
                               TensorRef::Of("cotangent/y", c)};
  CompileOptions co;
  co.device = "cpu:0";
  co.transforms.mutable_autodiff()->set_mode(v1::AUTODIFF_VJP);
  co.transforms.mutable_autodiff()->set_output("y");
  co.transforms.mutable_autodiff()->add_wrt("w");
  RunOptions ro;
  ro.report = true;
  auto r = SharedAutodiffEngine().RunGraph(*g, in, nullptr, co, ro);
  ASSERT_TRUE(r.ok()) << r.status();
  std::string kernels;
  for (const auto& st : r->report.steps()) absl::StrAppend(&kernels, st.implementation(), ";");
  EXPECT_EQ(kernels.find("reduce"), std::string::npos) << kernels;
  const HostTensor* dw = nullptr;
  for (const auto& [n, t] : r->outputs) {
    if (n == "grad/w") dw = &t;
  }
  ASSERT_NE(dw, nullptr);
  ASSERT_EQ(dw->dims(), (Dims{4, 3}));
  for (int64_t k = 0; k < 4; ++k) {
    for (int64_t j = 0; j < 3; ++j) {
      double want = 0;
      for (int64_t row = 0; row < 48; ++row) want += double{xs[row * 4 + k]} * cs[row * 3 + j];
      EXPECT_NEAR(dw->GetAsDouble(k * 3 + j), want, 1e-5) << k << ", " << j;
    }
  }
}

TEST(Autodiff, GroupNormDecompositionComputesGroupNorm) {
  auto g = ir::ParseGraphProto(
               "graph \"gn\"\ninput x: f64[1, 4, 2]\ninput s: f64[4]\ninput b: f64[4]\n"
               "let y = group_norm(x, s, b, groups=2, epsilon=1e-12)\nout y\n")
               .value();
  HostTensor x =
      HostTensor::FromVector<double>(v1::DTYPE_F64, {1, 4, 2}, {1, 2, 3, 4, 10, 10, 20, 20});
  HostTensor s = HostTensor::FromVector<double>(v1::DTYPE_F64, {4}, {1, 2, 1, -1});
  HostTensor b = HostTensor::FromVector<double>(v1::DTYPE_F64, {4}, {0, 0, 5, 5});
  std::vector<TensorRef> in = {TensorRef::Of("x", x), TensorRef::Of("s", s), TensorRef::Of("b", b)};
  CompileOptions co;
  co.device = "cpu:0";
  auto r = SharedAutodiffEngine().RunGraph(g, in, nullptr, co, {});
  ASSERT_TRUE(r.ok()) << r.status();
  // Group 0 holds 1, 2, 3, 4 (mean 2.5, variance 1.25); group 1 holds 10, 10,
  // 20, 20 (mean 15, variance 25): channel 2 is -1 + 5, channel 3 is -(1) + 5.
  const double a = 1 / std::sqrt(1.25);
  const std::vector<double> want = {-1.5 * a, -0.5 * a, 2 * 0.5 * a, 2 * 1.5 * a, 4, 4, 4, 4};
  const HostTensor& y = r->outputs[0].second;
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(y.GetAsDouble(i), want[i], 1e-9) << i;
}

// Max pool at ties: the first maximum of each window (row-major) takes the
// whole cotangent, as torch's max_pool2d backward does, in the tiling path
// and in the general (padded) one, here over the same four 2 x 2 windows.
TEST(Autodiff, MaxPoolTiesGoToTheFirstMaximum) {
  // Window (0, 0) has 5 at (0, 1) and (1, 0); window (0, 1) is all 2; window
  // (1, 0) has 7 at (3, 0) and (3, 1); window (1, 1) has no tie.
  HostTensor x = HostTensor::FromVector<float>(
      v1::DTYPE_F32, {1, 1, 4, 4}, {1, 5, 2, 2, 5, 0, 2, 2, 3, 1, 4, 9, 7, 7, 8, 6});
  HostTensor c = HostTensor::FromVector<float>(v1::DTYPE_F32, {1, 1, 2, 2}, {1, 2, 3, 4});
  std::vector<TensorRef> in = {TensorRef::Of("x", x), TensorRef::Of("c", c)};
  const std::vector<double> want = {0, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 4, 3, 0, 0, 0};
  for (const char* pool : {"max_pool(x, window=[2, 2])",
                           "max_pool(x, window=[2, 2], stride=[2, 2], pad_high=[1, 1])"}) {
    auto g = ir::ParseGraphProto(
        absl::StrCat("graph \"t\"\ninput x: f32[1, 1, 4, 4]\ninput c: f32[1, 1, 2, 2]\nlet y = ",
                     pool, "\nlet loss = reduce_sum(y * c)\nout loss\n"));
    ASSERT_TRUE(g.ok()) << g.status();
    CompileOptions co;
    co.device = "cpu:0";
    co.transforms = Grad("loss", {"x"});
    auto r = SharedAutodiffEngine().RunGraph(*g, in, nullptr, co, {});
    ASSERT_TRUE(r.ok()) << r.status();
    const HostTensor& dx = r->outputs[0].second;
    ASSERT_EQ(dx.num_elements(), 16) << pool;
    for (int i = 0; i < 16; ++i) EXPECT_EQ(dx.GetAsDouble(i), want[i]) << pool << " at " << i;
  }
}

// hvp (forward over reverse) against central differences of the gradient.
TEST(Autodiff, HvpMatchesFiniteDifferencesOfTheGradient) {
  const std::string text =
      "graph \"h\"\ninput x: f64[3, 2]\ninput w: f64[2]\n"
      "let y = reduce_sum(tanh(x * w) * exp(w))\nout y\n";
  auto g = ir::ParseGraphProto(text).value();
  HostTensor x =
      HostTensor::FromVector<double>(v1::DTYPE_F64, {3, 2}, {0.3, -0.7, 1.1, 0.2, -0.4, 0.9});
  HostTensor w = HostTensor::FromVector<double>(v1::DTYPE_F64, {2}, {0.5, -0.8});
  HostTensor v = HostTensor::FromVector<double>(v1::DTYPE_F64, {2}, {0.6, 1.3});
  CompileOptions co;
  co.device = "cpu:0";
  co.transforms = Grad("y", {"w"});
  co.transforms.mutable_autodiff()->set_mode(v1::AUTODIFF_HVP);
  std::vector<TensorRef> in = {TensorRef::Of("x", x), TensorRef::Of("w", w),
                               TensorRef::Of("tangent/w", v)};
  auto r = SharedAutodiffEngine().RunGraph(g, in, nullptr, co, {});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->outputs.size(), 3u);
  EXPECT_EQ(r->outputs[2].first, "hvp/w");
  const double eps = 1e-6;
  auto grad_at = [&](double sign) {
    HostTensor ws = w.Clone();
    for (int i = 0; i < 2; ++i)
      ws.SetFromDouble(i, w.GetAsDouble(i) + sign * eps * v.GetAsDouble(i));
    CompileOptions gco = co;
    gco.transforms = Grad("y", {"w"});
    std::vector<TensorRef> gin = {TensorRef::Of("x", x), TensorRef::Of("w", ws)};
    return SharedAutodiffEngine()
        .RunGraph(g, gin, nullptr, gco, {})
        .value()
        .outputs[0]
        .second.Clone();
  };
  HostTensor gp = grad_at(1), gm = grad_at(-1);
  for (int i = 0; i < 2; ++i) {
    const double fd = (gp.GetAsDouble(i) - gm.GetAsDouble(i)) / (2 * eps);
    EXPECT_NEAR(r->outputs[2].second.GetAsDouble(i), fd, 1e-6 * std::max(1.0, std::abs(fd)));
  }
}

}  // namespace
}  // namespace kiln
