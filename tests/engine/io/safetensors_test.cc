#include "engine/io/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln::io {
namespace {

using ::testing::HasSubstr;

// A file as the format describes it, header text given verbatim.
std::string Raw(std::string_view header, std::string_view data) {
  std::string out;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += header;
  out += data;
  return out;
}

absl::Status Parse(std::string bytes) { return SafetensorsFile::FromBytes(std::move(bytes)).status(); }

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/safetensors_test_" + std::to_string(::getpid()) + "_" + name;
}

TEST(Safetensors, RoundTripsEveryDtypeWithMetadata) {
  HostTensor f32 = HostTensor::FromVector<float>(v1::DTYPE_F32, {2, 3}, {1, 2, 3, 4, 5, 6});
  HostTensor i64 = HostTensor::FromVector<int64_t>(v1::DTYPE_I64, {3}, {-1, 0, int64_t{1} << 40});
  HostTensor scalar = HostTensor::FromVector<double>(v1::DTYPE_F64, {}, {3.5});
  HostTensor empty = *HostTensor::Create(v1::DTYPE_F16, {0, 4});
  HostTensor u8 = HostTensor::FromVector<uint8_t>(v1::DTYPE_U8, {5}, {1, 2, 3, 4, 5});
  const std::vector<SafetensorsItem> items = {
      {"w.f32", &f32}, {"a.i64", &i64}, {"s", &scalar}, {"e", &empty}, {"odd", &u8}};
  const std::map<std::string, std::string> meta = {{"step", "20"}, {"format", "kiln"}};
  const std::string path = TempPath("roundtrip.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, items, meta).ok());

  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata(), meta);
  ASSERT_EQ(file->tensors().size(), 5u);
  EXPECT_EQ(file->tensors()[0].name, "a.i64");  // name order
  for (const auto& [name, tensor] : items) {
    absl::StatusOr<HostTensor> back = file->Read(name);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->dtype(), tensor->dtype()) << name;
    EXPECT_EQ(back->dims(), tensor->dims()) << name;
    EXPECT_EQ(back->bytes(), tensor->bytes()) << name;
  }
  EXPECT_EQ(file->Read("missing").status().code(), absl::StatusCode::kNotFound);

  // Deterministic, and the data buffer starts 8-aligned.
  absl::StatusOr<std::string> a = SerializeSafetensors(items, meta);
  std::vector<SafetensorsItem> reversed(items.rbegin(), items.rend());
  absl::StatusOr<std::string> b = SerializeSafetensors(reversed, meta);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  uint64_t header_len = 0;
  std::memcpy(&header_len, a->data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
  ::unlink(path.c_str());
}

TEST(Safetensors, ReadsAFileWrittenByTheReferenceLayout) {
  // The layout of the format's own example, written by hand: two tensors, a
  // trailing-space-padded header, and metadata.
  const std::string header =
      R"({"__metadata__":{"k":"v"},"b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},)"
      R"("a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}   )";
  std::string data(12, '\0');
  const int32_t ints[2] = {7, -9};
  std::memcpy(data.data(), ints, 8);
  data[8] = '\x80';
  data[9] = '\x3f';  // bf16 1.0
  data[10] = '\x00';
  data[11] = '\xc0';  // bf16 -2.0
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::FromBytes(Raw(header, data));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->metadata().at("k"), "v");
  absl::StatusOr<HostTensor> a = f->Read("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->GetAsDouble(1), -9);
  absl::StatusOr<HostTensor> b = f->Read("b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->GetAsDouble(0), 1.0);
  EXPECT_EQ(b->GetAsDouble(1), -2.0);
}

struct Hostile {
  const char* name;
  std::string bytes;
  const char* message;
  absl::StatusCode code = absl::StatusCode::kInvalidArgument;
};

std::string T(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return absl::StrCat(R"("dtype":")", dtype, R"(","shape":)", shape, R"(,"data_offsets":)", offsets);
}

TEST(Safetensors, RefusesHostileFilesWithAClearError) {
  std::string huge_len(8, '\0');
  huge_len[3] = 0x10;  // 256 MiB header
  std::string deep = R"({"x":[[[[1]]]]})";
  const std::vector<Hostile> cases = {
      {"short", "abc", "shorter than the 8-byte header length"},
      {"header_over_limit", huge_len + "{}", "over the limit", absl::StatusCode::kResourceExhausted},
      {"header_past_end", std::string("\x40\0\0\0\0\0\0\0{}", 10), "runs past the end of the file"},
      {"not_object", Raw("[1,2]", ""), "not a JSON object"},
      {"bad_json", Raw("{\"a\":", ""), "not valid JSON"},
      {"too_deep", Raw(deep, ""), "nests deeper"},
      {"duplicate", Raw(absl::StrCat(R"({"a":{)", T("U8", "[1]", "[0,1]"), R"(},"a":{)",
                                     T("U8", "[1]", "[1,2]"), "}}"), "xy"),
       "is given twice"},
      {"unknown_dtype", Raw(absl::StrCat(R"({"a":{)", T("F8_E4M3", "[1]", "[0,1]"), "}}"), "x"),
       "'F8_E4M3' is unknown"},
      {"negative_dim", Raw(absl::StrCat(R"({"a":{)", T("U8", "[-1]", "[0,1]"), "}}"), "x"),
       "shape[0] is negative"},
      {"float_dim", Raw(absl::StrCat(R"({"a":{)", T("U8", "[1.5]", "[0,1]"), "}}"), "x"),
       "shape[0] is not an integer"},
      {"overflow", Raw(absl::StrCat(R"({"a":{)", T("F64", "[4294967296,4294967296]", "[0,1]"), "}}"), "x"),
       "overflows int64"},
      {"size_mismatch", Raw(absl::StrCat(R"({"a":{)", T("F32", "[2]", "[0,4]"), "}}"), "abcd"),
       "needs 8"},
      {"past_end", Raw(absl::StrCat(R"({"a":{)", T("U8", "[8]", "[0,8]"), "}}"), "abcd"),
       "runs past the data buffer"},
      {"end_before_begin", Raw(absl::StrCat(R"({"a":{)", T("U8", "[0]", "[3,1]"), "}}"), "abcd"),
       "is before begin"},
      {"overlap", Raw(absl::StrCat(R"({"a":{)", T("U8", "[3]", "[0,3]"), R"(},"b":{)",
                                   T("U8", "[2]", "[2,4]"), "}}"), "abcd"),
       "overlaps tensor 'a'"},
      {"gap", Raw(absl::StrCat(R"({"a":{)", T("U8", "[1]", "[0,1]"), R"(},"b":{)",
                               T("U8", "[1]", "[3,4]"), "}}"), "abcd"),
       "bytes 1..3 of the data buffer belong to no tensor"},
      {"trailing", Raw(absl::StrCat(R"({"a":{)", T("U8", "[1]", "[0,1]"), "}}"), "abcd"),
       "bytes 1..4 of the data buffer belong to no tensor"},
      {"metadata_not_string", Raw(R"({"__metadata__":{"k":1}})", ""), "is not a string"},
      {"missing_offsets", Raw(R"({"a":{"dtype":"U8","shape":[1]}})", "x"), "data_offsets is missing"},
      {"entry_not_object", Raw(R"({"a":3})", ""), "is not an object"},
      {"escaped_name", Raw(absl::StrCat(R"({"a\nERROR forged":{)", T("Q4", "[1]", "[0,1]"), "}}"), "x"),
       "'a\\nERROR forged'"},
  };
  for (const Hostile& c : cases) {
    const absl::Status s = Parse(c.bytes);
    EXPECT_EQ(s.code(), c.code) << c.name << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.name;
    EXPECT_EQ(std::string(s.message()).find('\n'), std::string::npos) << c.name;
  }
}

TEST(Safetensors, RefusesWhatIsNotARegularFile) {
  const std::string fifo = TempPath("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(fifo);  // must not block
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("is not a regular file"));
  ::unlink(fifo.c_str());
  EXPECT_THAT(std::string(SafetensorsFile::Open(::testing::TempDir()).status().message()),
              HasSubstr("is not a regular file"));
  EXPECT_EQ(SafetensorsFile::Open(TempPath("absent")).status().code(), absl::StatusCode::kNotFound);
}

TEST(Safetensors, WriterRefusesWhatTheFormatCannotHold) {
  HostTensor q = *HostTensor::Create(v1::DTYPE_Q8_0, {32});
  HostTensor f = HostTensor::FromVector<float>(v1::DTYPE_F32, {1}, {1});
  std::vector<SafetensorsItem> quantized = {{"q", &q}};
  EXPECT_THAT(std::string(SerializeSafetensors(quantized, {}).status().message()),
              HasSubstr("has no safetensors type"));
  std::vector<SafetensorsItem> twice = {{"a", &f}, {"a", &f}};
  EXPECT_THAT(std::string(SerializeSafetensors(twice, {}).status().message()), HasSubstr("twice"));
  std::vector<SafetensorsItem> bad_utf8 = {{"\xff\xfe", &f}};
  EXPECT_THAT(std::string(SerializeSafetensors(bad_utf8, {}).status().message()),
              HasSubstr("cannot write the header"));
  EXPECT_FALSE(WriteSafetensors("/nonexistent-dir/x.safetensors", twice, {}).ok());
}

}  // namespace
}  // namespace kiln::io
