// Loops whose trip count is a graph input (value specialisation,
// engine/io/onnx/onnx_specialize.h) and Slices whose start is computed at run
// time (a Gather of an import-time extent). Outputs are checked against f64
// references computed here.
#include "engine/io/onnx/onnx_specialize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "base/status.h"
#include "tests/engine/io/onnx_test_model.h"

namespace kiln::onnx_specialize_test {
namespace {

using onnx_test::MakeEngine;
using onnx_test::Model;
using onnx_test::SubInput;
using onnx_test::SubNode;

void TensorAttr(onnx::NodeProto* n, int type, std::vector<int64_t> dims,
                std::vector<double> values) {
  auto* a = n->add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  auto* t = a->mutable_t();
  t->set_data_type(type);
  for (int64_t d : dims) t->add_dims(d);
  for (double v : values) {
    if (type == onnx::TensorProto::FLOAT) t->add_float_data(static_cast<float>(v));
    if (type == onnx::TensorProto::INT64) t->add_int64_data(static_cast<int64_t>(v));
  }
}

const std::vector<double> kTable = {1, 2, 3, 4, 5};

// test_loop11's graph (ONNX's own Loop example) with M and cond graph inputs,
// plus an unrelated integer input `pick` (a Gather index: data, not a shape):
//   y_k = y_{k-1} + table[k:k+1] for k < M; res_scan stacks every y_k.
Model LoopModel() {
  Model m(11);
  m.Input("M", {}, onnx::TensorProto::INT64);
  m.Input("cond", {}, onnx::TensorProto::BOOL);
  m.Input("y", {1});
  m.Input("pick", {}, onnx::TensorProto::INT64);
  auto* loop = m.Node("Loop", {"M", "cond", "y"}, {"res_y", "res_scan"}, "loop");
  auto* a = loop->add_attribute();
  a->set_name("body");
  a->set_type(onnx::AttributeProto::GRAPH);
  onnx::GraphProto& body = *a->mutable_g();
  body.set_name("body");
  SubInput(body, "i", onnx::TensorProto::INT64);
  SubInput(body, "c", onnx::TensorProto::BOOL);
  SubInput(body, "y_in", onnx::TensorProto::FLOAT);
  SubNode(body, "Identity", {"c"}, {"c_out"});
  TensorAttr(SubNode(body, "Constant", {}, {"table"}), onnx::TensorProto::FLOAT, {5}, kTable);
  TensorAttr(SubNode(body, "Constant", {}, {"one"}), onnx::TensorProto::INT64, {}, {1});
  SubNode(body, "Add", {"i", "one"}, {"end"});
  Model::Ints(SubNode(body, "Unsqueeze", {"i"}, {"start1"}), "axes", {0});
  Model::Ints(SubNode(body, "Unsqueeze", {"end"}, {"end1"}), "axes", {0});
  SubNode(body, "Slice", {"table", "start1", "end1"}, {"s"});
  SubNode(body, "Add", {"y_in", "s"}, {"y_out"});
  SubNode(body, "Identity", {"y_out"}, {"scan"});
  for (const char* o : {"c_out", "y_out", "scan"}) body.add_output()->set_name(o);
  m.Init("weights", {3}, {10, 20, 30});
  m.Node("Gather", {"weights", "pick"}, {"picked"});
  m.Output("res_y");
  m.Output("res_scan");
  m.Output("picked");
  return m;
}

struct LoopRun {
  int64_t m;
  bool cond;
  int64_t pick;
};

absl::StatusOr<RunResult> RunLoop(Engine& engine, io::OnnxSpecializer& s, const LoopRun& r) {
  const HostTensor m = HostTensor::FromVector<int64_t>(v1::DTYPE_I64, {}, {r.m});
  const HostTensor c = HostTensor::FromVector<bool>(v1::DTYPE_BOOL, {}, {r.cond});
  const HostTensor y = HostTensor::FromVector<float>(v1::DTYPE_F32, {1}, {-2});
  const HostTensor p = HostTensor::FromVector<int64_t>(v1::DTYPE_I64, {}, {r.pick});
  const std::vector<std::pair<std::string, const HostTensor*>> all = {
      {"M", &m}, {"cond", &c}, {"y", &y}, {"pick", &p}};
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<const io::OnnxModel> model, s.For(all));
  std::vector<TensorRef> refs;
  const std::vector<std::string> fixed = s.value_inputs();
  for (const auto& [name, t] : all) {
    if (std::find(fixed.begin(), fixed.end(), name) == fixed.end())
      refs.push_back(TensorRef::Of(name, *t));
  }
  return engine.RunGraph(model->graph, refs, nullptr, {}, {});
}

TEST(OnnxSpecializer, LoopTripCountFromAnInputCompilesOncePerValue) {
  io::OnnxSpecializer::Options o;
  o.max_specializations = 2;
  auto s = io::OnnxSpecializer::Create(LoopModel().Bytes(), o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE((*s)->generic());
  auto engine = MakeEngine();
  for (LoopRun r : {LoopRun{5, true, 1}, {3, true, 2}, {0, true, 0}, {4, false, 1}, {5, true, 0}}) {
    auto out = RunLoop(*engine, **s, r);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->outputs.size(), 3u);
    const int64_t trips = r.cond ? r.m : 0;
    const HostTensor& scan = out->outputs[1].second;
    ASSERT_EQ(scan.dims(), (Dims{trips, 1})) << "M=" << r.m;
    double y = -2;
    for (int64_t k = 0; k < trips; ++k) {
      y += kTable[k];
      EXPECT_EQ(scan.GetAsDouble(k), y) << "M=" << r.m << " k=" << k;
    }
    EXPECT_EQ(out->outputs[0].second.GetAsDouble(0), y) << "M=" << r.m;
    EXPECT_EQ(out->outputs[2].second.GetAsDouble(0), 10.0 * (r.pick + 1));
  }
  // M and cond determine shapes; pick (a gather index) stays a run-time input.
  EXPECT_EQ((*s)->value_inputs(), (std::vector<std::string>{"M", "cond"}));
  EXPECT_EQ((*s)->cached(), 2);
  // M=5 was dropped (least recently used) and imported again at the end; a
  // value still held is not imported again.
  const int64_t imports = (*s)->imports();
  ASSERT_TRUE(RunLoop(*engine, **s, {5, true, 2}).ok());
  EXPECT_EQ((*s)->imports(), imports);
}

TEST(OnnxSpecializer, TripCountOverTheIterationLimitIsAClearError) {
  io::OnnxSpecializer::Options o;
  o.import.max_loop_iterations = 4;
  auto s = io::OnnxSpecializer::Create(LoopModel().Bytes(), o);
  ASSERT_TRUE(s.ok()) << s.status();
  auto engine = MakeEngine();
  ASSERT_TRUE(RunLoop(*engine, **s, {4, true, 0}).ok());
  auto out = RunLoop(*engine, **s, {1000000000000, true, 0});
  ASSERT_FALSE(out.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(out.status())) << out.status();
  EXPECT_TRUE(absl::StrContains(out.status().message(), "iteration limit of 4")) << out.status();
}

TEST(OnnxSpecializer, InterfaceIsTheDeclaredInputsOutputsAndInitializers) {
  auto i = io::ReadOnnxInterface(LoopModel().Bytes(), {});
  ASSERT_TRUE(i.ok()) << i.status();
  ASSERT_EQ(i->inputs.size(), 4u);  // "weights" is an initializer, not an input
  EXPECT_EQ(i->inputs[0].first, "M");
  EXPECT_EQ(i->inputs[0].second.dtype(), v1::DTYPE_I64);
  EXPECT_EQ(i->inputs[0].second.dims_size(), 0);
  EXPECT_EQ(i->inputs[2].first, "y");
  ASSERT_EQ(i->inputs[2].second.dims_size(), 1);
  EXPECT_EQ(i->inputs[2].second.dims(0).size(), 1);
  ASSERT_EQ(i->outputs.size(), 3u);
  EXPECT_EQ(i->outputs[1].first, "res_scan");
  ASSERT_EQ(i->initializers.size(), 1u);
  EXPECT_EQ(i->initializers[0].first, "weights");
  EXPECT_EQ(i->initializers[0].second.dims(), (Dims{3}));
  EXPECT_EQ(i->initializers[0].second.GetAsDouble(2), 30.0);
  EXPECT_FALSE(io::ReadOnnxInterface("not a model", {}).ok());
}

TEST(OnnxSpecializer, MissingOrWrongValueInputIsInvalidArgument) {
  auto s = io::OnnxSpecializer::Create(LoopModel().Bytes(), {});
  ASSERT_TRUE(s.ok()) << s.status();
  const HostTensor y = HostTensor::FromVector<float>(v1::DTYPE_F32, {1}, {0});
  const HostTensor big = HostTensor::FromVector<float>(v1::DTYPE_F32, {}, {5});
  std::vector<std::pair<std::string, const HostTensor*>> in = {{"y", &y}};
  auto r = (*s)->For(in);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "\"M\"")) << r.status();
  in.emplace_back("M", &big);
  r = (*s)->For(in);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  // An integer M of another type or shape than the model declares (i64[]).
  const HostTensor m32 = HostTensor::FromVector<int32_t>(v1::DTYPE_I32, {}, {3});
  const HostTensor m2 = HostTensor::FromVector<int64_t>(v1::DTYPE_I64, {2}, {3, 3});
  for (const HostTensor* m : {&m32, &m2}) {
    in.back().second = m;
    r = (*s)->For(in);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "must be i64[]")) << r.status();
  }
}

TEST(OnnxSpecializer, TripCountPastTheSlicedTableFailsTheRun) {
  // ONNX would slice table[5:6] as empty; Kiln's extent is fixed at 1, so the
  // run fails on the gather's range check (and the engine stays usable).
  auto s = io::OnnxSpecializer::Create(LoopModel().Bytes(), {});
  ASSERT_TRUE(s.ok()) << s.status();
  auto engine = MakeEngine();
  auto out = RunLoop(*engine, **s, {6, true, 0});
  ASSERT_FALSE(out.ok());
  EXPECT_TRUE(absl::StrContains(out.status().message(), "out of range")) << out.status();
  EXPECT_TRUE(RunLoop(*engine, **s, {2, true, 0}).ok());
}

TEST(OnnxSpecializer, ModelWithoutValueInputsImportsOnce) {
  // x[s : s + 2] with s a run-time input: a Gather, no specialisation.
  Model m(13);
  m.Input("x", {6});
  m.Input("s", {1}, onnx::TensorProto::INT64);
  m.InitInts("two", {2});
  m.Node("Add", {"s", "two"}, {"e"});
  m.Node("Slice", {"x", "s", "e"}, {"y"});
  m.Output("y");
  auto sp = io::OnnxSpecializer::Create(m.Bytes(), {});
  ASSERT_TRUE(sp.ok()) << sp.status();
  EXPECT_TRUE((*sp)->generic());
  EXPECT_EQ((*sp)->imports(), 1);
  const HostTensor x = HostTensor::FromVector<float>(v1::DTYPE_F32, {6}, {0, 1, 2, 3, 4, 5});
  auto engine = MakeEngine();
  // ONNX's Slice: a negative start counts from the end; the result is
  // empty (here: a failed run, the extent being fixed) when the clamped end
  // is not past the clamped start, and shorter when the end is past the dim.
  for (int64_t start : {0, 1, 4, -3, -2, -1, 5, -7}) {
    const HostTensor st = HostTensor::FromVector<int64_t>(v1::DTYPE_I64, {1}, {start});
    auto model =
        (*sp)->For(std::vector<std::pair<std::string, const HostTensor*>>{{"x", &x}, {"s", &st}});
    ASSERT_TRUE(model.ok()) << model.status();
    const std::vector<TensorRef> refs = {TensorRef::Of("x", x), TensorRef::Of("s", st)};
    auto out = engine->RunGraph((*model)->graph, refs, nullptr, {}, {});
    const int64_t n = 6;
    const int64_t b = std::clamp<int64_t>(start < 0 ? start + n : start, 0, n);
    const int64_t e = std::clamp<int64_t>(start + 2 < 0 ? start + 2 + n : start + 2, 0, n);
    if (e - b != 2) {
      EXPECT_FALSE(out.ok()) << "start " << start << ": ONNX gives " << std::max<int64_t>(0, e - b)
                             << " elements, not 2";
      continue;
    }
    ASSERT_TRUE(out.ok()) << "start " << start << ": " << out.status();
    const HostTensor& y = out->outputs[0].second;
    ASSERT_EQ(y.dims(), (Dims{2}));
    for (int64_t j = 0; j < 2; ++j)
      EXPECT_EQ(y.GetAsDouble(j), static_cast<double>(b + j)) << start;
  }
  EXPECT_EQ((*sp)->imports(), 1);
}

TEST(OnnxSpecializer, RunTimeSliceEndingBeforeItsStartIsRefused) {
  // x[s : s - 1]: empty for most s, but ONNX counts a negative end from the
  // dim (s = 1, end = 0: empty; s = 0, end = -1: five elements), so the
  // extent is not known at import.
  Model m(13);
  m.Input("x", {6});
  m.Input("s", {1}, onnx::TensorProto::INT64);
  m.InitInts("one", {1});
  m.Node("Sub", {"s", "one"}, {"e"});
  m.Node("Slice", {"x", "s", "e"}, {"y"});
  m.Output("y");
  auto r = io::ImportOnnxModel(m.Bytes(), {});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsUnimplemented(r.status())) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "end is before its start")) << r.status();
}

TEST(OnnxSpecializer, RunTimeSliceWithUnknownExtentIsRefused) {
  Model m(13);
  m.Input("x", {6});
  m.Input("s", {1}, onnx::TensorProto::INT64);
  m.Input("e", {1}, onnx::TensorProto::INT64);
  m.Node("Slice", {"x", "s", "e"}, {"y"});
  m.Output("y");
  auto r = io::ImportOnnxModel(m.Bytes(), {});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsUnimplemented(r.status())) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "end must be the start plus a constant"))
      << r.status();
  // Specialised on s and e (both small integer inputs), it runs.
  auto sp = io::OnnxSpecializer::Create(m.Bytes(), {});
  ASSERT_TRUE(sp.ok()) << sp.status();
  const HostTensor x = HostTensor::FromVector<float>(v1::DTYPE_F32, {6}, {0, 1, 2, 3, 4, 5});
  const HostTensor s = HostTensor::FromVector<int64_t>(v1::DTYPE_I64, {1}, {1});
  const HostTensor e = HostTensor::FromVector<int64_t>(v1::DTYPE_I64, {1}, {4});
  auto model = (*sp)->For(
      std::vector<std::pair<std::string, const HostTensor*>>{{"x", &x}, {"s", &s}, {"e", &e}});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*sp)->value_inputs(), (std::vector<std::string>{"s", "e"}));
  auto engine = MakeEngine();
  auto out = engine->RunGraph((*model)->graph, std::vector<TensorRef>{TensorRef::Of("x", x)},
                              nullptr, {}, {});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->outputs[0].second.dims(), (Dims{3}));
  EXPECT_EQ(out->outputs[0].second.GetAsDouble(2), 3.0);
}

}  // namespace
}  // namespace kiln::onnx_specialize_test
