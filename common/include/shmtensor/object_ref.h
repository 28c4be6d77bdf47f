// References to shmtensor objects.
#ifndef SHMTENSOR_COMMON_INCLUDE_SHMTENSOR_OBJECT_REF_H_
#define SHMTENSOR_COMMON_INCLUDE_SHMTENSOR_OBJECT_REF_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace shmtensor {

namespace internal {
class Lease;
}  // namespace internal

// Names one object of one daemon instance. A plain value: copy it, serialise
// it, send it to another process. It holds nothing: the object may be gone by
// the time someone uses it, and then Get fails with a stale-reference error
// (IsStaleReference), never with another object's bytes.
struct ObjectRef {
  uint64_t daemon_epoch = 0;
  uint32_t slot = 0;
  uint32_t generation = 0;
  bool exclusive = false;  // Sealed for hand-off to exactly one consumer.
  // 64 random bits the daemon drew for the object: a ref cannot be guessed
  // from slot and generation (listings show refs without it).
  uint64_t nonce = 0;

  // 26 bytes: a version byte (2), then the fields little-endian.
  std::string Serialize() const;
  // Inverse of Serialize. INVALID_ARGUMENT for any other input.
  static absl::StatusOr<ObjectRef> Parse(std::string_view bytes);

  bool operator==(const ObjectRef& o) const {
    return daemon_epoch == o.daemon_epoch && slot == o.slot &&
           generation == o.generation && exclusive == o.exclusive &&
           nonce == o.nonce;
  }
};

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

#endif  // SHMTENSOR_COMMON_INCLUDE_SHMTENSOR_OBJECT_REF_H_
