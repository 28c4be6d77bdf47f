#include "daemon/server/waiting_calls.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace shmtensor::daemon {

WaitingCalls::WaitingCalls() : thread_([this] { Loop(); }) {}

WaitingCalls::~WaitingCalls() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void WaitingCalls::Add(Call* call, absl::Time wake_at) {
  count_.fetch_add(1, std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  added_.push_back({call, wake_at});
  ++pokes_;
}

void WaitingCalls::Poke() {
  if (count_.load(std::memory_order_relaxed) == 0) return;
  absl::MutexLock lock(&mu_);
  ++pokes_;
}

size_t WaitingCalls::size() const {
  return count_.load(std::memory_order_relaxed);
}

void WaitingCalls::Loop() {
  // Owned by this thread alone: retried without any lock held.
  std::vector<Parked> parked;
  uint64_t seen = 0;
  while (true) {
    absl::Time wake = absl::InfiniteFuture();
    for (const Parked& p : parked) wake = std::min(wake, p.wake_at);
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this, &seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return pokes_ != seen || stopping_;
      };
      mu_.AwaitWithDeadline(absl::Condition(&ready), wake);
      if (stopping_) return;
      seen = pokes_;
      parked.insert(parked.end(), added_.begin(), added_.end());
      added_.clear();
    }
    std::vector<Parked> still;
    still.reserve(parked.size());
    for (Parked& p : parked) {
      if (p.call->cancelled.load(std::memory_order_acquire)) {
        p.call->Cancel();
        count_.fetch_sub(1, std::memory_order_relaxed);
        continue;
      }
      if (p.call->Retry(&p.wake_at)) {
        count_.fetch_sub(1, std::memory_order_relaxed);
        continue;
      }
      still.push_back(p);
    }
    parked.swap(still);
  }
}

}  // namespace shmtensor::daemon
