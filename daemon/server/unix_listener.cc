#include "daemon/server/unix_listener.h"

#include <fcntl.h>
#include <grpcpp/server_posix.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace shmtensor::daemon {

absl::StatusOr<UniqueFd> BindUnixSocket(const std::string& path, int type,
                                        mode_t mode, int gid) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "socket path '%s' is %d bytes; it must be 1 to %d", path.substr(0, 128),
        path.size(), sizeof(addr.sun_path) - 1));
  }
  memcpy(addr.sun_path, path.data(), path.size());
  UniqueFd fd(socket(AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) {
    return absl::UnavailableError(
        absl::StrFormat("socket: %s", std::strerror(errno)));
  }
  unlink(path.c_str());
  // The socket gets its mode from birth: no window with a wider one.
  const mode_t old_umask = umask(~mode & 0777);
  const int bound =
      bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int bind_errno = errno;
  umask(old_umask);
  if (bound != 0) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot listen on unix:%s: %s", path, std::strerror(bind_errno)));
  }
  chmod(path.c_str(), mode);
  if (gid >= 0 && chown(path.c_str(), static_cast<uid_t>(-1),
                        static_cast<gid_t>(gid)) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "cannot give socket %s group %d: %s", path, gid, std::strerror(errno)));
  }
  if (listen(fd.get(), SOMAXCONN) != 0) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot listen on unix:%s: %s", path, std::strerror(errno)));
  }
  return fd;
}

absl::StatusOr<UniqueFd> AdoptUnixSocket(UniqueFd fd, const std::string& path,
                                         int type) {
  int got_type = 0;
  int listening = 0;
  socklen_t len = sizeof(int);
  sockaddr_un addr{};
  socklen_t addr_len = sizeof(addr);
  if (getsockopt(fd.get(), SOL_SOCKET, SO_TYPE, &got_type, &len) != 0 ||
      getsockopt(fd.get(), SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 ||
      getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &addr_len) !=
          0 ||
      addr.sun_family != AF_UNIX) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the socket handed over for %s is not a Unix socket", path));
  }
  const std::string bound(addr.sun_path,
                          strnlen(addr.sun_path, sizeof(addr.sun_path)));
  if (got_type != type || listening == 0 || bound != path) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the socket handed over for %s is %s (type %d, %s)",
                        path, bound.substr(0, 128), got_type,
                        listening ? "listening" : "not listening"));
  }
  const int flags = fcntl(fd.get(), F_GETFL);
  if (flags < 0 || fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK) != 0 ||
      fcntl(fd.get(), F_SETFD, FD_CLOEXEC) != 0) {
    return absl::InternalError(
        absl::StrFormat("fcntl: %s", std::strerror(errno)));
  }
  return fd;
}

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Bind(
    const std::string& path, mode_t mode, int gid, UniqueFd adopted) {
  absl::StatusOr<UniqueFd> fd =
      adopted.valid() ? AdoptUnixSocket(std::move(adopted), path, SOCK_STREAM)
                      : BindUnixSocket(path, SOCK_STREAM, mode, gid);
  if (!fd.ok()) return fd.status();
  UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) {
    return absl::InternalError(
        absl::StrFormat("eventfd: %s", std::strerror(errno)));
  }
  return std::unique_ptr<UnixListener>(
      new UnixListener(*std::move(fd), std::move(wake)));
}

UnixListener::~UnixListener() { Stop(); }

void UnixListener::Start(grpc::Server* server, ConnectionTable* table) {
  thread_ = std::thread([this, server, table] { AcceptLoop(server, table); });
}

void UnixListener::Stop() {
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  (void)!write(wake_fd_.get(), &one, sizeof(one));
  thread_.join();
  // Drained, so that a Start after this Stop (a take-over that fell
  // through) accepts again instead of stopping at once.
  uint64_t count;
  (void)!read(wake_fd_.get(), &count, sizeof(count));
}

void UnixListener::AcceptLoop(grpc::Server* server, ConnectionTable* table) {
  absl::Time last_warning = absl::InfinitePast();
  uint64_t serial = 0;
  uint64_t refused_since_warning = 0;
  // At most one warning a second; the count of what it stands for follows.
  auto warn = [&](const std::string& what) {
    ++refused_since_warning;
    if (absl::Now() - last_warning < absl::Seconds(1)) return;
    spdlog::warn("{} ({} such since the last warning)", what,
                 refused_since_warning);
    refused_since_warning = 0;
    last_warning = absl::Now();
  };
  while (true) {
    pollfd p[2] = {{listen_fd_.get(), POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
    if (poll(p, 2, -1) < 0 && errno != EINTR) break;
    if (p[1].revents != 0) break;  // Stop().
    if (p[0].revents == 0) continue;
    const int fd = accept4(listen_fd_.get(), nullptr, nullptr,
                           SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        warn(absl::StrFormat(
            "cannot accept a connection: %s; retrying every 100 ms",
            std::strerror(errno)));
        // Only the wake fd: the backlog stays readable meanwhile.
        pollfd w{wake_fd_.get(), POLLIN, 0};
        if (poll(&w, 1, 100) > 0) break;
      }
      continue;
    }
    UniqueFd conn(fd);
    absl::StatusOr<PeerCredentials> peer = ReadPeerCredentials(fd);
    if (!peer.ok()) {
      warn(
          absl::StrFormat("refused a connection: %s", peer.status().message()));
      continue;
    }
    // No pidfd: the peer exited before we looked (its connection then ends
    // at once), or it is in a pid namespace the daemon cannot see into on a
    // kernel without SO_PEERPIDFD (its sessions end with the connection).
    absl::StatusOr<UniqueFd> pidfd = OpenPeerPidfd(fd, peer->pid);
    // The owner is the process itself (uid, pid and start time), so a pid
    // the kernel hands out again never acts for a dead process's sessions.
    absl::StatusOr<OwnerKey> owner =
        IdentifyPeer(*peer, pidfd.ok() ? pidfd->get() : -1, ++serial);
    if (!owner.ok()) {
      warn(absl::StrFormat("refused a connection of pid %d: %s", peer->pid,
                           owner.status().message()));
      continue;
    }
    Connection c{*peer, *owner,
                 pidfd.ok()
                     ? std::make_shared<const UniqueFd>(*std::move(pidfd))
                     : nullptr};
    if (absl::Status s = table->Add(fd, std::move(c)); !s.ok()) {
      warn(absl::StrFormat("refused a connection of pid %d: %s", peer->pid,
                           s.message()));
      continue;
    }
    grpc::AddInsecureChannelFromFd(server, conn.release());
  }
}

}  // namespace shmtensor::daemon
