#include "daemon/server/log_limiter.h"

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace shmtensor::daemon {
namespace {

TEST(LogLimiterTest, AllowsAFewLinesASecondAndCountsTheRest) {
  LogLimiter limiter(3);
  uint64_t suppressed = 99;
  int allowed = 0;
  for (int i = 0; i < 100000; ++i) {
    if (limiter.Allow(&suppressed)) ++allowed;
  }
  // Three per window; a slow machine may have crossed one window boundary.
  EXPECT_GE(allowed, 3);
  EXPECT_LE(allowed, 6);
  absl::SleepFor(absl::Milliseconds(1100));
  ASSERT_TRUE(limiter.Allow(&suppressed));
  EXPECT_EQ(suppressed, 100000u - allowed);
}

}  // namespace
}  // namespace shmtensor::daemon
