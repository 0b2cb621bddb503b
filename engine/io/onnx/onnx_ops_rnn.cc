// ONNX LSTM, GRU and RNN, decomposed onto a Kiln Scan over time: the input
// projection X W^T (+ biases) is one MatMul over every step before the scan;
// the body does the recurrent MatMul and the gates. Forward, reverse and
// bidirectional (one scan per direction over that direction's slice of W, R,
// B, the initial states and peepholes, the outputs concatenated along the
// direction axis), both layouts, initial states, LSTM peepholes and GRU's
// linear_before_reset, the activations ONNX lists for them (the
// `activations` attribute with activation_alpha / activation_beta), LSTM's
// input_forget (f = 1 - i) and `clip` (every activation's input clamped to
// [-clip, clip], as ONNX Runtime: the gates and, for LSTM's h, a clamped copy
// of the cell state). sequence_lens known
// at import: a row's steps past its length keep its state and give Y zeros
// (an import-time mask scanned beside X; the reverse direction then starts at
// the row's last step).
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/checked_int.h"
#include "base/status.h"
#include "engine/io/onnx/onnx_internal.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // see onnx_ops_control.cc
#endif

namespace kiln::io::onnx_internal {
namespace {

// Builds the scan body: nodes added to `g`, each inferred at once.
// One of ONNX's RNN activation functions with its alpha and beta.
struct Activation {
  std::string name;
  float alpha = 0, beta = 0;
};

class Body {
 public:
  // clip > 0: activation inputs are clamped to [-clip, clip]; 0: no clip.
  Body(ir::Graph& g, const Importer& c, double clip) : g_(g), c_(c), clip_(clip) {}

  absl::StatusOr<ValueRef> Input(const std::string& name, const TensorType& t) {
    auto n = std::make_unique<ir::Node>();
    n->op = v1::OP_INPUT;
    n->name = name;
    n->attrs.mutable_input();
    n->outputs.push_back(t);
    KILN_RETURN_IF_ERROR(ir::InferNode(g_, *n, c_.options().limits));
    return g_.AddNode(std::move(n))->out();
  }
  absl::StatusOr<ValueRef> Unary(v1::UnaryKind k, ValueRef x) {
    v1::Attrs a;
    a.mutable_unary()->set_kind(k);
    return EmitIn(g_, c_, v1::OP_UNARY, {x}, a);
  }
  absl::StatusOr<ValueRef> Binary(v1::BinaryKind k, ValueRef x, ValueRef y) {
    v1::Attrs a;
    a.mutable_binary()->set_kind(k);
    return EmitIn(g_, c_, v1::OP_BINARY, {x, y}, a);
  }
  absl::StatusOr<ValueRef> Where(ValueRef cond, ValueRef x, ValueRef y) {
    v1::Attrs a;
    a.mutable_where();
    return EmitIn(g_, c_, v1::OP_WHERE, {cond, x, y}, a);
  }
  absl::StatusOr<ValueRef> MatMulT(ValueRef x, ValueRef w) {  // x @ w^T
    v1::Attrs a;
    a.mutable_matmul()->set_transpose_b(true);
    return EmitIn(g_, c_, v1::OP_MATMUL, {x, w}, a);
  }
  // x[..., k*h : (k+1)*h] along `axis`.
  absl::StatusOr<ValueRef> Part(ValueRef x, int64_t axis, int64_t k, int64_t h) {
    v1::Attrs a;
    a.mutable_slice()->add_start(k * h);
    a.mutable_slice()->add_stop((k + 1) * h);
    a.mutable_slice()->add_axes(axis);
    return EmitIn(g_, c_, v1::OP_SLICE, {x}, a);
  }
  absl::StatusOr<ValueRef> One(DType dt) { return Scalar(dt, 1.0); }
  absl::StatusOr<ValueRef> Scalar(DType dt, double v) {
    KILN_ASSIGN_OR_RETURN(HostTensor t, HostTensor::Create(dt, {}));
    t.SetFromDouble(0, v);
    auto n = std::make_unique<ir::Node>();
    n->op = v1::OP_CONSTANT;
    n->attrs.mutable_constant();
    n->value = std::make_shared<const HostTensor>(std::move(t));
    KILN_RETURN_IF_ERROR(ir::InferNode(g_, *n, c_.options().limits));
    return g_.AddNode(std::move(n))->out();
  }

  // a(x), x of dtype dt.
  absl::StatusOr<ValueRef> Act(const Activation& a, DType dt, ValueRef x) {
    if (clip_ > 0) {
      KILN_ASSIGN_OR_RETURN(ValueRef lo, Scalar(dt, -clip_));
      KILN_ASSIGN_OR_RETURN(ValueRef hi, Scalar(dt, clip_));
      KILN_ASSIGN_OR_RETURN(x, Binary(v1::BINARY_MAX, x, lo));
      KILN_ASSIGN_OR_RETURN(x, Binary(v1::BINARY_MIN, x, hi));
    }
    const std::string& n = a.name;
    if (n == "Sigmoid") return Unary(v1::UNARY_SIGMOID, x);
    if (n == "Tanh") return Unary(v1::UNARY_TANH, x);
    if (n == "Relu") return Unary(v1::UNARY_RELU, x);
    if (n == "Softplus") return Unary(v1::UNARY_SOFTPLUS, x);
    if (n == "Softsign") {  // x / (1 + |x|)
      KILN_ASSIGN_OR_RETURN(ValueRef ax, Unary(v1::UNARY_ABS, x));
      KILN_ASSIGN_OR_RETURN(ValueRef one, One(dt));
      KILN_ASSIGN_OR_RETURN(ax, Binary(v1::BINARY_ADD, ax, one));
      return Binary(v1::BINARY_DIV, x, ax);
    }
    KILN_ASSIGN_OR_RETURN(ValueRef alpha, Scalar(dt, a.alpha));
    KILN_ASSIGN_OR_RETURN(ValueRef beta, Scalar(dt, a.beta));
    if (n == "Affine" || n == "HardSigmoid") {  // alpha x + beta (clamped to [0, 1])
      KILN_ASSIGN_OR_RETURN(ValueRef y, Binary(v1::BINARY_MUL, x, alpha));
      KILN_ASSIGN_OR_RETURN(y, Binary(v1::BINARY_ADD, y, beta));
      if (n == "Affine") return y;
      KILN_ASSIGN_OR_RETURN(ValueRef zero, Scalar(dt, 0.0));
      KILN_ASSIGN_OR_RETURN(ValueRef one, One(dt));
      KILN_ASSIGN_OR_RETURN(y, Binary(v1::BINARY_MAX, y, zero));
      return Binary(v1::BINARY_MIN, y, one);
    }
    if (n == "ScaledTanh") {  // alpha tanh(beta x)
      KILN_ASSIGN_OR_RETURN(ValueRef y, Binary(v1::BINARY_MUL, x, beta));
      KILN_ASSIGN_OR_RETURN(y, Unary(v1::UNARY_TANH, y));
      return Binary(v1::BINARY_MUL, y, alpha);
    }
    if (n == "LeakyRelu" || n == "Elu") {
      // relu(x) + alpha * (min(x, 0)) or alpha * (exp(min(x, 0)) - 1)
      KILN_ASSIGN_OR_RETURN(ValueRef zero, Scalar(dt, 0.0));
      KILN_ASSIGN_OR_RETURN(ValueRef pos, Unary(v1::UNARY_RELU, x));
      KILN_ASSIGN_OR_RETURN(ValueRef neg, Binary(v1::BINARY_MIN, x, zero));
      if (n == "Elu") {
        KILN_ASSIGN_OR_RETURN(neg, Unary(v1::UNARY_EXP, neg));
        KILN_ASSIGN_OR_RETURN(ValueRef one, One(dt));
        KILN_ASSIGN_OR_RETURN(neg, Binary(v1::BINARY_SUB, neg, one));
      }
      KILN_ASSIGN_OR_RETURN(neg, Binary(v1::BINARY_MUL, neg, alpha));
      return Binary(v1::BINARY_ADD, pos, neg);
    }
    if (n == "ThresholdedRelu") {  // x if x >= alpha else 0 (the RNN ops' definition)
      v1::Attrs ca;
      ca.mutable_compare()->set_kind(v1::COMPARE_GE);
      KILN_ASSIGN_OR_RETURN(ValueRef ge, EmitIn(g_, c_, v1::OP_COMPARE, {x, alpha}, ca));
      KILN_ASSIGN_OR_RETURN(ValueRef zero, Scalar(dt, 0.0));
      return Where(ge, x, zero);
    }
    return absl::InternalError("unchecked activation " + n);
  }

 private:
  ir::Graph& g_;
  const Importer& c_;
  double clip_ = 0;
};

// The activations of a node, per direction: (f, g, h) for LSTM, (f, g) for
// GRU, (f) for RNN. alpha / beta are consumed in order by the activations that take them
// (as ONNX Runtime), each defaulting to its ONNX operator's default.
absl::StatusOr<std::vector<std::vector<Activation>>> ReadActivations(Importer& c, bool lstm,
                                                                     bool rnn, int64_t dirs) {
  const size_t per = lstm ? 3 : rnn ? 1 : 2;
  std::vector<std::vector<Activation>> out(dirs);
  const onnx::AttributeProto* attr = c.Attr("activations");
  if (attr == nullptr) {
    for (auto& d : out) {
      d = {{"Sigmoid"}, {"Tanh"}};
      if (lstm) d.push_back({"Tanh"});
      if (rnn) d = {{"Tanh"}};
    }
    return out;
  }
  if (static_cast<size_t>(attr->strings_size()) != per * dirs) {
    return c.Invalid(absl::StrCat("activations lists ", attr->strings_size(), " functions; ",
                                  per * dirs, " expected (", per, " per direction)"));
  }
  const std::vector<float> alphas = c.AttrFloats("activation_alpha").value_or(std::vector<float>{});
  const std::vector<float> betas = c.AttrFloats("activation_beta").value_or(std::vector<float>{});
  size_t ai = 0, bi = 0;
  for (int64_t d = 0; d < dirs; ++d) {
    for (size_t k = 0; k < per; ++k) {
      Activation a{attr->strings(static_cast<int>(d * per + k))};
      float da = -1, db = -1;  // defaults; < 0: the function takes none
      if (a.name == "Affine")
        da = 1, db = 0;
      else if (a.name == "LeakyRelu")
        da = 0.01f;
      else if (a.name == "ScaledTanh")
        da = 1, db = 1;
      else if (a.name == "HardSigmoid")
        da = 0.2f, db = 0.5f;
      else if (a.name == "Elu")
        da = 1;
      else if (a.name == "ThresholdedRelu")
        da = 1;
      else if (a.name != "Sigmoid" && a.name != "Tanh" && a.name != "Relu" &&
               a.name != "Softsign" && a.name != "Softplus") {
        return c.Invalid("unknown activation " + a.name);
      }
      if (da >= 0) a.alpha = ai < alphas.size() ? alphas[ai++] : da;
      if (db >= 0) a.beta = bi < betas.size() ? betas[bi++] : db;
      out[d].push_back(a);
    }
  }
  return out;
}

absl::StatusOr<ValueRef> Slice1(Importer& c, ValueRef x, int64_t axis, int64_t start,
                                int64_t stop) {
  v1::Attrs a;
  a.mutable_slice()->add_start(start);
  a.mutable_slice()->add_stop(stop);
  a.mutable_slice()->add_axes(axis);
  return c.Emit(v1::OP_SLICE, {x}, a);
}

absl::StatusOr<ValueRef> Zeros(Importer& c, DType dt, const IrDims& dims) {
  KILN_ASSIGN_OR_RETURN(HostTensor t, HostTensor::Create(dt, Dims(dims.begin(), dims.end())));
  return c.Constant(std::move(t));
}

absl::StatusOr<ValueRef> Perm(Importer& c, ValueRef x, std::vector<int64_t> perm) {
  v1::Attrs a;
  for (int64_t p : perm) a.mutable_transpose()->add_perm(p);
  return c.Emit(v1::OP_TRANSPOSE, {x}, a);
}

absl::StatusOr<ValueRef> Concat(Importer& c, const std::vector<ValueRef>& parts, int64_t axis) {
  if (parts.size() == 1) return parts[0];
  v1::Attrs a;
  a.mutable_concat()->set_axis(axis);
  return c.Emit(v1::OP_CONCAT, parts, a);
}

// The node's shape and attributes, read once for every direction.
struct RnnSpec {
  bool lstm = false;
  bool rnn = false;           // the simple RNN: H = f(X W^T + H R^T + Wb + Rb)
  bool lbr = false;           // GRU linear_before_reset
  bool input_forget = false;  // LSTM: forget gate = 1 - input gate
  int gates = 0;
  int64_t layout = 0;
  int64_t dirs = 1;  // 2 when bidirectional
  int64_t seq = 0, batch = 0, h = 0, in = 0;
  DType dt = v1::DTYPE_F32;
  double clip = 0;            // > 0: the clip attribute
  std::vector<int64_t> lens;  // sequence_lens when some row is shorter than seq
};

// Direction d's slice of a [dirs, ...] operand (the operand itself when there
// is one direction).
absl::StatusOr<ValueRef> OfDirection(Importer& c, const RnnSpec& sp, ValueRef v, int64_t d) {
  if (sp.dirs == 1) return v;
  return Slice1(c, v, 0, d, d + 1);
}

// The scan of one direction d over x [seq, batch, in]: its outputs are the
// carries (h, [c], ...), then Y [seq, batch, H] at index `*y_index`.
absl::StatusOr<ValueRef> OneDirection(Importer& c, const RnnSpec& sp, ValueRef x, int64_t d,
                                      bool reverse, const std::vector<Activation>& act,
                                      int* y_index) {
  const bool lstm = sp.lstm, rnn = sp.rnn, lbr = sp.lbr;
  const int gates = sp.gates;
  const int64_t layout = sp.layout, batch = sp.batch, h = sp.h, seq = sp.seq;
  const DType dt = sp.dt;
  KILN_ASSIGN_OR_RETURN(ValueRef w, c.Ref(1));
  KILN_ASSIGN_OR_RETURN(w, OfDirection(c, sp, w, d));
  KILN_ASSIGN_OR_RETURN(w, c.Reshape(w, {gates * h, sp.in}));
  KILN_ASSIGN_OR_RETURN(ValueRef r, c.Ref(2));
  KILN_ASSIGN_OR_RETURN(r, OfDirection(c, sp, r, d));
  KILN_ASSIGN_OR_RETURN(r, c.Reshape(r, {gates * h, h}));
  // The input projection of every step at once: [seq, batch, G*H].
  v1::Attrs mm;
  mm.mutable_matmul()->set_transpose_b(true);
  KILN_ASSIGN_OR_RETURN(ValueRef xw, c.Emit(v1::OP_MATMUL, {x, w}, mm));
  ValueRef rb;
  if (c.has(3)) {
    KILN_ASSIGN_OR_RETURN(ValueRef b, c.Ref(3));
    KILN_ASSIGN_OR_RETURN(b, OfDirection(c, sp, b, d));
    KILN_ASSIGN_OR_RETURN(b, c.Reshape(b, {2 * gates * h}));
    KILN_ASSIGN_OR_RETURN(ValueRef wb, Slice1(c, b, 0, 0, gates * h));
    KILN_ASSIGN_OR_RETURN(rb, Slice1(c, b, 0, gates * h, 2 * gates * h));
    KILN_ASSIGN_OR_RETURN(xw, c.Binary(v1::BINARY_ADD, xw, wb));
    if (lstm || rnn) {
      KILN_ASSIGN_OR_RETURN(xw, c.Binary(v1::BINARY_ADD, xw, rb));
    }
  } else {
    KILN_ASSIGN_OR_RETURN(rb, Zeros(c, dt, {gates * h}));
  }
  auto state = [&](int input) -> absl::StatusOr<ValueRef> {
    if (!c.has(input)) return Zeros(c, dt, {batch, h});
    KILN_ASSIGN_OR_RETURN(ValueRef s, c.Ref(input));
    if (layout == 1) {
      KILN_ASSIGN_OR_RETURN(s, Perm(c, s, {1, 0, 2}));
    }
    KILN_ASSIGN_OR_RETURN(s, OfDirection(c, sp, s, d));
    return c.Reshape(s, {batch, h});
  };
  KILN_ASSIGN_OR_RETURN(ValueRef h0, state(5));
  std::vector<ValueRef> carries = {h0};
  if (lstm) {
    KILN_ASSIGN_OR_RETURN(ValueRef c0, state(6));
    carries.push_back(c0);
  }
  carries.push_back(r);
  if (!lstm && !rnn) carries.push_back(rb);
  const bool peep = lstm && c.has(7);
  if (peep) {
    KILN_ASSIGN_OR_RETURN(ValueRef p, c.Ref(7));
    KILN_ASSIGN_OR_RETURN(p, OfDirection(c, sp, p, d));
    KILN_ASSIGN_OR_RETURN(p, c.Reshape(p, {3 * h}));
    carries.push_back(p);
  }
  // The body: carries (h, [c], R, [Rb], [P]), then xw_t [batch, G*H].
  ir::Graph g;
  g.set_name(lstm ? "lstm_step" : rnn ? "rnn_step" : "gru_step");
  Body bd(g, c, sp.clip);
  std::vector<ValueRef> in;
  for (size_t i = 0; i < carries.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(ValueRef v, bd.Input(absl::StrCat("s", i), c.TypeOf(carries[i])));
    in.push_back(v);
  }
  const TensorType xt(dt, IrDims{batch, gates * h});
  KILN_ASSIGN_OR_RETURN(ValueRef xw_t, bd.Input("x", xt));
  const bool masked = !sp.lens.empty();
  ValueRef m_t;  // [batch, H] bool: this step is inside the row's sequence
  if (masked) {
    KILN_ASSIGN_OR_RETURN(m_t, bd.Input("m", TensorType(v1::DTYPE_BOOL, IrDims{batch, h})));
  }
  // A masked step keeps the state and gives Y zeros.
  auto keep = [&](ValueRef next, ValueRef prev) -> absl::StatusOr<ValueRef> {
    if (!masked) return next;
    return bd.Where(m_t, next, prev);
  };
  const ValueRef hp = in[0];
  std::vector<ir::GraphOutput> outs;
  ValueRef h1;
  if (lstm) {
    const ValueRef cp = in[1], rr = in[2];
    KILN_ASSIGN_OR_RETURN(ValueRef hr, bd.MatMulT(hp, rr));
    KILN_ASSIGN_OR_RETURN(ValueRef gsum, bd.Binary(v1::BINARY_ADD, xw_t, hr));
    KILN_ASSIGN_OR_RETURN(ValueRef gi, bd.Part(gsum, 1, 0, h));  // iofc
    KILN_ASSIGN_OR_RETURN(ValueRef go, bd.Part(gsum, 1, 1, h));
    KILN_ASSIGN_OR_RETURN(ValueRef gf, bd.Part(gsum, 1, 2, h));
    KILN_ASSIGN_OR_RETURN(ValueRef gc, bd.Part(gsum, 1, 3, h));
    ValueRef pi, po, pf;
    if (peep) {
      KILN_ASSIGN_OR_RETURN(pi, bd.Part(in[3], 0, 0, h));  // P = [Pi, Po, Pf]
      KILN_ASSIGN_OR_RETURN(po, bd.Part(in[3], 0, 1, h));
      KILN_ASSIGN_OR_RETURN(pf, bd.Part(in[3], 0, 2, h));
      KILN_ASSIGN_OR_RETURN(ValueRef t, bd.Binary(v1::BINARY_MUL, pi, cp));
      KILN_ASSIGN_OR_RETURN(gi, bd.Binary(v1::BINARY_ADD, gi, t));
      KILN_ASSIGN_OR_RETURN(t, bd.Binary(v1::BINARY_MUL, pf, cp));
      KILN_ASSIGN_OR_RETURN(gf, bd.Binary(v1::BINARY_ADD, gf, t));
    }
    KILN_ASSIGN_OR_RETURN(ValueRef i, bd.Act(act[0], dt, gi));
    ValueRef f;
    if (sp.input_forget) {  // coupled gates: f = 1 - i (ONNX Runtime's reading)
      KILN_ASSIGN_OR_RETURN(ValueRef one, bd.One(dt));
      KILN_ASSIGN_OR_RETURN(f, bd.Binary(v1::BINARY_SUB, one, i));
    } else {
      KILN_ASSIGN_OR_RETURN(f, bd.Act(act[0], dt, gf));
    }
    KILN_ASSIGN_OR_RETURN(ValueRef cc, bd.Act(act[1], dt, gc));
    KILN_ASSIGN_OR_RETURN(ValueRef fc, bd.Binary(v1::BINARY_MUL, f, cp));
    KILN_ASSIGN_OR_RETURN(ValueRef ic, bd.Binary(v1::BINARY_MUL, i, cc));
    KILN_ASSIGN_OR_RETURN(ValueRef c1, bd.Binary(v1::BINARY_ADD, fc, ic));
    if (peep) {
      KILN_ASSIGN_OR_RETURN(ValueRef t, bd.Binary(v1::BINARY_MUL, po, c1));
      KILN_ASSIGN_OR_RETURN(go, bd.Binary(v1::BINARY_ADD, go, t));
    }
    KILN_ASSIGN_OR_RETURN(ValueRef o, bd.Act(act[0], dt, go));
    KILN_ASSIGN_OR_RETURN(ValueRef tc, bd.Act(act[2], dt, c1));
    KILN_ASSIGN_OR_RETURN(h1, bd.Binary(v1::BINARY_MUL, o, tc));
    KILN_ASSIGN_OR_RETURN(ValueRef hk, keep(h1, hp));
    KILN_ASSIGN_OR_RETURN(ValueRef ck, keep(c1, cp));
    outs = {{"h", hk}, {"c", ck}, {"r", rr}};
    if (peep) outs.push_back({"p", in[3]});
  } else if (rnn) {
    const ValueRef rr = in[1];
    KILN_ASSIGN_OR_RETURN(ValueRef hr, bd.MatMulT(hp, rr));
    KILN_ASSIGN_OR_RETURN(ValueRef sum, bd.Binary(v1::BINARY_ADD, xw_t, hr));
    KILN_ASSIGN_OR_RETURN(h1, bd.Act(act[0], dt, sum));
    KILN_ASSIGN_OR_RETURN(ValueRef hk, keep(h1, hp));
    outs = {{"h", hk}, {"r", rr}};
  } else {
    const ValueRef rr = in[1], rbias = in[2];
    KILN_ASSIGN_OR_RETURN(ValueRef rzr, bd.Part(rr, 0, 0, 2 * h));  // zrh: z and r rows
    KILN_ASSIGN_OR_RETURN(ValueRef rh, bd.Part(rr, 0, 2, h));
    KILN_ASSIGN_OR_RETURN(ValueRef bzr, bd.Part(rbias, 0, 0, 2 * h));
    KILN_ASSIGN_OR_RETURN(ValueRef bh, bd.Part(rbias, 0, 2, h));
    KILN_ASSIGN_OR_RETURN(ValueRef hzr, bd.MatMulT(hp, rzr));
    KILN_ASSIGN_OR_RETURN(hzr, bd.Binary(v1::BINARY_ADD, hzr, bzr));
    KILN_ASSIGN_OR_RETURN(ValueRef xzr, bd.Part(xw_t, 1, 0, 2 * h));
    KILN_ASSIGN_OR_RETURN(ValueRef xh, bd.Part(xw_t, 1, 2, h));
    KILN_ASSIGN_OR_RETURN(ValueRef zr, bd.Binary(v1::BINARY_ADD, xzr, hzr));
    KILN_ASSIGN_OR_RETURN(zr, bd.Act(act[0], dt, zr));
    KILN_ASSIGN_OR_RETURN(ValueRef z, bd.Part(zr, 1, 0, h));
    KILN_ASSIGN_OR_RETURN(ValueRef rg, bd.Part(zr, 1, 1, h));
    ValueRef hn;
    if (lbr) {
      KILN_ASSIGN_OR_RETURN(ValueRef t, bd.MatMulT(hp, rh));
      KILN_ASSIGN_OR_RETURN(t, bd.Binary(v1::BINARY_ADD, t, bh));
      KILN_ASSIGN_OR_RETURN(hn, bd.Binary(v1::BINARY_MUL, rg, t));
    } else {
      KILN_ASSIGN_OR_RETURN(ValueRef t, bd.Binary(v1::BINARY_MUL, rg, hp));
      KILN_ASSIGN_OR_RETURN(t, bd.MatMulT(t, rh));
      KILN_ASSIGN_OR_RETURN(hn, bd.Binary(v1::BINARY_ADD, t, bh));
    }
    KILN_ASSIGN_OR_RETURN(ValueRef n, bd.Binary(v1::BINARY_ADD, xh, hn));
    KILN_ASSIGN_OR_RETURN(n, bd.Act(act[1], dt, n));
    // h1 = n + z * (h - n) = (1 - z) * n + z * h
    KILN_ASSIGN_OR_RETURN(ValueRef d, bd.Binary(v1::BINARY_SUB, hp, n));
    KILN_ASSIGN_OR_RETURN(d, bd.Binary(v1::BINARY_MUL, z, d));
    KILN_ASSIGN_OR_RETURN(h1, bd.Binary(v1::BINARY_ADD, n, d));
    KILN_ASSIGN_OR_RETURN(ValueRef hk, keep(h1, hp));
    outs = {{"h", hk}, {"r", rr}, {"rb", rbias}};
  }
  if (masked) {
    KILN_ASSIGN_OR_RETURN(ValueRef zero, bd.Scalar(dt, 0.0));
    KILN_ASSIGN_OR_RETURN(h1, bd.Where(m_t, h1, zero));
  }
  outs.push_back({"y", h1});
  g.outputs() = outs;
  std::vector<std::string> order;
  for (size_t i = 0; i < carries.size(); ++i) order.push_back(absl::StrCat("s", i));
  order.push_back("x");
  if (masked) order.push_back("m");
  KILN_ASSIGN_OR_RETURN(v1::Graph body, ExportSubgraph(g, order));

  std::vector<ValueRef> operands = carries;
  operands.push_back(xw);
  if (masked) {
    const CheckedInt n = CheckedInt(seq) * batch * h;
    KILN_RETURN_IF_ERROR(CheckTable(c, n.ok() ? n.get() : -1, "the sequence_lens mask"));
    KILN_ASSIGN_OR_RETURN(HostTensor mask, HostTensor::Create(v1::DTYPE_BOOL, {seq, batch, h}));
    for (int64_t t = 0; t < seq; ++t) {
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t k = 0; k < h; ++k)
          SetInt(mask, (t * batch + b) * h + k, t < sp.lens[b] ? 1 : 0);
      }
    }
    KILN_ASSIGN_OR_RETURN(ValueRef mv, c.Constant(std::move(mask)));
    operands.push_back(mv);
  }
  v1::Attrs a;
  auto* sa = a.mutable_scan();
  *sa->mutable_body() = std::move(body);
  sa->set_num_carries(static_cast<int>(carries.size()));
  sa->set_length(seq);
  sa->set_reverse(reverse);
  *y_index = static_cast<int>(carries.size());
  return c.Emit(v1::OP_SCAN, operands, a);
}

absl::Status Recurrent(Importer& c, bool lstm, bool rnn = false) {
  RnnSpec sp;
  sp.lstm = lstm;
  sp.rnn = rnn;
  sp.gates = lstm ? 4 : rnn ? 1 : 3;
  const std::string direction = c.AttrString("direction", "forward");
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional") {
    return c.Invalid("unknown direction " + direction);
  }
  sp.dirs = direction == "bidirectional" ? 2 : 1;
  KILN_ASSIGN_OR_RETURN(const std::vector<std::vector<Activation>> acts,
                        ReadActivations(c, lstm, rnn, sp.dirs));
  if (c.Attr("clip") != nullptr) {
    sp.clip = c.AttrFloat("clip", 0);
    if (!(sp.clip > 0) || !std::isfinite(sp.clip))
      return c.Invalid(absl::StrCat("clip ", sp.clip, " (must be > 0)"));
  }
  sp.input_forget = lstm && c.AttrInt("input_forget", 0) != 0;
  sp.layout = c.AttrInt("layout", 0);
  if (sp.layout != 0 && sp.layout != 1) return c.Invalid(absl::StrCat("layout ", sp.layout));
  sp.lbr = !lstm && c.AttrInt("linear_before_reset", 0) != 0;
  for (int i : {0, 1, 2}) KILN_RETURN_IF_ERROR(c.Need(i));
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  if (c.rank(0) != 3 || c.rank(1) != 3 || c.rank(2) != 3)
    return c.Invalid("X, W and R must be rank 3");
  if (!IsFloat(c.dtype(0))) return c.Invalid("X must be float");
  sp.dt = c.dtype(0);
  if (sp.layout == 1) {  // to [seq, batch, in]
    KILN_ASSIGN_OR_RETURN(x, Perm(c, x, {1, 0, 2}));
  }
  const IrDims xd = c.TypeOf(x).dims;
  sp.seq = xd[0];
  sp.batch = xd[1];
  const IrDims rd = c.type(2).dims;
  const IrDims wd = c.type(1).dims;
  sp.h = c.AttrInt("hidden_size", rd[2]);
  sp.in = wd[2];
  const int64_t seq = sp.seq, batch = sp.batch, h = sp.h, dirs = sp.dirs;
  if (seq < 0 || batch < 0 || h <= 0 || rd[2] != h || rd[1] != sp.gates * h || rd[0] != dirs) {
    return c.Unsupported(
        absl::StrCat("the sequence length, batch and hidden size must be known at import, R [",
                     dirs, ", ", sp.gates, " * hidden, hidden]"));
  }
  if (wd[0] != dirs || wd[1] != sp.gates * h) {
    return c.Invalid(absl::StrCat("W must be [", dirs, ", ", sp.gates * h, ", input size]"));
  }
  if (c.has(4)) {
    const HostTensor* lens = c.Const(4);
    if (lens == nullptr) return c.Unsupported("sequence_lens must be known at import");
    if (lens->num_elements() != batch) {
      return c.Invalid(
          absl::StrCat("sequence_lens has ", lens->num_elements(), " values for batch ", batch));
    }
    bool whole = true;
    for (int64_t i = 0; i < batch; ++i) {
      const int64_t n = GetInt(*lens, i);
      if (n < 0 || n > seq)
        return c.Invalid(
            absl::StrCat("sequence_lens[", i, "] = ", n, " is outside [0, ", seq, "]"));
      whole = whole && n == seq;
      sp.lens.push_back(n);
    }
    if (whole) sp.lens.clear();
  }
  // Y: [seq, dirs, batch, H] (layout 1: [batch, seq, dirs, H]); Y_h, Y_c:
  // [dirs, batch, H] (layout 1: [batch, dirs, H]). Bidirectional: direction 0
  // forward, 1 reverse.
  std::vector<ValueRef> ys, hs, cs;
  for (int64_t d = 0; d < dirs; ++d) {
    const bool reverse = dirs == 2 ? d == 1 : direction == "reverse";
    int y_index = 0;
    KILN_ASSIGN_OR_RETURN(ValueRef s, OneDirection(c, sp, x, d, reverse, acts[d], &y_index));
    KILN_ASSIGN_OR_RETURN(ValueRef y, c.Reshape(ValueRef{s.node, y_index}, {seq, 1, batch, h}));
    ys.push_back(y);
    KILN_ASSIGN_OR_RETURN(ValueRef hl, c.Reshape(ValueRef{s.node, 0}, {1, batch, h}));
    hs.push_back(hl);
    if (lstm) {
      KILN_ASSIGN_OR_RETURN(ValueRef cl, c.Reshape(ValueRef{s.node, 1}, {1, batch, h}));
      cs.push_back(cl);
    }
  }
  if (c.wants(0)) {
    KILN_ASSIGN_OR_RETURN(ValueRef y, Concat(c, ys, 1));
    if (sp.layout == 1) {
      KILN_ASSIGN_OR_RETURN(y, Perm(c, y, {2, 0, 1, 3}));
    }
    c.SetOutput(0, y);
  }
  for (int k : {1, 2}) {
    if (!c.wants(k) || (k == 2 && !lstm)) continue;
    KILN_ASSIGN_OR_RETURN(ValueRef st, Concat(c, k == 1 ? hs : cs, 0));
    if (sp.layout == 1) {
      KILN_ASSIGN_OR_RETURN(st, Perm(c, st, {1, 0, 2}));
    }
    c.SetOutput(k, st);
  }
  return absl::OkStatus();
}

absl::Status LstmOp(Importer& c) { return Recurrent(c, true); }
absl::Status GruOp(Importer& c) { return Recurrent(c, false); }
absl::Status RnnOp(Importer& c) { return Recurrent(c, false, true); }

}  // namespace

void RegisterRecurrent(ConverterTable& table) {
  table["LSTM"] = LstmOp;
  table["GRU"] = GruOp;
  table["RNN"] = RnnOp;
}

}  // namespace kiln::io::onnx_internal
