#include "client/gpu_releaser.h"

#include <mutex>
#include <vector>

#include "gtest/gtest.h"

namespace shmtensor::internal {
namespace {

// The queue's contract with fences that are complete at once (a
// default-constructed Fence has no events; the GPU side of fences is tested
// in tests/cuda_test.cc on a GPU).
TEST(GpuReleaserTest, ReleasesInOrderFlushWaitsAndDestructionDrains) {
  std::mutex mu;
  std::vector<uint64_t> sent;
  {
    GpuReleaser r([&](uint64_t id) {
      std::lock_guard<std::mutex> lock(mu);
      sent.push_back(id);
    });
    for (uint64_t id = 1; id <= 100; ++id) r.ReleaseAfter(cuda::Fence(), id);
    r.Flush();
    {
      std::lock_guard<std::mutex> lock(mu);
      ASSERT_EQ(sent.size(), 100u);
      for (uint64_t i = 0; i < sent.size(); ++i) EXPECT_EQ(sent[i], i + 1);
    }
    for (uint64_t id = 101; id <= 150; ++id) r.ReleaseAfter(cuda::Fence(), id);
  }  // The destructor sends what is still pending before it returns.
  ASSERT_EQ(sent.size(), 150u);
  EXPECT_EQ(sent.back(), 150u);
}

TEST(GpuReleaserTest, FlushWithNothingPendingReturnsAndNoThreadIsStarted) {
  GpuReleaser r([](uint64_t) { FAIL() << "nothing was handed in"; });
  r.Flush();
}

}  // namespace
}  // namespace shmtensor::internal
