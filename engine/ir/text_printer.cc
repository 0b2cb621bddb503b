// The text printer: one line per node in node order (see text.h).
#include <cmath>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "base/half.h"
#include "engine/ir/text.h"
#include "engine/ir/text_internal.h"
#include "engine/ir/verifier.h"

namespace kiln::ir {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using namespace text_internal;  // NOLINT: the text form's own helpers

// Constants up to this many elements print as a decimal list; larger ones
// (and those a list cannot reproduce byte for byte) as hex.
constexpr int64_t kMaxListElements = 64;

template <typename T>
T Load(const HostTensor& t, int64_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(t.data()) + i * sizeof(T), sizeof(T));
  return v;
}

// The decimal text of element i, or nullopt when decimal text would not read
// back to the same bytes (NaN payloads, bool bytes other than 0 and 1).
std::optional<std::string> ElementText(const HostTensor& t, int64_t i) {
  switch (t.dtype()) {
    case v1::DTYPE_F32: {
      const float v = Load<float>(t, i);
      if (std::isnan(v)) return std::nullopt;
      return FormatFloat(v);
    }
    case v1::DTYPE_F16:
    case v1::DTYPE_BF16: {
      const uint16_t bits = Load<uint16_t>(t, i);
      const float v = t.dtype() == v1::DTYPE_F16 ? HalfToFloat(bits) : Bf16ToFloat(bits);
      if (std::isnan(v)) return std::nullopt;
      return FormatFloat(v);
    }
    case v1::DTYPE_F64: {
      const double v = Load<double>(t, i);
      if (std::isnan(v)) return std::nullopt;
      return FormatDouble(v);
    }
    case v1::DTYPE_I8:
      return absl::StrCat(Load<int8_t>(t, i));
    case v1::DTYPE_U8:
      return absl::StrCat(Load<uint8_t>(t, i));
    case v1::DTYPE_I16:
      return absl::StrCat(Load<int16_t>(t, i));
    case v1::DTYPE_I32:
      return absl::StrCat(Load<int32_t>(t, i));
    case v1::DTYPE_I64:
      return absl::StrCat(Load<int64_t>(t, i));
    case v1::DTYPE_BOOL: {
      const uint8_t b = Load<uint8_t>(t, i);
      if (b > 1) return std::nullopt;
      return std::string(b ? "true" : "false");
    }
    default:
      return std::nullopt;
  }
}

std::string ConstantText(const HostTensor& t) {
  if (t.num_elements() <= kMaxListElements && !IsQuantized(t.dtype())) {
    std::vector<std::string> items;
    bool ok = true;
    for (int64_t i = 0; ok && i < t.num_elements(); ++i) {
      auto text = ElementText(t, i);
      ok = text.has_value();
      if (ok) items.push_back(*std::move(text));
    }
    if (ok) return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
  }
  const std::string_view bytes = t.bytes();
  return absl::StrCat("hex\"",
                      absl::BytesToHexString(absl::string_view(bytes.data(), bytes.size())), "\"");
}

class Printer {
 public:
  Printer(const Graph& g, const PrintOptions& options, int indent)
      : g_(g), options_(options), indent_(indent, ' ') {
    absl::flat_hash_map<std::string, int> name_count;
    for (const auto& n : g_.nodes()) {
      if (!n->name.empty()) ++name_count[n->name];
    }
    for (const auto& n : g_.nodes()) {
      const bool source = n->op == v1::OP_INPUT || n->op == v1::OP_PARAM;
      const bool unique = !n->name.empty() && name_count[n->name] == 1;
      display_[n->id] =
          (source && !n->name.empty()) || unique ? QuoteName(n->name) : absl::StrCat("%", n->id);
    }
  }

  // The statements, one per line, each ending in a newline.
  std::string Body() const {
    std::string out;
    for (const auto& n : g_.nodes()) absl::StrAppend(&out, indent_, NodeLine(*n), "\n");
    for (const GraphOutput& o : g_.outputs()) {
      const std::string ref = Ref(o.value);
      const std::string name = QuoteName(o.name);
      absl::StrAppend(&out, indent_, "out ", name, ref == name ? "" : absl::StrCat(" = ", ref),
                      "\n");
    }
    return out;
  }

 private:
  std::string Ref(ValueRef v) const {
    auto it = display_.find(v.node);
    const std::string base = it == display_.end() ? absl::StrCat("%", v.node) : it->second;
    return v.output == 0 ? base : absl::StrCat(base, "#", v.output);
  }

  std::string Type(const TensorType& t) const {
    std::vector<std::string> dims;
    for (int64_t d : t.dims) {
      if (d >= 0) {
        dims.push_back(absl::StrCat(d));
      } else if (const std::string* name = SymbolName(d, g_.symbols()); name != nullptr) {
        dims.push_back(QuoteName(*name));
      } else {
        dims.push_back("?");
      }
    }
    return absl::StrCat(DTypeName(t.dtype), "[", absl::StrJoin(dims, ", "), "]");
  }

  std::string NodeLine(const Node& n) const {
    const std::string& self = display_.at(n.id);
    std::string line;
    switch (n.op) {
      case v1::OP_INPUT:
      case v1::OP_PARAM:
        line = absl::StrCat(n.op == v1::OP_INPUT ? "input " : "param ", self, ": ",
                            n.outputs.empty() ? "?" : Type(n.type()));
        if (n.op == v1::OP_PARAM && n.attrs.param().frozen()) absl::StrAppend(&line, " frozen");
        break;
      case v1::OP_CONSTANT: {
        const TensorType t = n.value ? TensorType(n.value->dtype(), IrDims(n.value->dims().begin(),
                                                                           n.value->dims().end()))
                                     : TensorType();
        line = absl::StrCat("const ", self, ": ", Type(t), " = ",
                            n.value ? ConstantText(*n.value) : "[]");
        break;
      }
      default:
        line = absl::StrCat("let ", Targets(n), " = ", Call(n));
        break;
    }
    if (options_.annotations) absl::StrAppend(&line, Annotations(n));
    return line;
  }

  std::string Targets(const Node& n) const {
    const std::string& self = display_.at(n.id);
    if (n.outputs.size() == 1) return absl::StrCat(self, ": ", Type(n.type()));
    std::vector<std::string> targets;
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      targets.push_back(absl::StrCat(Ref(n.out(static_cast<int>(k))), ": ", Type(n.outputs[k])));
    }
    if (targets.empty()) return self;
    return absl::StrCat("(", absl::StrJoin(targets, ", "), ")");
  }

  std::string Call(const Node& n) const {
    const std::string fn = FunctionName(n.op, n.attrs);
    std::vector<std::string> args;
    for (const ValueRef& v : n.operands) args.push_back(Ref(v));
    const Reflection* refl = n.attrs.GetReflection();
    const auto* set =
        refl->GetOneofFieldDescriptor(n.attrs, v1::Attrs::descriptor()->FindOneofByName("kind"));
    if (set != nullptr) {
      // A family spelling ("relu") already says the kind.
      const FieldDescriptor* skip = fn == OpName(n.op) ? nullptr : FamilyKindField(n.op);
      for (std::string& f : Fields(refl->GetMessage(n.attrs, set), skip)) {
        args.push_back(std::move(f));
      }
    }
    return absl::StrCat(fn, "(", absl::StrJoin(args, ", "), ")");
  }

  std::vector<std::string> Fields(const Message& m, const FieldDescriptor* skip) const {
    std::vector<const FieldDescriptor*> fields;
    m.GetReflection()->ListFields(m, &fields);
    std::vector<std::string> out;
    for (const FieldDescriptor* f : fields) {
      if (f == skip) continue;
      if (!f->is_repeated()) {
        out.push_back(absl::StrCat(f->name(), "=", Value(m, f, -1)));
        continue;
      }
      std::vector<std::string> items;
      const int n = m.GetReflection()->FieldSize(m, f);
      for (int i = 0; i < n; ++i) items.push_back(Value(m, f, i));
      out.push_back(absl::StrCat(f->name(), "=[", absl::StrJoin(items, ", "), "]"));
    }
    return out;
  }

  // Field `f` of `m` (element `index` of a repeated field, or -1).
  std::string Value(const Message& m, const FieldDescriptor* f, int index) const {
    const Reflection* r = m.GetReflection();
    const bool rep = index >= 0;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        return absl::StrCat(rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f));
      case FieldDescriptor::CPPTYPE_INT64:
        return absl::StrCat(rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f));
      case FieldDescriptor::CPPTYPE_UINT32:
        return absl::StrCat(rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f));
      case FieldDescriptor::CPPTYPE_UINT64:
        return absl::StrCat(rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f));
      case FieldDescriptor::CPPTYPE_DOUBLE:
        return FormatDouble(rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f));
      case FieldDescriptor::CPPTYPE_FLOAT:
        return FormatFloat(rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f));
      case FieldDescriptor::CPPTYPE_BOOL:
        return (rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f)) ? "true" : "false";
      case FieldDescriptor::CPPTYPE_ENUM:
        return EnumValueText(f->enum_type(),
                             rep ? r->GetRepeatedEnumValue(m, f, index) : r->GetEnumValue(m, f));
      case FieldDescriptor::CPPTYPE_STRING: {
        const std::string s = rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f);
        if (f->type() == FieldDescriptor::TYPE_BYTES) {
          return absl::StrCat("hex\"", absl::BytesToHexString(s), "\"");
        }
        return QuoteString(s);
      }
      case FieldDescriptor::CPPTYPE_MESSAGE: {
        const Message& sub = rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f);
        if (f->message_type() == v1::Graph::descriptor()) {
          return Subgraph(static_cast<const v1::Graph&>(sub));
        }
        return absl::StrCat("{", absl::StrJoin(Fields(sub, nullptr), ", "), "}");
      }
    }
    return "?";
  }

  std::string Subgraph(const v1::Graph& body) const {
    const std::string head = absl::StrCat("graph ", QuoteString(body.name()), " {\n");
    VerifyOptions verify;
    verify.allow_internal_ops = true;
    auto g = ImportGraph(body, verify);
    if (!g.ok()) {
      // Only graphs that never verified get here; say why instead of guessing.
      const std::string why = absl::StrReplaceAll(g.status().message(), {{"\n", " "}});
      return absl::StrCat(head, indent_, "  # does not verify: ", why, "\n", indent_, "}");
    }
    Printer inner(**g, options_, static_cast<int>(indent_.size()) + 2);
    return absl::StrCat(head, inner.Body(), indent_, "}");
  }

  std::string Annotations(const Node& n) const {
    std::vector<std::string> items;
    if (n.path != v1::PATH_UNSPECIFIED) {
      items.push_back(absl::StrCat("path=", EnumValueText(v1::Path_descriptor(), n.path)));
    }
    if (!n.device.empty()) items.push_back(absl::StrCat("device=", QuoteString(n.device)));
    if (n.offset >= 0) items.push_back(absl::StrCat("offset=", n.offset));
    if (items.empty()) return "";
    return absl::StrCat(" {", absl::StrJoin(items, ", "), "}");
  }

  const Graph& g_;
  const PrintOptions& options_;
  const std::string indent_;
  absl::flat_hash_map<int32_t, std::string> display_;
};

}  // namespace

std::string PrintGraph(const Graph& graph, const PrintOptions& options) {
  std::string out;
  if (!graph.name().empty())
    absl::StrAppend(&out, "graph ", text_internal::QuoteString(graph.name()), "\n");
  absl::StrAppend(&out, Printer(graph, options, 0).Body());
  return out;
}

}  // namespace kiln::ir
