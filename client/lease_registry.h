// [P19] Which read leases of this process hold which bytes: how a tensor
// handed to torch's sharing (python/shmtensor/_torch_sharing.py) finds the
// lease of the object its memory lies in, to send it by reference.
//
// Every read-only lease on a host pool is registered for its life (once
// made read-only: MakeLease, or a shared seal's BecomeReadLease), under
// its address in the pool's read-only mapping. Writable leases (an unsealed
// buffer, a shared-writable object, a batch ring) are not: their memory
// travels by copy.
//
// Thread safety: thread-safe. Fork-safe: ClientCore's fork handlers hold
// the registry's lock across fork() (LockForFork).
#ifndef SHMTENSOR_CLIENT_LEASE_REGISTRY_H_
#define SHMTENSOR_CLIENT_LEASE_REGISTRY_H_

#include <cstdint>
#include <memory>

namespace shmtensor::internal {

class Lease;

class LeaseRegistry {
 public:
  // `lease`'s `size` bytes at `data` (size > 0), once the lease is owned by
  // a shared_ptr (Find reads its weak_from_this under the lock). The pointer
  // stays registered until Remove, which its destructor calls.
  static void Add(const Lease* lease, const uint8_t* data, uint64_t size);
  static void Remove(const Lease* lease, const uint8_t* data);
  // A live registered lease of this process's own sessions whose bytes
  // contain the `size` bytes at `p`, or null (none, or only ones being
  // destroyed or inherited across fork).
  static std::shared_ptr<Lease> Find(const void* p, uint64_t size);
  // For fork handlers: the lock, taken before fork() and released after it
  // in the parent and the child, so that no child inherits it held.
  static void LockForFork();
  static void UnlockAfterFork();
};

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_LEASE_REGISTRY_H_
