#include "daemon/memory/range_allocator.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace shmtensor::daemon {
namespace {

constexpr uint64_t kPage = 4096;

TEST(RangeAllocatorTest, AllocatesAlignedRangesUntilFull) {
  RangeAllocator a(16 * kPage, kPage);
  std::vector<uint64_t> got;
  for (int i = 0; i < 16; ++i) {
    std::optional<uint64_t> off = a.Allocate(kPage);
    ASSERT_TRUE(off.has_value());
    EXPECT_EQ(*off % kPage, 0u);
    got.push_back(*off);
  }
  EXPECT_FALSE(a.Allocate(kPage).has_value());
  EXPECT_EQ(a.free_bytes(), 0u);
  std::sort(got.begin(), got.end());
  for (int i = 0; i < 16; ++i) EXPECT_EQ(got[i], i * kPage);  // No overlap.
}

TEST(RangeAllocatorTest, FreeCoalescesNeighbours) {
  RangeAllocator a(8 * kPage, kPage);
  uint64_t x = *a.Allocate(2 * kPage);
  uint64_t y = *a.Allocate(2 * kPage);
  uint64_t z = *a.Allocate(4 * kPage);
  EXPECT_FALSE(a.Allocate(kPage).has_value());
  a.Free(x, 2 * kPage);
  a.Free(z, 4 * kPage);
  EXPECT_EQ(a.largest_free(), 4 * kPage);
  a.Free(y, 2 * kPage);  // Joins both sides.
  EXPECT_EQ(a.free_ranges(), 1u);
  EXPECT_EQ(a.largest_free(), 8 * kPage);
}

TEST(RangeAllocatorTest, BestFitKeepsLargeRangesWhole) {
  RangeAllocator a(10 * kPage, kPage);
  uint64_t small = *a.Allocate(kPage);
  uint64_t big = *a.Allocate(8 * kPage);
  *a.Allocate(kPage);
  a.Free(small, kPage);
  a.Free(big, 8 * kPage);
  // A one-page request takes the one-page hole, not a piece of the big one.
  EXPECT_EQ(*a.Allocate(kPage), small);
  EXPECT_EQ(a.largest_free(), 8 * kPage);
}

TEST(RangeAllocatorTest, AlignedAllocationKeepsBothRemaindersFree) {
  constexpr uint64_t kHuge = 16 * kPage;
  RangeAllocator a(4 * kHuge, kPage);
  const uint64_t small = *a.Allocate(kPage);  // Takes offset 0.
  ASSERT_EQ(small, 0u);
  const uint64_t big = *a.Allocate(2 * kHuge, kHuge);
  EXPECT_EQ(big, kHuge);  // Not at kPage: the next huge boundary.
  // The gap before it and the tail after it are still free and usable.
  EXPECT_EQ(a.free_bytes(), 4 * kHuge - kPage - 2 * kHuge);
  EXPECT_EQ(a.free_ranges(), 2u);
  EXPECT_EQ(*a.Allocate(kHuge - kPage), kPage);
  EXPECT_EQ(*a.Allocate(kHuge, kHuge), 3 * kHuge);
  EXPECT_FALSE(a.Allocate(kPage).has_value());
}

TEST(RangeAllocatorTest, AlignedAllocationSkipsRangesTooShortOnceAligned) {
  constexpr uint64_t kHuge = 16 * kPage;
  RangeAllocator a(4 * kHuge, kPage);
  ASSERT_EQ(*a.Allocate(kPage), 0u);
  // A free hole one huge page long that holds no aligned huge page, and a
  // longer free range after an allocated separator.
  const uint64_t hole = *a.Allocate(kHuge);
  ASSERT_EQ(hole, kPage);
  ASSERT_EQ(*a.Allocate(kHuge - kPage), kPage + kHuge);
  const uint64_t rest = *a.Allocate(2 * kHuge);
  ASSERT_EQ(rest, 2 * kHuge);
  a.Free(hole, kHuge);
  a.Free(rest, 2 * kHuge);
  // Best fit alone would pick the hole; alignment makes it take the next.
  EXPECT_EQ(*a.Allocate(kHuge, kHuge), 2 * kHuge);
  EXPECT_FALSE(a.Allocate(2 * kHuge, kHuge).has_value());
  EXPECT_EQ(*a.Allocate(kHuge, kHuge), 3 * kHuge);
  EXPECT_EQ(*a.Allocate(kHuge), hole);  // Unaligned requests still fit it.
}

TEST(RangeAllocatorTest, HighEndAllocationsPackDownFromTheTop) {
  constexpr uint64_t kHuge = 16 * kPage;
  RangeAllocator a(4 * kHuge, kPage);
  using End = RangeAllocator::End;
  EXPECT_EQ(*a.Allocate(kPage, 0, End::kHigh), 4 * kHuge - kPage);
  EXPECT_EQ(*a.Allocate(2 * kPage, 0, End::kHigh), 4 * kHuge - 3 * kPage);
  EXPECT_EQ(*a.Allocate(kHuge, kHuge, End::kLow), 0u);
  // Aligned from the high end: the highest aligned place that fits.
  EXPECT_EQ(*a.Allocate(kHuge, kHuge, End::kHigh), 2 * kHuge);
  EXPECT_EQ(a.free_bytes(), 4 * kHuge - 3 * kPage - 2 * kHuge);
  EXPECT_EQ(a.free_ranges(), 2u);  // [kHuge, 2 kHuge) and below the top.
}

TEST(RangeAllocatorTest, AllocateAtTakesAFreeRangeFromEitherEndOnly) {
  RangeAllocator a(16 * kPage, kPage);
  const uint64_t x = *a.Allocate(2 * kPage);       // [0, 2)
  const uint64_t y = *a.Allocate(2 * kPage);       // [2, 4)
  const uint64_t z = *a.Allocate(2 * kPage);       // [4, 6)
  ASSERT_TRUE(a.Allocate(2 * kPage).has_value());  // [6, 8); [8, 16) free.
  EXPECT_FALSE(a.AllocateAt(y, 2 * kPage));        // Not free.
  a.Free(x, 2 * kPage);
  a.Free(y, 2 * kPage);
  a.Free(z, 2 * kPage);  // [0, 6) free, one range.
  // Its middle would split it in two: refused, nothing changes.
  EXPECT_FALSE(a.CanAllocateAt(y, 2 * kPage));
  EXPECT_FALSE(a.AllocateAt(y, 2 * kPage));
  EXPECT_TRUE(a.CanAllocateAt(z, 2 * kPage));
  EXPECT_FALSE(a.CanAllocateAt(15 * kPage, 2 * kPage));
  EXPECT_EQ(a.free_bytes(), 14 * kPage);
  // Running past its end (into w) is refused too.
  EXPECT_FALSE(a.AllocateAt(z, 3 * kPage));
  // Its high end, then its low end: the same places as before.
  EXPECT_TRUE(a.AllocateAt(z, 2 * kPage));
  EXPECT_TRUE(a.AllocateAt(x, 2 * kPage));
  EXPECT_EQ(a.free_ranges(), 2u);  // [2, 4) and [8, 16).
  EXPECT_EQ(a.free_bytes(), 10 * kPage);
  EXPECT_TRUE(a.AllocateAt(y, 2 * kPage));  // Exactly a whole free range.
  EXPECT_FALSE(a.AllocateAt(15 * kPage, 2 * kPage));  // Past the pool.
  EXPECT_FALSE(a.AllocateAt(UINT64_MAX & ~(kPage - 1), kPage));
  EXPECT_EQ(a.free_ranges(), 1u);
  EXPECT_EQ(*a.Allocate(8 * kPage), 8 * kPage);
  EXPECT_EQ(a.free_bytes(), 0u);
}

TEST(RangeAllocatorTest, RoundUpToGranuleAndOverflow) {
  RangeAllocator a(1 << 20, kPage);
  EXPECT_EQ(*a.RoundUp(1), kPage);
  EXPECT_EQ(*a.RoundUp(kPage), kPage);
  EXPECT_EQ(*a.RoundUp(kPage + 1), 2 * kPage);
  EXPECT_FALSE(a.RoundUp(UINT64_MAX).has_value());
}

TEST(RangeAllocatorTest, RandomWorkloadKeepsAccounting) {
  RangeAllocator a(256 * kPage, kPage);
  std::mt19937 rng(7);
  std::vector<std::pair<uint64_t, uint64_t>> live;
  for (int i = 0; i < 5000; ++i) {
    if (!live.empty() && rng() % 4 == 0) {
      // Free one and ask for the same place back, as a session's next
      // Create of the same size does.
      const size_t k = rng() % live.size();
      const auto [o, l] = live[k];
      a.Free(o, l);
      live.erase(live.begin() + k);
      if (rng() % 2) {
        // CanAllocateAt foretells AllocateAt, and changes nothing.
        const uint64_t free_bytes = a.free_bytes();
        const bool can = a.CanAllocateAt(o, l);
        ASSERT_EQ(a.free_bytes(), free_bytes);
        const bool did = a.AllocateAt(o, l);
        ASSERT_EQ(can, did);
        if (did) live.emplace_back(o, l);
      }
    } else if (live.empty() || rng() % 2) {
      const uint64_t len = (1 + rng() % 8) * kPage;
      const uint64_t align = kPage << (rng() % 4);
      const auto end =
          rng() % 2 ? RangeAllocator::End::kLow : RangeAllocator::End::kHigh;
      if (auto off = a.Allocate(len, align, end)) {
        ASSERT_EQ(*off % align, 0u);
        for (auto& [o, l] : live) {
          ASSERT_TRUE(*off + len <= o || o + l <= *off) << "overlap";
        }
        live.emplace_back(*off, len);
      }
    } else {
      const size_t k = rng() % live.size();
      a.Free(live[k].first, live[k].second);
      live.erase(live.begin() + k);
    }
    uint64_t used = 0;
    for (auto& [o, l] : live) used += l;
    ASSERT_EQ(a.used_bytes(), used);
  }
  for (auto& [o, l] : live) a.Free(o, l);
  EXPECT_EQ(a.free_ranges(), 1u);
  EXPECT_EQ(a.free_bytes(), 256 * kPage);
}

}  // namespace
}  // namespace shmtensor::daemon
