#include "client/fork_guard.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grpc/fork.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <set>

#include "absl/synchronization/mutex.h"

namespace shmtensor::internal {
namespace {

// The registry is locked across fork() (prepare .. parent/child), so the
// child never sees it half-updated or locked by a thread that is gone.
std::mutex& RegistryMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::atomic<uint64_t> fork_generation{0};
std::atomic<uint64_t> forks_made{0};

std::set<std::string>& SocketPaths() {
  static auto* paths = new std::set<std::string>();
  return *paths;
}

// An inherited connection to a daemon: its descriptor number and the socket
// it was in the parent.
struct DaemonSocket {
  int fd;
  dev_t dev;
  ino_t ino;
};

// Filled by Prepare in the parent (the registry lock held), read by Child,
// which allocates nothing.
constexpr int kMaxDaemonSockets = 64;
DaemonSocket daemon_sockets[kMaxDaemonSockets];
int daemon_socket_count = 0;

// The process's sockets connected to a registered daemon path.
void FindDaemonSockets() {
  daemon_socket_count = 0;
  const std::set<std::string>& paths = SocketPaths();
  if (paths.empty()) return;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return;
  const int dir_fd = dirfd(dir);
  while (dirent* e = readdir(dir)) {
    const int fd = atoi(e->d_name);
    if (fd <= 2 || fd == dir_fd) continue;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_un peer{};
    socklen_t len = sizeof(peer);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0 ||
        peer.sun_family != AF_UNIX || !paths.count(peer.sun_path)) {
      continue;
    }
    if (daemon_socket_count == kMaxDaemonSockets) break;
    daemon_sockets[daemon_socket_count++] = {fd, st.st_dev, st.st_ino};
  }
  closedir(dir);
}

void Prepare() {
  forks_made.fetch_add(1, std::memory_order_relaxed);
  RegistryMutex().lock();
  FindDaemonSockets();
}

void Parent() { RegistryMutex().unlock(); }

// In the child, after gRPC's own handler. The inherited connections must
// go (a child that outlives its parent would otherwise keep the parent's
// session alive), but their descriptor numbers must not be reused: gRPC's
// endpoints of the parent's channels keep the numbers (gRPC's fork handler
// closes the descriptors but not the numbers its endpoints read from), and
// its pollers still read them now and then. A pipe or socket the child opens
// later on such a number (a multiprocessing queue, torch's descriptor
// passing) would lose bytes to gRPC: a consumer would block reading a
// message gRPC had read. So each number is made a socket whose peer is gone:
// the connection's last reference in the child goes, gRPC reads end of
// stream there, and nothing else ever gets the number.
void Child() {
  fork_generation.fetch_add(1, std::memory_order_relaxed);
  int pair[2] = {-1, -1};
  if (daemon_socket_count > 0 &&
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0) {
    close(pair[1]);
  }
  for (int i = 0; i < daemon_socket_count; ++i) {
    const DaemonSocket& d = daemon_sockets[i];
    struct stat st;
    const bool closed = fstat(d.fd, &st) != 0 && errno == EBADF;
    const bool still_it = !closed && st.st_dev == d.dev && st.st_ino == d.ino;
    // Never a number something else opened since (gRPC's child handler
    // opens descriptors of its own).
    if (!closed && !still_it) continue;
    if (pair[0] >= 0) {
      dup3(pair[0], d.fd, O_CLOEXEC);
    } else if (still_it) {
      close(d.fd);  // No descriptor to spare: at least let the parent go.
    }
  }
  if (pair[0] >= 0) close(pair[0]);
  RegistryMutex().unlock();
}

}  // namespace

void EnableForkSupport() {
  static std::once_flag once;
  std::call_once(once, [] {
    // gRPC reads these once, when it initialises; a user's setting wins.
    setenv("GRPC_ENABLE_FORK_SUPPORT", "1", /*overwrite=*/0);
    // With epoll, parent and child share one kernel epoll instance across
    // fork(), and a child's poller would take the parent's events and break
    // the parent's session. poll() keeps no kernel state; its cost grows
    // with the descriptors it watches, and a client watches one or two
    // connections.
    setenv("GRPC_POLL_STRATEGY", "poll", /*overwrite=*/0);
    // Debian builds Abseil without NDEBUG, so every absl::Mutex operation
    // (gRPC's included) takes one process-wide spin lock guarding the
    // debug lock-order graph, and no fork handler can hold it across fork():
    // a child forked while another thread holds it may hang in its first
    // absl::Mutex (docs/design.md, "Notes"). Off, the graph and its lock are
    // never touched. It is a debugging aid that release builds of Abseil
    // leave off anyway.
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
    pthread_atfork(grpc_prefork, grpc_postfork_parent, grpc_postfork_child);
    // Registered after gRPC's: runs before it in the prepare phase and after
    // it in the child.
    pthread_atfork(Prepare, Parent, Child);
  });
}

void RegisterDaemonAddress(const std::string& address) {
  if (address.rfind("unix:", 0) != 0) return;
  std::string path = address.substr(5);
  if (path.rfind("//", 0) == 0) path = path.substr(2);
  std::lock_guard<std::mutex> lock(RegistryMutex());
  SocketPaths().insert(path);
}

uint64_t ForksMade() { return forks_made.load(std::memory_order_relaxed); }

uint64_t ForkGeneration() {
  return fork_generation.load(std::memory_order_relaxed);
}

}  // namespace shmtensor::internal
