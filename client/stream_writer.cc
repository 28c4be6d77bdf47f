#include "client/stream_writer.h"

#include <utility>

#include "absl/time/clock.h"

namespace shmtensor::internal {

StreamWriter::StreamWriter(absl::AnyInvocable<bool()> write_one,
                           absl::AnyInvocable<bool()> on_poll,
                           absl::Duration poll)
    : write_one_(std::move(write_one)),
      on_poll_(std::move(on_poll)),
      poll_(poll) {
  thread_ = std::thread([this] { Run(); });
}

StreamWriter::~StreamWriter() { Stop(); }

void StreamWriter::Kick() {
  kicked_.fetch_add(1, std::memory_order_seq_cst);
  // sleeping_ under the lock: the thread checks for kicks under it before
  // it sleeps, so a kick it missed finds it sleeping (already waiting on
  // wake_, which it entered holding the lock). The notify after the lock:
  // the thread it wakes does not then block at once on the lock its waker
  // still holds (a second switch, which on a VM costs the waker tens of
  // µs when the woken thread runs on its CPU).
  bool sleeping;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sleeping = sleeping_;
  }
  if (sleeping) wake_.notify_one();
}

bool StreamWriter::Flush(absl::Time deadline) {
  const uint64_t target = kicked_.load(std::memory_order_seq_cst);
  std::unique_lock<std::mutex> lock(mu_);
  while (written_ < target && running_) {
    if (deadline == absl::InfiniteFuture()) {
      written_cv_.wait(lock);
      continue;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    written_cv_.wait_for(lock, absl::ToChronoNanoseconds(left));
  }
  return written_ >= target;
}

void StreamWriter::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void StreamWriter::PauseForFork() { fork_gate_.Pause(); }

void StreamWriter::ResumeAfterFork() { fork_gate_.Resume(); }

void StreamWriter::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    // Every kick up to here is written once write_one finds nothing left.
    const uint64_t target = kicked_.load(std::memory_order_seq_cst);
    if (target == written_) {
      if (stopping_) break;
      sleeping_ = true;
      auto woken = [&] {
        return stopping_ || kicked_.load(std::memory_order_seq_cst) != written_;
      };
      bool poll_due = false;
      if (on_poll_ == nullptr || poll_ == absl::InfiniteDuration()) {
        wake_.wait(lock, woken);
      } else {
        poll_due =
            !wake_.wait_for(lock, absl::ToChronoNanoseconds(poll_), woken);
      }
      sleeping_ = false;
      if (!poll_due) continue;
      // on_poll_ takes its owner's locks and may call: not under this lock.
      lock.unlock();
      fork_gate_.Enter();
      const bool drain = on_poll_();
      fork_gate_.Leave();
      lock.lock();
      if (!drain) continue;
    }
    lock.unlock();
    while (true) {
      fork_gate_.Enter();  // Never a write across fork().
      const bool wrote = write_one_();
      fork_gate_.Leave();
      if (!wrote) break;
    }
    lock.lock();
    written_ = target;
    written_cv_.notify_all();
  }
  // Flush waits only for a thread that runs: wake it to see this one gone.
  running_ = false;
  written_cv_.notify_all();
}

}  // namespace shmtensor::internal
