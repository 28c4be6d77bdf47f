// ObjectRef (the public struct) <-> v1::ObjectRef (the wire message): the
// one conversion the client's files share.
#ifndef SHMTENSOR_CLIENT_REF_PROTO_H_
#define SHMTENSOR_CLIENT_REF_PROTO_H_

#include "shmtensor/object_ref.h"
#include "shmtensor/v1/shmtensor.pb.h"

namespace shmtensor::internal {

inline ObjectRef FromProto(const v1::ObjectRef& r) {
  return ObjectRef{r.daemon_epoch(), r.slot(), r.generation(), r.exclusive(),
                   r.nonce()};
}

inline v1::ObjectRef ToProto(const ObjectRef& r) {
  v1::ObjectRef p;
  p.set_daemon_epoch(r.daemon_epoch);
  p.set_slot(r.slot);
  p.set_generation(r.generation);
  p.set_exclusive(r.exclusive);
  p.set_nonce(r.nonce);
  return p;
}

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_REF_PROTO_H_
