// SealedRef: the creator's ref and its lease (shmtensor/sealed_ref.h).
#include "shmtensor/sealed_ref.h"

#include "absl/status/status.h"
#include "client/lease.h"

namespace shmtensor {

absl::Status SealedRef::Release() {
  if (lease_ == nullptr) return absl::OkStatus();
  absl::Status s =
      lease_.use_count() == 1 ? lease_->ReleaseNow() : absl::OkStatus();
  lease_.reset();
  return s;
}

}  // namespace shmtensor
