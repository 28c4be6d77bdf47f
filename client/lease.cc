#include "client/lease.h"

namespace shmtensor::internal {

void Lease::CloseWritableRange() {
  if (opened_rw_range_ && access_ == Access::kReadWrite) {
    if (absl::StatusOr<PoolMapping*> m = core_->Mapping(placement_.pool_id());
        m.ok()) {
      (*m)->Protect(placement_.offset(), placement_.capacity_bytes(),
                    Access::kRead)
          .IgnoreError();
    }
    access_ = Access::kRead;
  }
}

Lease::~Lease() {
  if (core_->inherited()) return;  // The parent's lease, not ours to drop.
  CloseWritableRange();
  if (held_) core_->ReleaseLease(id_).IgnoreError();
}

absl::Status Lease::ReleaseNow() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!held_) return absl::OkStatus();
  if (absl::Status s = core_->CheckOwner(); !s.ok()) return s;
  CloseWritableRange();
  held_ = false;
  v1::ReleaseRequest req;
  req.set_session_id(core_->session_id());
  req.set_lease_id(id_);
  v1::ReleaseResponse resp;
  return core_->Call(&v1::ObjectStore::Stub::Release, req, &resp);
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
