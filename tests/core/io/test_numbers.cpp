// Metadata numbers: the whole text, within bounds, or nothing.
#include <gtest/gtest.h>

#include "io/numbers.h"

using namespace latent;

TEST(BoundedNumbers, IntegersAreWholeAndWithinBounds) {
  EXPECT_EQ(bounded_integer("16", 1, 100), 16);
  EXPECT_EQ(bounded_integer("-3", -5, 5), -3);
  EXPECT_EQ(bounded_integer("1", 1, 1), 1);
  for (const char* bad :
       {"", " 16", "16 ", "16x", "four", "+16", "1.5", "0", "101", "1000000000000", "99999999999999999999999"})
    EXPECT_FALSE(bounded_integer(bad, 1, 100)) << bad;
}

TEST(BoundedNumbers, NumbersAreWholeFiniteAndWithinBounds) {
  EXPECT_DOUBLE_EQ(*bounded_number("3.0", 1e-3, 1e3), 3.0);
  EXPECT_DOUBLE_EQ(*bounded_number("5", 1e-3, 1e3), 5.0);
  EXPECT_DOUBLE_EQ(*bounded_number("2.5e1", 0, 100), 25.0);
  for (const char* bad : {"", "nan", "inf", "-inf", " 3", "3 ", "3,0", "0", "1e400", "1001"})
    EXPECT_FALSE(bounded_number(bad, 1e-3, 1e3)) << bad;
}
