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

// The start time of process `pid`: clock ticks after boot, field 22 of
// /proc/<pid>/stat. With the pid it names one process for the machine's
// uptime: a pid the kernel hands out again belongs to a process started
// later. NOT_FOUND when no such process is visible; INTERNAL for a stat line
// that does not parse.
absl::StatusOr<uint64_t> ProcessStartTime(pid_t pid);

// Who may act for a session: the uid and the process, by the kernel's word,
// never the pid alone (a pid is handed out again once its process is gone,
// to any user). For a process the daemon can see (pid > 0), `instance` is
// its start time (ProcessStartTime); for one it cannot (pid 0: a pid
// namespace that is not the daemon's or below it, e.g. another container's)
// it is the one connection it opened the session on (1 << 63 | a serial), so
// such a session can be neither used nor resumed from anywhere else.
struct OwnerKey {
  uid_t uid = 0;
  pid_t pid = 0;
  uint64_t instance = 0;
  bool operator==(const OwnerKey& o) const {
    return uid == o.uid && pid == o.pid && instance == o.instance;
  }
  bool operator!=(const OwnerKey& o) const { return !(*this == o); }
};
inline OwnerKey OwnerOf(const PeerCredentials& peer, uint64_t start_time,
                        uint64_t connection_serial) {
  return peer.pid > 0
             ? OwnerKey{peer.uid, peer.pid, start_time}
             : OwnerKey{peer.uid, 0, (uint64_t{1} << 63) | connection_serial};
}

// Whether `other`, the owner key of a second connection (the descriptor
// socket's), is the process `owner` names: the same uid, pid and start time.
// A process the daemon cannot see (pid 0) has no pid to compare on either
// connection: the same uid, and the secret the caller checks, decide.
inline bool SameProcess(const OwnerKey& owner, const OwnerKey& other) {
  if (owner.pid > 0 || other.pid > 0) return owner == other;
  return owner.uid == other.uid;
}

// The owner key of the peer of connected Unix socket `socket_fd`, whose
// credentials are `peer` and `pidfd` a pidfd of it (OpenPeerPidfd; may be
// invalid for pid 0): its start time is read, then the pidfd must still show
// the process alive, so the time read was that process's and not a later
// holder's of its pid. FAILED_PRECONDITION when the peer has exited already
// (its connection is of no use), errors of ProcessStartTime otherwise. A
// live peer whose /proc entry this daemon cannot read (hidepid=2) gets the
// key of a pid the daemon cannot see (pid 0, by its connection).
absl::StatusOr<OwnerKey> IdentifyPeer(const PeerCredentials& peer, int pidfd,
                                      uint64_t connection_serial);

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
