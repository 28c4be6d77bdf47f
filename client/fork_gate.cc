#include "client/fork_gate.h"

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace shmtensor::internal {
namespace {
constexpr absl::Duration kPoll = absl::Microseconds(100);
// Longest wait of a fork for a call on its way.
constexpr absl::Duration kForkWait = absl::Seconds(2);
}  // namespace

void ForkGate::Enter() {
  in_call_.store(true, std::memory_order_seq_cst);
  while (pending_.load(std::memory_order_seq_cst)) {
    in_call_.store(false, std::memory_order_seq_cst);
    while (pending_.load(std::memory_order_seq_cst)) absl::SleepFor(kPoll);
    in_call_.store(true, std::memory_order_seq_cst);
  }
}

void ForkGate::Leave() { in_call_.store(false, std::memory_order_seq_cst); }

void ForkGate::Pause() {
  pending_.store(true, std::memory_order_seq_cst);
  const absl::Time deadline = absl::Now() + kForkWait;
  while (in_call_.load(std::memory_order_seq_cst) && absl::Now() < deadline) {
    absl::SleepFor(kPoll);
  }
}

void ForkGate::Resume() { pending_.store(false, std::memory_order_seq_cst); }

}  // namespace shmtensor::internal
