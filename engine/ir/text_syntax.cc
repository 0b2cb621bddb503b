// Tokens and spellings shared by the text printer and parser.
#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/ir/text_internal.h"

namespace kiln::ir::text_internal {

namespace {

using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;

bool IsIdentStart(char c) { return absl::ascii_isalpha(c) || c == '_'; }
bool IsIdentChar(char c) { return absl::ascii_isalnum(c) || c == '_' || c == '.'; }

// The common prefix of an enum's value names, cut after the last `_` so that
// whole words are stripped ("MASK_" of MASK_NONE .. MASK_BIAS).
std::string EnumPrefix(const EnumDescriptor* e) {
  if (e->value_count() == 0) return "";
  std::string prefix = e->value(0)->name();
  for (int i = 1; i < e->value_count(); ++i) {
    const std::string& name = e->value(i)->name();
    size_t k = 0;
    while (k < prefix.size() && k < name.size() && prefix[k] == name[k]) ++k;
    prefix.resize(k);
  }
  const size_t cut = prefix.rfind('_');
  return cut == std::string::npos ? "" : prefix.substr(0, cut + 1);
}

std::string StripPrefix(const EnumDescriptor* e, const std::string& name) {
  const std::string prefix = EnumPrefix(e);
  return absl::AsciiStrToLower(absl::StartsWith(name, prefix) ? name.substr(prefix.size()) : name);
}

}  // namespace

bool IsIdentifier(std::string_view s) {
  if (s.empty() || !IsIdentStart(s[0])) return false;
  for (char c : s) {
    if (!IsIdentChar(c)) return false;
  }
  return true;
}

bool IsReservedWord(std::string_view s) {
  static constexpr std::array<std::string_view, 12> kWords = {
      "graph", "input", "param", "const", "let", "out", "frozen", "true", "false", "inf", "nan",
      "hex"};
  return std::find(kWords.begin(), kWords.end(), s) != kWords.end();
}

std::string QuoteString(std::string_view s) {
  return absl::StrCat("\"", absl::CEscape(absl::string_view(s.data(), s.size())), "\"");
}

std::string QuoteName(std::string_view s) {
  if (IsIdentifier(s) && !IsReservedWord(s)) return std::string(s);
  return QuoteString(s);
}

std::string EnumValueText(const EnumDescriptor* e, int number) {
  if (e == v1::DType_descriptor()) {
    if (number == v1::DTYPE_UNSPECIFIED) return "unspecified";
    if (IsKnownDType(number)) return DTypeName(static_cast<DType>(number));
    return absl::StrCat(number);
  }
  const auto* v = e->FindValueByNumber(number);
  if (v == nullptr) return absl::StrCat(number);
  return StripPrefix(e, v->name());
}

std::optional<int> ParseEnumValueText(const EnumDescriptor* e, std::string_view text) {
  if (e == v1::DType_descriptor()) {
    if (text == "unspecified") return v1::DTYPE_UNSPECIFIED;
    if (auto d = ParseDType(text)) return static_cast<int>(*d);
    return std::nullopt;
  }
  const std::string full = absl::StrCat(
      EnumPrefix(e), absl::AsciiStrToUpper(absl::string_view(text.data(), text.size())));
  const auto* v = e->FindValueByName(full);
  if (v == nullptr) return std::nullopt;
  return v->number();
}

const FieldDescriptor* AttrsField(OpKind op) {
  return v1::Attrs::descriptor()->FindFieldByNumber(static_cast<int>(op));
}

const FieldDescriptor* FamilyKindField(OpKind op) {
  switch (op) {
    case v1::OP_UNARY:
    case v1::OP_BINARY:
    case v1::OP_COMPARE:
    case v1::OP_REDUCE:
    case v1::OP_POOL:
      return AttrsField(op)->message_type()->FindFieldByName("kind");
    default:
      return nullptr;
  }
}

namespace {

// The family spelling of `kind` of `op` ("relu", "reduce_sum", "max_pool").
std::string FamilyName(OpKind op, const EnumDescriptor* e, int kind) {
  const auto* v = e->FindValueByNumber(kind);
  const std::string base = StripPrefix(e, v->name());
  if (op == v1::OP_REDUCE) return absl::StrCat("reduce_", base);
  if (op == v1::OP_POOL) return absl::StrCat(base, "_pool");
  return base;
}

const absl::flat_hash_map<std::string, OpFunction>& FunctionTable() {
  static const auto* table = [] {
    auto* t = new absl::flat_hash_map<std::string, OpFunction>();
    const EnumDescriptor* ops = v1::OpKind_descriptor();
    for (int i = 0; i < ops->value_count(); ++i) {
      const auto op = static_cast<OpKind>(ops->value(i)->number());
      if (op == v1::OP_KIND_UNSPECIFIED || op == v1::OP_INPUT || op == v1::OP_PARAM ||
          op == v1::OP_CONSTANT) {
        continue;
      }
      (*t)[OpName(op)] = OpFunction{op, 0};
      const FieldDescriptor* kind = FamilyKindField(op);
      if (kind == nullptr) continue;
      const EnumDescriptor* e = kind->enum_type();
      for (int k = 0; k < e->value_count(); ++k) {
        const int number = e->value(k)->number();
        if (number == 0) continue;
        (*t)[FamilyName(op, e, number)] = OpFunction{op, number};
      }
    }
    return t;
  }();
  return *table;
}

}  // namespace

std::optional<OpFunction> LookupFunction(std::string_view name) {
  const auto& table = FunctionTable();
  auto it = table.find(absl::string_view(name.data(), name.size()));
  if (it == table.end()) return std::nullopt;
  return it->second;
}

std::string FunctionName(OpKind op, const v1::Attrs& attrs) {
  const FieldDescriptor* kind = FamilyKindField(op);
  const FieldDescriptor* field = AttrsField(op);
  if (kind == nullptr || field == nullptr) return OpName(op);
  const auto* refl = attrs.GetReflection();
  if (!refl->HasField(attrs, field)) return OpName(op);
  const auto& sub = refl->GetMessage(attrs, field);
  const int number = sub.GetReflection()->GetEnumValue(sub, kind);
  if (number == 0 || kind->enum_type()->FindValueByNumber(number) == nullptr) return OpName(op);
  return FamilyName(op, kind->enum_type(), number);
}

namespace {

template <typename T>
std::string FormatShortest(T v) {
  if (std::isnan(v)) return "nan";
  std::array<char, 64> buf;
  auto r = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  return std::string(buf.data(), r.ptr);
}

}  // namespace

std::string FormatDouble(double v) { return FormatShortest(v); }
std::string FormatFloat(float v) { return FormatShortest(v); }

namespace {

class Lexer {
 public:
  explicit Lexer(std::string_view text) : text_(text) {}

  absl::StatusOr<std::vector<Token>> Run() {
    std::vector<Token> out;
    while (true) {
      SkipSpaceAndComments();
      Token t;
      t.line = line_;
      t.col = col_;
      if (pos_ >= text_.size()) {
        out.push_back(t);
        return out;
      }
      const char c = text_[pos_];
      if (IsIdentStart(c)) {
        t.kind = Tok::kIdent;
        t.text = TakeWhile(IsIdentChar);
        if (t.text == "hex" && Peek() == '"') {
          t.kind = Tok::kBytes;
          if (auto s = ReadHex(t); !s.ok()) return s;
        }
      } else if (absl::ascii_isdigit(c)) {
        if (auto s = ReadNumber(t); !s.ok()) return s;
      } else if (c == '%') {
        Advance();
        t.kind = Tok::kLocal;
        t.text = TakeWhile([](char ch) { return absl::ascii_isdigit(ch); });
        if (t.text.empty() || t.text.size() > 9) return Error(t, "expected digits after `%`");
      } else if (c == '"') {
        t.kind = Tok::kString;
        if (auto s = ReadString(t); !s.ok()) return s;
      } else if (absl::StrContains("<>=!", c) && Peek(1) == '=') {
        t.kind = Tok::kPunct;
        t.text = std::string(text_.substr(pos_, 2));
        Advance();
        Advance();
      } else if (absl::StrContains("()[]{},=:@+-*/?<>", c)) {
        t.kind = Tok::kPunct;
        t.punct = c;
        t.text = std::string(1, c);
        // The parser refuses nesting past kMaxNesting; refuse it here, before
        // a hostile text of brackets becomes millions of tokens in memory.
        if (c == '(' || c == '[' || c == '{') {
          if (++open_brackets_ > kMaxNesting) {
            return Error(t, absl::StrCat("nesting deeper than ", kMaxNesting));
          }
        } else if ((c == ')' || c == ']' || c == '}') && open_brackets_ > 0) {
          --open_brackets_;
        }
        Advance();
      } else {
        return Error(t, absl::StrCat("unexpected character `", std::string(1, c), "`"));
      }
      if ((t.kind == Tok::kIdent || t.kind == Tok::kLocal || t.kind == Tok::kString) &&
          Peek() == '#' && absl::ascii_isdigit(Peek(1))) {
        Advance();
        const std::string digits = TakeWhile([](char ch) { return absl::ascii_isdigit(ch); });
        if (digits.size() > 9) return Error(t, "output index too large");
        t.output = std::stoi(digits);
      }
      out.push_back(std::move(t));
    }
  }

 private:
  int open_brackets_ = 0;  // brackets opened and not yet closed

  char Peek(size_t ahead = 0) const {
    return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0';
  }
  void Advance() {
    if (text_[pos_] == '\n') {
      ++line_;
      col_ = 1;
    } else {
      ++col_;
    }
    ++pos_;
  }
  template <typename Pred>
  std::string TakeWhile(Pred pred) {
    const size_t start = pos_;
    while (pos_ < text_.size() && pred(text_[pos_])) Advance();
    return std::string(text_.substr(start, pos_ - start));
  }
  void SkipSpaceAndComments() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') Advance();
      } else if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        Advance();
      } else {
        return;
      }
    }
  }
  static absl::Status Error(const Token& t, const std::string& msg) {
    return absl::InvalidArgumentError(absl::StrCat(t.line, ":", t.col, ": ", msg));
  }

  absl::Status ReadNumber(Token& t) {
    auto digits = [](char ch) { return absl::ascii_isdigit(ch); };
    t.kind = Tok::kInt;
    t.text = TakeWhile(digits);
    if (Peek() == '.') {
      t.kind = Tok::kFloat;
      Advance();
      t.text += '.';
      t.text += TakeWhile(digits);
    }
    if (Peek() == 'e' || Peek() == 'E') {
      t.kind = Tok::kFloat;
      t.text += 'e';
      Advance();
      if (Peek() == '+' || Peek() == '-') {
        t.text += Peek();
        Advance();
      }
      const std::string exp = TakeWhile(digits);
      if (exp.empty()) return Error(t, "expected digits in the exponent");
      t.text += exp;
    }
    if (IsIdentStart(Peek())) return Error(t, absl::StrCat("malformed number `", t.text, "...`"));
    return absl::OkStatus();
  }

  // Reads "..." at pos_ into t.text, unescaped; strings do not span lines.
  absl::Status ReadString(Token& t) {
    Advance();  // opening quote
    std::string raw;
    while (true) {
      if (pos_ >= text_.size() || text_[pos_] == '\n') return Error(t, "unterminated string");
      const char c = text_[pos_];
      if (c == '"') break;
      if (c == '\\' && pos_ + 1 < text_.size() && text_[pos_ + 1] != '\n') {
        raw += c;
        Advance();
      }
      raw += text_[pos_];
      Advance();
    }
    Advance();  // closing quote
    std::string error;
    if (!absl::CUnescape(raw, &t.text, &error))
      return Error(t, absl::StrCat("bad string: ", error));
    return absl::OkStatus();
  }

  absl::Status ReadHex(Token& t) {
    Token s = t;
    if (auto st = ReadString(s); !st.ok()) return st;
    if (s.text.size() % 2 != 0) return Error(t, "hex literal needs an even number of digits");
    for (char c : s.text) {
      if (!absl::ascii_isxdigit(c)) return Error(t, "hex literal holds a non-hex character");
    }
    t.text = absl::HexStringToBytes(s.text);
    return absl::OkStatus();
  }

  std::string_view text_;
  size_t pos_ = 0;
  int line_ = 1;
  int col_ = 1;
};

}  // namespace

absl::StatusOr<std::vector<Token>> Tokenize(std::string_view text) { return Lexer(text).Run(); }

std::string DescribeToken(const Token& t) {
  const std::string suffix = t.output >= 0 ? absl::StrCat("#", t.output) : "";
  switch (t.kind) {
    case Tok::kEnd:
      return "end of input";
    case Tok::kIdent:
      return absl::StrCat("`", t.text, suffix, "`");
    case Tok::kString:
      return absl::StrCat("string ", QuoteString(t.text), suffix);
    case Tok::kBytes:
      return "hex literal";
    case Tok::kInt:
    case Tok::kFloat:
      return absl::StrCat("number ", t.text);
    case Tok::kLocal:
      return absl::StrCat("`%", t.text, suffix, "`");
    case Tok::kPunct:
      return absl::StrCat("`", t.text, "`");
  }
  return "token";
}

}  // namespace kiln::ir::text_internal
