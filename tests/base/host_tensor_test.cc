// HostTensor::SetFromDouble: out-of-range doubles into integer dtypes are
// defined (a plain cast is undefined behaviour; UBSan found one in the npy test).
#include "base/host_tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace kiln {
namespace {

TEST(HostTensor, SetFromDoubleWrapsIntegers) {
  auto u8 = HostTensor::Create(v1::DTYPE_U8, {4});
  ASSERT_TRUE(u8.ok());
  u8->SetFromDouble(0, -2);
  u8->SetFromDouble(1, 300);
  u8->SetFromDouble(2, std::nan(""));
  u8->SetFromDouble(3, 7.9);
  EXPECT_EQ(u8->data_as<uint8_t>()[0], 254);
  EXPECT_EQ(u8->data_as<uint8_t>()[1], 44);
  EXPECT_EQ(u8->data_as<uint8_t>()[2], 0);
  EXPECT_EQ(u8->data_as<uint8_t>()[3], 7);

  auto i64 = HostTensor::Create(v1::DTYPE_I64, {3});
  ASSERT_TRUE(i64.ok());
  i64->SetFromDouble(0, 1e300);
  i64->SetFromDouble(1, -1e300);
  i64->SetFromDouble(2, std::ldexp(1.0, 63));  // INT64_MAX + 1 exactly
  EXPECT_EQ(i64->data_as<int64_t>()[0], std::numeric_limits<int64_t>::max());
  EXPECT_EQ(i64->data_as<int64_t>()[1], std::numeric_limits<int64_t>::min());
  EXPECT_EQ(i64->data_as<int64_t>()[2], std::numeric_limits<int64_t>::max());

  auto i8 = HostTensor::Create(v1::DTYPE_I8, {1});
  ASSERT_TRUE(i8.ok());
  i8->SetFromDouble(0, -129);
  EXPECT_EQ(i8->data_as<int8_t>()[0], 127);
}

}  // namespace
}  // namespace kiln
