// The creator's side of a ref: an ObjectRef and, while held, the lease that
// keeps its object alive.
#ifndef SHMTENSOR_CLIENT_INCLUDE_SHMTENSOR_SEALED_REF_H_
#define SHMTENSOR_CLIENT_INCLUDE_SHMTENSOR_SEALED_REF_H_

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "shmtensor/object_ref.h"

namespace shmtensor {

namespace internal {
class Lease;
}  // namespace internal

// What Buffer::Seal returns to the creator: the ref plus, for a shared
// (non-exclusive) seal, the lease that keeps the object alive while this
// SealedRef (or a copy of it) lives. Copies share the one lease.
// Thread safety: const methods are safe from any thread.
class SealedRef {
 public:
  SealedRef() = default;
  SealedRef(ObjectRef ref, std::shared_ptr<internal::Lease> lease)
      : ref_(ref), lease_(std::move(lease)) {}

  const ObjectRef& ref() const { return ref_; }
  // True while this SealedRef keeps the object alive.
  bool holds_lease() const { return lease_ != nullptr; }
  // Drops this copy's share of the lease now; the last share sends the
  // release without waiting (the daemon applies it before any later call of
  // this client, so this client sees it at once; others a moment later).
  void Reset() { lease_.reset(); }
  // Like Reset, but the last share waits for the daemon to drop the lease,
  // so the memory is back in the pool for every client on return.
  absl::Status Release();

 private:
  ObjectRef ref_;
  std::shared_ptr<internal::Lease> lease_;
};

}  // namespace shmtensor

#endif  // SHMTENSOR_CLIENT_INCLUDE_SHMTENSOR_SEALED_REF_H_
