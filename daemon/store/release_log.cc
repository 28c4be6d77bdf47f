#include "daemon/store/release_log.h"

#include "absl/strings/str_format.h"

namespace shmtensor::daemon {

absl::StatusOr<bool> ReleaseLog::Apply(uint64_t seq) {
  if (seq <= applied_) return false;
  if (seq != applied_ + 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ReleaseLeases seq %d out of order: expected %d", seq, applied_ + 1));
  }
  applied_ = seq;
  return true;
}

absl::Status ReleaseLog::NotReachedError(uint64_t seq) const {
  return absl::DeadlineExceededError(absl::StrFormat(
      "releases_through %d not reached: session applied ReleaseLeases "
      "through %d only",
      seq, applied_));
}

}  // namespace shmtensor::daemon
