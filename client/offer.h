// [P19] Sending an object to another process by reference: the sender
// offers a read lease it holds (the daemon pins the object:
// daemon/store/offer_table.h) and sends the ref with the offer's token; the
// receiver's Client::Take takes the pin over with a lease of its own. The
// Python package's torch sharing (python/shmtensor/_torch_sharing.py) sends
// tensors over pool memory this way.
//
// Built without the generated protobuf headers (like lease_address.h), for
// the Python binding.
//
// Thread safety: thread-safe.
#ifndef SHMTENSOR_CLIENT_OFFER_H_
#define SHMTENSOR_CLIENT_OFFER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "shmtensor/object_ref.h"

namespace shmtensor::internal {

class Lease;

struct LeaseOffer {
  ObjectRef ref;       // The object's.
  uint64_t token = 0;  // The offer's; Client::Take presents it.
  // The lease's bytes in this process (the object's first byte) and their
  // number: a pointer into them is at that many bytes into the object.
  const void* data = nullptr;
  uint64_t size_bytes = 0;
  std::string daemon_address;  // Client::address() of the lease's client.
};

// Offers the object of `lease` (a read lease of a sealed shared object).
// FAILED_PRECONDITION for any other lease (an unsealed buffer, a
// shared-writable object, an exclusive take) or one inherited across fork;
// RESOURCE_EXHAUSTED (LIMIT_EXCEEDED) at the daemon's
// limits.max_offers_per_session; the call's errors.
absl::StatusOr<LeaseOffer> OfferLease(Lease& lease);

// OfferLease of the live read lease of this process whose bytes contain
// the `size` bytes at `p` (LeaseRegistry); NOT_FOUND, asking the daemon
// nothing, when there is none: memory that is not a pool's, that only a
// writable lease holds, that this process inherited across fork (its lease
// is the parent's session's), or that runs past the object.
absl::StatusOr<LeaseOffer> OfferReadLeaseAt(const void* p, uint64_t size);

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_OFFER_H_
