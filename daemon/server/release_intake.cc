#include "daemon/server/release_intake.h"

#include <vector>

#include "absl/strings/str_format.h"

namespace shmtensor::daemon {

absl::Status ApplyReleaseMessage(ObjectStore& store, uint64_t session_id,
                                 const v1::ReleaseLeases& message,
                                 absl::Status* unknown) {
  const std::vector<uint64_t> ids(message.lease_ids().begin(),
                                  message.lease_ids().end());
  const std::vector<v1::OneWaySeal> seals(message.seals().begin(),
                                          message.seals().end());
  absl::Status s = store.ReleaseBatch(session_id, message.seq(), ids, seals);
  if (absl::IsNotFound(s)) {
    *unknown = s;
    return absl::OkStatus();
  }
  return s;
}

absl::Status ApplyCarriedReleases(
    ObjectStore& store, uint64_t session_id,
    const google::protobuf::RepeatedPtrField<v1::ReleaseLeases>& carried,
    absl::Status* unknown) {
  if (static_cast<size_t>(carried.size()) > kDaemonMaxCarriedReleases) {
    return absl::InvalidArgumentError(
        absl::StrFormat("request carries %d ReleaseLeases copies, at most %d",
                        carried.size(), kDaemonMaxCarriedReleases));
  }
  for (const v1::ReleaseLeases& message : carried) {
    absl::Status s = ApplyReleaseMessage(store, session_id, message, unknown);
    if (absl::IsInvalidArgument(s)) break;  // A gap: the stream has the rest.
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace shmtensor::daemon
