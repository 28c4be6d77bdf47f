#include "daemon/os/sd_daemon.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace shmtensor::daemon {
namespace {

// A datagram socket standing in for systemd's $NOTIFY_SOCKET.
class NotifySocket {
 public:
  NotifySocket() {
    path_ = absl::StrCat(testing::TempDir(), "/notify-", getpid());
    unlink(path_.c_str());
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    setenv("NOTIFY_SOCKET", path_.c_str(), 1);
  }
  ~NotifySocket() {
    unsetenv("NOTIFY_SOCKET");
    close(fd_);
    unlink(path_.c_str());
  }
  // One datagram: its text, and the descriptors it carried (owned).
  std::string Receive(std::vector<int>* fds) {
    char buf[4096];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
    iovec iov{buf, sizeof(buf)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(fd_, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) return "";
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds->push_back(fd);
      }
    }
    return std::string(buf, n);
  }

 private:
  std::string path_;
  int fd_ = -1;
};

TEST(NotifyTest, UnsetSocketTellsNothing) {
  unsetenv("NOTIFY_SOCKET");
  absl::StatusOr<bool> sent = Notify("READY=1");
  ASSERT_TRUE(sent.ok());
  EXPECT_FALSE(*sent);
}

TEST(NotifyTest, SendsStateAndDescriptors) {
  NotifySocket systemd;
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  absl::StatusOr<bool> sent =
      Notify("FDSTORE=1\nFDNAME=shmtensor.ledger", {p[1]});
  ASSERT_TRUE(sent.ok()) << sent.status();
  EXPECT_TRUE(*sent);
  std::vector<int> fds;
  EXPECT_EQ(systemd.Receive(&fds), "FDSTORE=1\nFDNAME=shmtensor.ledger");
  ASSERT_EQ(fds.size(), 1u);
  // The descriptor received is the pipe's write end.
  ASSERT_EQ(write(fds[0], "x", 1), 1);
  char c = 0;
  ASSERT_EQ(read(p[0], &c, 1), 1);
  EXPECT_EQ(c, 'x');
  close(fds[0]);
  close(p[0]);
  close(p[1]);
}

TEST(NotifyTest, RefusesABadSocketAddress) {
  setenv("NOTIFY_SOCKET", "relative/path", 1);
  EXPECT_FALSE(Notify("READY=1").ok());
  unsetenv("NOTIFY_SOCKET");
}

TEST(FdNameTest, FollowsSystemdRules) {
  EXPECT_TRUE(ValidFdName("shmtensor.pool.default"));
  EXPECT_FALSE(ValidFdName(""));
  EXPECT_FALSE(ValidFdName("a:b"));
  EXPECT_FALSE(ValidFdName(std::string(256, 'a')));
  EXPECT_FALSE(ValidFdName("tab\there"));
}

TEST(ListenFdsTest, AnotherProcessesVariablesAreIgnoredAndCleared) {
  setenv("LISTEN_PID", "1", 1);
  setenv("LISTEN_FDS", "2", 1);
  absl::StatusOr<std::vector<NamedFd>> fds = TakeListenFds();
  ASSERT_TRUE(fds.ok());
  EXPECT_TRUE(fds->empty());
  EXPECT_EQ(getenv("LISTEN_FDS"), nullptr);
}

TEST(ListenFdsTest, RoundTripThroughTheExecVariables) {
  // In a child: the descriptors move to 3 and 4 as an exec would see them.
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::vector<NamedFd> out;
    out.push_back({"shmtensor.listen", UniqueFd(dup(p[1]))});
    out.push_back({"shmtensor.ledger", UniqueFd(dup(p[1]))});
    if (!PrepareListenFdsForExec(out).ok()) _exit(10);
    out.clear();
    if ((fcntl(3, F_GETFD) & FD_CLOEXEC) != 0) _exit(11);  // Survives exec.
    absl::StatusOr<std::vector<NamedFd>> got = TakeListenFds();
    if (!got.ok() || got->size() != 2) _exit(12);
    if ((*got)[0].name != "shmtensor.listen" ||
        (*got)[1].name != "shmtensor.ledger") {
      _exit(13);
    }
    if ((*got)[0].fd.get() != 3 || (*got)[1].fd.get() != 4) _exit(14);
    if ((fcntl(3, F_GETFD) & FD_CLOEXEC) == 0) _exit(15);  // Taken: cloexec.
    if (write(4, "y", 1) != 1) _exit(16);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  char c = 0;
  ASSERT_EQ(read(p[0], &c, 1), 1);
  EXPECT_EQ(c, 'y');
  close(p[0]);
  close(p[1]);
}

}  // namespace
}  // namespace shmtensor::daemon
