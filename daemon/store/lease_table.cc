#include "daemon/store/lease_table.h"

#include <cassert>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace shmtensor::daemon {

uint64_t LeaseTable::Add(uint64_t session_id, uint32_t slot, bool write) {
  const uint64_t id = next_id_++;
  leases_.emplace(id, Lease{session_id, slot, write});
  return id;
}

absl::StatusOr<LeaseTable::Lease*> LeaseTable::Lookup(uint64_t session_id,
                                                      uint64_t lease_id) {
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    if (lease_id != 0 && lease_id < next_id_) {
      return absl::FailedPreconditionError(
          absl::StrFormat("lease %d was already released", lease_id));
    }
    return absl::NotFoundError(
        absl::StrFormat("lease %d was never issued", lease_id));
  }
  if (it->second.session != session_id) {
    return absl::PermissionDeniedError(
        absl::StrFormat("lease %d belongs to another session", lease_id));
  }
  return &it->second;
}

LeaseTable::Lease LeaseTable::Remove(uint64_t lease_id) {
  auto it = leases_.find(lease_id);
  // Invariant: only a lease held is removed (callers looked it up).
  assert(it != leases_.end());
  const Lease lease = it->second;
  leases_.erase(it);
  return lease;
}

}  // namespace shmtensor::daemon
