// Client-supplied strings in kilnd's logs and status messages (issue 11 item 8:
// a name with a newline forged a log line, a 1 MiB id came back whole).
//
// Pure functions; thread-safe. Kept apart from server/limits.h so that code
// which needs only these (tenants.cc) does not pull in the engine.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kiln::server {

// A client-supplied string (a name, an id, a certificate subject) as it may
// appear in a log line or a status message: in double quotes, with control
// bytes, quotes, backslashes and non-ASCII bytes C-escaped (a newline cannot
// start a forged log line, a NUL cannot land raw), and cut after its first
// `max_bytes` bytes with the length of the rest noted: "abc..."(+1048573 bytes).
std::string QuoteClientString(std::string_view s, size_t max_bytes = 64);

// `s` with every byte outside printable ASCII, and `"` and `\`, escaped
// (`\n`, `\t`, `\r`, `\"`, `\\`, else `\xNN`): safe inside one double-quoted
// field of one log line.
std::string EscapeClientBytes(std::string_view s);

}  // namespace kiln::server
