// .npy read/write: every dtype round-trips; headers NumPy writes (v1, v2,
// 0-d, empty, 1-tuple shapes) parse; Fortran order, big-endian, truncated and
// malformed files are refused with a message that says what to do.
#include "engine/io/npy.h"

#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

// A .npy file as NumPy would write it, with the given header dict.
std::string NpyBytes(const std::string& dict, const std::string& data, int major = 1) {
  std::string header = dict;
  const size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  const size_t len = header.size();
  for (size_t i = 0; i < (major == 1 ? 2u : 4u); ++i)
    out += static_cast<char>((len >> (8 * i)) & 0xff);
  return out + header + data;
}

TEST(NpyTest, EveryDTypeRoundTrips) {
  for (DType dt : {v1::DTYPE_F32, v1::DTYPE_F16, v1::DTYPE_BF16, v1::DTYPE_F64, v1::DTYPE_I8,
                   v1::DTYPE_U8, v1::DTYPE_I16, v1::DTYPE_I32, v1::DTYPE_I64, v1::DTYPE_BOOL}) {
    auto t = HostTensor::Create(dt, {2, 3});
    ASSERT_TRUE(t.ok());
    for (int64_t i = 0; i < 6; ++i) t->SetFromDouble(i, dt == v1::DTYPE_BOOL ? i % 2 : i - 2);
    auto bytes = SerializeNpy(*t);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    // NumPy's alignment: the data starts at a multiple of 64.
    EXPECT_EQ((bytes->size() - t->num_bytes()) % 64, 0u) << DTypeName(dt);
    auto back = ParseNpy(*bytes, "t.npy");
    ASSERT_TRUE(back.ok()) << DTypeName(dt) << ": " << back.status();
    EXPECT_EQ(back->dtype(), dt);
    EXPECT_EQ(back->dims(), (Dims{2, 3}));
    EXPECT_EQ(back->bytes(), t->bytes()) << DTypeName(dt);
  }
}

TEST(NpyTest, ShapesAsNumPyWritesThem) {
  const float one = 1.0f;
  const std::string f(reinterpret_cast<const char*>(&one), 4);
  auto scalar =
      ParseNpy(NpyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", f), "s");
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_TRUE(scalar->dims().empty());
  EXPECT_EQ(scalar->data_as<float>()[0], 1.0f);

  auto vec =
      ParseNpy(NpyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", f), "v");
  ASSERT_TRUE(vec.ok()) << vec.status();
  EXPECT_EQ(vec->dims(), (Dims{1}));

  auto empty =
      ParseNpy(NpyBytes("{'descr': '<i8', 'fortran_order': False, 'shape': (0, 5), }", ""), "e");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->dims(), (Dims{0, 5}));

  // Version 2 headers, keys in another order, '|' and '=' byte orders.
  auto v2 =
      ParseNpy(NpyBytes("{'shape': (1,), 'fortran_order': False, 'descr': '=f4'}", f, 2), "v2");
  ASSERT_TRUE(v2.ok()) << v2.status();
  auto u8 = ParseNpy(
      NpyBytes("{'descr': '|u1', 'fortran_order': False, 'shape': (2,), }", "\x01\x02"), "u");
  ASSERT_TRUE(u8.ok()) << u8.status();
  EXPECT_EQ(u8->dtype(), v1::DTYPE_U8);

  // A one-dim array may say Fortran order: its layout is the same.
  auto fvec =
      ParseNpy(NpyBytes("{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }", f), "fv");
  EXPECT_TRUE(fvec.ok()) << fvec.status();
}

TEST(NpyTest, RefusesWhatItCannotRead) {
  const std::string four(16, '\0');
  auto fortran = ParseNpy(
      NpyBytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", four), "f.npy");
  EXPECT_EQ(fortran.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(fortran.status().message()), HasSubstr("f.npy: Fortran-order"));
  EXPECT_THAT(std::string(fortran.status().message()), HasSubstr("ascontiguousarray"));

  auto big =
      ParseNpy(NpyBytes("{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }", four), "b");
  EXPECT_THAT(std::string(big.status().message()), HasSubstr("big-endian"));

  auto complex =
      ParseNpy(NpyBytes("{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", four), "c");
  EXPECT_THAT(std::string(complex.status().message()), HasSubstr("unsupported .npy dtype '<c8'"));

  auto structured = ParseNpy(
      NpyBytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (4,), }", four), "st");
  EXPECT_THAT(std::string(structured.status().message()), HasSubstr("structured"));

  auto truncated =
      ParseNpy(NpyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", four), "t");
  EXPECT_THAT(std::string(truncated.status().message()), HasSubstr("truncated data"));

  // A header may claim any shape: it is checked against the bytes present
  // before anything is allocated (the fuzzer's input claimed 2 PB; the reader
  // tried to allocate it).
  auto huge = ParseNpy(
      NpyBytes("{'descr': '<i2', 'fortran_order': False, 'shape': (1000000000000000, 1), }", four),
      "h");
  EXPECT_THAT(std::string(huge.status().message()),
              HasSubstr("truncated data: <i2[1000000000000000, 1] needs 2000000000000000 bytes"));
  auto overflowing = ParseNpy(
      NpyBytes("{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 2), }",
               four),
      "o");
  EXPECT_EQ(overflowing.status().code(), absl::StatusCode::kInvalidArgument);

  auto trailing =
      ParseNpy(NpyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", four), "t");
  EXPECT_THAT(std::string(trailing.status().message()), HasSubstr("trailing"));

  auto bad_bool =
      ParseNpy(NpyBytes("{'descr': '|b1', 'fortran_order': False, 'shape': (1,), }", "\x07"), "bb");
  EXPECT_THAT(std::string(bad_bool.status().message()), HasSubstr("not 0 or 1"));

  EXPECT_THAT(std::string(ParseNpy("PK\x03\x04 a zip", "z").status().message()),
              HasSubstr("bad magic"));
  EXPECT_FALSE(ParseNpy(NpyBytes("{'descr': '<f4', 'shape': (1,)}", four), "m").ok());
  EXPECT_FALSE(
      ParseNpy(NpyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", ""), "n")
          .ok());
  EXPECT_EQ(ReadNpy("/nonexistent/x.npy").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kiln
