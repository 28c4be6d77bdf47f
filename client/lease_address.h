// The address of a lease's bytes, and whether they are still the lease's,
// for adapters that export them (the
// Python binding's arrays, tensors and ring slots) without including
// client/lease.h, which needs the generated protobuf headers: the binding
// is also built where only the public headers and the client library are
// at hand (testing/gpu/gpu_check.sh builds it on the GPU machine).
#ifndef SHMTENSOR_CLIENT_LEASE_ADDRESS_H_
#define SHMTENSOR_CLIENT_LEASE_ADDRESS_H_

#include "absl/status/status.h"

namespace shmtensor::internal {

class Lease;

// The first byte of the lease's range in this process: Lease::data(). Marks
// nothing exposed (unlike Buffer::data()), so it is for an export that
// holds a share of the lease while it lives: Buffer::Seal counts those.
void* LeaseAddress(const Lease& lease);
// Lease::CheckHeld(): FAILED_PRECONDITION (STALE_REFERENCE) once a resume
// found the daemon no longer holds the lease. Every export checks it.
absl::Status LeaseHeld(const Lease& lease);

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_LEASE_ADDRESS_H_
