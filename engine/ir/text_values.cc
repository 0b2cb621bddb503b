// Literal values of the text form: numbers, constant payloads, attribute
// values through protobuf reflection; and the token cursor they read from.
#include <algorithm>
#include <charconv>
#include <cstring>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/half.h"
#include "base/status.h"
#include "engine/ir/text_internal.h"

namespace kiln::ir::text_internal {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

absl::Status ErrorAt(const Token& t, const std::string& msg, absl::StatusCode code) {
  return absl::Status(code, absl::StrCat(t.line, ":", t.col, ": ", msg));
}

absl::Status Expected(const Token& t, const std::string& what) {
  return ErrorAt(t, absl::StrCat("expected ", what, ", got ", DescribeToken(t)));
}

absl::Status AtToken(const Token& t, const absl::Status& status) {
  return ErrorAt(t, std::string(status.message()), status.code());
}

bool IsPunct(const Token& t, char c) { return t.kind == Tok::kPunct && t.punct == c; }

bool IsKeyword(const Token& t, std::string_view word) {
  return t.kind == Tok::kIdent && t.text == word && t.output < 0;
}

const Token& Cursor::Peek(size_t ahead) const {
  return toks_[std::min(pos_ + ahead, toks_.size() - 1)];
}

const Token& Cursor::Next() {
  const Token& t = Peek();
  if (pos_ + 1 < toks_.size()) ++pos_;
  return t;
}

absl::Status Cursor::Expect(char c) {
  if (!AtPunct(c)) return Expected(Peek(), absl::StrCat("`", std::string(1, c), "`"));
  Next();
  return absl::OkStatus();
}

absl::Status Cursor::Enter(const Token& at) {
  if (++depth_ > kMaxNesting) return ErrorAt(at, absl::StrCat("nesting deeper than ", kMaxNesting));
  return absl::OkStatus();
}

namespace {

template <typename T>
bool ParseNumber(const std::string& text, T* out) {
  const char* end = text.data() + text.size();
  auto r = std::from_chars(text.data(), end, *out);
  return r.ec == std::errc() && r.ptr == end;
}

template <typename T>
void Store(HostTensor& t, int64_t i, T v) {
  std::memcpy(static_cast<char*>(t.data()) + i * sizeof(T), &v, sizeof(T));
}

}  // namespace

bool ParseInt64(const std::string& text, int64_t* out) { return ParseNumber(text, out); }

// Stores the literal `text` (signed decimal, `inf`, `nan`, `true`, `false`)
// as element i of `t`, exactly: floats are read at their own precision and
// integers must fit the dtype.
absl::Status StoreElement(HostTensor& t, int64_t i, const Token& at, const std::string& text) {
  const DType d = t.dtype();
  const std::string type = DTypeName(d);
  if (d == v1::DTYPE_BOOL) {
    if (text != "true" && text != "false" && text != "0" && text != "1") {
      return ErrorAt(at, absl::StrCat("expected true or false for bool, got `", text, "`"));
    }
    Store<uint8_t>(t, i, text == "true" || text == "1");
    return absl::OkStatus();
  }
  if (text == "true" || text == "false") {
    return ErrorAt(at, absl::StrCat("`", text, "` is not a ", type, " value"));
  }
  if (d == v1::DTYPE_F64) {
    double v;
    if (!ParseNumber(text, &v)) return ErrorAt(at, absl::StrCat("bad number `", text, "`"));
    Store(t, i, v);
    return absl::OkStatus();
  }
  if (IsFloat(d)) {
    float v;
    if (!ParseNumber(text, &v)) return ErrorAt(at, absl::StrCat("bad number `", text, "`"));
    if (d == v1::DTYPE_F32) Store(t, i, v);
    if (d == v1::DTYPE_F16) Store(t, i, FloatToHalf(v));
    if (d == v1::DTYPE_BF16) Store(t, i, FloatToBf16(v));
    return absl::OkStatus();
  }
  int64_t v;
  if (!ParseNumber(text, &v)) {
    return ErrorAt(at, absl::StrCat("`", text, "` is not a ", type, " value"));
  }
  auto fits = [&](int64_t lo, int64_t hi) { return v >= lo && v <= hi; };
  bool ok = true;
  switch (d) {
    case v1::DTYPE_I8:
      ok = fits(-128, 127);
      Store<int8_t>(t, i, static_cast<int8_t>(v));
      break;
    case v1::DTYPE_U8:
      ok = fits(0, 255);
      Store<uint8_t>(t, i, static_cast<uint8_t>(v));
      break;
    case v1::DTYPE_I16:
      ok = fits(-32768, 32767);
      Store<int16_t>(t, i, static_cast<int16_t>(v));
      break;
    case v1::DTYPE_I32:
      ok = fits(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max());
      Store<int32_t>(t, i, static_cast<int32_t>(v));
      break;
    case v1::DTYPE_I64:
      Store<int64_t>(t, i, v);
      break;
    default:
      return ErrorAt(at, absl::StrCat(type, " values need a hex literal"));
  }
  if (!ok) return ErrorAt(at, absl::StrCat(text, " does not fit ", type));
  return absl::OkStatus();
}
namespace {

class ValueParser {
 public:
  ValueParser(Cursor& cur, SubgraphParser subgraph) : cur_(cur), subgraph_(std::move(subgraph)) {}

  // A signed number literal: `-`? (int | float | inf | nan).
  absl::StatusOr<Token> ParseSignedNumber(const std::string& what) {
    Token t = cur_.Peek();
    const bool neg = cur_.AtPunct('-');
    if (neg) cur_.Next();
    const Token& num = cur_.Next();
    const bool word = num.kind == Tok::kIdent && (num.text == "inf" || num.text == "nan");
    if (num.kind != Tok::kInt && num.kind != Tok::kFloat && !word) return Expected(num, what);
    if (!neg) t = num;
    t.kind = num.kind;
    t.text = absl::StrCat(neg ? "-" : "", num.text);
    return t;
  }

  absl::StatusOr<HostTensor> ParseConstant(const TensorType& type, int64_t max_elements) {
    const Token& at = cur_.Peek();
    const Dims dims = type.dims_vector();
    KILN_ASSIGN_OR_RETURN(int64_t n, CheckedNumElements(dims));
    if (n > max_elements) {
      return ErrorAt(
          at, absl::StrCat("constant has ", n, " elements, over the limit of ", max_elements),
          absl::StatusCode::kResourceExhausted);
    }
    if (at.kind == Tok::kBytes) {
      cur_.Next();
      const std::optional<int64_t> want = BytesFor(type.dtype, n);
      if (want && *want != static_cast<int64_t>(at.text.size())) {  // before allocating
        return ErrorAt(at, absl::StrCat("constant needs ", *want, " bytes, got ", at.text.size()));
      }
      auto t = HostTensor::FromBytes(type.dtype, dims, at.text);
      if (!t.ok()) return AtToken(at, t.status());
      return t;
    }
    if (IsQuantized(type.dtype)) return Expected(at, "hex\"...\" bytes for a quantized constant");
    // Each value is a token: a type larger than the rest of the text fails
    // before its storage is allocated.
    if (n > static_cast<int64_t>(cur_.remaining())) {
      return ErrorAt(at, absl::StrCat("constant needs ", n, " values; the text has fewer"));
    }
    auto created = HostTensor::Create(type.dtype, dims);
    if (!created.ok()) return AtToken(at, created.status());
    HostTensor t = std::move(created).value();
    const bool list = cur_.AtPunct('[');
    if (list) {
      cur_.Next();
    } else if (n != 1) {
      return Expected(at, absl::StrCat("a list of ", n, " values or hex\"...\""));
    }
    int64_t i = 0;
    while (!list || !cur_.AtPunct(']')) {
      const Token& item = cur_.Peek();
      std::string text;
      if (IsKeyword(item, "true") || IsKeyword(item, "false")) {
        text = cur_.Next().text;
      } else {
        KILN_ASSIGN_OR_RETURN(Token num, ParseSignedNumber("a number"));
        text = num.text;
      }
      if (i >= n) return ErrorAt(item, absl::StrCat("more than the ", n, " values of the type"));
      KILN_RETURN_IF_ERROR(StoreElement(t, i++, item, text));
      if (!list) break;
      if (!cur_.AtPunct(']')) {
        KILN_RETURN_IF_ERROR(cur_.Expect(','));
      }
    }
    if (list) cur_.Next();
    if (i != n) return ErrorAt(at, absl::StrCat("expected ", n, " values, got ", i));
    return t;
  }

  absl::Status ParseField(Message* msg, const FieldDescriptor* f) {
    if (!f->is_repeated()) return ParseValue(msg, f);
    const Token& open = cur_.Peek();
    KILN_RETURN_IF_ERROR(cur_.Expect('['));
    KILN_RETURN_IF_ERROR(cur_.Enter(open));
    while (!cur_.AtPunct(']')) {
      KILN_RETURN_IF_ERROR(ParseValue(msg, f));
      if (!cur_.AtPunct(']')) {
        KILN_RETURN_IF_ERROR(cur_.Expect(','));
      }
    }
    cur_.Next();
    cur_.Leave();
    return absl::OkStatus();
  }

  // One value of field `f` (appended when `f` is repeated).
  absl::Status ParseValue(Message* msg, const FieldDescriptor* f) {
    const Reflection* r = msg->GetReflection();
    const bool rep = f->is_repeated();
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
      case FieldDescriptor::CPPTYPE_INT64:
      case FieldDescriptor::CPPTYPE_UINT32:
      case FieldDescriptor::CPPTYPE_UINT64: {
        KILN_ASSIGN_OR_RETURN(Token num,
                              ParseSignedNumber(absl::StrCat("an integer for ", f->name())));
        int64_t v = 0;
        uint64_t u = 0;
        const bool is64 = f->cpp_type() == FieldDescriptor::CPPTYPE_INT64;
        const bool unsig = f->cpp_type() == FieldDescriptor::CPPTYPE_UINT32 ||
                           f->cpp_type() == FieldDescriptor::CPPTYPE_UINT64;
        const bool ok = num.kind == Tok::kInt &&
                        (unsig ? ParseNumber(num.text, &u) : ParseNumber(num.text, &v));
        const bool fits =
            ok && (is64 || (unsig ? (f->cpp_type() == FieldDescriptor::CPPTYPE_UINT64 ||
                                     u <= std::numeric_limits<uint32_t>::max())
                                  : (v >= std::numeric_limits<int32_t>::min() &&
                                     v <= std::numeric_limits<int32_t>::max())));
        if (!fits) return ErrorAt(num, absl::StrCat("`", num.text, "` is not a valid ", f->name()));
        switch (f->cpp_type()) {
          case FieldDescriptor::CPPTYPE_INT32:
            rep ? r->AddInt32(msg, f, static_cast<int32_t>(v))
                : r->SetInt32(msg, f, static_cast<int32_t>(v));
            break;
          case FieldDescriptor::CPPTYPE_INT64:
            rep ? r->AddInt64(msg, f, v) : r->SetInt64(msg, f, v);
            break;
          case FieldDescriptor::CPPTYPE_UINT32:
            rep ? r->AddUInt32(msg, f, static_cast<uint32_t>(u))
                : r->SetUInt32(msg, f, static_cast<uint32_t>(u));
            break;
          default:
            rep ? r->AddUInt64(msg, f, u) : r->SetUInt64(msg, f, u);
            break;
        }
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_DOUBLE:
      case FieldDescriptor::CPPTYPE_FLOAT: {
        KILN_ASSIGN_OR_RETURN(Token num,
                              ParseSignedNumber(absl::StrCat("a number for ", f->name())));
        double d;
        float fl;
        const bool dbl = f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE;
        if (!(dbl ? ParseNumber(num.text, &d) : ParseNumber(num.text, &fl))) {
          return ErrorAt(num, absl::StrCat("`", num.text, "` is out of range for ", f->name()));
        }
        if (dbl) {
          rep ? r->AddDouble(msg, f, d) : r->SetDouble(msg, f, d);
        } else {
          rep ? r->AddFloat(msg, f, fl) : r->SetFloat(msg, f, fl);
        }
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_BOOL: {
        const Token& t = cur_.Next();
        if (!IsKeyword(t, "true") && !IsKeyword(t, "false")) {
          return Expected(t, absl::StrCat("true or false for ", f->name()));
        }
        rep ? r->AddBool(msg, f, t.text == "true") : r->SetBool(msg, f, t.text == "true");
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_ENUM: {
        int value;
        if (cur_.Peek().kind == Tok::kIdent && cur_.Peek().output < 0) {
          const Token& t = cur_.Next();
          auto e = ParseEnumValueText(f->enum_type(), t.text);
          if (!e) return ErrorAt(t, absl::StrCat("unknown ", f->name(), " `", t.text, "`"));
          value = *e;
        } else {  // a raw number, for values this build does not name
          KILN_ASSIGN_OR_RETURN(Token num,
                                ParseSignedNumber(absl::StrCat("a ", f->name(), " name")));
          if (num.kind != Tok::kInt || !ParseNumber(num.text, &value)) {
            return ErrorAt(num, absl::StrCat("`", num.text, "` is not a valid ", f->name()));
          }
        }
        rep ? r->AddEnumValue(msg, f, value) : r->SetEnumValue(msg, f, value);
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_STRING: {
        const Token& t = cur_.Next();
        const bool bytes = f->type() == FieldDescriptor::TYPE_BYTES;
        if (t.kind != Tok::kString && !(bytes && t.kind == Tok::kBytes)) {
          return Expected(t, bytes ? "a string or hex\"...\"" : "a string");
        }
        rep ? r->AddString(msg, f, t.text) : r->SetString(msg, f, t.text);
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_MESSAGE: {
        Message* sub = rep ? r->AddMessage(msg, f) : r->MutableMessage(msg, f);
        if (f->message_type() == v1::Graph::descriptor()) {
          return subgraph_(static_cast<v1::Graph*>(sub));
        }
        return ParseMessage(sub);
      }
    }
    return ErrorAt(cur_.Peek(), "unsupported attribute type");
  }

  absl::Status ParseMessage(Message* msg) {
    const Token& open = cur_.Peek();
    KILN_RETURN_IF_ERROR(cur_.Expect('{'));
    KILN_RETURN_IF_ERROR(cur_.Enter(open));
    absl::flat_hash_set<int> seen;
    while (!cur_.AtPunct('}')) {
      const Token& key = cur_.Next();
      const FieldDescriptor* field =
          key.kind == Tok::kIdent ? msg->GetDescriptor()->FindFieldByName(key.text) : nullptr;
      if (field == nullptr) {
        return Expected(key, absl::StrCat("a field of ", msg->GetDescriptor()->name()));
      }
      if (!seen.insert(field->number()).second) {
        return ErrorAt(key, absl::StrCat("field `", key.text, "` given twice"));
      }
      if (const auto* oneof = field->containing_oneof();
          oneof != nullptr && msg->GetReflection()->HasOneof(*msg, oneof)) {
        return ErrorAt(key, absl::StrCat("only one of `", oneof->name(), "` may be set"));
      }
      KILN_RETURN_IF_ERROR(cur_.Expect('='));
      KILN_RETURN_IF_ERROR(ParseField(msg, field));
      if (!cur_.AtPunct('}')) {
        KILN_RETURN_IF_ERROR(cur_.Expect(','));
      }
    }
    cur_.Next();
    cur_.Leave();
    return absl::OkStatus();
  }

 private:
  Cursor& cur_;
  SubgraphParser subgraph_;
};

}  // namespace

absl::StatusOr<Token> ParseSignedNumber(Cursor& cur, const std::string& what) {
  return ValueParser(cur, nullptr).ParseSignedNumber(what);
}

absl::StatusOr<HostTensor> ParseConstantValue(Cursor& cur, const TensorType& type,
                                              int64_t max_elements) {
  return ValueParser(cur, nullptr).ParseConstant(type, max_elements);
}

absl::Status ParseAttribute(Cursor& cur, Message* msg, const FieldDescriptor* field,
                            const SubgraphParser& subgraph) {
  return ValueParser(cur, subgraph).ParseField(msg, field);
}

}  // namespace kiln::ir::text_internal
