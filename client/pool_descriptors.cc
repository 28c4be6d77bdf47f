#include "client/pool_descriptors.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "client/daemon_socket.h"
#include "shmtensor/defaults.h"

namespace shmtensor::internal {
namespace {

// Most descriptors one reply may carry.
constexpr size_t kMaxDescriptors = kMaxPools;

void CloseAll(const std::vector<int>& fds) {
  for (int fd : fds) close(fd);
}

// Connects to the descriptor socket beside `socket_path`, sends `request`
// and reads the reply, with the descriptors attached to it (close-on-exec,
// the caller's). Returns the connection (the caller's to close).
absl::StatusOr<int> Exchange(const std::string& socket_path,
                             const v1::DescriptorRequest& request,
                             absl::Time deadline,
                             std::optional<uid_t> daemon_uid,
                             v1::DescriptorReply* reply,
                             std::vector<int>* fds) {
  const std::string path = socket_path + kDescriptorSocketSuffix;
  absl::StatusOr<int> sock =
      ConnectDaemonSocket(path, deadline, daemon_uid, SOCK_SEQPACKET);
  if (!sock.ok()) return sock.status();
  const int fd = *sock;
  const std::string bytes = request.SerializeAsString();
  if (send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(bytes.size())) {
    const int e = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrFormat("sending the descriptor request on unix:%s: %s", path,
                        std::strerror(e)));
  }
  char buf[4096];
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxDescriptors));
  iovec iov{buf, sizeof(buf)};
  msghdr msg{};
  ssize_t n = -1;
  while (true) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 ||
        poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 60000))) == 0) {
      close(fd);
      return absl::UnavailableError(absl::StrFormat(
          "no answer to the descriptor request on unix:%s in time", path));
    }
    msg = msghdr{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n >= 0 || (errno != EAGAIN && errno != EINTR)) break;
  }
  const int recv_errno = errno;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); n >= 0 && c != nullptr;
       c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const size_t at = fds->size();
    fds->resize(at + count);
    memcpy(fds->data() + at, CMSG_DATA(c), count * sizeof(int));
  }
  if (n < 0) {
    close(fd);
    return absl::UnavailableError(
        absl::StrFormat("reading the descriptor reply on unix:%s: %s", path,
                        std::strerror(recv_errno)));
  }
  // A reply is never empty (DescriptorReply.granted, or a code): zero bytes
  // is the daemon closing the connection.
  if (n == 0 || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 ||
      !reply->ParseFromArray(buf, static_cast<int>(n))) {
    close(fd);
    CloseAll(*fds);
    return absl::InternalError(absl::StrFormat(
        "the daemon's descriptor reply on unix:%s (%d bytes) is malformed",
        path, n));
  }
  return fd;
}

// Sends `request` and returns the descriptors of a granted reply (the
// caller's), the reply in *reply; the daemon's refusal as its code and
// message after `refused`, every descriptor received closed. Errors as
// Exchange.
absl::StatusOr<std::vector<int>> Ask(const std::string& socket_path,
                                     const v1::DescriptorRequest& request,
                                     absl::Time deadline,
                                     std::optional<uid_t> daemon_uid,
                                     absl::string_view refused,
                                     v1::DescriptorReply* reply) {
  std::vector<int> fds;
  absl::StatusOr<int> conn =
      Exchange(socket_path, request, deadline, daemon_uid, reply, &fds);
  if (!conn.ok()) return conn.status();
  close(*conn);
  if (reply->code() != 0 || !reply->granted()) {
    CloseAll(fds);
    return absl::Status(
        reply->code() != 0 ? static_cast<absl::StatusCode>(reply->code())
                           : absl::StatusCode::kInternal,
        absl::StrCat(refused, reply->message().substr(0, 1024)));
  }
  return fds;
}

}  // namespace

absl::StatusOr<int> TakeForkHold(const std::string& socket_path,
                                 uint64_t session_id, const std::string& secret,
                                 absl::Time deadline,
                                 std::optional<uid_t> daemon_uid) {
  v1::DescriptorRequest request;
  request.set_session_id(session_id);
  request.set_secret(secret);
  request.set_fork_hold(true);
  v1::DescriptorReply reply;
  std::vector<int> fds;
  absl::StatusOr<int> conn =
      Exchange(socket_path, request, deadline, daemon_uid, &reply, &fds);
  if (!conn.ok()) return conn.status();
  CloseAll(fds);  // A hold's reply carries none.
  if (reply.code() != 0 || !reply.granted()) {
    close(*conn);
    return absl::Status(reply.code() != 0
                            ? static_cast<absl::StatusCode>(reply.code())
                            : absl::StatusCode::kInternal,
                        absl::StrCat("shmtensord refused a fork hold: ",
                                     reply.message().substr(0, 1024)));
  }
  return *conn;
}

absl::StatusOr<int> FetchReleaseRing(const std::string& socket_path,
                                     uint64_t session_id,
                                     const std::string& secret,
                                     absl::Time deadline,
                                     std::optional<uid_t> daemon_uid) {
  v1::DescriptorRequest request;
  request.set_session_id(session_id);
  request.set_secret(secret);
  request.set_release_ring_only(true);
  v1::DescriptorReply reply;
  absl::StatusOr<std::vector<int>> got =
      Ask(socket_path, request, deadline, daemon_uid,
          "shmtensord refused a release ring: ", &reply);
  if (!got.ok()) return got.status();
  std::vector<int>& fds = *got;
  struct stat st;
  const int flags = fds.size() == 1 ? fcntl(fds[0], F_GETFL) : -1;
  if (!reply.release_ring() || reply.pool_ids_size() != 0 || fds.size() != 1 ||
      fstat(fds[0], &st) != 0 || !S_ISREG(st.st_mode) || flags < 0 ||
      (flags & O_ACCMODE) != O_RDWR) {
    CloseAll(fds);
    return absl::InternalError(absl::StrFormat(
        "the daemon's reply to a release ring request names %d pools%s and "
        "carries %d descriptors, not one ring opened read-write",
        reply.pool_ids_size(), reply.release_ring() ? " and a ring" : "",
        fds.size()));
  }
  return fds[0];
}

absl::StatusOr<SessionDescriptors> FetchPoolDescriptors(
    const std::string& socket_path, uint64_t session_id,
    const std::string& secret, absl::Time deadline,
    std::optional<uid_t> daemon_uid) {
  v1::DescriptorRequest request;
  request.set_session_id(session_id);
  request.set_secret(secret);
  v1::DescriptorReply reply;
  absl::StatusOr<std::vector<int>> got =
      Ask(socket_path, request, deadline, daemon_uid,
          "shmtensord refused this process the pools' descriptors: ", &reply);
  if (!got.ok()) return got.status();
  std::vector<int>& fds = *got;
  const bool ring = reply.release_ring() && !fds.empty();
  const size_t pools = fds.size() - (ring ? 1 : 0);
  if (ring != reply.release_ring() ||
      static_cast<size_t>(reply.pool_ids_size()) != pools ||
      reply.access_size() != reply.pool_ids_size()) {
    CloseAll(fds);
    return absl::InternalError(absl::StrFormat(
        "the daemon's descriptor reply names %d pools%s but carries %d "
        "descriptors",
        reply.pool_ids_size(), reply.release_ring() ? " and a ring" : "",
        fds.size()));
  }
  SessionDescriptors out;
  for (size_t i = 0; i < fds.size(); ++i) {
    struct stat st;
    const int flags = fcntl(fds[i], F_GETFL);
    const int want =
        (ring && i == pools) || reply.access(i) == v1::POOL_ACCESS_READ_WRITE
            ? O_RDWR
            : O_RDONLY;
    if (fstat(fds[i], &st) != 0 || !S_ISREG(st.st_mode) || flags < 0 ||
        (flags & O_ACCMODE) != want) {
      CloseAll(fds);
      return absl::InternalError(absl::StrFormat(
          "descriptor %d of the daemon's reply is not a pool opened for "
          "its access",
          i));
    }
    if (ring && i == pools) {
      out.release_ring = fds[i];
    } else {
      out.pools.push_back({reply.pool_ids(i), reply.access(i), fds[i]});
    }
  }
  return out;
}

}  // namespace shmtensor::internal
