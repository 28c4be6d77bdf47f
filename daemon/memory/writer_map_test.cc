#include "daemon/memory/writer_map.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace shmtensor::daemon {
namespace {

using Range = WriterMap::Range;
using Ranges = std::vector<Range>;
constexpr uid_t kAlice = 1000;
constexpr uid_t kBob = 1001;

TEST(WriterMapTest, CleanMemoryNeedsNoClearing) {
  WriterMap m;
  EXPECT_EQ(m.Claim(0, 4096, kAlice), Ranges{});
  EXPECT_EQ(m.WriterAt(0), kAlice);
  EXPECT_EQ(m.WriterAt(4096), std::nullopt);
}

TEST(WriterMapTest, OneUidReusesItsOwnRangesUncleared) {
  WriterMap m;
  m.Claim(0, 8192, kAlice);
  EXPECT_EQ(m.Claim(0, 8192, kAlice), Ranges{});
  EXPECT_EQ(m.Claim(4096, 4096, kAlice), Ranges{});
  EXPECT_EQ(m.runs(), 1u);
}

TEST(WriterMapTest, AnotherUidGetsExactlyTheOtherUidsPartsCleared) {
  WriterMap m;
  m.Claim(4096, 4096, kAlice);    // [1, 2) pages Alice's.
  m.Claim(3 * 4096, 4096, kBob);  // [3, 4) Bob's.
  // Bob takes [0, 5): page 0 and 2 and 4 are clean, 3 his own, 1 Alice's.
  EXPECT_EQ(m.Claim(0, 5 * 4096, kBob), (Ranges{{4096, 4096}}));
  EXPECT_EQ(m.WriterAt(4096), kBob);
  EXPECT_EQ(m.runs(), 1u);  // One run of Bob's.
  // Alice now gets a part of Bob's run, cut in the middle.
  EXPECT_EQ(m.Claim(4096, 2 * 4096, kAlice), (Ranges{{4096, 2 * 4096}}));
  EXPECT_EQ(m.WriterAt(0), kBob);
  EXPECT_EQ(m.WriterAt(3 * 4096), kBob);
  EXPECT_EQ(m.runs(), 3u);
}

TEST(WriterMapTest, AdjacentStaleRunsOfDifferentUidsMergeIntoOneClear) {
  WriterMap m;
  m.Claim(0, 4096, kAlice);
  m.Claim(4096, 4096, kBob);
  EXPECT_EQ(m.Claim(0, 2 * 4096, 2000), (Ranges{{0, 2 * 4096}}));
}

TEST(WriterMapTest, ARangeSharedWithAnotherUidIsClearedForBoth) {
  WriterMap m;
  m.Claim(0, 4096, kAlice);
  m.Share(0, 4096, kBob);  // Bob takes Alice's exclusive hand-off.
  EXPECT_EQ(m.WriterAt(0), WriterMap::kMixed);
  EXPECT_EQ(m.Claim(0, 4096, kAlice), (Ranges{{0, 4096}}));
  m.Share(0, 4096, kAlice);  // Alice's own: stays hers.
  EXPECT_EQ(m.WriterAt(0), kAlice);
  m.Share(0, 2 * 4096, kBob);  // The clean page becomes Bob's.
  EXPECT_EQ(m.WriterAt(0), WriterMap::kMixed);
  EXPECT_EQ(m.WriterAt(4096), kBob);
  EXPECT_EQ(m.Claim(0, 2 * 4096, kBob), (Ranges{{0, 4096}}));
}

// Against a byte-per-page model: whatever the sequence, a claim returns
// exactly the pages some other uid (or several) was given writable.
TEST(WriterMapTest, MatchesAPageByPageModel) {
  constexpr int kPages = 64;
  constexpr uid_t kClean = 0;
  std::mt19937 rng(7);
  WriterMap m;
  std::vector<uid_t> model(kPages, kClean);
  for (int step = 0; step < 20000; ++step) {
    const uint64_t first = rng() % kPages;
    const uint64_t n = 1 + rng() % (kPages - first);
    const uid_t uid = 1 + rng() % 3;
    if (rng() % 3 == 0) {
      m.Share(first * 4096, n * 4096, uid);
      for (uint64_t p = first; p < first + n; ++p) {
        if (model[p] == kClean) {
          model[p] = uid;
        } else if (model[p] != uid) {
          model[p] = WriterMap::kMixed;
        }
      }
      continue;
    }
    std::vector<bool> want(kPages, false);
    for (uint64_t p = first; p < first + n; ++p) {
      want[p] = model[p] != kClean && model[p] != uid;
      model[p] = uid;
    }
    std::vector<bool> got(kPages, false);
    for (const Range& r : m.Claim(first * 4096, n * 4096, uid)) {
      ASSERT_EQ(r.offset % 4096, 0u);
      ASSERT_EQ(r.length % 4096, 0u);
      for (uint64_t p = r.offset / 4096; p < (r.offset + r.length) / 4096;
           ++p) {
        got[p] = true;
      }
    }
    ASSERT_EQ(got, want) << "step " << step;
    for (int p = 0; p < kPages; ++p) {
      const std::optional<uid_t> w = m.WriterAt(p * 4096);
      ASSERT_EQ(w.value_or(kClean), model[p]) << "step " << step;
    }
    ASSERT_LE(m.runs(), static_cast<size_t>(kPages));
  }
}

}  // namespace
}  // namespace shmtensor::daemon
