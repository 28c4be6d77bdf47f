#include "daemon/store/release_log.h"

#include "gtest/gtest.h"

namespace shmtensor::daemon {
namespace {

TEST(ReleaseLogTest, AppliesTheNextSeqDue) {
  ReleaseLog log;
  EXPECT_EQ(log.applied(), 0u);
  EXPECT_TRUE(*log.Apply(1));
  EXPECT_TRUE(*log.Apply(2));
  EXPECT_EQ(log.applied(), 2u);
}

TEST(ReleaseLogTest, SkipsASeqAppliedAlready) {
  ReleaseLog log;
  ASSERT_TRUE(*log.Apply(1));
  ASSERT_TRUE(*log.Apply(2));
  absl::StatusOr<bool> again = log.Apply(1);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again);
  EXPECT_FALSE(*log.Apply(2));
  EXPECT_EQ(log.applied(), 2u);
}

TEST(ReleaseLogTest, SeqZeroIsNeverApplied) {
  ReleaseLog log;
  absl::StatusOr<bool> zero = log.Apply(0);
  ASSERT_TRUE(zero.ok());
  EXPECT_FALSE(*zero);
  EXPECT_EQ(log.applied(), 0u);
}

TEST(ReleaseLogTest, RefusesASeqPastTheNextDue) {
  ReleaseLog log;
  ASSERT_TRUE(*log.Apply(1));
  absl::StatusOr<bool> gap = log.Apply(3);
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gap.status().message(),
            "ReleaseLeases seq 3 out of order: expected 2");
  EXPECT_EQ(log.applied(), 1u);  // Nothing recorded.
  EXPECT_TRUE(*log.Apply(2));
}

TEST(ReleaseLogTest, ReachedOnceEverySeqThroughItIsApplied) {
  ReleaseLog log;
  EXPECT_TRUE(log.Reached(0));
  EXPECT_FALSE(log.Reached(1));
  ASSERT_TRUE(*log.Apply(1));
  EXPECT_TRUE(log.Reached(1));
  EXPECT_FALSE(log.Reached(2));
}

TEST(ReleaseLogTest, NotReachedErrorNamesBothSeqs) {
  ReleaseLog log;
  ASSERT_TRUE(*log.Apply(1));
  absl::Status s = log.NotReachedError(4);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(),
            "releases_through 4 not reached: session applied ReleaseLeases "
            "through 1 only");
}

}  // namespace
}  // namespace shmtensor::daemon
