#include "client/release_outbox.h"

#include <algorithm>
#include <iterator>
#include <utility>

namespace shmtensor::internal {

void ReleaseOutbox::Enqueue(v1::ReleaseLeases message) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!unconfirmed_.empty() && sent_ > frozen_through_) {
    v1::ReleaseLeases& last = unconfirmed_.back();
    if (static_cast<size_t>(last.lease_ids_size() + last.seals_size() +
                            message.lease_ids_size() + message.seals_size()) <=
        kMaxJoined) {
      last.mutable_lease_ids()->MergeFrom(message.lease_ids());
      for (v1::OneWaySeal& seal : *message.mutable_seals()) {
        *last.add_seals() = std::move(seal);
      }
      return;
    }
  }
  message.set_seq(++sent_);
  unconfirmed_.push_back(std::move(message));
}

bool ReleaseOutbox::EnqueuePosted(
    v1::ReleaseLeases message, uint64_t applied,
    absl::FunctionRef<bool(const v1::ReleaseLeases&)> post) {
  std::lock_guard<std::mutex> lock(mu_);
  while (!unconfirmed_.empty() && unconfirmed_.front().seq() <= applied) {
    unconfirmed_.pop_front();
  }
  message.set_seq(++sent_);
  const bool posted = post(message);
  // Seen by the daemon from now on: nothing may join it.
  if (posted) frozen_through_ = sent_;
  unconfirmed_.push_back(std::move(message));
  return posted;
}

uint64_t ReleaseOutbox::Unwritten() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sent_ - written_through_;
}

bool ReleaseOutbox::HasUnconfirmed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !unconfirmed_.empty();
}

void ReleaseOutbox::Confirm(uint64_t through) {
  std::lock_guard<std::mutex> lock(mu_);
  while (!unconfirmed_.empty() && unconfirmed_.front().seq() <= through) {
    unconfirmed_.pop_front();
  }
}

std::vector<v1::SessionRequest> ReleaseOutbox::TakeUnwritten() {
  std::vector<v1::SessionRequest> batch;
  std::lock_guard<std::mutex> lock(mu_);
  // A message confirmed applied (a request carried it) left the queue and
  // need not be written.
  auto next = std::upper_bound(
      unconfirmed_.begin(), unconfirmed_.end(), written_through_,
      [](uint64_t seq, const v1::ReleaseLeases& m) { return seq < m.seq(); });
  if (next == unconfirmed_.end()) {
    written_through_ = sent_;
    return batch;
  }
  const size_t n = std::min<size_t>(kMaxWrittenTogether,
                                    std::distance(next, unconfirmed_.end()));
  batch.resize(n);
  for (size_t i = 0; i < n; ++i, ++next) *batch[i].mutable_release() = *next;
  frozen_through_ = std::max(frozen_through_, batch.back().release().seq());
  return batch;
}

size_t ReleaseOutbox::AlreadyWritten(
    const std::vector<v1::SessionRequest>& batch) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t first = 0;
  while (first < batch.size() &&
         batch[first].release().seq() <= written_through_) {
    ++first;
  }
  return first;
}

void ReleaseOutbox::Written(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  written_through_ = std::max(written_through_, seq);
}

void ReleaseOutbox::Abandon() {
  std::lock_guard<std::mutex> lock(mu_);
  written_through_ = sent_;
}

void ReleaseOutbox::Account(v1::OpenSession* account) {
  std::lock_guard<std::mutex> lock(mu_);
  account->set_releases_through(sent_);
  frozen_through_ = sent_;
  for (const v1::ReleaseLeases& message : unconfirmed_) {
    for (const v1::OneWaySeal& seal : message.seals()) {
      *account->add_pending_seals() = seal;
    }
  }
}

void ReleaseOutbox::Settle(uint64_t through) {
  std::lock_guard<std::mutex> lock(mu_);
  while (!unconfirmed_.empty() && unconfirmed_.front().seq() <= through) {
    unconfirmed_.pop_front();
  }
  written_through_ = std::max(written_through_, through);
}

bool ReleaseOutbox::Resend(
    uint64_t applied,
    absl::FunctionRef<bool(const v1::SessionRequest&)> write) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const v1::ReleaseLeases& message : unconfirmed_) {
    if (message.seq() <= applied) continue;
    v1::SessionRequest req;
    *req.mutable_release() = message;
    if (!write(req)) return false;
  }
  written_through_ = sent_;
  return true;
}

}  // namespace shmtensor::internal
