// Internal to the ONNX importer: the per-node conversion context and the
// converter tables of the onnx_ops_*.cc files.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/host_tensor.h"
#include "engine/ir/graph.h"
#include "engine/io/onnx/onnx_import.h"
#include "onnx/onnx_pb.h"  // ONNX_ML: onnx/onnx-ml.pb.h with its ONNX_API

namespace kiln::io::onnx_internal {

using ir::IrDims;
using ir::TensorType;
using ir::ValueRef;

// A value computed at import (a constant, or shape arithmetic over input
// shapes). `sym` is empty when every element is known; otherwise one entry per
// element: 0 = known, else the graph dim code (ir::kDynamic or a symbol dim)
// whose size the element is, unknown until run time.
struct Known {
  std::shared_ptr<const HostTensor> t;
  std::vector<int64_t> sym;
  bool complete() const { return sym.empty(); }
};

// One ONNX value: where it lives in the graph (ref.node < 0 until a Kiln op
// needs it: folded constants are materialized on first use) and, when known
// at import, its value.
struct Value {
  ValueRef ref;
  TensorType type;
  std::shared_ptr<const Known> known;
  // A one-element integer value computed at run time that is another one's
  // plus a constant (`i`, Unsqueeze(i), Add(i, 1) in a Loop body): its
  // elements equal base's + offset. A Slice whose starts and ends share a
  // base has an extent known at import (end - start) and becomes a Gather.
  struct Affine {
    ValueRef base;
    int64_t offset = 0;
  };
  std::optional<Affine> affine;
  // The stacked (scan) output of a Loop whose trip count its body computes
  // (a while loop): `ref` holds `bound` rows, of which the first `length`
  // (an i64 scalar of the graph; bound + 1 when the loop wanted more rows
  // than it has) are the output. Only a graph output may be one: the driver
  // adds `length` as the output kStackedLengthPrefix + name, and a node or a
  // subgraph output reading it is unsupported.
  struct Stacked {
    ValueRef length;
    int64_t bound = 0;
    std::string loop;  // the Loop's label, for errors
  };
  std::optional<Stacked> stacked;
};

// `v`'s affine form when it is a one-element integer value not known at
// import: its own, or {v.ref, 0}; nullopt otherwise.
std::optional<Value::Affine> AffineOf(const Value& v);
// Sets the affine form of a node's output from its inputs (Identity, Cast,
// Unsqueeze, Squeeze, Reshape, Flatten pass it on; Add / Sub of a known
// one-element integer shift it).
void PropagateAffine(const onnx::NodeProto& n, const std::vector<const Value*>& inputs, Value& out);

// Element i of an integer or bool tensor as int64.
int64_t GetInt(const HostTensor& t, int64_t i);
void SetInt(HostTensor& t, int64_t i, int64_t v);
// ONNX elem_type -> Kiln dtype; nullopt for types Kiln has no dtype for.
std::optional<DType> DTypeFromOnnx(int32_t elem_type);
absl::StatusOr<HostTensor> TensorFromProto(const onnx::TensorProto& p, const ir::InferLimits& limits);

// The values of one graph being imported, by ONNX name.
using ValueMap = absl::flat_hash_map<std::string, std::unique_ptr<Value>>;

class Importer;
using Converter = absl::Status (*)(Importer& c);
using ConverterTable = absl::flat_hash_map<std::string, Converter>;
void RegisterElementwise(ConverterTable& table);
void RegisterTensorOps(ConverterTable& table);
void RegisterNnOps(ConverterTable& table);
void RegisterReduceOps(ConverterTable& table);   // softmax, Reduce*, Einsum, losses (onnx_ops_reduce.cc)
void RegisterControlFlow(ConverterTable& table);  // If, Loop, Scan (onnx_ops_control.cc)
void RegisterRecurrent(ConverterTable& table);    // LSTM, GRU, RNN (onnx_ops_rnn.cc)
// Folds `c`'s node at import when its inputs are known; false when it cannot
// (the node is then converted to Kiln ops).
absl::StatusOr<bool> TryFold(Importer& c);

// The conversion of one ONNX node. Converters read inputs and attributes,
// emit Kiln nodes (each inferred at once, so types are always known) and set
// the node's outputs. An unsupported variant of an op is UNIMPLEMENTED with
// the reason (the driver names the node).
class Importer {
 public:
  Importer(ir::Graph& graph, const OnnxImportOptions& options, const onnx::NodeProto& node,
           int opset, std::vector<Value*> inputs)
      : graph_(graph), options_(options), node_(node), opset_(opset), inputs_(std::move(inputs)) {
    outputs_.resize(node.output_size());
  }

  const onnx::NodeProto& node() const { return node_; }
  int opset() const { return opset_; }
  const OnnxImportOptions& options() const { return options_; }
  ir::Graph& graph() { return graph_; }

  // Inputs: an ONNX optional input may be absent (index past the end or "").
  int num_inputs() const { return static_cast<int>(inputs_.size()); }
  bool has(int i) const { return i < num_inputs() && inputs_[i] != nullptr; }
  const Value& in(int i) const { return *inputs_[i]; }
  const TensorType& type(int i) const { return inputs_[i]->type; }
  int64_t rank(int i) const { return type(i).rank(); }
  DType dtype(int i) const { return type(i).dtype; }
  // The input's complete value, or nullptr.
  const HostTensor* Const(int i) const;
  absl::StatusOr<ValueRef> Ref(int i);
  absl::Status Need(int i) const;  // error unless input i is present

  // An input that must be known at import (axes, pads, sizes) as int64s;
  // absent (when optional) -> nullopt.
  absl::StatusOr<std::optional<std::vector<int64_t>>> Ints(int i);
  absl::StatusOr<std::vector<int64_t>> RequiredInts(int i);
  // Slice's starts, ends, axes and steps, from attributes (opset < 10) or
  // inputs 1..4, defaulted (every axis, step 1) and checked for equal length.
  struct SliceArgs {
    std::vector<int64_t> starts, ends, axes, steps;
  };
  absl::StatusOr<SliceArgs> SliceOperands();
  absl::StatusOr<double> Scalar(int i);  // a known one-element input
  // A shape input whose elements may be symbolic: >= 0 / negative literal
  // values, with sym[i] != 0 where element i is a run-time dim.
  absl::Status ShapeArg(int i, std::vector<int64_t>* values, std::vector<int64_t>* sym);

  // Attributes.
  const onnx::AttributeProto* Attr(const std::string& name) const;
  int64_t AttrInt(const std::string& name, int64_t def) const;
  float AttrFloat(const std::string& name, float def) const;
  std::string AttrString(const std::string& name, const std::string& def) const;
  std::optional<std::vector<int64_t>> AttrInts(const std::string& name) const;
  std::optional<std::vector<float>> AttrFloats(const std::string& name) const;
  // An int list that moved from an attribute to input `input` at `opset`.
  absl::StatusOr<std::optional<std::vector<int64_t>>> IntsAttrOrInput(const std::string& name,
                                                                      int moved_at, int input);

  // Emitting Kiln nodes. Each is inferred at once; failures name the ONNX node.
  absl::StatusOr<ValueRef> Emit(v1::OpKind op, std::vector<ValueRef> operands,
                                const v1::Attrs& attrs);
  absl::StatusOr<ValueRef> Constant(HostTensor t);
  absl::StatusOr<ValueRef> ScalarConst(DType dtype, double v);
  absl::StatusOr<ValueRef> Unary(v1::UnaryKind kind, ValueRef x);
  absl::StatusOr<ValueRef> Binary(v1::BinaryKind kind, ValueRef a, ValueRef b);
  absl::StatusOr<ValueRef> Compare(v1::CompareKind kind, ValueRef a, ValueRef b);
  absl::StatusOr<ValueRef> Where(ValueRef c, ValueRef a, ValueRef b);
  absl::StatusOr<ValueRef> Cast(ValueRef x, DType to);  // no node when already `to`
  absl::StatusOr<ValueRef> Reshape(ValueRef x, const IrDims& dims);  // dims may hold one -1
  absl::StatusOr<ValueRef> Clamp(ValueRef x, std::optional<double> lo, std::optional<double> hi);
  absl::StatusOr<ValueRef> Reduce(v1::ReduceKind kind, ValueRef x, std::vector<int64_t> axes,
                                  bool keepdims);
  const TensorType& TypeOf(ValueRef v) const { return graph_.TypeOf(v); }

  // The ONNX node producing each value of the graph this node is in (what
  // the pattern converters of onnx_patterns.cc walk back through).
  void set_producers(const onnx::GraphProto* graph, const absl::flat_hash_map<std::string, int>* producer) {
    onnx_graph_ = graph;
    producer_ = producer;
  }
  // The node producing `name` when it is of type `op` (with one output and at
  // least one input), else nullptr.
  const onnx::NodeProto* Producer(const std::string& name, const char* op) const;
  // The values of the graph this node is in (a subgraph reads some of them).
  void set_scope(ValueMap* scope) { scope_ = scope; }
  const ValueMap* scope() const { return scope_; }
  // The scope's value `name` in this graph (a known one materialized).
  absl::StatusOr<ValueRef> RefOf(const std::string& name);

  // Outputs.
  int num_outputs() const { return node_.output_size(); }
  bool wants(int i) const { return i < num_outputs() && !node_.output(i).empty(); }
  void SetOutput(int i, ValueRef v);
  void SetKnown(int i, std::shared_ptr<const Known> k);
  absl::Status SetConst(int i, HostTensor t);
  std::vector<std::optional<Value>>& outputs() { return outputs_; }

  // Errors naming the ONNX node.
  absl::Status Invalid(const std::string& what) const;
  absl::Status Unsupported(const std::string& what) const;
  std::string Label() const;

 private:
  ir::Graph& graph_;
  const OnnxImportOptions& options_;
  const onnx::NodeProto& node_;
  int opset_;
  std::vector<Value*> inputs_;
  std::vector<std::optional<Value>> outputs_;
  int emitted_ = 0;
  ValueMap* scope_ = nullptr;
  const onnx::GraphProto* onnx_graph_ = nullptr;
  const absl::flat_hash_map<std::string, int>* producer_ = nullptr;
};

// Converts `c`'s node together with the nodes before it when they form a
// pattern a Kiln op computes in one (onnx_patterns.cc): the decomposed
// LayerNorm and exact GELU of PyTorch's exports, and Pow(x, 2) as x * x.
// False when no pattern ends at this node (it is then converted alone).
absl::StatusOr<bool> TryPattern(Importer& c);

// Control flow (onnx_import.cc): the names a subgraph reads from enclosing
// graphs (graphs nested in it included), in first-use order.
std::vector<std::string> FreeValues(const onnx::GraphProto& body);

// A subgraph as a Kiln graph: inputs are the subgraph's own (`formal` names
// them, typed by position from `formal`; nullopt = as the subgraph declares),
// then one per name of `passed`, values of the enclosing scope the op must
// pass in. Enclosing values known at import are copied in as constants
// instead. `graph`'s outputs are the subgraph's; the caller may add nodes and
// outputs, then export it with ExportSubgraph.
struct ImportedSubgraph {
  std::unique_ptr<ir::Graph> graph;
  std::vector<TensorType> outputs;
  std::vector<std::string> formal;
  std::vector<std::string> passed;
};
// The wire graph with its input nodes first, in `order` (names of inputs):
// a Kiln subgraph binds its inputs by position, in node order.
absl::StatusOr<v1::Graph> ExportSubgraph(ir::Graph& g, const std::vector<std::string>& order);
// Adds a node to a subgraph being built, inferred at once.
absl::StatusOr<ValueRef> EmitIn(ir::Graph& g, const Importer& c, v1::OpKind op,
                                std::vector<ValueRef> operands, const v1::Attrs& attrs);
absl::StatusOr<ImportedSubgraph> ImportSubgraph(Importer& c, const onnx::GraphProto& body,
                                                const std::vector<std::optional<TensorType>>& formal,
                                                const std::vector<std::string>& free);

// Index tables, masks and weights the importer computes on the host (a gather's
// indices, a Trilu mask, an iota) have at most this many elements: the dims
// they come from are the model's, so a huge declared dim must fail cleanly
// instead of allocating.
inline constexpr int64_t kMaxImportTable = int64_t{1} << 24;
absl::Status CheckTable(const Importer& c, int64_t elements, const std::string& what);

// Normalizes `axis` against `rank` (ONNX: negative counts from the end).
absl::StatusOr<int64_t> NormAxis(const Importer& c, int64_t axis, int64_t rank);

// Helpers of the nn converters (onnx_ops_nn.cc, onnx_ops_reduce.cc).
namespace nn_util {
// Sets output i to v, or returns v's error.
absl::Status Out(Importer& c, int i, absl::StatusOr<ValueRef> v);
// A scalar constant of like's dtype.
absl::StatusOr<ValueRef> Scalar(Importer& c, ValueRef like, double v);
// Input i present and floating point (else UNIMPLEMENTED).
absl::Status NeedFloat(Importer& c, int i);
}  // namespace nn_util

}  // namespace kiln::io::onnx_internal
