// fork() with a live client: neither parent nor child breaks, a child gets
// its own session, and the child's copy of the parent's connection does not
// keep the parent's session alive after the parent dies.
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "client/lease.h"
#include "client/pool_mapping.h"
#include "gtest/gtest.h"
#include "shmtensor/client.h"
#include "tests/test_util.h"

namespace shmtensor {
namespace {

class ForkTest : public testing::DaemonTest {};

TEST_F(ForkTest, ChildConnectsItsOwnSessionAndParentCarriesOn) {
  absl::StatusOr<Buffer> before = client_->Create({.size_bytes = 4096});
  ASSERT_TRUE(before.ok());
  const uint64_t parent_session = client_->session_id();
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    // 1: the inherited client refuses to act for the parent.
    absl::StatusOr<StoreStats> inherited = client_->Stats();
    int result =
        inherited.status().code() == absl::StatusCode::kFailedPrecondition &&
                absl::StrContains(inherited.status().message(), "fork")
            ? 0
            : 1;
    // 2: a new client works and has a session of its own.
    absl::StatusOr<Client> own =
        Client::Connect({.address = daemon_->address()});
    if (!own.ok() || own->session_id() == parent_session) result |= 2;
    if (own.ok()) {
      absl::StatusOr<Buffer> b = own->Create({.size_bytes = 4096});
      if (!b.ok() || !b->Seal().ok()) result |= 4;
      absl::StatusOr<StoreStats> s = own->Stats();
      if (!s.ok() || s->sessions != 2) result |= 8;
    }
    write(pipefd[1], &result, sizeof(result));
    _exit(0);  // Inherited objects are leaked, as in any forked child.
  }
  close(pipefd[1]);
  int result = -1;
  ASSERT_EQ(read(pipefd[0], &result, sizeof(result)), sizeof(result));
  int status;
  waitpid(pid, &status, 0);
  EXPECT_EQ(result, 0);
  EXPECT_TRUE(WIFEXITED(status));
  // The parent's client and buffer are unharmed; the child's session ends
  // with its process (the daemon notices within moments).
  absl::StatusOr<StoreStats> s;
  const absl::Time deadline = absl::Now() + absl::Seconds(1);
  do {
    s = client_->Stats();
    ASSERT_TRUE(s.ok()) << s.status();
  } while (s->sessions != 1 && absl::Now() < deadline);
  EXPECT_EQ(s->sessions, 1u);
  EXPECT_TRUE(before->Seal().ok());
}

// This process's descriptors connected to the daemon's socket.
std::vector<int> SocketsConnectedTo(const std::string& path) {
  std::vector<int> fds;
  for (int fd = 3; fd < 1024; ++fd) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_un peer{};
    socklen_t len = sizeof(peer);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) == 0 &&
        peer.sun_family == AF_UNIX && path == peer.sun_path) {
      fds.push_back(fd);
    }
  }
  return fds;
}

// gRPC's endpoints of the parent's channels live on in a forked child and
// its pollers still read their descriptor numbers now and then. A child
// whose own pipe or socket took such a number would lose bytes to gRPC (a
// multiprocessing consumer would block reading a message). The child's
// inherited connections are gone, and their numbers read end of stream and
// are never handed out again.
TEST_F(ForkTest, ChildNeverReusesTheNumbersOfInheritedConnections) {
  ASSERT_TRUE(client_->Stats().ok());  // The connection is up.
  const std::vector<int> inherited = SocketsConnectedTo(daemon_->socket_path());
  ASSERT_FALSE(inherited.empty());
  int report[2];
  ASSERT_EQ(pipe(report), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    int result = 0;
    // 1: new descriptors never take an inherited connection's number.
    for (int i = 0; i < 8; ++i) {
      int p[2];
      if (pipe(p) != 0) result |= 8;
      for (int fd : p) {
        for (int old : inherited) {
          if (fd == old) result |= 1;
        }
      }
    }
    // 2: the numbers no longer reach the daemon (the parent's session must
    // be able to end with the parent).
    if (!SocketsConnectedTo(daemon_->socket_path()).empty()) result |= 2;
    for (int old : inherited) {
      // 4: reading it is the end of a stream, not a block or someone's data.
      char byte;
      if (recv(old, &byte, 1, MSG_DONTWAIT) != 0) result |= 4;
    }
    write(report[1], &result, sizeof(result));
    _exit(0);
  }
  ASSERT_GT(pid, 0);
  close(report[1]);
  int result = -1;
  ASSERT_EQ(read(report[0], &result, sizeof(result)), sizeof(result));
  close(report[0]);
  int status;
  waitpid(pid, &status, 0);
  EXPECT_EQ(result, 0) << "1: a number reused, 2: still connected, 4: not "
                          "at end of stream, 8: pipe() failed";
  EXPECT_TRUE(client_->Stats().ok());  // The parent's connection is whole.
}

// [P18] The parent's session ends with the parent, although a child it
// forked lives on with its descriptors; the object the child inherited a
// view of stays (a fork hold) until the child is gone too, then goes.
TEST_F(ForkTest, ParentSessionEndsWithTheParentAndItsMemoryWithTheChild) {
  std::unique_ptr<testing::Subprocess> parent = Child({"fork-hold"});
  absl::StatusOr<std::string> line = parent->ReadLine();
  ASSERT_TRUE(line.ok() && absl::StartsWith(*line, "ready ")) << line.status();
  pid_t grandchild = 0;
  ASSERT_TRUE(absl::SimpleAtoi(line->substr(6), &grandchild));
  // The parent's buffer is unsealed, so it counts as stock (a buffer taken
  // from the stock is the stock's until sealed): all used bytes here.
  auto Used = [&] { return client_->Stats()->pools[0].used_bytes; };
  EXPECT_EQ(Used(), 1u << 20);
  EXPECT_EQ(testing::MonitorStatus(daemon_->address()).fork_holds(), 1u);
  parent->Signal(SIGKILL);
  parent->Wait();
  absl::Time deadline = absl::Now() + absl::Seconds(1);
  while (testing::MonitorStatus(daemon_->address()).sessions() != 1 &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(testing::MonitorStatus(daemon_->address()).sessions(), 1u);
  EXPECT_EQ(Used(), 1u << 20);        // The child may still read it.
  EXPECT_EQ(kill(grandchild, 0), 0);  // Still alive, holding its fds.
  kill(grandchild, SIGKILL);
  deadline = absl::Now() + absl::Seconds(1);
  while (Used() != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(Used(), 0u);
  EXPECT_EQ(testing::MonitorStatus(daemon_->address()).fork_holds(), 0u);
}

// fork() while another thread keeps opening and closing writable ranges of
// the pool mapping the child inherits: every child's own client can open
// writable buffers at once (the mapping's locks are held across fork, never
// inherited locked), and the parent's thread carries on. That thread changes
// ranges through the mapping itself and makes no call to the daemon: a fork
// while another thread is inside a gRPC call is gRPC's limit, not this
// mapping's (client/fork_guard.h).
TEST_F(ForkTest, ForkWhileAnotherThreadOpensRangesNeverHangsTheChild) {
  std::vector<Buffer> held;  // Ranges for the thread to close and reopen.
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<Buffer> b = client_->Create({.size_bytes = 8192u << i});
    ASSERT_TRUE(b.ok()) << b.status();
    held.push_back(*std::move(b));
  }
  const internal::Lease& first = *held[0].lease();
  internal::PoolMapping* mapping =
      *first.core().Mapping(first.placement().pool_id());
  std::atomic<bool> stop{false};
  std::atomic<int> lifecycles{0};
  std::thread busy([&] {
    for (int i = 0; !stop.load(); ++i) {
      const v1::Placement& p = held[i % 4].lease()->placement();
      const internal::Access access = (i / 4) % 2 == 0
                                          ? internal::Access::kRead
                                          : internal::Access::kReadWrite;
      if (!mapping->Protect(p.offset(), p.capacity_bytes(), access).ok()) {
        break;
      }
      mapping->MarkExposed(p.offset(), p.capacity_bytes());
      lifecycles.fetch_add(1);
    }
  });
  while (lifecycles.load() == 0) absl::SleepFor(absl::Milliseconds(1));
  for (int k = 0; k < 40; ++k) {
    const pid_t pid = fork();
    if (pid == 0) {
      absl::StatusOr<Client> own =
          Client::Connect({.address = daemon_->address()});
      if (!own.ok()) _exit(2);
      absl::StatusOr<Buffer> b = own->Create({.size_bytes = 65536});
      if (!b.ok()) _exit(3);
      std::memset(b->data(), 2, 65536);
      _exit(b->Seal().ok() ? 0 : 4);
    }
    ASSERT_GT(pid, 0);
    int status = 0;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (absl::Now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        ADD_FAILURE() << "forked child " << k << " hung";
        break;
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "child " << k << " status " << status;
  }
  const int before = lifecycles.load();
  absl::SleepFor(absl::Milliseconds(50));
  stop.store(true);
  busy.join();
  EXPECT_GT(lifecycles.load(), before);  // The parent's thread carried on.
}

}  // namespace
}  // namespace shmtensor
