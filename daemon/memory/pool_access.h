// Who may use a pool, and how: the one place the daemon decides a peer's
// access from a pool's `users`, `groups`, `read_only_users` and
// `read_only_groups` (daemon/config.h) and the kernel's word about the peer
// (SO_PEERCRED uid and gid, SO_PEERGROUPS).
//
// Rules, in order: root and the daemon's own user may read and write every
// pool; so may the members of `socket_group` when one is configured and the
// pool names no `users` or `groups` of its own, nor that group among its
// `read_only_groups` (a daemon shared by a group keeps working unchanged). Then
// a uid in `users`, or a primary or supplementary gid in `groups`, may read and
// write; one in `read_only_users` / `read_only_groups` may only read. Anyone
// else may not use the pool at all. A session's access is this, narrowed to
// reading for a read-only session (OpenSession.read_only).
//
// Thread safety: immutable after construction; pure functions.
#ifndef SHMTENSOR_DAEMON_MEMORY_POOL_ACCESS_H_
#define SHMTENSOR_DAEMON_MEMORY_POOL_ACCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/os/peer.h"
#include "shmtensor/v1/shmtensor.pb.h"

namespace shmtensor::daemon {

// A pool's access lists as configured: user or group names, or numeric ids
// as decimal text.
struct PoolAccessConfig {
  std::vector<std::string> users;
  std::vector<std::string> groups;
  std::vector<std::string> read_only_users;
  std::vector<std::string> read_only_groups;
};

// The lists resolved to ids.
class PoolAccessRules {
 public:
  // Resolves names (getpwnam/getgrnam) and ids. `owner` is the daemon's
  // uid; `socket_gid` the socket_group's gid, or -1 for none.
  // INVALID_ARGUMENT naming the pool, the key and the name for a user or
  // group this system does not know.
  static absl::StatusOr<PoolAccessRules> Resolve(const std::string& pool,
                                                 const PoolAccessConfig& config,
                                                 uid_t owner, int socket_gid);

  // The default: root and `owner` only.
  explicit PoolAccessRules(uid_t owner) : owner_(owner) {}

  // What `peer` may do with the pool: POOL_ACCESS_UNSPECIFIED for nothing.
  v1::PoolAccess AccessOf(const PeerCredentials& peer) const;

 private:
  uid_t owner_;
  std::vector<uid_t> users_;
  std::vector<gid_t> groups_;
  std::vector<uid_t> read_only_users_;
  std::vector<gid_t> read_only_groups_;
};

// "rw", "ro" or "-", for logs and listings.
const char* AccessName(v1::PoolAccess access);

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_MEMORY_POOL_ACCESS_H_
