#include "client/gpu_releaser.h"

namespace shmtensor::internal {

GpuReleaser::~GpuReleaser() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void GpuReleaser::ReleaseAfter(cuda::Fence fence, uint64_t lease_id) {
  absl::MutexLock lock(&mu_);
  queue_.emplace_back(std::move(fence), lease_id);
  ++queued_;
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
}

void GpuReleaser::Flush() {
  absl::MutexLock lock(&mu_);
  const uint64_t target = queued_;
  auto done = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return sent_ >= target;
  };
  mu_.Await(absl::Condition(&done));
}

void GpuReleaser::Run() {
  while (true) {
    std::pair<cuda::Fence, uint64_t> item;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // Stopping, and drained.
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    // An error means the context (and with it the work) is gone: the memory
    // is no longer in use either way.
    item.first.Wait().IgnoreError();
    release_(item.second);
    absl::MutexLock lock(&mu_);
    ++sent_;
  }
}

}  // namespace shmtensor::internal
