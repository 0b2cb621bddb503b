// CheckedInt (base/checked_int.h): exact results where they fit, poisoned
// (and staying poisoned) where a step overflows.
#include "base/checked_int.h"

#include <gtest/gtest.h>

namespace kiln {
namespace {

// Constant evaluation: a compiler that evaluates an operator's arguments in
// another order than the implementation assumed fails to build this file.
static_assert((CheckedInt(6) * 7).get() == 42);
static_assert((CheckedInt(40) + 2).get() == 42);
static_assert((CheckedInt(50) - 8).get() == 42);
static_assert((CheckedInt(84) / 2).get() == 42);

TEST(CheckedInt, ExactResults) {
  // Runtime values, so the operators are not folded at compile time.
  volatile int64_t six = 6, seven = 7, big = int64_t{1} << 40;
  EXPECT_EQ((CheckedInt(six) * seven).value(), 42);
  EXPECT_EQ((CheckedInt(six) + seven).value(), 13);
  EXPECT_EQ((CheckedInt(six) - seven).value(), -1);
  EXPECT_EQ((CheckedInt(big) / six).value(), (int64_t{1} << 40) / 6);
  EXPECT_EQ((CheckedInt(8) * 8 * 1).value(), 64);  // the reshape of [8, 8]
}

TEST(CheckedInt, OverflowPoisonsTheWholeFormula) {
  volatile int64_t max = kInt64Max, two = 2, zero = 0;
  EXPECT_FALSE((CheckedInt(max) + 1).ok());
  EXPECT_FALSE((CheckedInt(-max) - two * 2).ok());
  EXPECT_FALSE((CheckedInt(max) * two).ok());
  EXPECT_FALSE((CheckedInt(max) / zero).ok());
  EXPECT_FALSE((CheckedInt(std::numeric_limits<int64_t>::min()) / -1).ok());
  const CheckedInt poisoned = CheckedInt(max) * two;
  EXPECT_FALSE((poisoned - max + 0).ok());
  EXPECT_FALSE((poisoned * zero).ok());
  EXPECT_EQ(poisoned.value(), std::nullopt);
}

}  // namespace
}  // namespace kiln
