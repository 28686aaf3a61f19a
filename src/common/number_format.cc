#include "relay/common/number_format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace relay {

std::string format_significant(double value, int digits) {
  digits = std::max(1, digits);
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0) return "0";
  char buf[64];
  const double magnitude = std::fabs(value);
  if (magnitude < 1e-3) {
    std::snprintf(buf, sizeof(buf), "%.*e", digits - 1, value);
    return buf;
  }
  // Decimals after the point for `digits` significant ones. Rounding can
  // carry into the next power of ten (9.996 -> "10.0"), which then needs one
  // decimal fewer.
  int exponent = static_cast<int>(std::floor(std::log10(magnitude)));
  const double scale = std::pow(10.0, digits - 1 - exponent);
  if (std::round(magnitude * scale) >= std::pow(10.0, digits)) ++exponent;
  const int decimals = std::max(0, digits - 1 - exponent);
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, value);
  return buf;
}

}  // namespace relay
