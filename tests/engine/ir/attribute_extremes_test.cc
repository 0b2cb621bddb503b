// Every integer attribute of the shape-bearing ops set to the int64 edge
// values, one field (or list entry) at a time, through the path kilnd takes:
// ImportGraph (verify + infer), ExportGraph, PrintGraph, then Specialize where
// inputs are symbolic. Each graph is accepted or rejected with INVALID_ARGUMENT
// or RESOURCE_EXHAUSTED; an accepted one has only dims that are sizes, `?` or a
// symbol of its graph. Under 2 s.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/ir/text.h"
#include "engine/ir/verifier.h"
#include "gtest/gtest.h"

namespace kiln::ir {
namespace {

namespace pb = google::protobuf;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
const std::vector<int64_t> kExtremes = {
    0, -1, 1, 2, kInt64Max, kInt64Min, kInt64Max / 2 + 1, int64_t{1} << 62, int64_t{1} << 32, int64_t{1} << 31,
    (int64_t{1} << 30) - 1, kInt64Max - 1, kInt64Min + 1, -2,
};

// Each graph names the node under test "n". Symbolic variants reach the rules'
// symbolic branches at import and their concrete ones at Specialize.
const char* const kGraphs[] = {
    "input x: f32[4, 3]\nlet n = pad(x, low=[1, 0], high=[0, 2])\nout n",
    "input x: f32[b, 3]\nlet n = pad(x, low=[1, 0], high=[0, 2], mode=reflect)\nout n",
    "input x: f32[4, 3]\nlet n = pad(x, low=[1, 0], high=[0, 2], mode=edge)\nout n",
    "input x: f32[1, 2, 8]\ninput w: f32[4, 2, 3]\nlet n = conv(x, w, stride=[1], dilation=[1], "
    "pad_low=[0], pad_high=[0])\nout n",
    "input x: f32[1, 4, 6, 6]\ninput w: f32[4, 2, 3, 3]\nlet n = conv(x, w, stride=[2, 1], "
    "dilation=[1, 2], pad_low=[1, 1], pad_high=[1, 0], groups=2)\nout n",
    "input x: f32[b, 2, l]\ninput w: f32[4, 2, k]\nlet n = conv(x, w, stride=[1], dilation=[1], "
    "pad_low=[0], pad_high=[0])\nout n",
    "input x: f32[1, 2, 4, 4]\ninput w: f32[2, 3, 3, 3]\nlet n = conv_transpose2d(x, w, "
    "stride=[2, 2], dilation=[1, 1], pad_low=[1, 0], pad_high=[0, 1], output_padding=[1, 0], "
    "groups=1)\nout n",
    "input x: f32[1, 2, h, 4]\ninput w: f32[2, 3, 3, 3]\nlet n = conv_transpose2d(x, w, "
    "stride=[2, 2], dilation=[1, 1], pad_low=[1, 0], pad_high=[0, 1], output_padding=[1, 0])\nout n",
    "input x: f32[1, 2, 8, 8]\nlet n = max_pool(x, window=[2, 3], stride=[2, 1], pad_low=[1, 0], "
    "pad_high=[0, 1])\nout n",
    "input x: f32[1, 2, l]\nlet n = avg_pool(x, window=[3], stride=[2], pad_low=[1], pad_high=[1])"
    "\nout n",
    "input x: f32[5, 6]\nlet n = slice(x, start=[1, 0], stop=[4, -1], step=[2, 1], axes=[0, 1])"
    "\nout n",
    "input x: f32[b, 6]\nlet n = slice(x, start=[1, 0], stop=[4, -1], step=[2, 1])\nout n",
    "input x: f32[2, 3, 4]\nlet n = reshape(x, shape=[6, -1])\nout n",
    "input x: f32[b, 3, 4]\nlet n = reshape(x, shape=[-1, 3, 4])\nout n",
    "input x: f32[3, 1]\nlet n = expand(x, shape=[2, 3, 4])\nout n",
    "input x: f32[2, 3]\nlet n = concat(x, x, axis=1)\nout n",
    "input x: f32[b, 3]\nlet n = concat(x, x, axis=0)\nout n",
    "input x: f32[2, 3, 4]\nlet n = transpose(x, perm=[2, 0, 1])\nout n",
    "input x: f32[5, 3]\ninput i: i64[2, 2]\nlet n = gather(x, i, axis=1)\nout n",
    "input x: f32[5, 3]\ninput i: i64[2]\ninput u: f32[5, 2]\nlet n = scatter_add(x, i, u, axis=1)"
    "\nout n",
    "input x: f32[2, 3, 4]\nlet n = reduce_sum(x, axes=[0, 2])\nout n",
    "input x: f32[2, 3]\nlet n = argmax(x, axis=1)\nout n",
    "input x: f32[2, 3]\nlet n = cumsum(x, axis=1)\nout n",
    "input x: f32[2, 5]\nlet (n, ni) = topk(x, k=2, axis=1)\nout n",
    "input x: f32[b, l]\nlet (n, ni) = topk(x, k=2)\nout n",
    "input x: f32[4, 8, 2]\nlet n = fft(x, n=4)\nout n",
    "input x: f32[4, 8]\nlet n = rfft(x, n=8)\nout n",
    "input x: f32[4, m, 2]\nlet n = irfft(x)\nout n",
    "input x: f32[4, 5, 2]\nlet n = irfft(x, n=8)\nout n",
    "input q: f32[1, 2, 4, 8]\nlet n = rope(q, rotary_dim=4, position_offset=3)\nout n",
    "input q: f32[1, 2, s, 8]\nlet n = rope(q, position_offset=3)\nout n",
    "input q: f32[1, 2, 4, 8]\nlet n = attention(q, q, q, mask=sliding_window, window=2, heads=2)"
    "\nout n",
    "input q: f32[1, 2, 4, 8]\nlet n = attention(q, q, q, mask=prefix, prefix=1, kv_heads=2)\nout n",
    "input x: f32[2, 4, 3]\nlet n = group_norm(x, groups=2)\nout n",
    "input x: f32[2, 3]\nlet n = softmax(x, axis=1)\nout n",
    "input x: f32[2, 3]\nlet n = layer_norm(x, axis=1)\nout n",
    "input x: f32[2, 3]\ninput s: f32[3]\nlet n = quantize(x, s, bits=8, axis=1)\nout n",
    "input x: f32[b, 4]\nlet n = all_gather(x, axis=1, group=[0, 1])\nout n",
    "input x: f32[4, 4]\nlet n = reduce_scatter(x, kind=sum, axis=0, group=[0, 1])\nout n",
    "input l: f32[4, 10]\ninput y: i64[4]\nlet n = softmax_cross_entropy(l, y, ignore_index=-100)"
    "\nout n",
    R"(input c0: f32[3]
input xs: f32[5, 3]
let (n, ys) = scan(c0, xs, body=graph "step" {
  input c: f32[3]
  input xt: f32[3]
  out carry = c + xt
  out y = xt
}, num_carries=1, length=5)
out ys)",
};

bool IsIntField(const pb::FieldDescriptor* f) {
  return f->cpp_type() == pb::FieldDescriptor::CPPTYPE_INT64 ||
         f->cpp_type() == pb::FieldDescriptor::CPPTYPE_INT32;
}

void SetInt(pb::Message& m, const pb::FieldDescriptor* f, int index, int64_t v) {
  const pb::Reflection* r = m.GetReflection();
  const bool is64 = f->cpp_type() == pb::FieldDescriptor::CPPTYPE_INT64;
  const int32_t v32 = static_cast<int32_t>(v);  // int32 fields see the value's low bits
  if (!f->is_repeated()) {
    is64 ? r->SetInt64(&m, f, v) : r->SetInt32(&m, f, v32);
  } else if (index < r->FieldSize(m, f)) {
    is64 ? r->SetRepeatedInt64(&m, f, index, v) : r->SetRepeatedInt32(&m, f, index, v32);
  } else {
    is64 ? r->AddInt64(&m, f, v) : r->AddInt32(&m, f, v32);
  }
}

// The attribute message of the node named "n".
pb::Message& AttrsOf(v1::Graph& g) {
  for (v1::Node& node : *g.mutable_nodes()) {
    if (node.name() != "n") continue;
    v1::Attrs& attrs = *node.mutable_attrs();
    const pb::Reflection* r = attrs.GetReflection();
    const pb::FieldDescriptor* set =
        r->GetOneofFieldDescriptor(attrs, v1::Attrs::descriptor()->FindOneofByName("kind"));
    return *r->MutableMessage(&attrs, set);
  }
  ADD_FAILURE() << "no node named n";
  static v1::Attrs none;
  return none;
}

// Imports `g`; checks the outcome is a status of the allowed kinds and an
// accepted graph is well formed. Returns how many were accepted (0 or 1).
int Check(const v1::Graph& g, const std::string& what) {
  auto r = ImportGraph(g);
  if (!r.ok()) {
    EXPECT_TRUE(r.status().code() == absl::StatusCode::kInvalidArgument ||
                r.status().code() == absl::StatusCode::kResourceExhausted)
        << what << ": " << r.status();
    EXPECT_NE(r.status().message().find("node "), std::string::npos) << what << ": " << r.status();
    return 0;
  }
  Graph& graph = **r;
  bool symbolic = false;
  for (const auto& node : graph.nodes()) {
    for (const TensorType& t : node->outputs) {
      for (int64_t d : t.dims) {
        EXPECT_TRUE(d >= 0 || d == kDynamic || SymbolName(d, graph.symbols()) != nullptr)
            << what << ": " << NodeLabel(*node) << " has dim " << d;
        symbolic |= d < 0;
      }
    }
  }
  v1::Graph exported;
  ExportGraph(graph, &exported);
  EXPECT_FALSE(PrintGraph(graph).empty());
  if (!symbolic) return 1;
  // Bind every input dim that is not concrete to 3.
  std::vector<std::pair<std::string, Dims>> shapes;
  for (const Node* in : graph.Inputs()) {
    Dims dims;
    for (int64_t d : in->type().dims) dims.push_back(d >= 0 ? d : 3);
    shapes.emplace_back(in->name, dims);
  }
  const absl::Status s = Specialize(graph, shapes);
  if (!s.ok()) {
    EXPECT_TRUE(s.code() == absl::StatusCode::kInvalidArgument ||
                s.code() == absl::StatusCode::kResourceExhausted)
        << what << " (specialized): " << s;
    return 1;
  }
  for (const auto& node : graph.nodes()) {
    for (const TensorType& t : node->outputs) {
      EXPECT_TRUE(t.is_static()) << what << " (specialized): " << NodeLabel(*node);
    }
  }
  return 1;
}

TEST(AttributeExtremesTest, EveryIntegerAttributeAtTheEdgesGivesAStatus) {
  int cases = 0, accepted = 0;
  for (const char* text : kGraphs) {
    auto base = ParseGraphProto(text);
    ASSERT_TRUE(base.ok()) << base.status() << "\n" << text;
    accepted += Check(*base, text);  // the unedited graph verifies
    const pb::Message& attrs = AttrsOf(*base);
    const pb::Descriptor* desc = attrs.GetDescriptor();
    int fields = 0;
    for (int fi = 0; fi < desc->field_count(); ++fi) {
      const pb::FieldDescriptor* f = desc->field(fi);
      if (!IsIntField(f)) continue;
      ++fields;
      const int size = f->is_repeated() ? attrs.GetReflection()->FieldSize(attrs, f) : 1;
      for (int64_t v : kExtremes) {
        // One entry at a time, then (for lists) every entry and one entry more.
        for (int index = 0; index <= (f->is_repeated() ? size : 0); ++index) {
          v1::Graph g = *base;
          SetInt(AttrsOf(g), f, index, v);
          accepted += Check(g, absl::StrCat(text, "\n  with ", f->name(), "[", index, "]=", v));
          ++cases;
        }
        if (f->is_repeated() && size > 1) {
          v1::Graph g = *base;
          for (int index = 0; index < size; ++index) SetInt(AttrsOf(g), f, index, v);
          accepted += Check(g, absl::StrCat(text, "\n  with every ", f->name(), "=", v));
          ++cases;
        }
      }
    }
    EXPECT_GT(fields, 0) << "no integer attribute to vary in\n" << text;
  }
  // The sweep is real: many cases, some of them accepted and some rejected.
  EXPECT_GT(cases, 1000);
  EXPECT_GT(accepted, 100);
  EXPECT_LT(accepted, cases);
}

}  // namespace
}  // namespace kiln::ir
