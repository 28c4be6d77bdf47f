// Who is calling, as the kernel says: the credentials of the process at the
// other end of a Unix socket (SO_PEERCRED), a pidfd that follows that process
// (SO_PEERPIDFD where the kernel has it, pidfd_open otherwise), and what
// /proc says of it for operators. Nothing here trusts what a request claims.
//
// Thread safety: pure functions; UniqueFd is not thread-safe.
#ifndef SHMTENSOR_DAEMON_OS_PEER_H_
#define SHMTENSOR_DAEMON_OS_PEER_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shmtensor::daemon {

// Owns one file descriptor; closes it on destruction. Movable, not copyable
// (one owner per descriptor).
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// The process at the other end of a connected Unix socket, when it
// connected (or its pid namespace's view of it: the kernel translates pids
// into the daemon's namespace).
struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  // Supplementary groups when it connected (SO_PEERGROUPS); empty where the
  // kernel cannot say (before Linux 4.13).
  std::vector<gid_t> groups;
};

// Who owns a session: the peer's pid where the daemon can see it (the
// kernel gives 0 for a process in a pid namespace that is not the daemon's
// or below it, e.g. another container's); for such a process, the one
// connection it opened the session on (1 << 40 | a connection serial), so
// its session can be neither used nor resumed from anywhere else.
using OwnerKey = uint64_t;
inline OwnerKey OwnerOf(pid_t pid, uint64_t connection_serial) {
  return pid > 0 ? static_cast<OwnerKey>(pid)
                 : (OwnerKey{1} << 40) | connection_serial;
}

// SO_PEERCRED (and SO_PEERGROUPS) of `socket_fd`. INTERNAL naming errno
// when the kernel cannot say (not a Unix socket).
absl::StatusOr<PeerCredentials> ReadPeerCredentials(int socket_fd);

// pidfd_open(pid): NOT_FOUND when no such process exists (ESRCH),
// UNIMPLEMENTED when the kernel gives no pidfds (ENOSYS before Linux 5.3;
// EPERM from a seccomp profile that refuses the call), INTERNAL naming errno
// otherwise.
absl::StatusOr<UniqueFd> OpenPidfd(pid_t pid);

// A pidfd of the peer of `socket_fd`: SO_PEERPIDFD (Linux 6.5+: the process
// that connected, race-free), else pidfd_open(pid) (a pid recycled between
// the peer's exit and this call would be followed instead; the peer's own
// exit closes the socket first, so the daemon sees the connection end).
// INTERNAL naming errno when neither works.
absl::StatusOr<UniqueFd> OpenPeerPidfd(int socket_fd, pid_t pid);

// True once the process `pidfd` refers to has exited (the pidfd polls
// readable then). Never blocks.
bool ProcessExited(int pidfd);

// For operators: the command line of `pid` from /proc (arguments joined by
// spaces, at most 4 KiB), empty when the daemon cannot see it.
std::string CommandLineOf(pid_t pid);

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_OS_PEER_H_
