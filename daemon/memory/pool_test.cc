#include "daemon/memory/pool.h"

#include <memory>

#include "daemon/memory/fake_segment.h"
#include "gtest/gtest.h"

namespace shmtensor::daemon {
namespace {

constexpr uint64_t kPage = 4096;
constexpr RangeAllocator::End kLow = RangeAllocator::End::kLow;

Pool MakePool(uint64_t pages) {
  return Pool("default", std::make_unique<FakeSegment>(pages * kPage));
}

TEST(PoolTest, AllocateWithoutHistoryTakesTheAllocatorsPlace) {
  Pool pool = MakePool(16);
  EXPECT_EQ(pool.Allocate(1, 2 * kPage, 0, kLow), 0u);
  EXPECT_EQ(pool.Allocate(1, 2 * kPage, 0, kLow), 2 * kPage);
}

// Client 2 holds [0, 2) and [4, 6) pages, client 1 was given [2, 4)
// writable; then [0, 4) is freed. Best fit alone would place the next
// 2-page object at page 0.
void AddHistory(Pool& pool) {
  EXPECT_EQ(pool.Allocate(2, 2 * kPage, 0, kLow), 0u);
  EXPECT_EQ(pool.Allocate(1, 2 * kPage, 0, kLow), 2 * kPage);
  EXPECT_EQ(pool.Allocate(2, 2 * kPage, 0, kLow), 4 * kPage);
  pool.NoteWritten(1, 2 * kPage, 2 * kPage);
  pool.allocator().Free(0, 2 * kPage);
  pool.allocator().Free(2 * kPage, 2 * kPage);
}

TEST(PoolTest, AllocateReusesARangeTheClientWroteBefore) {
  Pool pool = MakePool(16);
  AddHistory(pool);
  EXPECT_EQ(pool.Allocate(1, 2 * kPage, 0, kLow), 2 * kPage);
}

TEST(PoolTest, AffinityIsPerClient) {
  Pool pool = MakePool(16);
  AddHistory(pool);
  EXPECT_EQ(pool.Allocate(2, 2 * kPage, 0, kLow), 0u);
}

TEST(PoolTest, AffinityIsForTheSameCapacityOnly) {
  Pool pool = MakePool(16);
  AddHistory(pool);
  EXPECT_EQ(pool.Allocate(1, kPage, 0, kLow), 0u);
}

TEST(PoolTest, AffinityNeverSplitsAFreeRange) {
  Pool pool = MakePool(16);
  ASSERT_EQ(pool.Allocate(1, 2 * kPage, 0, kLow), 0u);
  ASSERT_EQ(pool.Allocate(1, 2 * kPage, 0, kLow), 2 * kPage);
  pool.NoteWritten(1, 2 * kPage, 2 * kPage);
  pool.allocator().Free(0, 2 * kPage);
  pool.allocator().Free(2 * kPage, 2 * kPage);
  // [2, 4) lies inside the free range [0, 16): taking it would split it.
  EXPECT_EQ(pool.Allocate(1, 2 * kPage, 0, kLow), 0u);
}

TEST(PoolTest, AffinitySkipsAMisalignedRange) {
  Pool pool = MakePool(16);
  ASSERT_EQ(pool.Allocate(1, 2 * kPage, 0, kLow), 0u);
  ASSERT_EQ(pool.Allocate(1, 2 * kPage, 0, kLow), 2 * kPage);
  pool.NoteWritten(1, 2 * kPage, 2 * kPage);
  pool.allocator().Free(2 * kPage, 2 * kPage);
  // Asked at a 4-page alignment, page 2 does not do.
  EXPECT_EQ(pool.Allocate(1, 2 * kPage, 4 * kPage, kLow), 4 * kPage);
}

TEST(PoolTest, WrittenKeepsTheMostRecentFirst) {
  Pool pool = MakePool(64);
  pool.NoteWritten(1, 0, kPage);
  pool.NoteWritten(1, kPage, kPage);
  pool.NoteWritten(1, 0, kPage);  // Again: moves to the front, not doubled.
  std::vector<Pool::Range> w = pool.written(1);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0].offset, 0u);
  EXPECT_EQ(w[1].offset, kPage);
}

TEST(PoolTest, WrittenKeepsAtMostKWrittenRanges) {
  Pool pool = MakePool(64);
  for (uint64_t i = 0; i < Pool::kWrittenRanges + 4; ++i) {
    pool.NoteWritten(1, i * kPage, kPage);
  }
  std::vector<Pool::Range> w = pool.written(1);
  ASSERT_EQ(w.size(), Pool::kWrittenRanges);
  EXPECT_EQ(w.front().offset, (Pool::kWrittenRanges + 3) * kPage);
  EXPECT_EQ(w.back().offset, 4 * kPage);  // The oldest four are forgotten.
}

TEST(PoolTest, ForgetClientDropsItsRanges) {
  Pool pool = MakePool(16);
  AddHistory(pool);
  pool.ForgetClient(1);
  EXPECT_TRUE(pool.written(1).empty());
  EXPECT_EQ(pool.Allocate(1, 2 * kPage, 0, kLow), 0u);
}

TEST(PoolTest, UsageReportsTheAllocatorAndCounters) {
  Pool pool = MakePool(16);
  ASSERT_EQ(pool.Allocate(1, 3 * kPage, 0, kLow), 0u);
  pool.objects = 1;
  pool.leases = 2;
  pool.high_water_bytes = 5 * kPage;
  const Pool::Usage u = pool.usage();
  EXPECT_EQ(u.used_bytes, 3 * kPage);
  EXPECT_EQ(u.free_bytes, 13 * kPage);
  EXPECT_EQ(u.largest_free_bytes, 13 * kPage);
  EXPECT_EQ(u.high_water_bytes, 5 * kPage);
  EXPECT_EQ(u.objects, 1u);
  EXPECT_EQ(u.leases, 2u);
}

}  // namespace
}  // namespace shmtensor::daemon
