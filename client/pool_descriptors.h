// The client side of the descriptor hand-over (DescriptorRequest in
// shmtensor.proto, docs/shm_layout.md): host pools have no name to open, so
// a session's process receives their descriptors from the daemon over
// "<socket path>.fd", with SCM_RIGHTS.
//
// Thread safety: pure functions.
#ifndef SHMTENSOR_CLIENT_POOL_DESCRIPTORS_H_
#define SHMTENSOR_CLIENT_POOL_DESCRIPTORS_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "shmtensor/v1/shmtensor.pb.h"

namespace shmtensor::internal {

// One received descriptor; the caller owns `fd` (close-on-exec).
struct PoolDescriptor {
  uint32_t pool_id = 0;
  v1::PoolAccess access = v1::POOL_ACCESS_UNSPECIFIED;
  int fd = -1;
};

// What a session's process receives: its host pools' descriptors, and its
// release ring's (-1: none), all the caller's.
struct SessionDescriptors {
  std::vector<PoolDescriptor> pools;
  int release_ring = -1;
};

// Connects to the descriptor socket beside the gRPC socket `socket_path`
// (checking who serves it as ConnectDaemonSocket does), sends the session's
// id and secret, and returns the descriptors of the host pools it may use,
// each checked to be a regular file opened as its access says (O_RDONLY for
// POOL_ACCESS_READ), and of its release ring (checked to be a regular file
// opened O_RDWR). Errors: as ConnectDaemonSocket; the daemon's refusal
// with its code and message; UNAVAILABLE when no reply comes by `deadline`;
// INTERNAL for a malformed reply (every descriptor received is closed then).
absl::StatusOr<SessionDescriptors> FetchPoolDescriptors(
    const std::string& socket_path, uint64_t session_id,
    const std::string& secret, absl::Time deadline,
    std::optional<uid_t> daemon_uid);

// A new release ring for session `session_id`, which has none (after a
// resume: DescriptorRequest.release_ring_only): its descriptor (the
// caller's), checked to be a regular file opened O_RDWR. Errors as
// FetchPoolDescriptors; INTERNAL for a reply that carries anything but one
// ring (an older daemon answers such a request as a descriptor request).
absl::StatusOr<int> FetchReleaseRing(const std::string& socket_path,
                                     uint64_t session_id,
                                     const std::string& secret,
                                     absl::Time deadline,
                                     std::optional<uid_t> daemon_uid);

// [P18] Takes a fork hold for session `session_id` (DescriptorRequest.
// fork_hold): the daemon pins every object the session holds now for as
// long as the returned connection (close-on-exec, the caller's) is open in
// any process. The caller forks, closes it in the parent, and leaves it to
// the child, whose exit (or exec) closes it. Errors as FetchPoolDescriptors.
absl::StatusOr<int> TakeForkHold(const std::string& socket_path,
                                 uint64_t session_id, const std::string& secret,
                                 absl::Time deadline,
                                 std::optional<uid_t> daemon_uid);

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_POOL_DESCRIPTORS_H_
