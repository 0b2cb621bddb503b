#include "engine/quant/int8_export.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/ir/graph.h"
#include "engine/ir/rewriter.h"
#include "engine/ir/verifier.h"

namespace kiln::quant {
namespace {

using ir::ValueRef;

// The constants of passes/qat.cc, in f32 as its graph computes them.
constexpr float kMinRange = 1e-30f;
constexpr float kMinRangeFraction = 0x1p-30f;

struct QuantizedWeight {
  HostTensor q;       // i8, the weight's dims
  HostTensor scale;   // f32 [] or [N]
  HostTensor colsum;  // f32 [N] (or []): sum over K of q, for an asymmetric activation
};

// Quantizes w ([K, N], or [N, K] when `tb`) as passes/qat.cc's graph does.
absl::StatusOr<QuantizedWeight> QuantizeWeight(const HostTensor& w, bool tb, bool per_channel,
                                               const HostTensor* lsq) {
  const int64_t rows = w.dims()[0], cols = w.dims()[1];
  const int64_t n = tb ? rows : cols, k = tb ? cols : rows;
  const int64_t channels = per_channel ? n : 1;
  const float* v = w.data_as<float>();
  auto at = [&](int64_t kk, int64_t nn) { return v[tb ? nn * cols + kk : kk * cols + nn]; };
  std::vector<float> s(channels);
  if (lsq != nullptr) {
    const float init_mult = static_cast<float>(2 / std::sqrt(127.0));
    for (int64_t c = 0; c < channels; ++c) {
      const float learned = lsq->data_as<float>()[c];
      if (learned > 0) {
        s[c] = learned;
        continue;
      }
      double sum = 0;
      int64_t count = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        for (int64_t nn = per_channel ? c : 0; nn < (per_channel ? c + 1 : n); ++nn) {
          sum += std::abs(at(kk, nn)), ++count;
        }
      }
      s[c] = std::max(static_cast<float>(sum / std::max<int64_t>(1, count)) * init_mult, kMinRange);
    }
  } else {
    std::vector<float> amax(channels, 0.0f);
    for (int64_t kk = 0; kk < k; ++kk) {
      for (int64_t nn = 0; nn < n; ++nn) {
        float& m = amax[per_channel ? nn : 0];
        m = std::max(m, std::abs(at(kk, nn)));
      }
    }
    const float top = *std::max_element(amax.begin(), amax.end());
    for (int64_t c = 0; c < channels; ++c) {
      const float a = std::max(amax[c], top * kMinRangeFraction);
      s[c] = std::max(a, kMinRange) / 127.0f;
    }
  }
  QuantizedWeight out;
  KILN_ASSIGN_OR_RETURN(out.q, HostTensor::Create(v1::DTYPE_I8, w.dims()));
  KILN_ASSIGN_OR_RETURN(out.scale,
                        HostTensor::Create(v1::DTYPE_F32, per_channel ? Dims{n} : Dims{}));
  KILN_ASSIGN_OR_RETURN(out.colsum,
                        HostTensor::Create(v1::DTYPE_F32, per_channel ? Dims{n} : Dims{n}));
  std::copy(s.begin(), s.end(), out.scale.data_as<float>());
  int8_t* q = out.q.data_as<int8_t>();
  for (int64_t kk = 0; kk < k; ++kk) {
    for (int64_t nn = 0; nn < n; ++nn) {
      const float r = std::nearbyint(at(kk, nn) / s[per_channel ? nn : 0]);
      const int8_t qv = static_cast<int8_t>(std::clamp(r, -128.0f, 127.0f));
      q[tb ? nn * cols + kk : kk * cols + nn] = qv;
      out.colsum.data_as<float>()[nn] += qv;
    }
  }
  return out;
}

ValueRef AddParam(ir::Graph& g, const std::string& name, const ir::TensorType& type) {
  auto node = std::make_unique<ir::Node>();
  node->op = v1::OP_PARAM;
  node->name = name;
  node->attrs.mutable_param()->set_frozen(true);
  node->outputs.push_back(type);
  return g.AddNode(std::move(node))->out();
}

std::vector<int64_t> AllAxes(int64_t rank) {
  std::vector<int64_t> axes(rank);
  for (int64_t i = 0; i < rank; ++i) axes[i] = i;
  return axes;
}

}  // namespace

absl::StatusOr<Int8Model> ExportInt8(const v1::Graph& proto, const v1::QatSpec& qat,
                                     const std::map<std::string, HostTensor>& trained) {
  if (qat.bits() != 0 && qat.bits() != 8) {
    return absl::UnimplementedError(
        absl::StrCat("int8 export of a ", qat.bits(), "-bit QAT graph: only 8 bits export"));
  }
  if (qat.weight_asymmetric()) {
    return absl::UnimplementedError(
        "int8 export of asymmetric weights: oneDNN's int8 matmul takes symmetric (s8) weights; "
        "train with symmetric weights (the default) to export");
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<ir::Graph> g, ir::ImportGraph(proto));
  Int8Model model;
  const auto uses = g->UseCounts();
  std::map<std::string, HostTensor> added;
  std::vector<int32_t> targets;
  for (const auto& n : g->nodes()) {
    if (n->op == v1::OP_MATMUL && n->type().dtype == v1::DTYPE_F32) targets.push_back(n->id);
  }
  for (const auto& n : g->nodes()) {
    if (n->op == v1::OP_CONV) {
      model.notes.push_back(absl::StrCat(ir::NodeLabel(*n), " stays f32 (conv is not exported)"));
    }
  }
  for (int32_t id : targets) {
    const ir::Node& mm = *g->FindNode(id);
    ir::Node& wn = *g->FindNode(mm.operands[1].node);
    if (wn.op != v1::OP_PARAM || wn.type().rank() != 2 || uses.at(mm.operands[1]) != 1 ||
        g->TypeOf(mm.operands[0]).dtype != v1::DTYPE_F32) {
      model.notes.push_back(absl::StrCat(
          ir::NodeLabel(mm), " stays f32 (its weight is not a rank-2 param of its own)"));
      continue;
    }
    const std::string name = wn.name;
    auto it = trained.find(name);
    if (it == trained.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the trained value of \"", name, "\" is not given"));
    }
    const HostTensor& w = it->second;
    if (w.dtype() != v1::DTYPE_F32 || w.dims() != wn.type().dims_vector()) {
      return absl::InvalidArgumentError(absl::StrCat("\"", name, "\" must be f32",
                                                     DimsToString(wn.type().dims_vector()), ", is ",
                                                     DTypeName(w.dtype()), DimsToString(w.dims())));
    }
    const bool ta = mm.attrs.matmul().transpose_a(), tb = mm.attrs.matmul().transpose_b();
    const int64_t channel_axis = tb ? 0 : 1;
    const int64_t n = w.dims()[channel_axis];
    const HostTensor* lsq = nullptr;
    if (qat.lsq()) {
      auto s = trained.find(name + "/lsq_scale");
      const int64_t want = qat.weight_per_channel() ? n : 1;
      if (s != trained.end()) {
        if (s->second.dtype() != v1::DTYPE_F32 || s->second.num_elements() != want) {
          return absl::InvalidArgumentError(
              absl::StrCat("\"", name, "/lsq_scale\" must be f32 with ", want, " values"));
        }
        lsq = &s->second;
      }
    }
    HostTensor zeros;
    if (qat.lsq() && lsq == nullptr) {
      KILN_ASSIGN_OR_RETURN(zeros,
                            HostTensor::Create(v1::DTYPE_F32, {qat.weight_per_channel() ? n : 1}));
      lsq = &zeros;
    }
    KILN_ASSIGN_OR_RETURN(QuantizedWeight qw, QuantizeWeight(w, tb, qat.weight_per_channel(), lsq));
    wn.outputs[0].dtype = v1::DTYPE_I8;
    ir::TensorType st;
    st.dtype = v1::DTYPE_F32;
    if (qat.weight_per_channel()) st.dims = {n};
    const std::string scale_name = name + "/scale";
    ValueRef sw = AddParam(*g, scale_name, st);
    ir::Rewriter r(*g, mm, mm.path);
    const ValueRef x = mm.operands[0];
    const DType f32 = v1::DTYPE_F32;
    ValueRef y;
    if (qat.weights_only()) {
      v1::Attrs d;
      if (qat.weight_per_channel()) d.mutable_dequantize()->set_axis(channel_axis);
      ValueRef wf = r.Add(v1::OP_DEQUANTIZE, {mm.operands[1], sw}, std::move(d));
      y = r.MatMul(x, wf, ta, tb);
    } else {
      const int64_t rank = g->TypeOf(x).rank();
      v1::Attrs qa;
      qa.mutable_quantize()->set_bits(8);
      ValueRef sx, qx, zp;
      if (!qat.activation_asymmetric()) {
        ValueRef amax = r.Reduce(v1::REDUCE_MAX, r.Unary(v1::UNARY_ABS, x), AllAxes(rank), false);
        sx = r.Binary(v1::BINARY_DIV, r.Binary(v1::BINARY_MAX, amax, r.Scalar(kMinRange, f32)),
                      r.Scalar(127, f32));
        qa.mutable_quantize()->set_symmetric(true);
        qa.mutable_quantize()->set_to(v1::DTYPE_I8);
        qx = r.Add(v1::OP_QUANTIZE, {x, sx}, std::move(qa));
      } else {
        const ValueRef zero = r.Scalar(0, f32);
        ValueRef lo =
            r.Binary(v1::BINARY_MIN, r.Reduce(v1::REDUCE_MIN, x, AllAxes(rank), false), zero);
        ValueRef hi =
            r.Binary(v1::BINARY_MAX, r.Reduce(v1::REDUCE_MAX, x, AllAxes(rank), false), zero);
        ValueRef range = r.Binary(v1::BINARY_SUB, hi, lo);
        sx = r.Binary(v1::BINARY_DIV, r.Binary(v1::BINARY_MAX, range, r.Scalar(kMinRange, f32)),
                      r.Scalar(255, f32));
        zp = r.Unary(v1::UNARY_ROUND, r.Binary(v1::BINARY_DIV, r.Unary(v1::UNARY_NEG, lo), sx));
        zp = r.Binary(v1::BINARY_MIN, zp, r.Scalar(255, f32));
        qa.mutable_quantize()->set_to(v1::DTYPE_U8);
        qx = r.Add(v1::OP_QUANTIZE, {x, sx, r.Cast(zp, v1::DTYPE_U8)}, std::move(qa));
      }
      ValueRef acc = r.MatMul(qx, mm.operands[1], ta, tb);
      y = r.Cast(acc, f32);
      if (qat.activation_asymmetric()) {
        KILN_ASSIGN_OR_RETURN(HostTensor colsum, HostTensor::Create(f32, {n}));
        std::copy_n(qw.colsum.data_as<float>(), n, colsum.data_as<float>());
        y = r.Binary(v1::BINARY_SUB, y,
                     r.Binary(v1::BINARY_MUL, zp, r.Constant(std::move(colsum))));
      }
      y = r.Binary(v1::BINARY_MUL, y, r.Binary(v1::BINARY_MUL, sx, sw));
    }
    KILN_RETURN_IF_ERROR(r.status()) << "while exporting " << ir::NodeLabel(mm) << " to int8";
    r.last()->name = mm.name;
    g->ReplaceAllUses(mm.out(), y);
    added.emplace(name, std::move(qw.q));
    added.emplace(scale_name, std::move(qw.scale));
    model.notes.push_back(absl::StrCat(
        ir::NodeLabel(mm), ": ",
        qat.weights_only() ? "i8 weights, f32 product" : "integer product (i8 x i8 -> i32)"));
  }
  g->RemoveDeadNodes();
  KILN_RETURN_IF_ERROR(g->SortTopologically());
  KILN_RETURN_IF_ERROR(ir::VerifyGraph(*g)) << "while verifying the int8 graph";
  for (const ir::Node* p : g->Params()) {
    if (auto a = added.find(p->name); a != added.end()) {
      model.params.emplace(p->name, std::move(a->second));
      continue;
    }
    auto t = trained.find(p->name);
    if (t == trained.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the trained value of \"", p->name, "\" is not given"));
    }
    model.params.emplace(p->name, t->second.Clone());
  }
  ir::ExportGraph(*g, &model.graph);
  return model;
}

}  // namespace kiln::quant
