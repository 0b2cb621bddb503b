// The in-memory IR every pass works on.
//
// A Graph owns its Nodes; node ids are unique and stable for the graph's
// lifetime (passes allocate new ones with NextId()). `nodes()` is kept in
// topological order by the verifier and by SortTopologically() after a pass
// appends nodes. Attributes are the wire messages (kiln.v1.Attrs) so every op
// has one typed attribute message, defined once. Constant payloads are moved out
// of the proto into `Node::value` so copying attributes never copies weights.
//
// Dims: a non-negative value is a concrete size; kDynamic (-1) is an anonymous
// symbolic dim ("?"); SymbolDim(k) (<= -2) names graph symbol k ("batch").
// Shapes are concrete after specialization (the HIR stage binds symbols from
// the run's input shapes); every stage after HIR sees only concrete dims.
//
// Thread safety: none; a Graph belongs to one compile at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "base/dtype.h"
#include "base/host_tensor.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::ir {

using v1::OpKind;
using IrDims = absl::InlinedVector<int64_t, 6>;

constexpr int64_t kDynamic = -1;
constexpr int64_t SymbolDim(int symbol) { return -2 - symbol; }
constexpr bool IsSymbolDim(int64_t d) { return d <= -2; }
// int64: a dim far below -2 (only ever a bug) must not wrap to a small index.
constexpr int64_t SymbolIndex(int64_t d) { return -2 - d; }
// The name of symbol dim `d` in `symbols`; nullptr when `d` is not a symbol
// dim or names no symbol there (never an out-of-range read).
inline const std::string* SymbolName(int64_t d, const std::vector<std::string>& symbols) {
  if (!IsSymbolDim(d) || SymbolIndex(d) >= static_cast<int64_t>(symbols.size())) return nullptr;
  return &symbols[SymbolIndex(d)];
}

struct TensorType {
  DType dtype = v1::DTYPE_UNSPECIFIED;
  IrDims dims;

  TensorType() = default;
  TensorType(DType dt, IrDims d) : dtype(dt), dims(std::move(d)) {}

  int64_t rank() const { return static_cast<int64_t>(dims.size()); }
  bool is_static() const;
  // Element count; REQUIRES: is_static(). Callers verified no overflow.
  int64_t num_elements() const;
  // Byte size; REQUIRES: is_static() and a dense or whole-block dtype.
  int64_t num_bytes() const;
  Dims dims_vector() const { return Dims(dims.begin(), dims.end()); }
  friend bool operator==(const TensorType& a, const TensorType& b) {
    return a.dtype == b.dtype && a.dims == b.dims;
  }
};

struct ValueRef {
  int32_t node = -1;
  int32_t output = 0;
  friend bool operator==(ValueRef a, ValueRef b) {
    return a.node == b.node && a.output == b.output;
  }
  template <typename H>
  friend H AbslHashValue(H h, ValueRef v) {
    return H::combine(std::move(h), v.node, v.output);
  }
};

struct Node {
  int32_t id = -1;
  std::string name;
  OpKind op = v1::OP_KIND_UNSPECIFIED;
  absl::InlinedVector<ValueRef, 4> operands;
  v1::Attrs attrs;                           // constants: value moved to `value`
  std::shared_ptr<const HostTensor> value;   // OP_CONSTANT payload
  absl::InlinedVector<TensorType, 1> outputs;

  // Compiler annotations (not part of the user's graph).
  v1::Path path = v1::PATH_UNSPECIFIED;      // set by legalize
  std::string device;                        // set by place
  std::vector<int32_t> origins;              // user node ids this node computes
  int64_t offset = -1;                       // set by plan_memory: arena byte offset

  const TensorType& type(int i = 0) const { return outputs[i]; }
  ValueRef out(int i = 0) const { return ValueRef{id, i}; }
};

struct GraphOutput {
  std::string name;
  ValueRef value;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  Graph(Graph&&) = default;
  Graph& operator=(Graph&&) = default;

  // Deep copy (constant payloads are shared: they are immutable).
  std::unique_ptr<Graph> Clone() const;

  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }
  int32_t ir_version() const { return ir_version_; }
  void set_ir_version(int32_t v) { ir_version_ = v; }

  const std::vector<std::unique_ptr<Node>>& nodes() const { return nodes_; }
  std::vector<GraphOutput>& outputs() { return outputs_; }
  const std::vector<GraphOutput>& outputs() const { return outputs_; }
  std::vector<std::string>& symbols() { return symbols_; }
  const std::vector<std::string>& symbols() const { return symbols_; }

  // Symbol index for `name`, adding it when new.
  int InternSymbol(std::string_view name);

  Node* FindNode(int32_t id) const;
  const TensorType& TypeOf(ValueRef v) const;  // REQUIRES: v is valid

  // Appends a node; an id of -1 is replaced by NextId(). The caller restores
  // topological order (SortTopologically) if the node is used earlier.
  Node* AddNode(std::unique_ptr<Node> node);
  int32_t NextId() const { return next_id_; }

  // Rewires every use of `from` (operands and graph outputs) to `to`;
  // returns how many uses it rewired.
  int ReplaceAllUses(ValueRef from, ValueRef to);
  // Number of uses of each value (operands and graph outputs).
  absl::flat_hash_map<ValueRef, int> UseCounts() const;
  // Removes nodes whose results nobody uses, except Input and Param nodes.
  int RemoveDeadNodes();
  // Stable topological sort (Kahn, ties broken by current position).
  // Fails when operands form a cycle or name a missing node.
  absl::Status SortTopologically();

  // Inputs and params in node order.
  std::vector<const Node*> Inputs() const;
  std::vector<const Node*> Params() const;

 private:
  void Reindex();

  std::string name_;
  int32_t ir_version_ = 0;
  std::vector<std::unique_ptr<Node>> nodes_;
  absl::flat_hash_map<int32_t, Node*> by_id_;
  std::vector<GraphOutput> outputs_;
  std::vector<std::string> symbols_;
  int32_t next_id_ = 0;
};

// "node 7 \"fc1\" (matmul)" — how every diagnostic names a node.
std::string NodeLabel(const Node& node);
// Lower-case op name as used in the text form ("matmul", "layer_norm").
const std::string& OpName(OpKind op);
std::string TypeToString(const TensorType& t, const std::vector<std::string>& symbols = {});

}  // namespace kiln::ir
