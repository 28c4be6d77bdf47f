// The daemon's side of the release protocol (docs/shm_layout.md, "Releases
// and one-way seals") where it meets the session stream: the ReleaseLeases
// messages a session sends there, handed to the store, which applies each
// seq once and in order (ObjectStore::ReleaseBatch,
// daemon/store/release_log.h). The copies a request carries, and the
// releases it follows (releases_through), travel with the request as its
// Caller (daemon/store/caller.h) and are admitted by the store under the
// request's own lock (ObjectStore::Admit). A resume's account
// (OpenSession.releases_through, pending_seals) goes to the store with the
// resume (ObjectStore::ResumeSession).
#ifndef SHMTENSOR_DAEMON_SERVER_RELEASE_INTAKE_H_
#define SHMTENSOR_DAEMON_SERVER_RELEASE_INTAKE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "daemon/store/object_store.h"
#include "shmtensor/v1/shmtensor.pb.h"

namespace shmtensor::daemon {

// Applies one message of `session_id` from its stream. Leases the session does
// not hold, and seals the store refuses, are skipped: OK then, with *unknown
// naming them (for the log: the client cannot be answered on the stream).
// INVALID_ARGUMENT when its seq is past the next one due (a gap); other errors
// are the session's (not open).
absl::Status ApplyReleaseMessage(ObjectStore& store, uint64_t session_id,
                                 const v1::ReleaseLeases& message,
                                 absl::Status* unknown);

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_SERVER_RELEASE_INTAKE_H_
