#include "client/offer.h"

#include <memory>

#include "absl/strings/str_format.h"
#include "client/client_core.h"
#include "client/lease.h"
#include "client/lease_registry.h"
#include "client/ref_proto.h"

namespace shmtensor::internal {

absl::StatusOr<LeaseOffer> OfferLease(Lease& lease) {
  ClientCore& core = lease.core();
  if (absl::Status s = lease.CheckHeld(); !s.ok()) return s;
  if (lease.access() != Access::kRead || lease.device().is_cuda()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "lease %d is not a read lease of a host pool: only views of sealed "
        "shared objects travel by reference",
        lease.id()));
  }
  v1::OfferRequest req;
  req.set_session_id(core.session_id());
  req.set_lease_id(lease.id());
  v1::OfferResponse resp;
  if (absl::Status s =
          core.CallAfterReleases(&v1::ObjectStore::Stub::Offer, req, &resp);
      !s.ok()) {
    return s;
  }
  return LeaseOffer{FromProto(resp.ref()), resp.offer_token(), lease.data(),
                    lease.placement().size_bytes(), core.address()};
}

absl::StatusOr<LeaseOffer> OfferReadLeaseAt(const void* p, uint64_t size) {
  std::shared_ptr<Lease> lease = LeaseRegistry::Find(p, size);
  if (lease == nullptr) {
    return absl::NotFoundError(absl::StrFormat(
        "no read lease of this process holds the %d bytes at %p", size, p));
  }
  return OfferLease(*lease);
}

}  // namespace shmtensor::internal
