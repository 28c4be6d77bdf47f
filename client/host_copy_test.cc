// CopyHost: every byte copied and none outside, whether one thread copies
// or several; how many threads a copy gets.
#include "client/host_copy.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace shmtensor::internal {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(HostCopyTest, LargeCopiesShareTheCpusTheCallerMayUse) {
  EXPECT_EQ(CopyThreadsFor(kParallelCopyBytes - 1, 8), 1);
  EXPECT_EQ(CopyThreadsFor(kParallelCopyBytes, 1), 1);  // One CPU: alone.
  EXPECT_EQ(CopyThreadsFor(kParallelCopyBytes, 2), 2);
  EXPECT_EQ(CopyThreadsFor(kParallelCopyBytes, 8), 2);  // 8 MiB each.
  EXPECT_EQ(CopyThreadsFor(20 * kMiB, 8), 2);
  EXPECT_EQ(CopyThreadsFor(64 * kMiB, 3), 3);
  EXPECT_EQ(CopyThreadsFor(512 * kMiB, 64), kMaxCopyThreads);
}

// Sizes on both sides of the threshold and of a part's page rounding: the
// destination holds the source's bytes exactly, and the guard bytes around
// it are untouched.
TEST(HostCopyTest, EveryByteLandsAndNoneOutside) {
  constexpr uint64_t kGuard = 4096;
  for (uint64_t size :
       {uint64_t{0}, uint64_t{1}, kParallelCopyBytes - 1, kParallelCopyBytes,
        kParallelCopyBytes + 4097, 37 * kMiB + 123}) {
    std::vector<uint8_t> src(size);
    for (uint64_t i = 0; i < size; ++i) {
      src[i] = static_cast<uint8_t>(i * 131 + (i >> 12) + 7);
    }
    std::vector<uint8_t> dst(size + 2 * kGuard, 0xEE);
    CopyHost(dst.data() + kGuard, src.data(), size);
    for (uint64_t i = 0; i < kGuard; ++i) {
      ASSERT_EQ(dst[i], 0xEE) << size << " before, at " << i;
      ASSERT_EQ(dst[kGuard + size + i], 0xEE) << size << " after, at " << i;
    }
    for (uint64_t i = 0; i < size; ++i) {
      ASSERT_EQ(dst[kGuard + i], src[i]) << size << " at " << i;
    }
  }
}

}  // namespace
}  // namespace shmtensor::internal
