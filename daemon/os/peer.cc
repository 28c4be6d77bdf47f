#include "daemon/os/peer.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77  // Linux 6.5; older headers lack it.
#endif

namespace shmtensor::daemon {

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    fd_ = o.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<PeerCredentials> ReadPeerCredentials(int socket_fd) {
  struct ucred cred {};
  socklen_t len = sizeof(cred);
  if (getsockopt(socket_fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return absl::InternalError(
        absl::StrCat("SO_PEERCRED: ", std::strerror(errno)));
  }
  PeerCredentials peer{cred.pid, cred.uid, cred.gid, {}};
  // The list is as long as the peer's; NGROUPS_MAX (65536) bounds it.
  std::vector<gid_t> groups(64);
  for (int attempt = 0; attempt < 4; ++attempt) {
    socklen_t bytes = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (getsockopt(socket_fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(),
                   &bytes) == 0) {
      groups.resize(bytes / sizeof(gid_t));
      peer.groups = std::move(groups);
      break;
    }
    if (errno != ERANGE || bytes / sizeof(gid_t) > 65536) break;
    groups.resize(bytes / sizeof(gid_t));
  }
  return peer;
}

absl::StatusOr<UniqueFd> OpenPeerPidfd(int socket_fd, pid_t pid) {
  int pidfd = -1;
  socklen_t len = sizeof(pidfd);
  if (getsockopt(socket_fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) == 0 &&
      pidfd >= 0) {
    return UniqueFd(pidfd);
  }
  if (pid <= 0) {
    return absl::InternalError(
        "the peer's pid is not visible here (another pid namespace) and the "
        "kernel has no SO_PEERPIDFD");
  }
  return OpenPidfd(pid);
}

absl::StatusOr<UniqueFd> OpenPidfd(pid_t pid) {
  const long fd = syscall(SYS_pidfd_open, pid, 0);
  if (fd >= 0) return UniqueFd(static_cast<int>(fd));
  const std::string what =
      absl::StrCat("pidfd_open(", pid, "): ", std::strerror(errno));
  switch (errno) {
    case ESRCH:
      return absl::NotFoundError(what);
    case ENOSYS:
    case EPERM:
      return absl::UnimplementedError(what);
    default:
      return absl::InternalError(what);
  }
}

absl::StatusOr<uint64_t> ProcessStartTime(pid_t pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/stat");
  std::ifstream in(path);
  std::string line;
  if (pid <= 0 || !std::getline(in, line)) {
    return absl::NotFoundError(absl::StrCat("no process ", pid, " in /proc"));
  }
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so
  // the fields are counted after its last ')'. Start time is field 22.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) {
    return absl::InternalError(absl::StrCat(path, " does not parse"));
  }
  std::vector<absl::string_view> fields = absl::StrSplit(
      absl::string_view(line).substr(close + 1), ' ', absl::SkipEmpty());
  uint64_t start = 0;
  // fields[0] is field 3 (state), so field 22 is fields[19].
  if (fields.size() < 20 || !absl::SimpleAtoi(fields[19], &start)) {
    return absl::InternalError(absl::StrCat(path, " does not parse"));
  }
  return start;
}

absl::StatusOr<OwnerKey> IdentifyPeer(const PeerCredentials& peer, int pidfd,
                                      uint64_t connection_serial) {
  if (peer.pid <= 0) return OwnerOf(peer, 0, connection_serial);
  absl::StatusOr<uint64_t> start = ProcessStartTime(peer.pid);
  if (absl::IsNotFound(start.status()) && pidfd >= 0 && !ProcessExited(pidfd)) {
    // Alive, yet /proc does not show it (hidepid=2, and this daemon is not
    // root): no start time tells it from a later holder of its pid, so it
    // is keyed as a process the daemon cannot see at all, by its
    // connection (its session cannot be resumed from another one).
    PeerCredentials hidden = peer;
    hidden.pid = 0;
    return OwnerOf(hidden, 0, connection_serial);
  }
  if (!start.ok()) return start.status();
  if (pidfd >= 0 && ProcessExited(pidfd)) {
    return absl::FailedPreconditionError(
        absl::StrCat("process ", peer.pid, " exited before it was known"));
  }
  return OwnerOf(peer, *start, connection_serial);
}

bool ProcessExited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR));
}

std::string CommandLineOf(pid_t pid) {
  if (pid <= 0) return "";
  std::ifstream in(absl::StrCat("/proc/", pid, "/cmdline"), std::ios::binary);
  std::string raw;
  raw.resize(4096);
  in.read(raw.data(), raw.size());
  raw.resize(in.gcount());
  while (!raw.empty() && raw.back() == '\0') raw.pop_back();
  for (char& c : raw) {
    if (c == '\0') c = ' ';
  }
  return raw;
}

}  // namespace shmtensor::daemon
