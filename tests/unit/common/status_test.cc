#include "relay/common/status.h"

#include <gtest/gtest.h>

namespace relay {
namespace {

StatusOr<int> parse_positive(int x) {
  if (x <= 0) return InvalidArgumentError(absl::StrCat("x: must be > 0, got ", x));
  return x;
}

StatusOr<int> twice(int x) {
  RELAY_ASSIGN_OR_RETURN(int v, parse_positive(x));
  return 2 * v;
}

Status check_both(int a, int b) {
  RELAY_RETURN_IF_ERROR(parse_positive(a).status());
  RELAY_RETURN_IF_ERROR(parse_positive(b).status());
  return OkStatus();
}

TEST(StatusTest, AssignOrReturnPropagatesValueAndError) {
  ASSERT_TRUE(twice(3).ok());
  EXPECT_EQ(*twice(3), 6);
  StatusOr<int> bad = twice(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "x: must be > 0, got -1");
}

TEST(StatusTest, ReturnIfErrorStopsAtFirstError) {
  EXPECT_TRUE(check_both(1, 2).ok());
  Status s = check_both(1, -5);
  EXPECT_EQ(s.message(), "x: must be > 0, got -5");
}

TEST(StatusTest, CodesAreGrpcCanonicalCodes) {
  // Handlers convert with a static_cast; these values are gRPC's.
  EXPECT_EQ(static_cast<int>(absl::StatusCode::kInvalidArgument), 3);
  EXPECT_EQ(static_cast<int>(absl::StatusCode::kNotFound), 5);
  EXPECT_EQ(static_cast<int>(absl::StatusCode::kFailedPrecondition), 9);
}

TEST(StatusDeathTest, CheckAbortsWithMessage) {
  EXPECT_DEATH(RELAY_CHECK(1 + 1 == 3, "arithmetic broke"), "arithmetic broke");
}

}  // namespace
}  // namespace relay
