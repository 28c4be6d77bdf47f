#include "client/fork_guard.h"

#include <dirent.h>
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

std::set<std::string>& SocketPaths() {
  static auto* paths = new std::set<std::string>();
  return *paths;
}

void Prepare() { RegistryMutex().lock(); }
void Parent() { RegistryMutex().unlock(); }

void Child() {
  fork_generation.fetch_add(1, std::memory_order_relaxed);
  const std::set<std::string>& paths = SocketPaths();
  if (!paths.empty()) {
    if (DIR* dir = opendir("/proc/self/fd")) {
      const int dir_fd = dirfd(dir);
      while (dirent* e = readdir(dir)) {
        const int fd = atoi(e->d_name);
        if (fd <= 2 || fd == dir_fd) continue;
        struct stat st;
        if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
        sockaddr_un peer{};
        socklen_t len = sizeof(peer);
        if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0 ||
            peer.sun_family != AF_UNIX) {
          continue;
        }
        // close(), never shutdown(): the parent shares the connection.
        if (paths.count(peer.sun_path)) close(fd);
      }
      closedir(dir);
    }
  }
  RegistryMutex().unlock();
}

}  // namespace

void EnableForkSupport() {
  static std::once_flag once;
  std::call_once(once, [] {
    // gRPC reads these once, when it initialises; a user's setting wins.
    setenv("GRPC_ENABLE_FORK_SUPPORT", "1", /*overwrite=*/0);
    // With epoll, parent and child share one kernel epoll instance across
    // fork(), and a child's poller steals the parent's events (seen: the
    // parent's session broke as soon as a forked child used gRPC). poll()
    // keeps no kernel state; for a client's one or two connections it costs
    // nothing measurable.
    setenv("GRPC_POLL_STRATEGY", "poll", /*overwrite=*/0);
    // Debian builds Abseil without NDEBUG, so every absl::Mutex operation
    // (gRPC's included) takes one process-wide spin lock guarding the
    // debug lock-order graph, and no fork handler can hold it across fork():
    // a child forked while another thread held it hung in its first
    // absl::Mutex (seen in ForkTest: grpc_init in the child's Connect, 2 of
    // 31 runs). Off, the graph and its lock are never touched. It is
    // a debugging aid that release builds of Abseil leave off anyway.
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

uint64_t ForkGeneration() {
  return fork_generation.load(std::memory_order_relaxed);
}

}  // namespace shmtensor::internal
