// The daemon's side of the release protocol (docs/shm_layout.md, "Releases
// and one-way seals") where it meets the wire: the ReleaseLeases messages a
// session sends on its stream and the copies its requests carry, handed to
// the store, which applies each seq once and in order
// (ObjectStore::ReleaseBatch, daemon/store/release_log.h). A resume's
// account (OpenSession.releases_through, pending_seals) goes to the store
// with the resume (ObjectStore::Resume); a request waits for the messages
// through its releases_through in ServeAfterReleases (service.h).
#ifndef SHMTENSOR_DAEMON_SERVER_RELEASE_INTAKE_H_
#define SHMTENSOR_DAEMON_SERVER_RELEASE_INTAKE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/release_protocol.h"
#include "daemon/store/object_store.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "shmtensor/v1/shmtensor.pb.h"

namespace shmtensor::daemon {

// Applies one message of `session_id` (from its stream, or a copy a request
// carried). Leases the session does not hold, and seals the store refuses,
// are skipped: OK then, with *unknown naming them (for the log: the client
// cannot be answered on the stream). INVALID_ARGUMENT when its seq is past
// the next one due (a gap); other errors are the session's (not open).
absl::Status ApplyReleaseMessage(ObjectStore& store, uint64_t session_id,
                                 const v1::ReleaseLeases& message,
                                 absl::Status* unknown);

// Applies the copies a request carries (its `releases`), in order, up to
// the first gap: the stream delivers the rest, and the request waits for
// them (ServeAfterReleases). INVALID_ARGUMENT when it carries more than
// kDaemonMaxCarriedReleases, naming both counts; other errors as
// ApplyReleaseMessage's, *unknown as there.
absl::Status ApplyCarriedReleases(
    ObjectStore& store, uint64_t session_id,
    const google::protobuf::RepeatedPtrField<v1::ReleaseLeases>& carried,
    absl::Status* unknown);

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_SERVER_RELEASE_INTAKE_H_
