// Internal to the text form (text_printer.cc, text_parser.cc): the tokens,
// and the spellings both sides must agree on — names, enum values, op
// function names, numbers. Not a public API.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "base/host_tensor.h"
#include "engine/ir/graph.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace kiln::ir::text_internal {

// ---- Names -----------------------------------------------------------------

// [A-Za-z_][A-Za-z0-9_.]*
bool IsIdentifier(std::string_view s);
// Words the grammar gives a meaning (statement keywords, literals); a node or
// symbol with such a name prints quoted.
bool IsReservedWord(std::string_view s);
// `s` bare when it is a non-reserved identifier, else as a quoted C string.
std::string QuoteName(std::string_view s);
std::string QuoteString(std::string_view s);  // always quoted, C escapes

// ---- Enums and op functions ---------------------------------------------------

// Lower-case value name without the enum's common prefix ("causal" for
// MASK_CAUSAL); DType values by dtype name ("f16"); unknown numbers as digits.
std::string EnumValueText(const google::protobuf::EnumDescriptor* e, int number);
// Inverse of EnumValueText for names (numbers are parsed by the caller).
std::optional<int> ParseEnumValueText(const google::protobuf::EnumDescriptor* e,
                                      std::string_view text);

// The attribute message field (in kiln.v1.Attrs) of `op`, or null.
const google::protobuf::FieldDescriptor* AttrsField(OpKind op);
// The `kind` field of a family op's attribute message (unary, binary, compare,
// reduce, pool), or null for other ops.
const google::protobuf::FieldDescriptor* FamilyKindField(OpKind op);

// A call's function name resolved: the op, and for family spellings ("relu",
// "reduce_sum", "max_pool") the kind value they imply (0 = none implied).
struct OpFunction {
  OpKind op = v1::OP_KIND_UNSPECIFIED;
  int kind = 0;
};
// Every op but the sources (declared with input/param/const).
std::optional<OpFunction> LookupFunction(std::string_view name);
// The spelling the printer uses for a node: the family name when the kind is
// a known value, else the op name.
std::string FunctionName(OpKind op, const v1::Attrs& attrs);

// ---- Numbers -----------------------------------------------------------------

// Shortest text that reads back to exactly `v` ("0.1", "1e-05", "inf", "nan").
std::string FormatDouble(double v);
std::string FormatFloat(float v);

// ---- Tokens ------------------------------------------------------------------

enum class Tok {
  kEnd,
  kIdent,   // identifier or keyword
  kString,  // "..." (text holds the unescaped bytes)
  kBytes,   // hex"..." (text holds the decoded bytes)
  kInt,     // digits (sign is a separate `-` token)
  kFloat,   // digits with `.` or an exponent
  kLocal,   // %<digits> (text holds the digits)
  kPunct,   // one of ( ) [ ] { } , = : @ + - * / ? < > <= >= == !=
};

struct Token {
  Tok kind = Tok::kEnd;
  std::string text;
  char punct = 0;  // single-character punctuation; 0 for two-character operators
  // `name#k`, `%id#k`, `"name"#k`: output k of the value; -1 when absent.
  int output = -1;
  int line = 1;
  int col = 1;
};

// Splits `text` into tokens, dropping whitespace and `#` comments; the last
// token is kEnd. Fails on an unknown character, an unterminated string or a
// bad hex literal, with `line:col`.
absl::StatusOr<std::vector<Token>> Tokenize(std::string_view text);
// "`let`", "string \"a\"", "end of input": for "expected X, got Y".
std::string DescribeToken(const Token& t);

// ---- Parsing -----------------------------------------------------------------

// "line:col: msg" errors; `AtToken` puts the position in front of `status`.
absl::Status ErrorAt(const Token& t, const std::string& msg,
                     absl::StatusCode code = absl::StatusCode::kInvalidArgument);
absl::Status Expected(const Token& t, const std::string& what);  // "expected X, got Y"
absl::Status AtToken(const Token& t, const absl::Status& status);

bool IsPunct(const Token& t, char c);
bool IsKeyword(const Token& t, std::string_view word);  // an identifier without `#k`

// Brackets, calls, messages and subgraphs nest at most this deep: a bound on
// the parser's recursion for hostile input.
inline constexpr int kMaxNesting = 256;

// A position in a token list (which it does not own and which must end in
// kEnd), shared by the parser of a graph and those of its subgraphs.
class Cursor {
 public:
  explicit Cursor(const std::vector<Token>& toks) : toks_(toks) {}
  Cursor(const Cursor&) = delete;
  Cursor& operator=(const Cursor&) = delete;

  const Token& Peek(size_t ahead = 0) const;  // stays on kEnd past the end
  const Token& Next();
  size_t pos() const { return pos_; }
  size_t remaining() const { return pos_ < toks_.size() ? toks_.size() - pos_ : 0; }
  bool AtPunct(char c) const { return IsPunct(Peek(), c); }
  absl::Status Expect(char c);
  // Enters one nesting level (failing past kMaxNesting); Leave() exits it.
  absl::Status Enter(const Token& at);
  void Leave() { --depth_; }

 private:
  const std::vector<Token>& toks_;
  size_t pos_ = 0;
  int depth_ = 0;
};

bool ParseInt64(const std::string& text, int64_t* out);
// `-`? (int | float | inf | nan); the token's text carries the sign.
absl::StatusOr<Token> ParseSignedNumber(Cursor& cur, const std::string& what);
// Element i of `t` from literal text (signed number, inf, nan, true, false),
// exactly: floats at their own precision, integers range-checked.
absl::Status StoreElement(HostTensor& t, int64_t i, const Token& at, const std::string& text);
// A constant's value for `type` (concrete): `[v, ...]`, a bare scalar, or
// hex"..." bytes. More than `max_elements` elements is RESOURCE_EXHAUSTED.
absl::StatusOr<HostTensor> ParseConstantValue(Cursor& cur, const TensorType& type,
                                              int64_t max_elements);
// Parses `graph "name" { ... }` at the cursor into the wire graph.
using SubgraphParser = std::function<absl::Status(v1::Graph*)>;
// The value of attribute `field` of `msg` (a list for a repeated field).
absl::Status ParseAttribute(Cursor& cur, google::protobuf::Message* msg,
                            const google::protobuf::FieldDescriptor* field,
                            const SubgraphParser& subgraph);

}  // namespace kiln::ir::text_internal
