#include "client/daemon_socket.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "shmtensor/defaults.h"

namespace shmtensor::internal {

absl::StatusOr<std::string> SocketPathOf(const std::string& address) {
  absl::string_view rest = address;
  if (!absl::ConsumePrefix(&rest, "unix:")) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "address '%s' is not unix:/path: shmtensord serves the data plane on "
        "its Unix socket only",
        address.substr(0, 128)));
  }
  if (absl::StartsWith(rest, "//")) rest.remove_prefix(2);
  if (rest.empty()) {
    return absl::InvalidArgumentError("address 'unix:' names no socket path");
  }
  return std::string(rest);
}

absl::StatusOr<int> ConnectDaemonSocket(const std::string& path,
                                        absl::Time deadline,
                                        std::optional<uid_t> allowed_uid,
                                        int type) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "socket path '%s...' is %d bytes, at most %d", path.substr(0, 64),
        path.size(), sizeof(addr.sun_path) - 1));
  }
  std::optional<uid_t> env_uid;
  if (const char* env = std::getenv(kDaemonUidEnv); env != nullptr && *env) {
    uint32_t v;
    if (absl::SimpleAtoi(env, &v)) {
      env_uid = v;
    } else {
      // A user name (the service user of a shared daemon).
      struct passwd pw;
      struct passwd* found = nullptr;
      char buf[4096];
      if (getpwnam_r(env, &pw, buf, sizeof(buf), &found) != 0 ||
          found == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s='%s' is neither a uid nor a user here",
                            kDaemonUidEnv, std::string(env).substr(0, 32)));
      }
      env_uid = found->pw_uid;
    }
  }
  memcpy(addr.sun_path, path.data(), path.size());
  absl::Duration backoff = absl::Milliseconds(5);
  int last_errno = 0;
  while (true) {
    // Non-blocking from the start: a daemon whose backlog is full answers
    // EAGAIN (tried again below until the deadline) instead of blocking
    // this connect past it.
    const int fd = socket(AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      return absl::UnavailableError(
          absl::StrFormat("socket: %s", std::strerror(errno)));
    }
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      struct ucred cred {};
      socklen_t len = sizeof(cred);
      if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
        const int e = errno;
        close(fd);
        return absl::UnavailableError(absl::StrFormat(
            "SO_PEERCRED on unix:%s: %s", path, std::strerror(e)));
      }
      const bool trusted = cred.uid == getuid() || cred.uid == geteuid() ||
                           cred.uid == 0 ||
                           (allowed_uid && cred.uid == *allowed_uid) ||
                           (env_uid && cred.uid == *env_uid);
      if (!trusted) {
        close(fd);
        return absl::PermissionDeniedError(absl::StrFormat(
            "unix:%s is served by uid %d (pid %d), not by this user (uid %d) "
            "or root; nothing was sent. If that is the daemon you mean to "
            "use, set %s=%d",
            path, cred.uid, cred.pid, getuid(), kDaemonUidEnv, cred.uid));
      }
      return fd;
    }
    last_errno = errno;
    close(fd);
    const bool may_appear = last_errno == ENOENT ||
                            last_errno == ECONNREFUSED || last_errno == EAGAIN;
    if (!may_appear || absl::Now() + backoff > deadline) break;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(100));
  }
  return absl::UnavailableError(absl::StrFormat(
      "no shmtensord answers at unix:%s (%s); start it with deploy/run.sh or "
      "set SHMTENSOR_ADDRESS",
      path, std::strerror(last_errno)));
}

}  // namespace shmtensor::internal
