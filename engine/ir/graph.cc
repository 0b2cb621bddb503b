#include "engine/ir/graph.h"

#include <algorithm>
#include <queue>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln::ir {

bool TensorType::is_static() const {
  return std::all_of(dims.begin(), dims.end(), [](int64_t d) { return d >= 0; });
}

int64_t TensorType::num_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

int64_t TensorType::num_bytes() const {
  auto b = BytesFor(dtype, num_elements());
  return b ? *b : 0;
}

std::unique_ptr<Graph> Graph::Clone() const {
  auto g = std::make_unique<Graph>();
  g->name_ = name_;
  g->ir_version_ = ir_version_;
  g->outputs_ = outputs_;
  g->symbols_ = symbols_;
  g->next_id_ = next_id_;
  for (const auto& n : nodes_) g->AddNode(std::make_unique<Node>(*n));
  return g;
}

int Graph::InternSymbol(std::string_view name) {
  for (size_t i = 0; i < symbols_.size(); ++i) {
    if (symbols_[i] == name) return static_cast<int>(i);
  }
  symbols_.emplace_back(name);
  return static_cast<int>(symbols_.size() - 1);
}

Node* Graph::FindNode(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

const TensorType& Graph::TypeOf(ValueRef v) const { return FindNode(v.node)->outputs[v.output]; }

Node* Graph::AddNode(std::unique_ptr<Node> node) {
  if (node->id < 0) node->id = next_id_;
  next_id_ = std::max(next_id_, node->id + 1);
  Node* raw = node.get();
  by_id_[raw->id] = raw;
  nodes_.push_back(std::move(node));
  return raw;
}

int Graph::ReplaceAllUses(ValueRef from, ValueRef to) {
  if (from == to) return 0;
  int replaced = 0;
  for (auto& n : nodes_) {
    for (auto& op : n->operands) {
      if (op == from) op = to, ++replaced;
    }
  }
  for (auto& o : outputs_) {
    if (o.value == from) o.value = to, ++replaced;
  }
  return replaced;
}

absl::flat_hash_map<ValueRef, int> Graph::UseCounts() const {
  absl::flat_hash_map<ValueRef, int> uses;
  for (const auto& n : nodes_) {
    for (const auto& op : n->operands) ++uses[op];
  }
  for (const auto& o : outputs_) ++uses[o.value];
  return uses;
}

int Graph::RemoveDeadNodes() {
  // A worklist from the outputs, so the result does not depend on node order
  // (passes append nodes and re-sort afterwards).
  absl::flat_hash_set<int32_t> live;
  std::vector<int32_t> work;
  auto mark = [&](int32_t id) {
    if (live.insert(id).second) work.push_back(id);
  };
  for (const auto& o : outputs_) mark(o.value.node);
  for (const auto& n : nodes_) {
    if (n->op == v1::OP_INPUT || n->op == v1::OP_PARAM) mark(n->id);
  }
  while (!work.empty()) {
    const Node* n = FindNode(work.back());
    work.pop_back();
    if (n == nullptr) continue;
    for (const auto& op : n->operands) mark(op.node);
  }
  const size_t before = nodes_.size();
  nodes_.erase(std::remove_if(nodes_.begin(), nodes_.end(),
                              [&](const std::unique_ptr<Node>& n) { return !live.contains(n->id); }),
               nodes_.end());
  Reindex();
  return static_cast<int>(before - nodes_.size());
}

void Graph::Reindex() {
  by_id_.clear();
  for (auto& n : nodes_) by_id_[n->id] = n.get();
}

absl::Status Graph::SortTopologically() {
  const size_t n = nodes_.size();
  absl::flat_hash_map<int32_t, size_t> pos;
  for (size_t i = 0; i < n; ++i) pos[nodes_[i]->id] = i;
  std::vector<int> pending(n, 0);
  std::vector<std::vector<size_t>> users(n);
  for (size_t i = 0; i < n; ++i) {
    for (const auto& op : nodes_[i]->operands) {
      auto it = pos.find(op.node);
      if (it == pos.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(NodeLabel(*nodes_[i]), ": operand names missing node ", op.node));
      }
      ++pending[i];
      users[it->second].push_back(i);
    }
  }
  std::priority_queue<size_t, std::vector<size_t>, std::greater<>> ready;
  for (size_t i = 0; i < n; ++i) {
    if (pending[i] == 0) ready.push(i);
  }
  std::vector<size_t> order;
  order.reserve(n);
  while (!ready.empty()) {
    size_t i = ready.top();
    ready.pop();
    order.push_back(i);
    for (size_t u : users[i]) {
      if (--pending[u] == 0) ready.push(u);
    }
  }
  if (order.size() != n) {
    // Walk operands from a stuck node until a node repeats: that is the cycle.
    size_t start = 0;
    while (pending[start] == 0) ++start;
    std::vector<size_t> path;
    absl::flat_hash_map<size_t, size_t> seen;
    size_t cur = start;
    while (!seen.contains(cur)) {
      seen[cur] = path.size();
      path.push_back(cur);
      for (const auto& op : nodes_[cur]->operands) {
        size_t p = pos[op.node];
        if (pending[p] > 0) {
          cur = p;
          break;
        }
      }
    }
    std::vector<std::string> labels;
    for (size_t k = seen[cur]; k < path.size(); ++k) labels.push_back(NodeLabel(*nodes_[path[k]]));
    labels.push_back(NodeLabel(*nodes_[cur]));
    return absl::InvalidArgumentError(
        absl::StrCat("cycle: ", absl::StrJoin(labels, " uses ")));
  }
  std::vector<std::unique_ptr<Node>> sorted;
  sorted.reserve(n);
  for (size_t i : order) sorted.push_back(std::move(nodes_[i]));
  nodes_ = std::move(sorted);
  Reindex();
  return absl::OkStatus();
}

std::vector<const Node*> Graph::Inputs() const {
  std::vector<const Node*> out;
  for (const auto& n : nodes_) {
    if (n->op == v1::OP_INPUT) out.push_back(n.get());
  }
  return out;
}

std::vector<const Node*> Graph::Params() const {
  std::vector<const Node*> out;
  for (const auto& n : nodes_) {
    if (n->op == v1::OP_PARAM) out.push_back(n.get());
  }
  return out;
}

const std::string& OpName(OpKind op) {
  static const auto* names = [] {
    auto* m = new absl::flat_hash_map<int, std::string>();
    const auto* desc = v1::OpKind_descriptor();
    for (int i = 0; i < desc->value_count(); ++i) {
      std::string name = desc->value(i)->name();
      if (absl::StartsWith(name, "OP_")) name = name.substr(3);
      (*m)[desc->value(i)->number()] = absl::AsciiStrToLower(name);
    }
    return m;
  }();
  static const std::string* unknown = new std::string("unknown_op");
  auto it = names->find(op);
  return it == names->end() ? *unknown : it->second;
}

std::string NodeLabel(const Node& node) {
  std::string op(OpName(node.op));
  // Unknown or unset kinds keep the op name: the label must never be empty.
  if (node.op == v1::OP_UNARY && node.attrs.has_unary() &&
      v1::UnaryKind_IsValid(node.attrs.unary().kind()) &&
      node.attrs.unary().kind() != v1::UNARY_KIND_UNSPECIFIED) {
    op = absl::AsciiStrToLower(v1::UnaryKind_Name(node.attrs.unary().kind()));
    if (absl::StartsWith(op, "unary_")) op = op.substr(6);
  } else if (node.op == v1::OP_BINARY && node.attrs.has_binary() &&
             v1::BinaryKind_IsValid(node.attrs.binary().kind()) &&
             node.attrs.binary().kind() != v1::BINARY_KIND_UNSPECIFIED) {
    op = absl::AsciiStrToLower(v1::BinaryKind_Name(node.attrs.binary().kind()));
    if (absl::StartsWith(op, "binary_")) op = op.substr(7);
  }
  if (node.name.empty()) return absl::StrCat("node ", node.id, " (", op, ")");
  return absl::StrCat("node ", node.id, " \"", node.name, "\" (", op, ")");
}

std::string TypeToString(const TensorType& t, const std::vector<std::string>& symbols) {
  std::vector<std::string> dims;
  for (int64_t d : t.dims) {
    if (d >= 0) {
      dims.push_back(absl::StrCat(d));
    } else if (d == kDynamic) {
      dims.push_back("?");
    } else {
      const std::string* name = SymbolName(d, symbols);
      dims.push_back(name != nullptr ? *name : absl::StrCat("$", SymbolIndex(d)));
    }
  }
  return absl::StrCat(DTypeName(t.dtype), "[", absl::StrJoin(dims, ", "), "]");
}

}  // namespace kiln::ir
