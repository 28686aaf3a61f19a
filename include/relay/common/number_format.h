#pragma once

// Numbers for people: progress lines print rates that range from a fraction
// of a sample per second (a large model on a CPU) to thousands, and a fixed
// "%.0f" showed 0.3 samples/s as "0".

#include <string>

namespace relay {

// `value` rounded to `digits` significant digits (>= 1), in fixed notation:
// 0.31249 -> "0.312", 4.7149 -> "4.71", 0.3 -> "0.300". Integers with more
// digits than that keep them all (1690.4 -> "1690", not "1.69e+03"); below
// 1e-3 it is scientific ("1.23e-05") rather than a row of zeros. 0 is "0",
// and NaN and infinities are "nan", "inf", "-inf".
std::string format_significant(double value, int digits = 3);

}  // namespace relay
