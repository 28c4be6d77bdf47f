// SealedRef's lease handling lives in the client library (object_ref.cc is
// shared with the daemon, which has no leases of its own).
#include "absl/status/status.h"
#include "client/lease.h"
#include "shmtensor/object_ref.h"

namespace shmtensor {

absl::Status SealedRef::Release() {
  if (lease_ == nullptr) return absl::OkStatus();
  absl::Status s =
      lease_.use_count() == 1 ? lease_->ReleaseNow() : absl::OkStatus();
  lease_.reset();
  return s;
}

}  // namespace shmtensor
