// The text parser: builds the graph node by node, inferring types as it goes
// (see text.h for the grammar).
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "engine/ir/text.h"
#include "engine/ir/text_internal.h"
#include "engine/ir/verifier.h"

namespace kiln::ir {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using namespace text_internal;  // NOLINT: the text form's own helpers

// An expression's value: a graph value, or a scalar literal waiting for the
// dtype of the tensor it meets.
struct Operand {
  bool literal = false;
  ValueRef value;
  std::string number;  // literal: signed text ("-0.5", "inf")
  Token at;
  int results = 1;  // a call's result count; > 1 only a tuple `let` may bind
};

// A `let`/`const`/`input` name: a name, or `%<id>` (a local label).
struct Target {
  std::string key;   // scope key (see Parser::Key)
  std::string name;  // node name; empty for a local label
  Token at;
};

bool TypeMatches(const TensorType& declared, const TensorType& inferred) {
  if (declared.dtype != inferred.dtype || declared.rank() != inferred.rank()) return false;
  for (int64_t k = 0; k < declared.rank(); ++k) {
    const int64_t a = declared.dims[k], b = inferred.dims[k];
    if (a != b && a != kDynamic && b != kDynamic) return false;
  }
  return true;
}

class Parser {
 public:
  Parser(Cursor& cur, const ParseOptions& options, int depth)
      : cur_(cur), options_(options), depth_(depth), g_(std::make_unique<Graph>()) {
    g_->set_ir_version(kIrVersion);
    verify_.allow_internal_ops = options.allow_internal_ops;
    verify_.limits = options.limits;
    verify_.max_nodes = options.max_nodes;
  }

  // The whole input: an optional `graph "name"` header, then statements.
  absl::StatusOr<std::unique_ptr<Graph>> ParseTop() {
    if (IsKeyword(Peek(), "graph")) {
      Next();
      const Token& name = Next();
      if (name.kind != Tok::kString && name.kind != Tok::kIdent) {
        return Expected(name, "a graph name");
      }
      g_->set_name(name.text);
    }
    KILN_RETURN_IF_ERROR(Statements(/*braced=*/false));
    return Finish(Peek());
  }

  // A subgraph's statements after its `{`, through the closing `}`.
  absl::StatusOr<std::unique_ptr<Graph>> ParseBlock(std::string name, const Token& at) {
    g_->set_name(std::move(name));
    KILN_RETURN_IF_ERROR(Statements(/*braced=*/true));
    return Finish(at);
  }

 private:
  // ---- tokens ----
  const Token& Peek(size_t ahead = 0) const { return cur_.Peek(ahead); }
  const Token& Next() { return cur_.Next(); }
  bool AtPunct(char c) const { return cur_.AtPunct(c); }
  absl::Status Expect(char c) { return cur_.Expect(c); }

  absl::StatusOr<std::unique_ptr<Graph>> Finish(const Token& at) {
    if (auto s = VerifyGraph(*g_, verify_, depth_); !s.ok()) return AtToken(at, s);
    return std::move(g_);
  }

  // ---- statements ----
  absl::Status Statements(bool braced) {
    while (true) {
      const Token& t = Peek();
      if (t.kind == Tok::kEnd) {
        if (braced) return Expected(t, "`}` closing the subgraph");
        return absl::OkStatus();
      }
      if (braced && IsPunct(t, '}')) {
        Next();
        return absl::OkStatus();
      }
      stmt_first_id_ = g_->NextId();
      if (IsKeyword(t, "input") || IsKeyword(t, "param")) {
        KILN_RETURN_IF_ERROR(Source());
      } else if (IsKeyword(t, "const")) {
        KILN_RETURN_IF_ERROR(Const());
      } else if (IsKeyword(t, "let")) {
        KILN_RETURN_IF_ERROR(Let());
      } else if (IsKeyword(t, "out")) {
        KILN_RETURN_IF_ERROR(Out());
      } else if (IsKeyword(t, "graph")) {
        return ErrorAt(t, "`graph \"name\"` must be the first line");
      } else {
        return Expected(t, "a statement (input, param, const, let, out)");
      }
    }
  }

  absl::Status Source() {
    const bool param = Next().text == "param";
    KILN_ASSIGN_OR_RETURN(Target target, ParseTarget());
    if (target.name.empty()) {
      return ErrorAt(target.at, absl::StrCat(param ? "params" : "inputs", " need a name"));
    }
    KILN_RETURN_IF_ERROR(Expect(':'));
    auto node = std::make_unique<Node>();
    KILN_ASSIGN_OR_RETURN(TensorType type, ParseType());
    node->op = param ? v1::OP_PARAM : v1::OP_INPUT;
    node->name = target.name;
    node->outputs.push_back(std::move(type));
    if (param) {
      node->attrs.mutable_param()->set_frozen(IsKeyword(Peek(), "frozen"));
      if (node->attrs.param().frozen()) Next();
    }
    KILN_ASSIGN_OR_RETURN(Node * n, Emit(std::move(node), target.at));
    KILN_RETURN_IF_ERROR(MaybeAnnotations(n));
    return Bind(target, n->out());
  }

  absl::Status Const() {
    Next();
    KILN_ASSIGN_OR_RETURN(Target target, ParseTarget());
    KILN_RETURN_IF_ERROR(Expect(':'));
    const Token& type_at = Peek();
    KILN_ASSIGN_OR_RETURN(TensorType type, ParseType());
    if (!type.is_static()) return ErrorAt(type_at, "a constant's type must be concrete");
    KILN_RETURN_IF_ERROR(Expect('='));
    KILN_ASSIGN_OR_RETURN(HostTensor value,
                          ParseConstantValue(cur_, type, verify_.limits.max_tensor_elements));
    auto node = std::make_unique<Node>();
    node->op = v1::OP_CONSTANT;
    node->name = target.name;
    node->attrs.mutable_constant();
    node->value = std::make_shared<const HostTensor>(std::move(value));
    KILN_ASSIGN_OR_RETURN(Node * n, Emit(std::move(node), target.at));
    KILN_RETURN_IF_ERROR(MaybeAnnotations(n));
    return Bind(target, n->out());
  }

  absl::Status Let() {
    const Token& let = Next();
    std::vector<Target> targets;
    std::vector<std::optional<TensorType>> types;
    const bool tuple = AtPunct('(');
    if (tuple) Next();
    do {
      if (!targets.empty()) Next();  // the comma
      KILN_ASSIGN_OR_RETURN(Target t, ParseTarget(/*allow_output=*/tuple && !targets.empty()));
      targets.push_back(std::move(t));
      types.emplace_back();
      if (AtPunct(':')) {
        Next();
        KILN_ASSIGN_OR_RETURN(types.back(), ParseType());
      }
    } while (tuple && AtPunct(','));
    if (tuple) {
      KILN_RETURN_IF_ERROR(Expect(')'));
    }
    KILN_RETURN_IF_ERROR(Expect('='));
    let_expr_start_ = cur_.pos();
    let_types_ = &types;
    auto expr = ParseExpr();
    let_types_ = nullptr;
    if (!expr.ok()) return expr.status();
    if (expr->literal) {
      return ErrorAt(expr->at,
                     "a literal alone has no dtype; declare it with "
                     "`const name: type = value`");
    }
    const ValueRef v = expr->value;
    Node* node = g_->FindNode(v.node);
    const bool fresh = v.output == 0 && v.node >= stmt_first_id_ && v.node == last_created_;
    const int results = fresh ? static_cast<int>(node->outputs.size()) : 1;
    if (static_cast<int>(targets.size()) != results) {
      if (results > 1) {
        return ErrorAt(let, absl::StrCat(OpName(node->op), " has ", results,
                                         " results; bind them all with `let (a, b, ...) = ...`"));
      }
      return ErrorAt(let, absl::StrCat("binds ", targets.size(), " names to one value"));
    }
    if (fresh) {
      node->name = targets[0].name;
    } else if (AtPunct('{')) {
      return ErrorAt(Peek(), "annotations need a node made by this `let`, not an existing value");
    }
    for (size_t k = 0; k < targets.size(); ++k) {
      const ValueRef out{v.node, fresh ? static_cast<int>(k) : v.output};
      const TensorType& inferred = g_->TypeOf(out);
      if (types[k] && !TypeMatches(*types[k], inferred)) {
        return ErrorAt(targets[k].at,
                       absl::StrCat("declared ", TypeToString(*types[k], g_->symbols()),
                                    " but inferred ", TypeToString(inferred, g_->symbols())));
      }
      // `name#k` after the first target restates the first target's output k.
      if (k > 0 && targets[k].at.output >= 0) {
        if (targets[k].key != targets[0].key || targets[k].at.output != static_cast<int>(k)) {
          return ErrorAt(targets[k].at, absl::StrCat("expected ", DescribeToken(targets[0].at),
                                                     " with #", k, ", or a new name"));
        }
        continue;
      }
      if (k > 0 && targets[k].name == "_") continue;  // discarded
      KILN_RETURN_IF_ERROR(Bind(targets[k], out));
    }
    if (fresh) return MaybeAnnotations(node);
    return absl::OkStatus();
  }

  absl::Status Out() {
    Next();
    const Token& name = Next();
    if (!((name.kind == Tok::kIdent && !IsReservedWord(name.text)) || name.kind == Tok::kString) ||
        name.output >= 0) {
      return Expected(name, "an output name");
    }
    ValueRef v;
    if (AtPunct('=')) {
      Next();
      KILN_ASSIGN_OR_RETURN(Operand e, ParseExpr());
      KILN_ASSIGN_OR_RETURN(v, Resolve(e));
    } else {
      KILN_ASSIGN_OR_RETURN(v, Lookup(name));
    }
    if (name.text.empty()) return ErrorAt(name, "output names must not be empty");
    for (const GraphOutput& o : g_->outputs()) {
      if (o.name == name.text)
        return ErrorAt(name, absl::StrCat("duplicate output \"", o.name, "\""));
    }
    g_->outputs().push_back(GraphOutput{name.text, v});
    return absl::OkStatus();
  }

  // `{path=..., device="...", offset=N}` after a node's statement.
  absl::Status MaybeAnnotations(Node* n) {
    if (!AtPunct('{')) return absl::OkStatus();
    Next();
    while (!AtPunct('}')) {
      const Token& key = Next();
      KILN_RETURN_IF_ERROR(Expect('='));
      const Token& val = Peek();
      if (IsKeyword(key, "path") && val.kind == Tok::kIdent) {
        auto p = ParseEnumValueText(v1::Path_descriptor(), val.text);
        if (!p) return Expected(val, "a path (native, common_ir, rewritten, unsupported)");
        n->path = static_cast<v1::Path>(*p);
      } else if (IsKeyword(key, "device") && val.kind == Tok::kString) {
        n->device = val.text;
      } else if (IsKeyword(key, "offset") && val.kind == Tok::kInt) {
        if (!ParseInt64(val.text, &n->offset)) return ErrorAt(val, "offset out of range");
      } else {
        return Expected(key, "an annotation (path=<path>, device=\"<id>\", offset=<bytes>)");
      }
      Next();
      if (!AtPunct('}')) {
        KILN_RETURN_IF_ERROR(Expect(','));
      }
    }
    Next();
    return absl::OkStatus();
  }

  // ---- names ----
  absl::StatusOr<Target> ParseTarget(bool allow_output = false) {
    const Token& t = Next();
    Target target;
    target.at = t;
    if (t.kind == Tok::kLocal) {
      target.key = Key(t);
    } else if ((t.kind == Tok::kIdent && !IsReservedWord(t.text)) || t.kind == Tok::kString) {
      target.key = Key(t);
      target.name = t.text;
      if (t.text.empty()) return ErrorAt(t, "names must not be empty");
    } else {
      return Expected(t, "a name (an identifier, a \"quoted name\" or %<id>)");
    }
    if (t.output >= 0 && !allow_output) return Expected(t, "a name without `#`");
    return target;
  }

  // Names and %labels share one scope; a label's key starts with a byte no
  // quoted name can make it collide with ("%5" the name vs %5 the label).
  static std::string Key(const Token& t) {
    return t.kind == Tok::kLocal ? absl::StrCat(std::string(1, '\0'), t.text)
                                 : absl::StrCat("n", t.text);
  }

  absl::Status Bind(const Target& t, ValueRef v) {
    auto [it, inserted] = scope_.try_emplace(t.key, v, t.at);
    if (!inserted) {
      return ErrorAt(t.at, absl::StrCat(DescribeToken(t.at), " is already defined at ",
                                        it->second.second.line, ":", it->second.second.col));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<ValueRef> Lookup(const Token& t) {
    auto it = scope_.find(Key(t));
    if (it == scope_.end()) return ErrorAt(t, absl::StrCat("unknown value ", DescribeToken(t)));
    ValueRef v = it->second.first;
    if (t.output >= 0) {
      const Node* n = g_->FindNode(v.node);
      if (t.output >= static_cast<int>(n->outputs.size())) {
        return ErrorAt(t, absl::StrCat(DescribeToken(t), ": ", NodeLabel(*n), " has ",
                                       n->outputs.size(), " result(s)"));
      }
      v.output = t.output;
    }
    return v;
  }

  // ---- types and constants ----
  absl::StatusOr<TensorType> ParseType() {
    const Token& dt = Next();
    if (dt.kind != Tok::kIdent) return Expected(dt, "a type such as f32[2, 3]");
    auto dtype = ParseDType(dt.text);
    if (!dtype) return ErrorAt(dt, absl::StrCat("unknown dtype `", dt.text, "`"));
    TensorType type;
    type.dtype = *dtype;
    KILN_RETURN_IF_ERROR(Expect('['));
    while (!AtPunct(']')) {
      const Token& d = Next();
      if (d.kind == Tok::kInt) {
        int64_t size;
        if (!ParseInt64(d.text, &size)) return ErrorAt(d, "dim out of range");
        type.dims.push_back(size);
      } else if (IsPunct(d, '?') || (d.kind == Tok::kString && d.text == "?")) {
        type.dims.push_back(kDynamic);
      } else if ((d.kind == Tok::kIdent || d.kind == Tok::kString) && !d.text.empty() &&
                 d.output < 0) {
        type.dims.push_back(SymbolDim(g_->InternSymbol(d.text)));
      } else {
        return Expected(d, "a dim (a size, `?` or a symbol name)");
      }
      if (!AtPunct(']')) {
        KILN_RETURN_IF_ERROR(Expect(','));
      }
    }
    Next();
    return type;
  }

  // ---- nodes ----
  absl::StatusOr<Node*> Emit(std::unique_ptr<Node> node, const Token& at) {
    if (static_cast<int64_t>(g_->nodes().size()) >= verify_.max_nodes) {
      return ErrorAt(at, absl::StrCat("more than ", verify_.max_nodes, " nodes"),
                     absl::StatusCode::kResourceExhausted);
    }
    const auto* refl = node->attrs.GetReflection();
    if (refl->GetOneofFieldDescriptor(
            node->attrs, v1::Attrs::descriptor()->FindOneofByName("kind")) == nullptr) {
      refl->MutableMessage(&node->attrs, AttrsField(node->op));  // all defaults
    }
    Node* n = g_->AddNode(std::move(node));
    n->origins = {n->id};
    last_created_ = n->id;
    if (auto s = InferNode(*g_, *n, verify_.limits, depth_); !s.ok()) return AtToken(at, s);
    return n;
  }

  absl::StatusOr<ValueRef> Literal(const Operand& lit, DType dtype) {
    if (!IsKnownDType(dtype) || IsQuantized(dtype)) {
      return ErrorAt(lit.at, absl::StrCat("a literal cannot take dtype ", DTypeName(dtype)));
    }
    auto t = HostTensor::Create(dtype, {});
    if (!t.ok()) return AtToken(lit.at, t.status());
    KILN_RETURN_IF_ERROR(StoreElement(*t, 0, lit.at, lit.number));
    auto node = std::make_unique<Node>();
    node->op = v1::OP_CONSTANT;
    node->value = std::make_shared<const HostTensor>(std::move(t).value());
    KILN_ASSIGN_OR_RETURN(Node * n, Emit(std::move(node), lit.at));
    return n->out();
  }

  // A non-literal operand's value; rejects a multi-result call used whole.
  absl::StatusOr<ValueRef> Resolve(const Operand& o) {
    if (o.literal) {
      return ErrorAt(o.at, "a scalar literal needs a tensor operand to take its dtype from");
    }
    if (o.results > 1) {
      return ErrorAt(o.at, absl::StrCat("this call has ", o.results,
                                        " results; bind them with `let (a, b, ...) = ...`"));
    }
    return o.value;
  }

  // Resolves `ops`, turning literals into scalar constants of the dtype of
  // their partner: the other operand of a binary/compare op, the other
  // branch of a where.
  absl::StatusOr<std::vector<ValueRef>> ResolveOperands(OpKind op,
                                                        const std::vector<Operand>& ops) {
    std::vector<int> partner(ops.size(), -1);
    if ((op == v1::OP_BINARY || op == v1::OP_COMPARE) && ops.size() == 2) partner = {1, 0};
    if (op == v1::OP_WHERE && ops.size() == 3) partner = {-1, 2, 1};
    std::vector<ValueRef> out;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].literal && partner[i] >= 0 && !ops[partner[i]].literal) {
        KILN_ASSIGN_OR_RETURN(ValueRef other, Resolve(ops[partner[i]]));
        KILN_ASSIGN_OR_RETURN(ValueRef v, Literal(ops[i], g_->TypeOf(other).dtype));
        out.push_back(v);
        continue;
      }
      KILN_ASSIGN_OR_RETURN(ValueRef v, Resolve(ops[i]));
      out.push_back(v);
    }
    return out;
  }

  absl::StatusOr<Operand> Make(OpKind op, int kind, const std::vector<Operand>& operands,
                               const Token& at, v1::Attrs attrs = {}) {
    KILN_ASSIGN_OR_RETURN(std::vector<ValueRef> refs, ResolveOperands(op, operands));
    auto node = std::make_unique<Node>();
    node->op = op;
    node->attrs = std::move(attrs);
    Message* msg = node->attrs.GetReflection()->MutableMessage(&node->attrs, AttrsField(op));
    if (kind != 0) msg->GetReflection()->SetEnumValue(msg, FamilyKindField(op), kind);
    node->operands.assign(refs.begin(), refs.end());
    if (op == v1::OP_CUSTOM && custom_types_ != nullptr) {
      for (const auto& t : *custom_types_) {
        if (!t) return ErrorAt(at, "custom ops need every result type declared in the `let`");
        node->outputs.push_back(*t);
      }
    }
    KILN_ASSIGN_OR_RETURN(Node * n, Emit(std::move(node), at));
    Operand out;
    out.value = n->out();
    out.at = at;
    out.results = static_cast<int>(n->outputs.size());
    return out;
  }

  // ---- expressions: Python precedence ----
  static std::optional<v1::CompareKind> CompareOp(const Token& t) {
    if (t.kind != Tok::kPunct) return std::nullopt;
    if (t.text == "==") return v1::COMPARE_EQ;
    if (t.text == "!=") return v1::COMPARE_NE;
    if (t.text == "<") return v1::COMPARE_LT;
    if (t.text == "<=") return v1::COMPARE_LE;
    if (t.text == ">") return v1::COMPARE_GT;
    if (t.text == ">=") return v1::COMPARE_GE;
    return std::nullopt;
  }

  bool AtInfixOperator() const {
    return AtPunct('+') || AtPunct('-') || AtPunct('*') || AtPunct('/') || AtPunct('@') ||
           CompareOp(Peek()).has_value();
  }

  // Comparisons bind loosest and do not chain (`a < b < c` is an error).
  absl::StatusOr<Operand> ParseExpr() {
    KILN_ASSIGN_OR_RETURN(Operand lhs, ParseSum());
    const auto kind = CompareOp(Peek());
    if (!kind) return lhs;
    const Token& op = Next();
    KILN_ASSIGN_OR_RETURN(Operand rhs, ParseSum());
    if (CompareOp(Peek())) return ErrorAt(Peek(), "comparisons do not chain; add parentheses");
    return Make(v1::OP_COMPARE, *kind, {lhs, rhs}, op);
  }

  absl::StatusOr<Operand> ParseSum() {
    KILN_ASSIGN_OR_RETURN(Operand lhs, ParseTerm());
    while (AtPunct('+') || AtPunct('-')) {
      const Token& op = Next();
      KILN_ASSIGN_OR_RETURN(Operand rhs, ParseTerm());
      KILN_ASSIGN_OR_RETURN(
          lhs,
          Make(v1::OP_BINARY, op.punct == '+' ? v1::BINARY_ADD : v1::BINARY_SUB, {lhs, rhs}, op));
    }
    return lhs;
  }

  absl::StatusOr<Operand> ParseTerm() {
    KILN_ASSIGN_OR_RETURN(Operand lhs, ParseUnary());
    while (AtPunct('*') || AtPunct('/') || AtPunct('@')) {
      const Token& op = Next();
      KILN_ASSIGN_OR_RETURN(Operand rhs, ParseUnary());
      if (op.punct == '@') {
        KILN_ASSIGN_OR_RETURN(lhs, Make(v1::OP_MATMUL, 0, {lhs, rhs}, op));
      } else {
        KILN_ASSIGN_OR_RETURN(
            lhs,
            Make(v1::OP_BINARY, op.punct == '*' ? v1::BINARY_MUL : v1::BINARY_DIV, {lhs, rhs}, op));
      }
    }
    return lhs;
  }

  absl::StatusOr<Operand> ParseUnary() {
    if (!AtPunct('-')) return ParsePrimary();
    const Token& minus = Next();
    KILN_RETURN_IF_ERROR(cur_.Enter(minus));
    KILN_ASSIGN_OR_RETURN(Operand x, ParseUnary());
    cur_.Leave();
    if (x.literal) {
      x.number = x.number[0] == '-' ? x.number.substr(1) : absl::StrCat("-", x.number);
      x.at = minus;
      return x;
    }
    return Make(v1::OP_UNARY, v1::UNARY_NEG, {x}, minus);
  }

  absl::StatusOr<Operand> ParsePrimary() {
    const Token& t = Peek();
    Operand o;
    o.at = t;
    if (IsPunct(t, '(')) {
      Next();
      KILN_RETURN_IF_ERROR(cur_.Enter(t));
      KILN_ASSIGN_OR_RETURN(o, ParseExpr());
      cur_.Leave();
      KILN_RETURN_IF_ERROR(Expect(')'));
      return o;
    }
    if (t.kind == Tok::kInt || t.kind == Tok::kFloat || IsKeyword(t, "inf") ||
        IsKeyword(t, "nan")) {
      o.literal = true;
      o.number = Next().text;
      return o;
    }
    if (t.kind == Tok::kIdent && t.output < 0 && IsPunct(Peek(1), '(')) return ParseCall();
    if ((t.kind == Tok::kIdent && !IsReservedWord(t.text)) || t.kind == Tok::kString ||
        t.kind == Tok::kLocal) {
      Next();
      KILN_ASSIGN_OR_RETURN(o.value, Lookup(t));
      return o;
    }
    return Expected(t, "a value");
  }

  absl::StatusOr<Operand> ParseCall() {
    const size_t start = cur_.pos();
    const Token& fn = Next();
    auto f = LookupFunction(fn.text);
    if (!f) return ErrorAt(fn, absl::StrCat("unknown op `", fn.text, "`"));
    if (IsInternalOp(f->op) && !options_.allow_internal_ops) {
      return ErrorAt(fn, absl::StrCat("`", fn.text,
                                      "` is an internal op made by passes; "
                                      "client graphs cannot contain it"));
    }
    KILN_RETURN_IF_ERROR(cur_.Enter(fn));
    Next();  // `(`
    std::vector<Operand> operands;
    v1::Attrs attrs;
    Message* msg = attrs.GetReflection()->MutableMessage(&attrs, AttrsField(f->op));
    absl::flat_hash_set<int> seen;
    while (!AtPunct(')')) {
      if (Peek().kind == Tok::kIdent && IsPunct(Peek(1), '=')) {
        const Token& key = Next();
        Next();
        const FieldDescriptor* field = msg->GetDescriptor()->FindFieldByName(key.text);
        if (field == nullptr) return UnknownAttribute(fn, key, *msg);
        if (f->kind != 0 && field == FamilyKindField(f->op)) {
          return ErrorAt(key, absl::StrCat("`", fn.text, "` already says the kind"));
        }
        if (!seen.insert(field->number()).second) {
          return ErrorAt(key, absl::StrCat("attribute `", key.text, "` given twice"));
        }
        KILN_RETURN_IF_ERROR(
            ParseAttribute(cur_, msg, field, [this](v1::Graph* g) { return ParseSubgraph(g); }));
      } else {
        if (!seen.empty()) return ErrorAt(Peek(), "operands must come before attributes");
        KILN_ASSIGN_OR_RETURN(Operand o, ParseExpr());
        operands.push_back(std::move(o));
      }
      if (!AtPunct(')')) {
        KILN_RETURN_IF_ERROR(Expect(','));
      }
    }
    Next();  // `)`
    cur_.Leave();
    // A custom op takes its result types from the `let` it is the whole of.
    const bool whole_let = start == let_expr_start_ && !AtInfixOperator();
    custom_types_ = whole_let ? let_types_ : nullptr;
    auto out = Make(f->op, f->kind, operands, fn, std::move(attrs));
    custom_types_ = nullptr;
    return out;
  }

  absl::Status UnknownAttribute(const Token& fn, const Token& key, const Message& msg) {
    std::vector<std::string> names;
    const auto* d = msg.GetDescriptor();
    for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
    return ErrorAt(
        key,
        absl::StrCat("`", fn.text, "` has no attribute `", key.text, "`",
                     names.empty() ? " (it has none)"
                                   : absl::StrCat(" (it has: ", absl::StrJoin(names, ", "), ")")));
  }

  // `graph "name" { ... }`: parsed and verified on its own, stored as the wire graph.
  absl::Status ParseSubgraph(v1::Graph* out) {
    const Token& kw = Next();
    if (!IsKeyword(kw, "graph")) return Expected(kw, "a subgraph `graph \"name\" { ... }`");
    std::string name;
    if (Peek().kind == Tok::kString || (Peek().kind == Tok::kIdent && Peek().output < 0)) {
      name = Next().text;
    }
    KILN_RETURN_IF_ERROR(Expect('{'));
    if (depth_ + 1 > verify_.limits.max_subgraph_depth) {
      return ErrorAt(kw, absl::StrCat("subgraph nesting exceeds the limit of ",
                                      verify_.limits.max_subgraph_depth));
    }
    Parser inner(cur_, options_, depth_ + 1);
    KILN_ASSIGN_OR_RETURN(auto body, inner.ParseBlock(std::move(name), kw));
    ExportGraph(*body, out);
    return absl::OkStatus();
  }

  Cursor& cur_;
  const ParseOptions& options_;
  const int depth_;
  VerifyOptions verify_;
  std::unique_ptr<Graph> g_;
  // Names and %labels in scope, with where each was defined.
  absl::flat_hash_map<std::string, std::pair<ValueRef, Token>> scope_;
  int32_t stmt_first_id_ = 0;
  int32_t last_created_ = -1;
  // The `let` being parsed: where its expression starts and its declared types.
  size_t let_expr_start_ = static_cast<size_t>(-1);
  const std::vector<std::optional<TensorType>>* let_types_ = nullptr;
  const std::vector<std::optional<TensorType>>* custom_types_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Graph>> ParseGraph(std::string_view text,
                                                  const ParseOptions& options) {
  KILN_ASSIGN_OR_RETURN(std::vector<Token> toks, Tokenize(text));
  Cursor cur(toks);
  Parser parser(cur, options, /*depth=*/0);
  return parser.ParseTop();
}

absl::StatusOr<v1::Graph> ParseGraphProto(std::string_view text, const ParseOptions& options) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, ParseGraph(text, options));
  v1::Graph proto;
  ExportGraph(*g, &proto);
  return proto;
}

}  // namespace kiln::ir
