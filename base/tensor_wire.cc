#include "base/tensor_wire.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"

namespace kiln {
namespace {

using google::protobuf::internal::WireFormatLite;
namespace io = google::protobuf::io;

// NamedTensor.tensor and Tensor.data (proto/kiln/v1/tensor.proto).
constexpr int kNamedTensorTensor = 2;
constexpr int kTensorData = 3;

void PutVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

uint32_t LengthDelimitedTag(int field) {
  return WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
}

absl::Status Malformed(const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("the message is not well-formed protobuf: ", what));
}

// Copies one field (its tag already read) from `in` to the end of `out`.
bool CopyField(io::CodedInputStream& in, uint32_t tag, std::string& out) {
  std::string field;
  {
    io::StringOutputStream stream(&field);
    io::CodedOutputStream coded(&stream);
    if (!WireFormatLite::SkipField(&in, tag, &coded)) return false;
  }
  out += field;
  return true;
}

// Reads a length prefix that must fit in what is left of the enclosing limit.
absl::StatusOr<int> ReadLength(io::CodedInputStream& in, const std::string& what) {
  uint32_t len = 0;
  if (!in.ReadVarint32(&len)) return Malformed(absl::StrCat("truncated length of ", what));
  const int left = in.BytesUntilLimit();
  if (len > static_cast<uint32_t>(INT_MAX) || (left >= 0 && static_cast<int>(len) > left)) {
    return Malformed(absl::StrCat(what, " claims ", len, " bytes, past the end of the message"));
  }
  return static_cast<int>(len);
}

// The fields of one Tensor (its limit pushed) into `rest`, the data into
// the sink's memory.
absl::Status SplitTensor(io::CodedInputStream& in, int field, int index,
                         const TensorDataSink& sink, std::string& rest, SplitData& moved) {
  while (true) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) {
      if (!in.ConsumedEntireMessage()) return Malformed("a bad tag inside a tensor");
      return absl::OkStatus();
    }
    if (tag != LengthDelimitedTag(kTensorData)) {
      if (!CopyField(in, tag, rest)) return Malformed("a bad field inside a tensor");
      continue;
    }
    absl::StatusOr<int> len = ReadLength(in, "a tensor's data");
    if (!len.ok()) return len.status();
    v1::Tensor head;
    if (!head.ParseFromString(rest)) return Malformed("a bad field inside a tensor");
    absl::StatusOr<char*> dst = sink(field, index, head, *len);
    if (!dst.ok()) return dst.status();
    if (*len > 0 && !in.ReadRaw(*dst, *len)) return Malformed("a tensor's data is cut short");
    moved = SplitData{field, index, *dst, *len};
  }
}

// One NamedTensor (its limit pushed) into `rest`.
absl::Status SplitNamedTensor(io::CodedInputStream& in, int field, int index,
                              const TensorDataSink& sink, std::string& rest, SplitData& moved) {
  while (true) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) {
      if (!in.ConsumedEntireMessage()) return Malformed("a bad tag inside a named tensor");
      return absl::OkStatus();
    }
    if (tag != LengthDelimitedTag(kNamedTensorTensor)) {
      if (!CopyField(in, tag, rest)) return Malformed("a bad field inside a named tensor");
      continue;
    }
    absl::StatusOr<int> len = ReadLength(in, "a named tensor's tensor");
    if (!len.ok()) return len.status();
    const io::CodedInputStream::Limit limit = in.PushLimit(*len);
    std::string tensor;
    if (absl::Status s = SplitTensor(in, field, index, sink, tensor, moved); !s.ok()) return s;
    in.PopLimit(limit);
    PutVarint(rest, tag);
    PutVarint(rest, tensor.size());
    rest += tensor;
  }
}

}  // namespace

absl::StatusOr<std::string> SplitTensorData(io::ZeroCopyInputStream& stream, int64_t total_bytes,
                                            std::span<const int> fields, int64_t min_bytes,
                                            const TensorDataSink& sink,
                                            std::vector<SplitData>* moved) {
  if (total_bytes < 0 || total_bytes > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("a message of ", total_bytes, " bytes is past protobuf's 2 GiB limit"));
  }
  moved->clear();
  io::CodedInputStream in(&stream);
  in.SetTotalBytesLimit(INT_MAX);
  (void)in.PushLimit(static_cast<int>(total_bytes));
  std::vector<int> counts(fields.size(), 0);
  std::string rest;
  while (true) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) {
      if (!in.ConsumedEntireMessage()) return Malformed("a bad tag");
      break;
    }
    const int number = static_cast<int>(WireFormatLite::GetTagFieldNumber(tag));
    const auto which = std::find(fields.begin(), fields.end(), number);
    if (which == fields.end() ||
        WireFormatLite::GetTagWireType(tag) != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      if (!CopyField(in, tag, rest)) return Malformed(absl::StrCat("a bad field ", number));
      continue;
    }
    const int index = counts[which - fields.begin()]++;
    absl::StatusOr<int> len = ReadLength(in, absl::StrCat("field ", number));
    if (!len.ok()) return len.status();
    PutVarint(rest, tag);
    if (*len < min_bytes) {
      // Small: kept whole for the generated parser.
      std::string bytes;
      if (!in.ReadString(&bytes, *len)) return Malformed(absl::StrCat("field ", number, " is cut short"));
      PutVarint(rest, bytes.size());
      rest += bytes;
      continue;
    }
    const io::CodedInputStream::Limit limit = in.PushLimit(*len);
    std::string named;
    SplitData data;
    if (absl::Status s = SplitNamedTensor(in, number, index, sink, named, data); !s.ok()) {
      return s;
    }
    in.PopLimit(limit);
    PutVarint(rest, named.size());
    rest += named;
    if (data.field != 0) moved->push_back(data);
  }
  return rest;
}

void WirePieces::Append(std::string_view bytes) {
  if (bytes.empty()) return;
  if (pieces_.empty() || pieces_.back().data != nullptr) pieces_.emplace_back();
  pieces_.back().owned.append(bytes);
  size_ += bytes.size();
}

void WirePieces::Reference(const void* data, size_t size) {
  if (size == 0) return;
  Piece p;
  p.data = static_cast<const char*>(data);
  p.size = size;
  pieces_.push_back(std::move(p));
  size_ += size;
  referenced_bytes_ += size;
}

std::string WirePieces::Flatten() const {
  std::string s;
  s.reserve(size_);
  for (const Piece& p : pieces_) {
    if (p.data != nullptr) {
      s.append(p.data, p.size);
    } else {
      s += p.owned;
    }
  }
  return s;
}

bool AppendNamedTensor(int field, std::string_view name, DType dtype,
                       std::span<const int64_t> dims, const void* data, int64_t bytes,
                       int64_t min_reference_bytes, WirePieces& out) {
  // protobuf writes fields in number order and leaves out proto3 defaults:
  // the Tensor's dtype and dims are its own encoding of them.
  v1::Tensor head_proto;
  head_proto.set_dtype(dtype);
  for (int64_t d : dims) head_proto.add_dims(d);
  const std::string head = head_proto.SerializeAsString();
  const uint64_t data_bytes = bytes > 0 ? static_cast<uint64_t>(bytes) : 0;
  const uint64_t tensor_bytes =
      head.size() + (data_bytes > 0 ? VarintSize(LengthDelimitedTag(kTensorData)) +
                                          VarintSize(data_bytes) + data_bytes
                                    : 0);
  std::string named;
  if (!name.empty()) {
    PutVarint(named, LengthDelimitedTag(1));
    PutVarint(named, name.size());
    named.append(name);
  }
  PutVarint(named, LengthDelimitedTag(kNamedTensorTensor));
  PutVarint(named, tensor_bytes);
  std::string prefix;
  PutVarint(prefix, LengthDelimitedTag(field));
  PutVarint(prefix, named.size() + tensor_bytes);
  prefix += named;
  prefix += head;
  if (data_bytes == 0) {
    out.Append(prefix);
    return false;
  }
  PutVarint(prefix, LengthDelimitedTag(kTensorData));
  PutVarint(prefix, data_bytes);
  out.Append(prefix);
  if (bytes >= min_reference_bytes) {
    out.Reference(data, data_bytes);
    return true;
  }
  out.Append(std::string_view(static_cast<const char*>(data), data_bytes));
  return false;
}

}  // namespace kiln
