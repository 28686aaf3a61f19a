#include "relay/common/number_format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

namespace relay {
namespace {

struct Case {
  double value;
  int digits;
  std::string want;
};

TEST(NumberFormatTest, ThreeSignificantDigits) {
  const Case cases[] = {
      {0.3, 3, "0.300"},  // was "0" with "%.0f": the user report
      {0.31249, 3, "0.312"},
      {4.7149, 3, "4.71"},
      {12.345, 3, "12.3"},
      {151.4, 3, "151"},
      {1690.4, 3, "1690"},  // whole numbers keep their digits
      {123456.7, 3, "123457"},
      {0.0012345, 3, "0.00123"},
      {0.00099, 3, "9.90e-04"},  // below 1e-3: scientific, never 0.000
      {9.996, 3, "10.0"},        // rounding carries into the next decade
      {99.96, 3, "100"},
      {0.9996, 3, "1.00"},
      {-0.31249, 3, "-0.312"},
      {0.0, 3, "0"},
      {2.4, 1, "2"},
      {0.04567, 2, "0.046"},
      {0.5, 0, "0.5"},  // digits < 1 means 1
  };
  for (const Case& c : cases) {
    EXPECT_EQ(format_significant(c.value, c.digits), c.want) << c.value << " to " << c.digits;
  }
}

TEST(NumberFormatTest, NonFiniteValues) {
  EXPECT_EQ(format_significant(std::nan("")), "nan");
  EXPECT_EQ(format_significant(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(format_significant(-std::numeric_limits<double>::infinity()), "-inf");
}

TEST(NumberFormatTest, NeverZeroForAPositiveRate) {
  for (double v = 1e-6; v < 1e6; v *= 1.7) {
    const std::string s = format_significant(v);
    EXPECT_NE(std::stod(s), 0.0) << v << " printed as " << s;
    EXPECT_NEAR(std::stod(s), v, v * 5e-3) << v << " printed as " << s;
  }
}

}  // namespace
}  // namespace relay
