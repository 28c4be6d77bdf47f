#include "client/lease.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "client/lease_address.h"
#include "client/lease_registry.h"
#include "client/lease_share.h"
#include "shmtensor/errors.h"

namespace shmtensor::internal {

bool Lease::ClosesAtOnce(WriteRevocation revocation,
                         const PoolMapping& mapping) {
  if (revocation == WriteRevocation::kImmediate) return true;
  // An export alive now, or an escaped pointer, outlives the write access:
  // nobody vouches for it.
  if (exports_.load(std::memory_order_acquire) > 0 ||
      escaped_.load(std::memory_order_acquire)) {
    return true;
  }
  // Raw pointers: kDeferred's caller vouches that none is left.
  if (revocation == WriteRevocation::kDeferred) return false;
  return exposed_.load(std::memory_order_acquire) ||
         mapping.Exposed(placement_.offset(), placement_.capacity_bytes());
}

LeaseExport::LeaseExport(std::shared_ptr<Lease> lease)
    : lease_(std::move(lease)) {
  lease_->exports_.fetch_add(1, std::memory_order_acq_rel);
}

LeaseExport::~LeaseExport() {
  lease_->exports_.fetch_sub(1, std::memory_order_acq_rel);
}

int LiveExports(const Lease& lease) { return lease.live_exports(); }
void MarkEscaped(Lease& lease) { lease.MarkEscaped(); }
bool LeaseEscaped(const Lease& lease) { return lease.escaped(); }
void* LeaseAddress(const Lease& lease) { return lease.data(); }
absl::Status LeaseHeld(const Lease& lease) { return lease.CheckHeld(); }
bool LeaseSharesRef(const Lease& lease, const ObjectRef& ref) {
  return lease.SharesRef(ref);
}

// The rule of client/lease_share.h.
bool Lease::SharesRef(const ObjectRef& ref) const {
  return shared() && shared_ref_ == ref && !core_->inherited() && !lost();
}

void Lease::Register() {
  if (access_ != Access::kRead || device_.is_cuda() ||
      placement_.size_bytes() == 0 ||
      registered_.load(std::memory_order_acquire) != nullptr) {
    return;
  }
  LeaseRegistry::Add(this, data_, placement_.size_bytes());
  registered_.store(data_, std::memory_order_release);
}

void Lease::CloseWritableRange() {
  if (opened_rw_range_ && access_ == Access::kReadWrite) {
    if (absl::StatusOr<PoolMapping*> m = core_->Mapping(placement_.pool_id());
        m.ok() && ClosesAtOnce(revocation_, **m)) {
      (*m)->Protect(placement_.offset(), placement_.capacity_bytes(),
                    Access::kRead)
          .IgnoreError();
    }
    access_ = Access::kRead;
  }
}

void Lease::MarkEscaped() {
  if (opened_rw_range_) escaped_.store(true, std::memory_order_release);
}

void Lease::MarkExposed() {
  if (!opened_rw_range_ || exposed_.exchange(true)) return;
  if (absl::StatusOr<PoolMapping*> m = core_->Mapping(placement_.pool_id());
      m.ok()) {
    (*m)->MarkExposed(placement_.offset(), placement_.capacity_bytes());
  }
}

void Lease::FillForRead() const {
  if (device_.is_cuda() || placement_.size_bytes() == 0) return;
  if (absl::StatusOr<PoolMapping*> m = core_->Mapping(placement_.pool_id());
      m.ok()) {
    (*m)->FillForRead(placement_.offset(), placement_.size_bytes());
  }
}

WriteRevocation Lease::revocation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return revocation_;
}

void Lease::UseOnStream(CudaStream stream) {
  if (!device_.is_cuda()) return;
  if (stream == 1) stream = kLegacyDefaultStream;  // DLPack's spelling.
  std::lock_guard<std::mutex> lock(mu_);
  if (std::find(streams_.begin(), streams_.end(), stream) == streams_.end()) {
    streams_.push_back(stream);
  }
}

cuda::Fence Lease::RecordFence() {
  std::vector<CudaStream> streams = streams_;
  streams.push_back(kLegacyDefaultStream);
  absl::StatusOr<cuda::Fence> fence =
      cuda::Fence::Record(device_.index, streams);
  if (fence.ok()) return *std::move(fence);
  // Could not record: wait for all of this process's work on the device
  // instead. If that fails as well, the context and its work are gone.
  cuda::WaitForStream(device_.index, kLegacyDefaultStream).IgnoreError();
  return cuda::Fence();
}

Lease::~Lease() {
  if (const uint8_t* at = registered_.load(std::memory_order_acquire)) {
    LeaseRegistry::Remove(this, at);
  }
  core_->LeaseGone();
  if (core_->inherited()) return;  // The parent's lease, not ours to drop.
  if (shared()) core_->DropShare(shared_ref_, this);
  CloseWritableRange();
  if (!held_) return;
  releasing_.store(true, std::memory_order_release);
  if (device_.is_cuda()) {
    // This Lease goes now; its release waits for the fence.
    core_->LeaseUnmade(id_);
    core_->ReleaseAfter(RecordFence(), id_);
    return;
  }
  core_
      ->ReleaseLease(id_, named_create_ || shared_writable()
                              ? ClientCore::Route::kStream
                              : ClientCore::Route::kPost)
      .IgnoreError();
}

absl::Status Lease::ReleaseNow() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!held_) return absl::OkStatus();
  if (absl::Status s = core_->CheckOwner(); !s.ok()) return s;
  CloseWritableRange();
  if (device_.is_cuda()) RecordFence().Wait().IgnoreError();
  held_ = false;
  releasing_.store(true, std::memory_order_release);
  if (lost()) return absl::OkStatus();  // The daemon holds it no more.
  v1::ReleaseRequest req;
  req.set_session_id(core_->session_id());
  req.set_lease_id(id_);
  v1::ReleaseResponse resp;
  // Still held while the call is on its way, so a resume meanwhile keeps
  // it for the call to release.
  // After the session's releases and seals sent so far (this lease's own
  // one-way seal among them, maybe).
  absl::Status s =
      core_->CallAfterReleases(&v1::ObjectStore::Stub::Release, req, &resp);
  if (s.ok()) {
    core_->ForgetLease(id_, /*released=*/true);
  } else {
    // Maybe not released (the call broke, say): the stream's release is
    // certain to arrive.
    core_->ReleaseLease(id_).IgnoreError();
  }
  return s;
}

bool Lease::MarkLost() {
  lost_.store(true, std::memory_order_release);
  return !releasing_.load(std::memory_order_acquire);
}

absl::Status Lease::CheckHeld() const {
  if (core_->views_revoked() && core_->inherited()) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            "lease ", id_, " in pool ", placement_.pool_id(), " at offset ",
            placement_.offset(),
            " was inherited across a fork whose hold the daemon refused: its "
            "bytes may be reused, so this process's view of it was made "
            "inaccessible")),
        kReasonStaleReference);
  }
  if (!lost()) return absl::OkStatus();
  return WithReason(
      absl::FailedPreconditionError(absl::StrCat(
          "lease ", id_, " in pool ", placement_.pool_id(), " at offset ",
          placement_.offset(),
          " was lost: the daemon that resumed the session did not hold it, "
          "so its bytes may have been reused")),
      kReasonStaleReference);
}

absl::Status Lease::CloseForSeal(CudaStream stream,
                                 WriteRevocation revocation) {
  std::lock_guard<std::mutex> lock(mu_);
  if (device_.is_cuda()) {
    return cuda::WaitForStream(device_.index, stream);
  }
  revocation_ = revocation;
  absl::StatusOr<PoolMapping*> m = core_->Mapping(placement_.pool_id());
  if (!m.ok()) return m.status();
  if (!ClosesAtOnce(revocation, **m)) {
    access_ = Access::kRead;
    return absl::OkStatus();
  }
  absl::StatusOr<uint8_t*> p = (*m)->Protect(
      placement_.offset(), placement_.capacity_bytes(), Access::kRead);
  if (!p.ok()) return p.status();
  access_ = Access::kRead;
  return absl::OkStatus();
}

void Lease::BecomeReadLease() {
  std::lock_guard<std::mutex> lock(mu_);
  if (device_.is_cuda()) return;  // One mapping of device memory.
  // Readers read through the read-only mapping, like every other view.
  absl::StatusOr<PoolMapping*> m = core_->Mapping(placement_.pool_id());
  if (m.ok()) {
    data_ = const_cast<uint8_t*>((*m)->read_base()) + placement_.offset();
    Register();
  }
}

void Lease::MarkSharedWritable() {
  std::lock_guard<std::mutex> lock(mu_);
  revocation_ = WriteRevocation::kDeferred;
  shared_writable_ = true;
}

bool Lease::shared_writable() const {
  std::lock_guard<std::mutex> lock(mu_);
  return shared_writable_;
}

void Lease::Forget() {
  std::lock_guard<std::mutex> lock(mu_);
  held_ = false;
  releasing_.store(true, std::memory_order_release);
  core_->ForgetLease(id_, /*released=*/false);
}

}  // namespace shmtensor::internal
