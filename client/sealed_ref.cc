// SealedRef: the creator's ref and its lease (shmtensor/sealed_ref.h).
#include "shmtensor/sealed_ref.h"

#include "absl/status/status.h"
#include "client/lease.h"

namespace shmtensor {

absl::Status SealedRef::Release() {
  if (lease_ == nullptr) return absl::OkStatus();
  // Only the last holder releases (a share a Get takes meanwhile would
  // be left with a released lease: UnshareIfLast decides under the
  // shares' lock).
  absl::Status s = lease_->core().UnshareIfLast(lease_) ? lease_->ReleaseNow()
                                                        : absl::OkStatus();
  lease_.reset();
  return s;
}

}  // namespace shmtensor
