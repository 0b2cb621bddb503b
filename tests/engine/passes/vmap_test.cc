// vmap (engine/passes/vmap.h) against the un-vmapped graph run once per
// slice: every output's slice i equals the graph on slice i of every batched
// input (f64 where the CPU runs the ops in f64, f32 for matmul), with the
// batch at several axes, some inputs unbatched, params never batched, and
// composed with grad (vmap of grad = per-example gradients). The errors name
// what is wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "absl/strings/str_replace.h"
#include "engine/engine.h"
#include "engine/ir/text.h"

namespace kiln {
namespace {

std::unique_ptr<Engine> MakeVmapEngine() {
  EngineOptions o;
  o.calibration = EngineOptions::Calibration::kNever;
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(e).value();
}

Engine& SharedVmapEngine() {
  static std::unique_ptr<Engine> engine = MakeVmapEngine();
  return *engine;
}

HostTensor Random(DType dt, const Dims& dims, std::mt19937& rng) {
  HostTensor t = HostTensor::Create(dt, dims).value();
  std::uniform_real_distribution<double> u(-1, 1);
  for (int64_t i = 0; i < t.num_elements(); ++i) t.SetFromDouble(i, u(rng));
  return t;
}

// Slice `i` of `t` along `axis` (the axis removed).
HostTensor SliceAt(const HostTensor& t, int64_t axis, int64_t i) {
  Dims dims = t.dims();
  const int64_t n = dims[axis];
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= dims[d];
  for (size_t d = axis + 1; d < dims.size(); ++d) inner *= dims[d];
  dims.erase(dims.begin() + axis);
  HostTensor out = HostTensor::Create(t.dtype(), dims).value();
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t k = 0; k < inner; ++k) {
      out.SetFromDouble(o * inner + k, t.GetAsDouble((o * n + i) * inner + k));
    }
  }
  return out;
}

struct VmapCase {
  std::string name;
  std::string text;
  int64_t axis = 0;
  std::vector<std::string> batched;  // empty = every input
  v1::AutodiffSpec autodiff = {};
  double tolerance = 1e-12;
};

void CheckAgainstSlices(const VmapCase& c, int64_t size) {
  SCOPED_TRACE(c.name);
  auto graph = ir::ParseGraphProto(c.text);
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto sig = SharedVmapEngine().Inspect(*graph);
  ASSERT_TRUE(sig.ok()) << sig.status();
  std::mt19937 rng(std::hash<std::string>()(c.name));
  std::vector<HostTensor> param_values;
  std::vector<TensorRef> param_refs;
  param_values.reserve(sig->params.size());
  for (const auto& p : sig->params) {
    Dims d;
    for (const auto& x : p.type.dims()) d.push_back(x.size());
    param_values.push_back(Random(p.type.dtype(), d, rng));
    param_refs.push_back(TensorRef::Of(p.name, param_values.back()));
  }
  auto params = SharedVmapEngine().CreateParams(param_refs);
  ASSERT_TRUE(params.ok()) << params.status();
  // The batched inputs get the batch at the axis; the others are shared.
  std::map<std::string, HostTensor> inputs;
  std::map<std::string, int64_t> batch_axis;
  for (const auto& in : sig->inputs) {
    Dims d;
    for (const auto& x : in.type.dims()) d.push_back(x.size());
    const bool batched = c.batched.empty() ||
                         std::find(c.batched.begin(), c.batched.end(), in.name) != c.batched.end();
    if (batched) {
      const int64_t a = c.axis < 0 ? c.axis + static_cast<int64_t>(d.size()) + 1 : c.axis;
      d.insert(d.begin() + a, size);
      batch_axis[in.name] = a;
    }
    inputs.emplace(in.name, Random(in.type.dtype(), d, rng));
  }
  CompileOptions co;
  co.device = "cpu:0";
  *co.transforms.mutable_autodiff() = c.autodiff;
  v1::VmapSpec* vm = co.transforms.mutable_vmap();
  vm->set_size(size);
  vm->set_axis(c.axis);
  for (const std::string& n : c.batched) vm->add_inputs(n);
  std::vector<TensorRef> refs;
  for (const auto& [n, t] : inputs) refs.push_back(TensorRef::Of(n, t));
  auto all = SharedVmapEngine().RunGraph(*graph, refs, params->get(), co, {});
  ASSERT_TRUE(all.ok()) << all.status();
  CompileOptions plain;
  plain.device = "cpu:0";
  *plain.transforms.mutable_autodiff() = c.autodiff;
  for (int64_t i = 0; i < size; ++i) {
    std::vector<HostTensor> slices;
    slices.reserve(inputs.size());
    std::vector<TensorRef> slice_refs;
    for (const auto& [n, t] : inputs) {
      auto it = batch_axis.find(n);
      slices.push_back(it == batch_axis.end() ? t.Clone() : SliceAt(t, it->second, i));
      slice_refs.push_back(TensorRef::Of(n, slices.back()));
    }
    auto one = SharedVmapEngine().RunGraph(*graph, slice_refs, params->get(), plain, {});
    ASSERT_TRUE(one.ok()) << one.status();
    ASSERT_EQ(one->outputs.size(), all->outputs.size());
    for (size_t k = 0; k < one->outputs.size(); ++k) {
      const auto& [name, want] = one->outputs[k];
      EXPECT_EQ(all->outputs[k].first, name);
      const HostTensor& got_all = all->outputs[k].second;
      const int64_t out_axis =
          c.axis < 0 ? c.axis + static_cast<int64_t>(want.dims().size()) + 1 : c.axis;
      Dims want_dims = want.dims();
      want_dims.insert(want_dims.begin() + out_axis, size);
      ASSERT_EQ(got_all.dims(), want_dims) << name;
      const HostTensor got = SliceAt(got_all, out_axis, i);
      for (int64_t e = 0; e < want.num_elements(); ++e) {
        const double w = want.GetAsDouble(e);
        ASSERT_NEAR(got.GetAsDouble(e), w, c.tolerance * std::max(1.0, std::abs(w)))
            << name << "[" << e << "] of slice " << i;
      }
    }
  }
}

TEST(Vmap, EqualsTheGraphRunPerSlice) {
  std::vector<VmapCase> cases;
  cases.push_back({"elementwise_broadcast",
                   "graph \"e\"\ninput x: f64[3]\ninput y: f64[2, 3]\nparam w: f64[3]\n"
                   "let z = tanh(x * w) + y * 2.0\nlet c = clamp(z, min=-0.5, max=0.6)\n"
                   "let d = exp(c) - x\nout c\nout d\n"});
  cases.push_back({"elementwise_axis1_x_only",
                   "graph \"e\"\ninput x: f64[3, 2]\ninput y: f64[2]\nparam w: f64[2]\n"
                   "let z = sin(x) * y + w\nout z\nout y\n",
                   1,
                   {"x"}});
  cases.push_back({"compare_where_cast",
                   "graph \"w\"\ninput a: f64[2, 3]\ninput b: f64[3]\nparam p: f64[3]\n"
                   "let c = gt(a, b)\nlet y = where(c, a * p, b)\n"
                   "let z = cast(cast(y, to=f32), to=f64) + cast(c, to=f64)\nout y\nout z\n",
                   1});
  cases.push_back(
      {"negative_axis", "graph \"e\"\ninput x: f64[3, 2]\nlet z = x * x - 1.0\nout z\n", -1});
  cases.push_back({"reduce_softmax_reshape_transpose",
                   "graph \"r\"\ninput x: f64[4, 5]\n"
                   "let s = softmax(x, axis=0)\nlet l = log_softmax(x, axis=-1)\n"
                   "let r = reduce_sum(x * s, axes=[1])\nlet m = reduce_max(l)\n"
                   "let k = reduce_mean(x, axes=[-2], keepdims=true)\n"
                   "let t = transpose(reshape(x, shape=[2, 10]), perm=[1, 0])\n"
                   "out r\nout m\nout k\nout t\n",
                   -1});
  cases.push_back({"matmul",
                   "graph \"m\"\ninput x: f32[6]\ninput a: f32[3, 6]\nparam w: f32[6, 4]\n"
                   "param v: f32[4]\n"
                   "let h = tanh(x @ w)\nlet k = a @ w\nlet q = k @ v\nlet p = w @ h\n"
                   "let s = x @ x\nout h\nout k\nout q\nout p\nout s\n",
                   0,
                   {},
                   {},
                   1e-5});
  cases.push_back({"matmul_one_side",
                   "graph \"m\"\ninput a: f32[3, 6]\ninput b: f32[6, 2]\n"
                   "let k = a @ b\nout k\n",
                   2,
                   {"a"},
                   {},
                   1e-5});
  // vmap of grad: per-example gradients of a per-example loss.
  v1::AutodiffSpec grad;
  grad.set_mode(v1::AUTODIFF_GRAD_WITH_LOSS);
  grad.set_output("loss");
  grad.add_wrt("w");
  grad.add_wrt("b");
  cases.push_back({"per_example_grad",
                   "graph \"g\"\ninput x: f64[4]\ninput t: f64[]\nparam w: f64[4]\nparam b: f64[]\n"
                   "let z = tanh(reduce_sum(x * w) + b)\nlet loss = (z - t) * (z - t)\nout loss\n",
                   0,
                   {},
                   grad});
  for (const VmapCase& c : cases) CheckAgainstSlices(c, 5);
  // A batch of one.
  CheckAgainstSlices(cases[0], 1);
}

TEST(Vmap, RecordedInTheExecutableKey) {
  auto graph = ir::ParseGraphProto("graph \"k\"\ninput x: f64[3]\nlet y = x * x\nout y\n");
  ASSERT_TRUE(graph.ok());
  CompileOptions a, b;
  a.device = b.device = "cpu:0";
  a.transforms.mutable_vmap()->set_size(4);
  b.transforms.mutable_vmap()->set_size(4);
  b.transforms.mutable_vmap()->set_axis(1);
  auto ea = SharedVmapEngine().Compile(*graph, a, {});
  auto eb = SharedVmapEngine().Compile(*graph, b, {});
  ASSERT_TRUE(ea.ok() && eb.ok()) << ea.status() << eb.status();
  EXPECT_NE(ea->executable->key(), eb->executable->key());
  const v1::TensorType& in = ea->executable->signature().inputs.at(0).type;
  ASSERT_EQ(in.dims_size(), 2);
  EXPECT_EQ(in.dims(0).size(), 4);
  EXPECT_EQ(in.dims(1).size(), 3);
}

TEST(Vmap, ErrorsNameWhatIsWrong) {
  auto expect = [](const std::string& text, const v1::VmapSpec& spec, absl::StatusCode code,
                   const std::string& needle, bool training = false) {
    auto graph = ir::ParseGraphProto(text);
    ASSERT_TRUE(graph.ok()) << graph.status();
    CompileOptions co;
    co.device = "cpu:0";
    *co.transforms.mutable_vmap() = spec;
    if (training) {
      co.transforms.mutable_training()->set_loss("y");
      co.transforms.mutable_training()->mutable_optimizer()->set_kind(v1::OPTIMIZER_SGD);
      co.transforms.mutable_training()->mutable_optimizer()->set_lr(0.1);
    }
    auto r = SharedVmapEngine().Compile(*graph, co, {});
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status();
  };
  const std::string simple = "graph \"s\"\ninput x: f64[3]\nlet y = x * x\nout y\n";
  v1::VmapSpec s;
  s.set_size(4);
  s.set_axis(2);
  expect(simple, s, absl::StatusCode::kInvalidArgument,
         "vmap axis 2 is out of range for input \"x\" of rank 1");
  s.set_axis(0);
  s.add_inputs("z");
  expect(simple, s, absl::StatusCode::kInvalidArgument,
         "vmap inputs name \"z\", which is no input of the graph; its inputs: x");
  s.clear_inputs();
  s.set_size(0);
  expect(simple, s, absl::StatusCode::kInvalidArgument, "vmap size 0 is out of range");
  s.set_size(4);
  expect("graph \"c\"\ninput x: f64[3]\nlet y = cumsum(x, axis=0)\nout y\n", s,
         absl::StatusCode::kUnimplemented, "(cumsum) has no vmap batching rule");
  expect("graph \"c\"\ninput x: f64[3]\nparam w: f64[3]\nlet y = reduce_sum(x * w)\nout y\n", s,
         absl::StatusCode::kInvalidArgument, "both a training step and vmap", true);
}

}  // namespace
}  // namespace kiln
