// When a get may take a share of a lease this process holds instead of
// asking the daemon: the one rule for every holder of shares, the client's
// (ClientCore::FindShare) and an adapter's that keeps shares of its own
// (the Python binding's views, python/src/shared_view.h), usable without
// client/lease.h, which needs the generated protobuf headers (see
// client/lease_address.h).
#ifndef SHMTENSOR_CLIENT_LEASE_SHARE_H_
#define SHMTENSOR_CLIENT_LEASE_SHARE_H_

#include <cstdint>

#include "shmtensor/object_ref.h"

namespace shmtensor::internal {

class Lease;

// Lease::SharesRef: `lease` is its client's share of exactly `ref` (nonce
// and exclusive flag included; never an exclusive ref's), this process is
// the one that holds it (not a child it was inherited by) and the daemon
// still holds it (not lost in a resume). Thread-safe.
bool LeaseSharesRef(const Lease& lease, const ObjectRef& ref);

// The key shares are found by (slot and generation); a find compares the
// whole ref after.
inline uint64_t ShareKey(const ObjectRef& ref) {
  return (uint64_t{ref.slot} << 32) | ref.generation;
}

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_LEASE_SHARE_H_
