#include "daemon/server/release_intake.h"

#include <vector>

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

}  // namespace shmtensor::daemon
