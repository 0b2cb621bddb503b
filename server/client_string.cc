#include "server/client_string.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kiln::server {

std::string EscapeClientBytes(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      default:
        break;
    }
    if (c < 0x20 || c >= 0x7f) {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    } else {
      out.push_back(ch);
    }
  }
  return out;
}

std::string QuoteClientString(std::string_view s, size_t max_bytes) {
  const std::string_view kept = s.substr(0, std::min(s.size(), max_bytes));
  std::string out = absl::StrCat("\"", EscapeClientBytes(kept));
  if (kept.size() < s.size()) {
    absl::StrAppend(&out, "...\"(+", s.size() - kept.size(), " bytes)");
  } else {
    out.push_back('"');
  }
  return out;
}

}  // namespace kiln::server
