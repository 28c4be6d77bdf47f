#include "daemon/os/peer.h"

#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "gtest/gtest.h"

namespace shmtensor::daemon {
namespace {

TEST(PeerTest, CredentialsComeFromTheKernelNotTheCaller) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  absl::StatusOr<PeerCredentials> c = ReadPeerCredentials(a.get());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->pid, getpid());
  EXPECT_EQ(c->uid, getuid());
  EXPECT_EQ(c->gid, getgid());
  EXPECT_FALSE(ReadPeerCredentials(-1).ok());
}

TEST(PeerTest, PidfdSaysWhenThePeerProcessExits) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  const pid_t child = fork();
  if (child == 0) {
    close(sv[0]);
    close(go[1]);  // Else its own copy keeps the pipe open.
    // Connect-time credentials of a socketpair are its creator's, so the
    // child makes a connection of its own: it passes its end to the parent
    // through the pair and waits.
    int own[2];
    socketpair(AF_UNIX, SOCK_STREAM, 0, own);
    char cmsgbuf[CMSG_SPACE(sizeof(int))] = {};
    char byte = 0;
    iovec iov{&byte, 1};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsgbuf;
    msg.msg_controllen = sizeof(cmsgbuf);
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &own[0], sizeof(int));
    sendmsg(sv[1], &msg, 0);
    char c;
    read(go[0], &c, 1);
    _exit(0);
  }
  close(sv[1]);
  close(go[0]);
  char cmsgbuf[CMSG_SPACE(sizeof(int))] = {};
  char byte;
  iovec iov{&byte, 1};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = cmsgbuf;
  msg.msg_controllen = sizeof(cmsgbuf);
  ASSERT_EQ(recvmsg(sv[0], &msg, 0), 1);
  int fd;
  memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&msg)), sizeof(int));
  UniqueFd theirs(fd);
  absl::StatusOr<PeerCredentials> c = ReadPeerCredentials(theirs.get());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->pid, child);
  absl::StatusOr<UniqueFd> pidfd = OpenPeerPidfd(theirs.get(), c->pid);
  ASSERT_TRUE(pidfd.ok()) << pidfd.status();
  EXPECT_FALSE(ProcessExited(pidfd->get()));
  close(go[1]);  // Lets the child exit.
  int status;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(ProcessExited(pidfd->get()));
  close(sv[0]);
}

TEST(PeerTest, PidfdOfAProcessAndOfNone) {
  absl::StatusOr<UniqueFd> mine = OpenPidfd(getpid());
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_FALSE(ProcessExited(mine->get()));
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int status;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  // Reaped: no such process (unless the pid was given out again at once).
  absl::StatusOr<UniqueFd> gone = OpenPidfd(child);
  if (!gone.ok()) {
    EXPECT_TRUE(absl::IsNotFound(gone.status())) << gone.status();
    EXPECT_NE(gone.status().message().find("pidfd_open("), std::string::npos);
  }
  EXPECT_FALSE(OpenPidfd(-1).ok());
}

// [P20] A pid alone does not name a process: with its start time it does.
TEST(PeerTest, StartTimeTellsAProcessFromALaterOneWithItsPid) {
  absl::StatusOr<uint64_t> mine = ProcessStartTime(getpid());
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(*ProcessStartTime(getpid()), *mine);  // Stable.
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  const pid_t child = fork();
  if (child == 0) {
    // A name with spaces and parentheses: the stat line's fields are
    // counted after the last ')'.
    prctl(PR_SET_NAME, "a) b (c", 0, 0, 0);
    close(go[1]);
    char c;
    (void)!read(go[0], &c, 1);
    _exit(0);
  }
  close(go[0]);
  usleep(20000);  // A tick (10 ms) or more after this process started.
  absl::StatusOr<uint64_t> theirs = ProcessStartTime(child);
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  EXPECT_GE(*theirs, *mine);
  const PeerCredentials peer{child, getuid(), getgid(), {}};
  absl::StatusOr<UniqueFd> pidfd = OpenPidfd(child);
  ASSERT_TRUE(pidfd.ok());
  absl::StatusOr<OwnerKey> key = IdentifyPeer(peer, pidfd->get(), 7);
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(*key, (OwnerKey{getuid(), child, *theirs}));
  EXPECT_FALSE(SameProcess(*key, OwnerKey{getuid(), child, *theirs + 1}));
  EXPECT_FALSE(SameProcess(*key, OwnerKey{getuid() + 1, child, *theirs}));
  close(go[1]);
  while (!ProcessExited(pidfd->get())) usleep(1000);
  // Exited (a zombie, its /proc entry still there): what its pid says is of
  // no use for it.
  EXPECT_EQ(IdentifyPeer(peer, pidfd->get(), 7).status().code(),
            absl::StatusCode::kFailedPrecondition);
  int status;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_FALSE(IdentifyPeer(peer, pidfd->get(), 7).ok());
  EXPECT_TRUE(absl::IsNotFound(ProcessStartTime(1 << 30).status()));
  EXPECT_FALSE(ProcessStartTime(0).ok());
}

TEST(PeerTest, AProcessTheDaemonCannotSeeIsOwnedByItsConnection) {
  const PeerCredentials unseen{0, 1000, 1000, {}};
  const OwnerKey a = OwnerOf(unseen, 0, 1), b = OwnerOf(unseen, 0, 2);
  EXPECT_NE(a, b);  // Another connection: another owner.
  // On the descriptor socket the uid (and the secret) decide.
  EXPECT_TRUE(SameProcess(a, b));
  EXPECT_FALSE(SameProcess(a, OwnerOf({0, 1001, 1001, {}}, 0, 1)));
}

TEST(PeerTest, CommandLineOfAVisibleProcess) {
  EXPECT_NE(CommandLineOf(getpid()).find("peer_test"), std::string::npos);
  EXPECT_EQ(CommandLineOf(0), "");
  EXPECT_EQ(CommandLineOf(1 << 30), "");  // No such pid.
}

}  // namespace
}  // namespace shmtensor::daemon
