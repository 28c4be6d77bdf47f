#include "client/range_set.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace shmtensor::internal {
namespace {

TEST(RangeSetTest, AddMergesOverlappingAndTouchingRanges) {
  RangeSet s;
  EXPECT_TRUE(s.Covers(5, 5));  // Empty range.
  EXPECT_FALSE(s.Covers(0, 1));
  s.Add(10, 20);
  s.Add(30, 40);
  EXPECT_EQ(s.intervals(), 2u);
  EXPECT_TRUE(s.Covers(10, 20));
  EXPECT_TRUE(s.Covers(12, 18));
  EXPECT_FALSE(s.Covers(9, 20));
  EXPECT_FALSE(s.Covers(10, 21));
  EXPECT_FALSE(s.Covers(15, 35));  // Spans the gap.
  s.Add(20, 30);                   // Touches both: one interval.
  EXPECT_EQ(s.intervals(), 1u);
  EXPECT_TRUE(s.Covers(10, 40));
  s.Add(0, 50);  // Swallows it.
  EXPECT_EQ(s.intervals(), 1u);
  EXPECT_EQ(s.bytes(), 50u);
  s.Add(7, 7);  // Empty: no-op.
  EXPECT_EQ(s.bytes(), 50u);
}

TEST(RangeSetTest, IntersectsAnyOverlapButNotATouch) {
  RangeSet s;
  EXPECT_FALSE(s.Intersects(0, 100));
  s.Add(10, 20);
  s.Add(30, 40);
  EXPECT_TRUE(s.Intersects(15, 16));   // Inside.
  EXPECT_TRUE(s.Intersects(0, 11));    // Overlaps the start.
  EXPECT_TRUE(s.Intersects(19, 25));   // Overlaps the end.
  EXPECT_TRUE(s.Intersects(5, 50));    // Spans both.
  EXPECT_FALSE(s.Intersects(20, 30));  // The gap, touching both.
  EXPECT_FALSE(s.Intersects(0, 10));   // Ends where one starts.
  EXPECT_FALSE(s.Intersects(40, 41));  // Starts where one ends.
  EXPECT_FALSE(s.Intersects(15, 15));  // Empty.
}

TEST(RangeSetTest, RemoveSplitsAndTrims) {
  RangeSet s;
  s.Add(0, 100);
  s.Remove(40, 60);  // Splits.
  EXPECT_EQ(s.intervals(), 2u);
  EXPECT_TRUE(s.Covers(0, 40));
  EXPECT_TRUE(s.Covers(60, 100));
  EXPECT_FALSE(s.Covers(39, 41));
  EXPECT_FALSE(s.Covers(40, 60));
  s.Remove(30, 70);  // Trims both sides.
  EXPECT_TRUE(s.Covers(0, 30));
  EXPECT_FALSE(s.Covers(0, 31));
  EXPECT_TRUE(s.Covers(70, 100));
  EXPECT_FALSE(s.Covers(69, 100));
  s.Remove(200, 300);  // Nothing there.
  EXPECT_EQ(s.bytes(), 60u);
  s.Remove(0, 1000);
  EXPECT_EQ(s.intervals(), 0u);
  EXPECT_FALSE(s.Covers(0, 1));
}

// Random adds and removes against a bitmap model: Covers agrees on random
// ranges, and intervals stay disjoint and apart (the count matches the
// model's runs).
TEST(RangeSetTest, AgreesWithABitmapModel) {
  constexpr uint64_t kSize = 512;
  std::mt19937_64 rng(20261129);
  for (int round = 0; round < 20; ++round) {
    RangeSet s;
    std::vector<bool> model(kSize, false);
    for (int op = 0; op < 400; ++op) {
      uint64_t a = rng() % (kSize + 1);
      uint64_t b = rng() % (kSize + 1);
      if (a > b) std::swap(a, b);
      const bool add = rng() % 2 == 0;
      if (add) {
        s.Add(a, b);
      } else {
        s.Remove(a, b);
      }
      for (uint64_t i = a; i < b; ++i) model[i] = add;

      uint64_t c = rng() % (kSize + 1);
      uint64_t d = rng() % (kSize + 1);
      if (c > d) std::swap(c, d);
      bool covered = true;
      for (uint64_t i = c; i < d; ++i) covered = covered && model[i];
      ASSERT_EQ(s.Covers(c, d), covered) << "[" << c << ", " << d << ")";
      bool touched = false;
      for (uint64_t i = c; i < d; ++i) touched = touched || model[i];
      ASSERT_EQ(s.Intersects(c, d), touched) << "[" << c << ", " << d << ")";

      size_t runs = 0;
      uint64_t bytes = 0;
      for (uint64_t i = 0; i < kSize; ++i) {
        bytes += model[i];
        runs += model[i] && (i == 0 || !model[i - 1]);
      }
      ASSERT_EQ(s.intervals(), runs);
      ASSERT_EQ(s.bytes(), bytes);
    }
  }
}

}  // namespace
}  // namespace shmtensor::internal
