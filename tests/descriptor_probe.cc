#include "tests/descriptor_probe.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace shmtensor::testing {

absl::StatusOr<std::unique_ptr<RawSession>> OpenRawSession(
    const std::string& address, bool read_only) {
  auto s = std::make_unique<RawSession>();
  s->channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  s->stub = v1::ObjectStore::NewStub(s->channel);
  s->ctx = std::make_unique<grpc::ClientContext>();
  s->stream = s->stub->Session(s->ctx.get());
  v1::SessionRequest open;
  open.mutable_open()->set_client_name("raw");
  open.mutable_open()->set_read_only(read_only);
  v1::SessionEvent event;
  if (!s->stream->Write(open) || !s->stream->Read(&event) ||
      !event.has_opened()) {
    const grpc::Status st = s->stream->Finish();
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                        st.error_message());
  }
  s->opened = event.opened();
  return s;
}

int ConnectDescriptorSocket(const std::string& socket_path) {
  const std::string path = socket_path + ".fd";
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string DescriptorRequestBytes(uint64_t session_id,
                                   const std::string& secret) {
  v1::DescriptorRequest r;
  r.set_session_id(session_id);
  r.set_secret(secret);
  return r.SerializeAsString();
}

absl::StatusOr<DescriptorAnswer> ReadAnswer(int fd, int timeout_ms) {
  DescriptorAnswer answer;
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) {
    return absl::DeadlineExceededError("no answer");
  }
  char buf[4096];
  char control[CMSG_SPACE(sizeof(int) * 64)];
  iovec iov{buf, sizeof(buf)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); n >= 0 && c != nullptr;
       c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int got;
      memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      answer.access_modes.push_back(fcntl(got, F_GETFL) & O_ACCMODE);
      close(got);
    }
  }
  if (n > 0) {
    v1::DescriptorReply reply;
    if (reply.ParseFromArray(buf, static_cast<int>(n))) {
      answer.replied = true;
      answer.code = reply.code();
      answer.message = reply.message();
    }
  }
  return answer;
}

bool SendWithDescriptors(int fd, const std::string& bytes,
                         const std::vector<int>& fds) {
  std::string data = bytes;
  iovec iov{data.data(), data.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  return sendmsg(fd, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
}

absl::StatusOr<DescriptorAnswer> AskDescriptors(const std::string& socket_path,
                                                const std::string& bytes,
                                                int timeout_ms) {
  const int fd = ConnectDescriptorSocket(socket_path);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("connect ", socket_path, ".fd: ", std::strerror(errno)));
  }
  if (!bytes.empty() && !SendWithDescriptors(fd, bytes, {})) {
    const int e = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("send: ", std::strerror(e)));
  }
  absl::StatusOr<DescriptorAnswer> answer = ReadAnswer(fd, timeout_ms);
  close(fd);
  return answer;
}

}  // namespace shmtensor::testing
