#include "client/lease.h"

namespace shmtensor::internal {

Lease::~Lease() {
  if (core_->inherited()) return;  // The parent's lease, not ours to drop.
  if (opened_rw_range_ && access_ == Access::kReadWrite) {
    if (absl::StatusOr<PoolMapping*> m = core_->Mapping(placement_.pool_id());
        m.ok()) {
      (*m)->Protect(placement_.offset(), placement_.capacity_bytes(),
                    Access::kRead)
          .IgnoreError();
    }
  }
  if (held_) core_->ReleaseLease(id_).IgnoreError();
}

absl::Status Lease::CloseForSeal() {
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<PoolMapping*> m = core_->Mapping(placement_.pool_id());
  if (!m.ok()) return m.status();
  absl::StatusOr<uint8_t*> p = (*m)->Protect(
      placement_.offset(), placement_.capacity_bytes(), Access::kRead);
  if (!p.ok()) return p.status();
  access_ = Access::kRead;
  return absl::OkStatus();
}

void Lease::BecomeReadLease() {
  std::lock_guard<std::mutex> lock(mu_);
  // Readers read through the read-only mapping, like every other view.
  absl::StatusOr<PoolMapping*> m = core_->Mapping(placement_.pool_id());
  if (m.ok())
    data_ = const_cast<uint8_t*>((*m)->read_base()) + placement_.offset();
}

void Lease::Forget() {
  std::lock_guard<std::mutex> lock(mu_);
  held_ = false;
}

}  // namespace shmtensor::internal
