// Exports of a lease's bytes, for the adapters that make them (the Python
// binding's arrays, buffer-protocol exports and DLPack tensors, the C++
// torch adapter's tensors) without including client/lease.h, which needs
// the generated protobuf headers: the binding is also built where only the
// public headers and the client library are at hand
// (testing/gpu/gpu_check.sh builds it on the GPU machine).
//
// Every pointer into pool memory that leaves the library is an export of
// its lease, of one of three kinds:
//  - counted: it lives in an object whose life the library sees (an array,
//    a tensor, a capsule), which holds a LeaseExport for as long as it
//    lives;
//  - escaped: a raw pointer an adapter handed past its own caller to
//    whoever uses it (the Python package's `address`): nobody who seals
//    can vouch for it; it marks the lease for good (LeaseEscaped);
//  - exposed: a raw pointer the C++ API hands its caller (Buffer::data(),
//    View::mutable_data()), who may vouch for it (WriteRevocation::
//    kDeferred); it marks the lease, and the memory for every later use in
//    this process (Lease::MarkExposed).
// Whether a writable range closes at once when its lease gives up write
// access (seal, release) is decided in one place from these
// (Lease::ClosesAtOnce): at once while a counted export lives or once one
// escaped, whatever the WriteRevocation, and for an exposed one under
// kWhenExposed (the default), so no pointer that left can write after a
// seal unless its holder vouched for it.
#ifndef SHMTENSOR_CLIENT_LEASE_ADDRESS_H_
#define SHMTENSOR_CLIENT_LEASE_ADDRESS_H_

#include <memory>

#include "absl/status/status.h"

namespace shmtensor::internal {

class Lease;

// A counted export: holds a share of the lease (so the object lives, and
// its memory stays unreused, while the export does) and counts itself in
// the lease from construction to destruction. Not copyable or movable: one
// per export, owned by what exports.
//
// Thread safety: constructed and destroyed on any thread.
class LeaseExport {
 public:
  explicit LeaseExport(std::shared_ptr<Lease> lease);
  ~LeaseExport();
  LeaseExport(const LeaseExport&) = delete;
  LeaseExport& operator=(const LeaseExport&) = delete;

  const std::shared_ptr<Lease>& lease() const { return lease_; }

 private:
  std::shared_ptr<Lease> lease_;
};

// Counted exports of the lease alive now.
int LiveExports(const Lease& lease);
// Marks a raw pointer into the lease's writable bytes handed past the
// adapter's caller (see above); no-op for a read-only lease or a CUDA
// pool. Whether one was.
void MarkEscaped(Lease& lease);
bool LeaseEscaped(const Lease& lease);

// The first byte of the lease's range in this process: Lease::data(). Marks
// nothing exposed (unlike Buffer::data()): for the maker of a counted
// export, whose LeaseExport lives as long as the pointer.
void* LeaseAddress(const Lease& lease);
// Lease::CheckHeld(): FAILED_PRECONDITION (STALE_REFERENCE) once a resume
// found the daemon no longer holds the lease. Every export checks it.
absl::Status LeaseHeld(const Lease& lease);

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_LEASE_ADDRESS_H_
