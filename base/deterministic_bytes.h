// A protobuf message's bytes in deterministic serialization (map entries in
// key order): the one helper for every key or identity computed over a
// message (executable keys, CSE keys, checkpoint graph identities).
// Deterministic for one build of protobuf, not canonical across versions: keys
// made from it carry the compiler's version beside them.
//
// Thread safety: thread-safe (reads `message` only).
#pragma once

#include <google/protobuf/message_lite.h>

#include <string>

namespace kiln {

std::string DeterministicBytes(const google::protobuf::MessageLite& message);

}  // namespace kiln
