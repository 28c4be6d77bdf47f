#include "daemon/store/caller.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_format.h"

namespace shmtensor::daemon {
namespace {

// The payload that marks AwaitingReleasesError's status; never sent.
constexpr char kAwaitingReleasesPayload[] =
    "shmtensor.daemon/awaiting-releases";

}  // namespace

absl::Status AwaitingReleasesError(uint64_t seq, uint64_t applied) {
  absl::Status s = absl::UnavailableError(absl::StrFormat(
      "waiting for ReleaseLeases through seq %d: session applied through %d",
      seq, applied));
  s.SetPayload(kAwaitingReleasesPayload, absl::Cord());
  return s;
}

bool IsAwaitingReleases(const absl::Status& status) {
  return status.GetPayload(kAwaitingReleasesPayload).has_value();
}

}  // namespace shmtensor::daemon
