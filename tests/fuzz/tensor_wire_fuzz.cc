// The hand-read tensor data of a Run request (base/tensor_wire.h: kilnd's
// ParseRunRequest) on arbitrary bytes, against protobuf's own parser: never
// a crash, and whenever protobuf accepts the bytes as a RunRequest,
// SplitTensorData accepts them too and the rest plus the moved data is the
// very message protobuf parsed. The first two bytes choose the chunking of
// the input stream and the size from which data is moved.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <string>
#include <vector>

#include "base/tensor_wire.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/message_differencer.h"
#include "kiln/v1/service.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int chunk = 1 + data[0];
  const int64_t min_bytes = data[1] % 64;
  const std::string bytes(reinterpret_cast<const char*>(data) + 2, size - 2);
  kiln::v1::RunRequest reference;
  const bool protobuf_ok = reference.ParseFromString(bytes);

  std::deque<std::string> storage;
  std::vector<kiln::SplitData> moved;
  google::protobuf::io::ArrayInputStream in(bytes.data(), static_cast<int>(bytes.size()), chunk);
  constexpr int kFields[] = {4, 5};
  absl::StatusOr<std::string> rest = kiln::SplitTensorData(
      in, static_cast<int64_t>(bytes.size()), kFields, min_bytes,
      [&storage](int, int, const kiln::v1::Tensor&, int64_t n) -> absl::StatusOr<char*> {
        storage.emplace_back(static_cast<size_t>(n), '\0');
        return storage.back().data();
      },
      &moved);
  if (!protobuf_ok) return 0;
  kiln::v1::RunRequest got;
  if (!rest.ok() || !got.ParseFromString(*rest)) {
    std::fprintf(stderr, "protobuf parses the request, the split does not: %s\n",
                 rest.ok() ? "the rest does not parse" : rest.status().ToString().c_str());
    std::abort();
  }
  for (const kiln::SplitData& d : moved) {
    auto* field = d.field == 4 ? got.mutable_inputs() : got.mutable_params();
    if (d.index >= field->size()) {
      std::fprintf(stderr, "moved data of element %d of field %d, which has %d\n", d.index,
                   d.field, field->size());
      std::abort();
    }
    field->Mutable(d.index)->mutable_tensor()->set_data(d.data, static_cast<size_t>(d.bytes));
  }
  if (!google::protobuf::util::MessageDifferencer::Equals(got, reference)) {
    std::fprintf(stderr, "the split request differs from protobuf's:\n%s\nvs\n%s\n",
                 got.DebugString().c_str(), reference.DebugString().c_str());
    std::abort();
  }
  return 0;
}
