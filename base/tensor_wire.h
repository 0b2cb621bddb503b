// Tensor bytes on the wire without an intermediate protobuf string (issue 12
// item 2; docs/server.md, "Tensor bytes on the wire").
//
// A generated protobuf parser copies every `bytes` field into a std::string
// and the serializer copies it back out; for a 4 MiB tensor those are two
// passes over memory on each side, plus a third wherever the string's
// 16-byte alignment is not what a device wants. These helpers handle the
// `kiln.v1.NamedTensor` fields of a message by hand, with protobuf's own wire
// format (google::protobuf::io / WireFormatLite), and leave everything else
// to the generated code:
//
//  - SplitTensorData reads a serialized message and moves the `tensor.data`
//    of each NamedTensor in the chosen fields straight from the input
//    stream's chunks into memory the caller provides (one copy); the rest of
//    the message comes back as bytes for the generated parser.
//  - WirePieces / AppendNamedTensor write a message as an ordered list of
//    byte runs it owns and ranges of tensor data it only refers to, byte for
//    byte what protobuf's serializer produces for the same message.
//
// Pure functions and value types; thread-compatible.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "base/host_tensor.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "kiln/v1/tensor.pb.h"

namespace kiln {

// Where SplitTensorData puts one tensor's data. `head` holds the Tensor's
// fields read before its data (dtype and dims, in protobuf's canonical
// order); `bytes` is the data's length. Returns memory for exactly `bytes`
// bytes that stays valid until the caller is done with it, or an error
// (which fails the parse).
using TensorDataSink = std::function<absl::StatusOr<char*>(
    int field, int index, const v1::Tensor& head, int64_t bytes)>;

// One tensor's data that SplitTensorData moved out of the message.
struct SplitData {
  int field = 0;       // the message's field number (e.g. RunRequest.inputs = 4)
  int index = 0;       // which element of that repeated field
  char* data = nullptr;  // from the sink
  int64_t bytes = 0;
};

// Reads one serialized message of `total_bytes` from `in`. For each
// NamedTensor (length-delimited) in one of `fields` whose encoding is at
// least `min_bytes` long, the data of its `tensor` goes into the memory
// `sink` returns, and the NamedTensor stays in the rest of the message with
// empty data; `moved` lists what moved. Returns the rest of the message:
// parsing it with protobuf gives the message with those data fields empty.
// A data field given twice in one NamedTensor keeps the last, as protobuf
// does. INVALID_ARGUMENT when the bytes are not a well-formed message (a
// length past the end of the message, a bad tag or wire type).
absl::StatusOr<std::string> SplitTensorData(google::protobuf::io::ZeroCopyInputStream& in,
                                            int64_t total_bytes, std::span<const int> fields,
                                            int64_t min_bytes, const TensorDataSink& sink,
                                            std::vector<SplitData>* moved);

// A serialized message as an ordered list of pieces: runs of bytes it owns,
// and ranges of tensor data it refers to (the builder keeps those alive for
// as long as the pieces are used). Move-only value type.
class WirePieces {
 public:
  struct Piece {
    std::string owned;         // when `data` is null
    const char* data = nullptr;  // a referenced range of `size` bytes
    size_t size = 0;
  };

  WirePieces() = default;
  WirePieces(WirePieces&&) = default;
  WirePieces& operator=(WirePieces&&) = default;
  WirePieces(const WirePieces&) = delete;
  WirePieces& operator=(const WirePieces&) = delete;

  // Appends a copy of `bytes` (joined to the owned run before it).
  void Append(std::string_view bytes);
  // Appends a reference to `size` bytes at `data`.
  void Reference(const void* data, size_t size);

  const std::vector<Piece>& pieces() const { return pieces_; }
  // Total bytes of the message.
  uint64_t size() const { return size_; }
  // Bytes in referenced pieces.
  uint64_t referenced_bytes() const { return referenced_bytes_; }
  // The whole message in one string (a copy; for tests and small messages).
  std::string Flatten() const;

 private:
  std::vector<Piece> pieces_;
  uint64_t size_ = 0;
  uint64_t referenced_bytes_ = 0;
};

// Appends field `field` of a message, holding the NamedTensor {name,
// Tensor{dtype, dims, data}}, exactly as protobuf serializes it. The data is
// referenced (not copied) when it is at least `min_reference_bytes` long;
// then `data` must stay valid while `out` is used. Returns whether it was
// referenced.
bool AppendNamedTensor(int field, std::string_view name, DType dtype,
                       std::span<const int64_t> dims, const void* data, int64_t bytes,
                       int64_t min_reference_bytes, WirePieces& out);

}  // namespace kiln
