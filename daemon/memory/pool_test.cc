#include "daemon/memory/pool.h"

#include <memory>

#include "daemon/memory/fake_segment.h"
#include "gtest/gtest.h"

namespace shmtensor::daemon {
namespace {

constexpr uint64_t kPage = 4096;
constexpr RangeAllocator::End kLow = RangeAllocator::End::kLow;
constexpr uid_t kUid = 1000;

Pool MakePool(uint64_t pages) {
  return Pool("default", std::make_unique<FakeSegment>(pages * kPage));
}

std::optional<uint64_t> Allocate(Pool& pool, uint64_t client, uint64_t bytes,
                                 uint64_t alignment = 0) {
  return pool.AllocateObject(client, {bytes, alignment, kLow}, false);
}

// Client `client` was given [offset, offset + bytes) writable (a write
// lease it has since dropped).
void NoteWritten(Pool& pool, uint64_t client, uint64_t offset, uint64_t bytes) {
  pool.AddLease(client, kUid, offset, bytes, /*write=*/true);
  pool.DropLease();
}

TEST(PoolTest, AllocateWithoutHistoryTakesTheAllocatorsPlace) {
  Pool pool = MakePool(16);
  EXPECT_EQ(Allocate(pool, 1, 2 * kPage), 0u);
  EXPECT_EQ(Allocate(pool, 1, 2 * kPage), 2 * kPage);
}

// Client 2 holds [0, 2) and [4, 6) pages, client 1 was given [2, 4)
// writable; then [0, 4) is freed. Best fit alone would place the next
// 2-page object at page 0.
void AddHistory(Pool& pool) {
  EXPECT_EQ(Allocate(pool, 2, 2 * kPage), 0u);
  EXPECT_EQ(Allocate(pool, 1, 2 * kPage), 2 * kPage);
  EXPECT_EQ(Allocate(pool, 2, 2 * kPage), 4 * kPage);
  NoteWritten(pool, 1, 2 * kPage, 2 * kPage);
  pool.FreeObject(0, 2 * kPage);
  pool.FreeObject(2 * kPage, 2 * kPage);
}

TEST(PoolTest, AllocateReusesARangeTheClientWroteBefore) {
  Pool pool = MakePool(16);
  AddHistory(pool);
  EXPECT_EQ(Allocate(pool, 1, 2 * kPage), 2 * kPage);
}

TEST(PoolTest, AffinityIsPerClient) {
  Pool pool = MakePool(16);
  AddHistory(pool);
  EXPECT_EQ(Allocate(pool, 2, 2 * kPage), 0u);
}

TEST(PoolTest, AffinityIsForTheSameCapacityOnly) {
  Pool pool = MakePool(16);
  AddHistory(pool);
  EXPECT_EQ(Allocate(pool, 1, kPage), 0u);
}

TEST(PoolTest, AffinityComesFromWriteLeasesOnly) {
  Pool pool = MakePool(16);
  AddHistory(pool);
  pool.ForgetClient(1);
  pool.AddLease(1, kUid, 0, 2 * kPage, /*write=*/false);  // A read lease.
  EXPECT_TRUE(pool.written(1).empty());
}

TEST(PoolTest, AffinityNeverSplitsAFreeRange) {
  Pool pool = MakePool(16);
  ASSERT_EQ(Allocate(pool, 1, 2 * kPage), 0u);
  ASSERT_EQ(Allocate(pool, 1, 2 * kPage), 2 * kPage);
  NoteWritten(pool, 1, 2 * kPage, 2 * kPage);
  pool.FreeObject(0, 2 * kPage);
  pool.FreeObject(2 * kPage, 2 * kPage);
  // [2, 4) lies inside the free range [0, 16): taking it would split it.
  EXPECT_EQ(Allocate(pool, 1, 2 * kPage), 0u);
}

TEST(PoolTest, AffinitySkipsAMisalignedRange) {
  Pool pool = MakePool(16);
  ASSERT_EQ(Allocate(pool, 1, 2 * kPage), 0u);
  ASSERT_EQ(Allocate(pool, 1, 2 * kPage), 2 * kPage);
  NoteWritten(pool, 1, 2 * kPage, 2 * kPage);
  pool.FreeObject(2 * kPage, 2 * kPage);
  // Asked at a 4-page alignment, page 2 does not do.
  EXPECT_EQ(Allocate(pool, 1, 2 * kPage, 4 * kPage), 4 * kPage);
}

TEST(PoolTest, WrittenKeepsTheMostRecentFirst) {
  Pool pool = MakePool(64);
  NoteWritten(pool, 1, 0, kPage);
  NoteWritten(pool, 1, kPage, kPage);
  NoteWritten(pool, 1, 0, kPage);  // Again: moves to the front, not doubled.
  std::vector<Pool::Range> w = pool.written(1);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0].offset, 0u);
  EXPECT_EQ(w[1].offset, kPage);
}

TEST(PoolTest, WrittenKeepsAtMostKWrittenRanges) {
  Pool pool = MakePool(64);
  for (uint64_t i = 0; i < Pool::kWrittenRanges + 4; ++i) {
    NoteWritten(pool, 1, i * kPage, kPage);
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
  EXPECT_EQ(Allocate(pool, 1, 2 * kPage), 0u);
}

TEST(PoolTest, ANewObjectIsCountedOnlyWhenItFits) {
  Pool pool = MakePool(4);
  ASSERT_EQ(Allocate(pool, 1, 4 * kPage), 0u);
  EXPECT_FALSE(Allocate(pool, 1, kPage).has_value());
  EXPECT_EQ(pool.usage().objects, 1u);
  // An object of no bytes takes no range, but is an object.
  EXPECT_EQ(pool.AllocateObject(1, {0, 0, kLow}, false), 0u);
  EXPECT_EQ(pool.usage().objects, 2u);
  EXPECT_EQ(pool.usage().used_bytes, 4 * kPage);
}

TEST(PoolTest, UsageFollowsObjectsLeasesAndStock) {
  Pool pool = MakePool(16);
  ASSERT_EQ(pool.AllocateObject(1, {3 * kPage, 0, kLow}, /*stock=*/true), 0u);
  ASSERT_EQ(Allocate(pool, 1, 2 * kPage), 3 * kPage);
  pool.AddLease(1, kUid, 0, 3 * kPage, true);
  pool.AddLease(2, kUid, 3 * kPage, 2 * kPage, false);
  pool.AddLease(3, kUid, 3 * kPage, 2 * kPage, false);
  Pool::Usage u = pool.usage();
  EXPECT_EQ(u.used_bytes, 5 * kPage);
  EXPECT_EQ(u.free_bytes, 11 * kPage);
  EXPECT_EQ(u.largest_free_bytes, 11 * kPage);
  EXPECT_EQ(u.objects, 2u);
  EXPECT_EQ(u.leases, 3u);
  EXPECT_EQ(u.stock_bytes, 3 * kPage);

  pool.Unstock(3 * kPage);  // Sealed.
  pool.DropLease();
  pool.DropLease();
  pool.FreeObject(3 * kPage, 2 * kPage);
  u = pool.usage();
  EXPECT_EQ(u.used_bytes, 3 * kPage);
  EXPECT_EQ(u.high_water_bytes, 5 * kPage);  // The most ever used at once.
  EXPECT_EQ(u.objects, 1u);
  EXPECT_EQ(u.leases, 1u);
  EXPECT_EQ(u.stock_bytes, 0u);
}

TEST(PoolTest, RestoreObjectRefusesAnOverlapAndCountsNothingThen) {
  Pool pool = MakePool(16);
  ASSERT_TRUE(pool.RestoreObject(2 * kPage, 2 * kPage));
  EXPECT_FALSE(pool.RestoreObject(3 * kPage, 2 * kPage));
  const Pool::Usage u = pool.usage();
  EXPECT_EQ(u.objects, 1u);
  EXPECT_EQ(u.used_bytes, 2 * kPage);
  EXPECT_EQ(u.high_water_bytes, 2 * kPage);
}

// [P21] Bytes another uid wrote reach a new uid only cleared, and are
// counted; a failed clear leaves them to be cleared next time.
TEST(PoolTest, ClaimForWriterNamesWhatAnotherUidWrote) {
  Pool pool = MakePool(16);
  ASSERT_EQ(Allocate(pool, 1, 2 * kPage), 0u);
  EXPECT_TRUE(pool.ClaimForWriter(0, 2 * kPage, kUid).empty());  // Clean.
  pool.FreeObject(0, 2 * kPage);
  ASSERT_EQ(Allocate(pool, 2, 2 * kPage), 0u);
  std::vector<WriterMap::Range> stale =
      pool.ClaimForWriter(0, 2 * kPage, kUid + 1);
  ASSERT_EQ(stale.size(), 1u);
  EXPECT_EQ(stale[0].length, 2 * kPage);
  EXPECT_EQ(pool.usage().cleared_bytes, 2 * kPage);
  pool.ClearFailed(stale);
  EXPECT_EQ(pool.WriterAt(0), WriterMap::kMixed);
  EXPECT_EQ(pool.ClaimForWriter(0, 2 * kPage, kUid + 1).size(), 1u);
}

TEST(PoolTest, ForgetWritersMakesEveryRangeMixed) {
  Pool pool = MakePool(16);
  pool.ForgetWriters();
  EXPECT_EQ(pool.WriterAt(0), WriterMap::kMixed);
  EXPECT_EQ(pool.WriterAt(15 * kPage), WriterMap::kMixed);
}

}  // namespace
}  // namespace shmtensor::daemon
