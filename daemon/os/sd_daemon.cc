#include "daemon/os/sd_daemon.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace shmtensor::daemon {
namespace {

constexpr int kFirstFd = 3;            // SD_LISTEN_FDS_START
constexpr size_t kMaxNotifyFds = 253;  // SCM_MAX_FD

}  // namespace

bool ValidFdName(absl::string_view name) {
  if (name.empty() || name.size() > 255) return false;
  for (char c : name) {
    if (c < 0x20 || c > 0x7e || c == ':') return false;
  }
  return true;
}

absl::StatusOr<bool> Notify(absl::string_view state,
                            const std::vector<int>& fds) {
  const char* path = getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return false;
  if (fds.size() > kMaxNotifyFds) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d descriptors in one notification; at most %d",
                        fds.size(), kMaxNotifyFds));
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t len = strlen(path);
  if ((path[0] != '/' && path[0] != '@') || len >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("NOTIFY_SOCKET '%s' is not a socket address",
                        absl::string_view(path).substr(0, 128)));
  }
  memcpy(addr.sun_path, path, len);
  if (path[0] == '@') addr.sun_path[0] = '\0';
  const socklen_t addr_len =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len);
  UniqueFd sock(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) {
    return absl::InternalError(
        absl::StrFormat("notify: socket: %s", std::strerror(errno)));
  }
  iovec iov{const_cast<char*>(state.data()), state.size()};
  msghdr msg{};
  msg.msg_name = &addr;
  msg.msg_namelen = addr_len;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (!fds.empty()) {
    control.resize(CMSG_SPACE(sizeof(int) * fds.size()));
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t sent;
  do {
    sent = sendmsg(sock.get(), &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent < 0) {
    return absl::InternalError(
        absl::StrFormat("notify %s: %s", path, std::strerror(errno)));
  }
  return true;
}

absl::StatusOr<std::vector<NamedFd>> TakeListenFds() {
  const char* pid_env = getenv("LISTEN_PID");
  const char* fds_env = getenv("LISTEN_FDS");
  const char* names_env = getenv("LISTEN_FDNAMES");
  const std::string names_text = names_env == nullptr ? "" : names_env;
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
  std::vector<NamedFd> out;
  if (pid_env == nullptr || fds_env == nullptr) return out;
  int pid = 0;
  int count = 0;
  if (!absl::SimpleAtoi(pid_env, &pid)) {
    return absl::InvalidArgumentError("LISTEN_PID is not a number");
  }
  if (pid != getpid()) return out;  // Meant for another process.
  if (!absl::SimpleAtoi(fds_env, &count) || count < 0 || count > 4096) {
    return absl::InvalidArgumentError("LISTEN_FDS is not a count");
  }
  std::vector<std::string> names;
  if (!names_text.empty()) names = absl::StrSplit(names_text, ':');
  for (int i = 0; i < count; ++i) {
    const int fd = kFirstFd + i;
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "LISTEN_FDS says %d descriptors, and %d is not open", count, fd));
    }
    out.push_back({i < static_cast<int>(names.size()) ? names[i] : "unknown",
                   UniqueFd(fd)});
  }
  return out;
}

absl::Status PrepareListenFdsForExec(const std::vector<NamedFd>& fds) {
  // Out of the way first (a descriptor may already sit where another goes),
  // then into place.
  std::vector<int> high;
  for (const NamedFd& f : fds) {
    const int d = fcntl(f.fd.get(), F_DUPFD_CLOEXEC, 1024);
    if (d < 0) {
      return absl::InternalError(
          absl::StrFormat("dup for exec: %s", std::strerror(errno)));
    }
    high.push_back(d);
  }
  std::vector<std::string> names;
  for (size_t i = 0; i < high.size(); ++i) {
    const int target = kFirstFd + static_cast<int>(i);
    if (dup2(high[i], target) < 0) {  // dup2 clears close-on-exec.
      return absl::InternalError(
          absl::StrFormat("dup2 for exec: %s", std::strerror(errno)));
    }
    close(high[i]);
    names.push_back(fds[i].name);
  }
  setenv("LISTEN_FDS", absl::StrCat(fds.size()).c_str(), 1);
  setenv("LISTEN_PID", absl::StrCat(getpid()).c_str(), 1);
  setenv("LISTEN_FDNAMES", absl::StrJoin(names, ":").c_str(), 1);
  return absl::OkStatus();
}

}  // namespace shmtensor::daemon
