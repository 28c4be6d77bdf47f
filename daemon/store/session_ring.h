// The daemon's end of a session's release ring (common/release_ring.h,
// docs/shm_layout.md, "The release ring"): the memory, a memfd of its own
// sealed so that the client, which maps it writable, can neither shrink it
// (the daemon's reads would fault) nor grow it, nor add seals; and the
// reader over it.
//
// Ownership: owns the mapping, and keeps no descriptor (a daemon with many
// sessions holds no descriptor per session; the client's is the only one);
// the session owns the ring. Not copyable or movable: the reader points
// into the mapping.
// Thread safety: none; the store uses it under its lock.
#ifndef SHMTENSOR_DAEMON_STORE_SESSION_RING_H_
#define SHMTENSOR_DAEMON_STORE_SESSION_RING_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/release_ring.h"
#include "daemon/os/mapped_fd.h"
#include "daemon/os/peer.h"

namespace shmtensor::daemon {

class SessionRing {
 public:
  // A new ring, and in *descriptor its memory's one descriptor
  // (read-write, close-on-exec), for the session's process. INTERNAL naming
  // the system call that failed.
  static absl::StatusOr<std::unique_ptr<SessionRing>> Create(
      UniqueFd* descriptor);

  SessionRing(const SessionRing&) = delete;
  SessionRing& operator=(const SessionRing&) = delete;

  ReleaseRingReader& reader() { return reader_; }

 private:
  explicit SessionRing(MappedFd mapping);

  MappedFd mapping_;
  ReleaseRingReader reader_;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_STORE_SESSION_RING_H_
