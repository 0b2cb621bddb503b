#include "engine/train/train_step.h"

#include <cmath>
#include <limits>
#include <numbers>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/passes/autodiff.h"
#include "engine/passes/autodiff_internal.h"

namespace kiln::train {
namespace {

using ir::ValueRef;
using passes::ad::Builder;
using passes::ad::Valid;

// Hyper-parameters with PyTorch's defaults filled in.
struct Hyper {
  double lr = 0, wd = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double momentum = 0, dampening = 0;
  bool nesterov = false;
  int ns_steps = 5;
  double muon_lr = 0;
};

Hyper Resolve(const v1::OptimizerSpec& s) {
  Hyper h;
  h.lr = s.lr();
  switch (s.kind()) {
    case v1::OPTIMIZER_ADAMW:
      h.wd = 0.01;
      break;
    case v1::OPTIMIZER_LION:
      h.beta2 = 0.99;
      break;
    case v1::OPTIMIZER_MUON:
      h.momentum = 0.95, h.nesterov = true;
      break;
    default:
      break;
  }
  if (s.has_weight_decay()) h.wd = s.weight_decay();
  if (s.has_beta1()) h.beta1 = s.beta1();
  if (s.has_beta2()) h.beta2 = s.beta2();
  if (s.has_epsilon()) h.eps = s.epsilon();
  if (s.has_momentum()) h.momentum = s.momentum();
  if (s.has_dampening()) h.dampening = s.dampening();
  if (s.kind() == v1::OPTIMIZER_SGD) h.nesterov = s.nesterov();
  if (s.kind() == v1::OPTIMIZER_MUON && s.has_muon_nesterov()) h.nesterov = s.muon_nesterov();
  if (s.ns_steps() > 0) h.ns_steps = s.ns_steps();
  h.muon_lr = s.has_muon_lr() ? s.muon_lr() : h.lr;
  return h;
}

absl::Status Bad(absl::string_view field, double v, absl::string_view want) {
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer ", field, " = ", v, " is out of range: it must be ", want));
}

ValueRef AddParam(ir::Graph& g, const std::string& name, const ir::TensorType& type) {
  auto node = std::make_unique<ir::Node>();
  node->op = v1::OP_PARAM;
  node->name = name;
  node->attrs.mutable_param()->set_frozen(true);
  node->outputs.push_back(type);
  return g.AddNode(std::move(node))->out();
}

// The learning-rate factor of step t (1-based, f32 scalar): the schedule's
// lr over `base_lr` (cosine decays to min_lr / base_lr).
ValueRef ScheduleFactor(Builder& b, const v1::LrSchedule& s, ValueRef t, double base_lr) {
  const double lr = 1.0, min_lr = s.min_lr() / base_lr;
  const DType f = v1::DTYPE_F32;
  auto c = [&](double v) { return b.Sc(v, f); };
  auto min1 = [&](ValueRef v) { return b.r().Binary(v1::BINARY_MIN, v, c(1)); };
  switch (s.kind()) {
    case v1::SCHEDULE_LINEAR_WARMUP:
      if (s.warmup_steps() == 0) return c(lr);
      return b.Scale(min1(b.Scale(t, 1.0 / static_cast<double>(s.warmup_steps()))), lr);
    case v1::SCHEDULE_COSINE: {
      const double w = static_cast<double>(s.warmup_steps());
      const double span = static_cast<double>(s.total_steps()) - w;
      ValueRef progress = b.r().Binary(v1::BINARY_MAX, b.Scale(b.Sub(t, c(w)), 1.0 / span), c(0));
      progress = min1(progress);
      ValueRef cosine =
          b.Scale(b.Add(c(1), b.Un(v1::UNARY_COS, b.Scale(progress, std::numbers::pi))), 0.5);
      ValueRef decayed = b.Add(c(min_lr), b.Scale(cosine, lr - min_lr));
      if (s.warmup_steps() == 0) return decayed;
      ValueRef warm = b.Scale(b.Scale(t, 1.0 / w), lr);
      return b.r().Where(b.r().Compare(v1::COMPARE_LE, t, c(w)), warm, decayed);
    }
    default:
      return c(lr);
  }
}

// Loss scaling as resolved from an AmpSpec (GradScaler's defaults).
struct LossScaling {
  v1::LossScaleMode mode = v1::LOSS_SCALE_NONE;
  double init = 65536, growth = 2, backoff = 0.5;
  int64_t interval = 2000;
};

LossScaling ScalingOf(const v1::AmpSpec* amp) {
  LossScaling s;
  if (amp == nullptr || amp->compute() == v1::DTYPE_UNSPECIFIED) return s;
  s.mode = amp->loss_scale();
  if (s.mode == v1::LOSS_SCALE_DEFAULT) {
    s.mode = amp->compute() == v1::DTYPE_F16 ? v1::LOSS_SCALE_DYNAMIC : v1::LOSS_SCALE_NONE;
  }
  if (amp->has_init_scale()) s.init = amp->init_scale();
  if (amp->has_growth_factor()) s.growth = amp->growth_factor();
  if (amp->has_backoff_factor()) s.backoff = amp->backoff_factor();
  if (amp->has_growth_interval()) s.interval = amp->growth_interval();
  return s;
}

// The param node named `name` (REQUIRES: it exists).
ValueRef FindParam(const ir::Graph& g, const std::string& name) {
  for (const ir::Node* p : g.Params()) {
    if (p->name == name) return p->out();
  }
  return ValueRef{};
}

struct Update {
  std::string name;  // the param (or state) written
  ValueRef value;
};

// The optimizers' update rules for one param p with gradient g.
class Updater {
 public:
  Updater(ir::Graph& g, const v1::OptimizerSpec& spec, const Hyper& h, ValueRef t, ValueRef lr)
      : g_(g), spec_(spec), h_(h), t_(t), lr_(lr) {}

  absl::Status Apply(const std::string& name, ValueRef p, ValueRef grad, bool decay,
                     std::vector<Update>& out) {
    const ir::Node& origin = *g_.FindNode(p.node);
    Builder b(g_, origin);
    const ir::TensorType type = g_.TypeOf(p);
    const DType dt = type.dtype;
    ValueRef lr = Cast(b, lr_, dt), t = Cast(b, t_, dt);
    const double wd = decay ? h_.wd : 0;
    auto state = [&](const char* what) {
      return AddParam(g_, absl::StrCat(kStatePrefix, name, "/", what), type);
    };
    auto c = [&](double v) { return b.Sc(v, dt); };
    switch (spec_.kind()) {
      case v1::OPTIMIZER_SGD: {
        ValueRef d = wd > 0 ? b.Add(grad, b.Scale(p, wd)) : grad;
        if (h_.momentum > 0) {
          ValueRef buf = state("momentum");
          ValueRef next = b.Add(b.Scale(buf, h_.momentum), b.Scale(d, 1 - h_.dampening));
          // torch.optim.SGD starts the buffer at the first gradient (no dampening).
          if (h_.dampening != 0)
            next = b.r().Where(b.r().Compare(v1::COMPARE_EQ, t, c(1)), d, next);
          out.push_back({g_.FindNode(buf.node)->name, next});
          d = h_.nesterov ? b.Add(d, b.Scale(next, h_.momentum)) : next;
        }
        out.push_back({name, b.Sub(p, b.Mul(lr, d))});
        break;
      }
      case v1::OPTIMIZER_ADAM:
      case v1::OPTIMIZER_ADAMW:
        AdamUpdate(b, name, p, grad, lr, wd, spec_.kind() == v1::OPTIMIZER_ADAMW, state, out);
        break;
      case v1::OPTIMIZER_LION: {
        ValueRef m = state("momentum");
        ValueRef q = wd > 0 ? b.Mul(p, b.Sub(c(1), b.Scale(lr, wd))) : p;
        ValueRef mix = b.Add(b.Scale(m, h_.beta1), b.Scale(grad, 1 - h_.beta1));
        out.push_back({name, b.Sub(q, b.Mul(lr, b.Un(v1::UNARY_SIGN, mix)))});
        out.push_back(
            {g_.FindNode(m.node)->name, b.Add(b.Scale(m, h_.beta2), b.Scale(grad, 1 - h_.beta2))});
        break;
      }
      case v1::OPTIMIZER_MUON: {
        if (type.rank() != 2) {
          AdamUpdate(b, name, p, grad, lr, wd, true, state, out);
          break;
        }
        ValueRef mlr = Cast(b, muon_lr_, dt);
        ValueRef buf = state("momentum");
        ValueRef next = b.Add(b.Scale(buf, h_.momentum), b.Scale(grad, 1 - h_.momentum));
        out.push_back({g_.FindNode(buf.node)->name, next});
        ValueRef u =
            h_.nesterov ? b.Add(b.Scale(grad, 1 - h_.momentum), b.Scale(next, h_.momentum)) : next;
        ValueRef o = NewtonSchulz(b, u, type.dims[0], type.dims[1]);
        const double scale = std::sqrt(
            std::max(1.0, static_cast<double>(type.dims[0]) / static_cast<double>(type.dims[1])));
        ValueRef q = wd > 0 ? b.Mul(p, b.Sub(c(1), b.Scale(mlr, wd))) : p;
        out.push_back({name, b.Sub(q, b.Mul(b.Scale(mlr, scale), o))});
        break;
      }
      default:
        return absl::InvalidArgumentError("unknown optimizer");
    }
    return b.status();
  }

  void set_muon_lr(ValueRef v) { muon_lr_ = v; }

 private:
  static ValueRef Cast(Builder& b, ValueRef v, DType dt) {
    return b.T(v).dtype == dt ? v : b.r().Cast(v, dt);
  }

  template <typename State>
  void AdamUpdate(Builder& b, const std::string& name, ValueRef p, ValueRef grad, ValueRef lr,
                  double wd, bool decoupled, State& state, std::vector<Update>& out) {
    const DType dt = g_.TypeOf(p).dtype;
    auto c = [&](double v) { return b.Sc(v, dt); };
    ValueRef m = state("m"), v = state("v");
    ValueRef q = p;
    if (wd > 0 && decoupled) q = b.Mul(p, b.Sub(c(1), b.Scale(lr, wd)));
    if (wd > 0 && !decoupled) grad = b.Add(grad, b.Scale(p, wd));
    ValueRef m_next = b.Add(b.Scale(m, h_.beta1), b.Scale(grad, 1 - h_.beta1));
    ValueRef v_next = b.Add(b.Scale(v, h_.beta2), b.Scale(b.Mul(grad, grad), 1 - h_.beta2));
    // torch.optim.Adam's order: denom = sqrt(v) / sqrt(1 - b2^t) + eps,
    // p -= lr / (1 - b1^t) * m / denom (torch forms the bias corrections in double).
    ValueRef bc1 = OneMinusPow(b, h_.beta1, dt);
    ValueRef bc2 = OneMinusPow(b, h_.beta2, dt);
    ValueRef denom =
        b.Add(b.Div(b.Un(v1::UNARY_SQRT, v_next), b.Un(v1::UNARY_SQRT, bc2)), c(h_.eps));
    ValueRef step = b.Div(lr, bc1);
    out.push_back({name, b.Sub(q, b.Mul(step, b.Div(m_next, denom)))});
    out.push_back({g_.FindNode(m.node)->name, m_next});
    out.push_back({g_.FindNode(v.node)->name, v_next});
  }

  // 1 - beta^t (t >= 1, beta in [0, 1)) to a few ulps, in f32 (f64 for f64
  // params). Forming beta^t first and subtracting cancels: for beta2 = 0.999 in
  // f32 the rounding of beta alone (1.3e-8) is 1.3e-5 of 1 - beta^t while
  // t << 1000, and a rounded pow adds up to 3e-8 / (1 - beta^t) more, which made
  // every Adam step about 6e-6 of lr too short in f32 (char_gpt's loss curve
  // against PyTorch, which forms the corrections in double). Instead
  // 1 - beta^t = -expm1(x) with x = t ln(beta) (ln beta in double), and expm1 by
  // Kahan's formula (u - 1) x / ln(u) for u = exp(x), whose rounding errors in u
  // cancel between u - 1 and ln(u). u is held below 1 (the largest value under
  // it), where the formula gives x, expm1's value for such tiny x; x is clamped
  // at -30, where 1 - beta^t is 1 in f32 (ln 0 is taken as -30 for beta = 0).
  ValueRef OneMinusPow(Builder& b, double beta, DType dt) {
    const DType ct = dt == v1::DTYPE_F64 ? dt : v1::DTYPE_F32;  // never in 16 bits
    auto c = [&](double v) { return b.Sc(v, ct); };
    const double below_one = ct == v1::DTYPE_F64 ? std::nextafter(1.0, 0.0)
                                                 : static_cast<double>(std::nextafter(1.0f, 0.0f));
    const double log_beta = beta > 0 ? std::log(beta) : -30.0;
    ValueRef x = b.r().Binary(v1::BINARY_MAX, b.Scale(Cast(b, t_, ct), log_beta), c(-30));
    ValueRef u = b.r().Binary(v1::BINARY_MIN, b.Un(v1::UNARY_EXP, x), c(below_one));
    ValueRef expm1 = b.Div(b.Mul(b.Sub(u, c(1)), x), b.Un(v1::UNARY_LOG, u));
    return Cast(b, b.Un(v1::UNARY_NEG, expm1), dt);
  }

  // Five (ns_steps) Newton-Schulz iterations towards the nearest
  // semi-orthogonal matrix, on the wide orientation.
  ValueRef NewtonSchulz(Builder& b, ValueRef grad, int64_t rows, int64_t cols) {
    const DType dt = g_.TypeOf(grad).dtype;
    const double ka = 3.4445, kb = -4.7750, kc = 2.0315;
    ValueRef norm =
        b.Un(v1::UNARY_SQRT, b.r().Reduce(v1::REDUCE_SUM, b.Mul(grad, grad), {}, false));
    ValueRef x = b.Div(grad, b.Add(norm, b.Sc(1e-7, dt)));
    const bool tall = rows > cols;
    if (tall) x = b.r().Transpose(x, {1, 0});
    for (int i = 0; i < h_.ns_steps; ++i) {
      ValueRef a = b.r().MatMul(x, x, false, true);
      ValueRef bm = b.Add(b.Scale(a, kb), b.Scale(b.r().MatMul(a, a), kc));
      x = b.Add(b.Scale(x, ka), b.r().MatMul(bm, x));
    }
    if (tall) x = b.r().Transpose(x, {1, 0});
    return x;
  }

  ir::Graph& g_;
  const v1::OptimizerSpec& spec_;
  const Hyper& h_;
  ValueRef t_, lr_, muon_lr_;
};

}  // namespace

absl::Status ValidateOptimizer(const v1::OptimizerSpec& s) {
  if (s.kind() == v1::OPTIMIZER_UNSPECIFIED || !v1::OptimizerKind_IsValid(s.kind())) {
    return absl::InvalidArgumentError(absl::StrCat("unknown optimizer kind ",
                                                   static_cast<int>(s.kind()),
                                                   "; use sgd, adam, adamw, lion or muon"));
  }
  const Hyper h = Resolve(s);
  auto finite = [](double v) { return std::isfinite(v); };
  if (!finite(h.lr) || h.lr <= 0) return Bad("lr", h.lr, "> 0");
  if (!finite(h.muon_lr) || h.muon_lr <= 0) return Bad("muon_lr", h.muon_lr, "> 0");
  if (!finite(h.wd) || h.wd < 0) return Bad("weight_decay", h.wd, ">= 0");
  if (!(h.beta1 >= 0 && h.beta1 < 1)) return Bad("beta1", h.beta1, "in [0, 1)");
  if (!(h.beta2 >= 0 && h.beta2 < 1)) return Bad("beta2", h.beta2, "in [0, 1)");
  if (!finite(h.eps) || h.eps <= 0) return Bad("epsilon", h.eps, "> 0");
  if (!(h.momentum >= 0 && h.momentum < 1)) return Bad("momentum", h.momentum, "in [0, 1)");
  if (!(h.dampening >= 0 && h.dampening <= 1)) return Bad("dampening", h.dampening, "in [0, 1]");
  if (s.kind() == v1::OPTIMIZER_SGD && h.nesterov && (h.momentum <= 0 || h.dampening != 0)) {
    return absl::InvalidArgumentError(
        "optimizer nesterov needs momentum > 0 and dampening = 0 (as torch.optim.SGD)");
  }
  if (s.ns_steps() < 0 || s.ns_steps() > 100) return Bad("ns_steps", s.ns_steps(), "in [0, 100]");
  if (!finite(s.max_grad_norm()) || s.max_grad_norm() < 0) {
    return Bad("max_grad_norm", s.max_grad_norm(), ">= 0 (0 = no clipping)");
  }
  const v1::LrSchedule& sc = s.schedule();
  if (!v1::ScheduleKind_IsValid(sc.kind())) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown schedule kind ", static_cast<int>(sc.kind())));
  }
  if (sc.warmup_steps() < 0 || sc.warmup_steps() > (int64_t{1} << 40)) {
    return Bad("schedule.warmup_steps", static_cast<double>(sc.warmup_steps()), "in [0, 2^40]");
  }
  if (sc.kind() == v1::SCHEDULE_COSINE) {
    if (sc.total_steps() <= sc.warmup_steps() || sc.total_steps() > (int64_t{1} << 40)) {
      return Bad("schedule.total_steps", static_cast<double>(sc.total_steps()),
                 "> schedule.warmup_steps and <= 2^40");
    }
    if (!(sc.min_lr() >= 0 && sc.min_lr() <= h.lr))
      return Bad("schedule.min_lr", sc.min_lr(), "in [0, lr]");
  }
  return absl::OkStatus();
}

absl::Status AppendTrainStep(ir::Graph& g, const v1::TrainingSpec& spec,
                             std::vector<std::pair<std::string, std::string>>* param_updates,
                             const StepExtras& extras) {
  KILN_RETURN_IF_ERROR(ValidateOptimizer(spec.optimizer()));
  KILN_ASSIGN_OR_RETURN(ValueRef loss, passes::FindOutput(g, spec.loss()));
  const ir::TensorType lt = g.TypeOf(loss);
  if (!IsFloat(lt.dtype) || lt.num_elements() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("the loss \"", spec.loss(),
                                                   "\" must be a float scalar, but it is ",
                                                   ir::TypeToString(lt, g.symbols())));
  }
  for (const ir::Node* p : g.Params()) {
    if (IsOptimizerState(p->name) || p->name.rfind(kUpdatePrefix, 0) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param \"", p->name, "\" uses a name reserved for optimizer state (opt/, update/)"));
    }
  }
  std::vector<std::string> names(spec.params().begin(), spec.params().end());
  if (names.empty()) {
    for (const ir::Node* p : g.Params()) {
      if (!p->attrs.param().frozen() && IsFloat(p->type().dtype)) names.push_back(p->name);
    }
    if (names.empty()) return absl::InvalidArgumentError("the graph has no trainable param");
  }
  KILN_ASSIGN_OR_RETURN(std::vector<ValueRef> wrt, passes::FindDifferentiable(g, names));
  for (size_t i = 0; i < wrt.size(); ++i) {
    const ir::Node& n = *g.FindNode(wrt[i].node);
    if (n.op != v1::OP_PARAM) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", names[i], "\" is an input; only params can be trained"));
    }
    if (n.attrs.param().frozen()) {
      return absl::InvalidArgumentError(absl::StrCat("param \"", names[i], "\" is frozen"));
    }
  }
  absl::flat_hash_set<std::string> no_decay;
  for (const std::string& n : spec.optimizer().no_weight_decay()) {
    if (std::find(names.begin(), names.end(), n) == names.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("no_weight_decay names \"", n, "\", which is not a trained param"));
    }
    no_decay.insert(n);
  }

  const LossScaling scaling = ScalingOf(extras.amp);
  g.outputs().push_back({"__train_loss", loss});
  const ir::Node& loss_node = *g.FindNode(loss.node);
  ValueRef one, loss_scale, good_steps, skipped_steps;
  {
    Builder b(g, loss_node);
    one = b.Sc(1, lt.dtype);
    if (scaling.mode == v1::LOSS_SCALE_STATIC) {
      loss_scale = b.Sc(scaling.init, v1::DTYPE_F32);
    } else if (scaling.mode == v1::LOSS_SCALE_DYNAMIC) {
      // 0 (fresh optimizer state) reads as init_scale.
      ir::TensorType f32;
      f32.dtype = v1::DTYPE_F32;
      ir::TensorType i64;
      i64.dtype = v1::DTYPE_I64;
      ValueRef state = AddParam(g, kLossScaleParam, f32);
      good_steps = AddParam(g, kGoodStepsParam, i64);
      skipped_steps = AddParam(g, kSkippedStepsParam, i64);
      loss_scale = b.r().Where(b.r().Compare(v1::COMPARE_GT, state, b.Sc(0, v1::DTYPE_F32)), state,
                               b.Sc(scaling.init, v1::DTYPE_F32));
    }
    if (Valid(loss_scale)) {
      one = lt.dtype == v1::DTYPE_F32 ? loss_scale : b.r().Cast(loss_scale, lt.dtype);
    }
    one = b.BroadcastTo(one, lt.dims);
    KILN_RETURN_IF_ERROR(b.status());
  }
  KILN_ASSIGN_OR_RETURN(std::vector<ValueRef> grads, passes::BuildVjp(g, loss, one, wrt));
  loss = g.outputs().back().value;
  g.outputs().pop_back();

  const Hyper h = Resolve(spec.optimizer());
  std::vector<Update> updates;
  ir::TensorType step_type;  // i64 scalar (a braced {} dims warns in GCC 12)
  step_type.dtype = v1::DTYPE_I64;
  ValueRef step = AddParam(g, kStepParam, step_type);
  Builder b(g, *g.FindNode(step.node));
  ValueRef next_step = b.Add(step, b.Sc(1, v1::DTYPE_I64));
  ValueRef t = b.r().Cast(next_step, v1::DTYPE_F32);
  ValueRef factor = ScheduleFactor(b, spec.optimizer().schedule(), t, h.lr);
  ValueRef lr = b.Scale(factor, h.lr);
  updates.push_back({kStepParam, next_step});
  ValueRef finite;  // DYNAMIC: whether every gradient is finite (bool scalar)
  if (Valid(loss_scale)) {
    ValueRef inv = b.Div(b.Sc(1, v1::DTYPE_F32), loss_scale);
    for (ValueRef& gr : grads) {
      const DType dt = b.T(gr).dtype;
      gr = b.Mul(gr, dt == v1::DTYPE_F32 ? inv : b.r().Cast(inv, dt));
    }
  }
  if (scaling.mode == v1::LOSS_SCALE_DYNAMIC) {
    // sum |g| is inf or NaN exactly when some gradient is (short of an f32
    // overflow of the sum itself, which would be no trainable step either).
    ValueRef total;
    for (ValueRef gr : grads) {
      ValueRef s = b.r().Reduce(v1::REDUCE_SUM, b.Un(v1::UNARY_ABS, gr), {}, false);
      if (b.T(s).dtype != v1::DTYPE_F32) s = b.r().Cast(s, v1::DTYPE_F32);
      total = Valid(total) ? b.Add(total, s) : s;
    }
    finite = b.r().Compare(v1::COMPARE_LE, total,
                           b.Sc(std::numeric_limits<float>::max(), v1::DTYPE_F32));
  }
  if (spec.optimizer().max_grad_norm() > 0) {
    // torch.nn.utils.clip_grad_norm_: scale by min(1, max / (norm + 1e-6)).
    ValueRef sq;
    for (ValueRef gr : grads) {
      ValueRef s = b.r().Reduce(v1::REDUCE_SUM, b.Mul(gr, gr), {}, false);
      if (b.T(s).dtype != v1::DTYPE_F32) s = b.r().Cast(s, v1::DTYPE_F32);
      sq = Valid(sq) ? b.Add(sq, s) : s;
    }
    ValueRef norm = b.Un(v1::UNARY_SQRT, sq);
    ValueRef coef = b.r().Binary(v1::BINARY_MIN,
                                 b.Div(b.Sc(spec.optimizer().max_grad_norm(), v1::DTYPE_F32),
                                       b.Add(norm, b.Sc(1e-6, v1::DTYPE_F32))),
                                 b.Sc(1, v1::DTYPE_F32));
    for (ValueRef& gr : grads) {
      const DType dt = b.T(gr).dtype;
      gr = b.Mul(gr, dt == v1::DTYPE_F32 ? coef : b.r().Cast(coef, dt));
    }
  }
  KILN_RETURN_IF_ERROR(b.status());
  Updater up(g, spec.optimizer(), h, t, lr);
  up.set_muon_lr(b.Scale(factor, h.muon_lr));
  KILN_RETURN_IF_ERROR(b.status());
  for (size_t i = 0; i < wrt.size(); ++i) {
    KILN_RETURN_IF_ERROR(
        up.Apply(names[i], wrt[i], grads[i], !no_decay.contains(names[i]), updates))
        << "while adding the update of \"" << names[i] << "\"";
  }
  for (const passes::LsqScale& s : extras.lsq_scales) {
    for (Update& u : updates) {
      if (u.name != s.param) continue;
      ValueRef p = FindParam(g, s.param);
      u.value =
          b.r().Where(b.r().Compare(v1::COMPARE_GT, p, b.Sc(0, v1::DTYPE_F32)), u.value, s.init);
    }
  }
  if (Valid(finite)) {
    // A skipped step keeps every param and state tensor as it was.
    for (Update& u : updates) u.value = b.r().Where(finite, u.value, FindParam(g, u.name));
    const ValueRef one_i = b.Sc(1, v1::DTYPE_I64), zero_i = b.Sc(0, v1::DTYPE_I64);
    ValueRef good = b.r().Where(finite, b.Add(good_steps, one_i), zero_i);
    ValueRef grow = b.r().Compare(v1::COMPARE_GE, good, b.Sc(scaling.interval, v1::DTYPE_I64));
    ValueRef scale_next =
        b.r().Where(finite, b.r().Where(grow, b.Scale(loss_scale, scaling.growth), loss_scale),
                    b.Scale(loss_scale, scaling.backoff));
    updates.push_back({kLossScaleParam, scale_next});
    updates.push_back({kGoodStepsParam, b.r().Where(grow, zero_i, good)});
    updates.push_back(
        {kSkippedStepsParam, b.Add(skipped_steps, b.r().Where(finite, zero_i, one_i))});
  }
  KILN_RETURN_IF_ERROR(b.status()) << "while adding the loss scaling";
  std::vector<ir::GraphOutput> outputs;
  outputs.push_back({spec.loss(), loss});
  outputs.push_back({kLrOutput, lr});
  if (Valid(loss_scale)) outputs.push_back({kLossScaleOutput, loss_scale});
  param_updates->clear();
  for (const Update& u : updates) {
    const std::string out = absl::StrCat(kUpdatePrefix, u.name);
    outputs.push_back({out, u.value});
    param_updates->emplace_back(out, u.name);
  }
  g.outputs() = std::move(outputs);
  return g.SortTopologically();
}

}  // namespace kiln::train
