// The daemon: pools, the object store and the gRPC server, wired together.
//
// Start() does everything that can fail, in order: checks the socket's
// directory (made 0700 if missing; it must be the daemon user's or root's and
// writable by nobody else, so no other user can take the address or replace
// the socket), takes the address lock in it (so a second daemon on the same
// address is refused), resolves each pool's users and groups, creates and
// reserves the pools (unnamed memory: nothing to clean up after a crash,
// host_segment.h), and starts serving ObjectStore, Monitor, gRPC health and
// reflection on the socket (accepted by the daemon itself, unix_listener.h;
// and, when configured, monitoring on a TCP address) and the pools'
// descriptors on "<socket>.fd" (descriptor_server.h).
// Shutdown() turns health to NOT_SERVING, stops accepting, ends every session
// and watch, and (in the destructor) closes every pool, unlinks both sockets
// and, last, the lock file (<socket>.lock, holding the pid). A daemon that
// dies without cleaning up leaves the sockets and the unlocked lock file; the
// next one on the address takes them over.
//
// Thread safety: Shutdown() may be called from any thread, once.
#ifndef SHMTENSOR_DAEMON_DAEMON_H_
#define SHMTENSOR_DAEMON_DAEMON_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/config.h"
#include "daemon/server/connections.h"
#include "daemon/server/descriptor_server.h"
#include "daemon/server/monitor_service.h"
#include "daemon/server/service.h"
#include "daemon/server/unix_listener.h"
#include "daemon/store/object_store.h"

namespace shmtensor::daemon {

class Daemon {
 public:
  // Validates `config` and starts serving. FAILED_PRECONDITION when another
  // daemon holds the address, RESOURCE_EXHAUSTED when memory cannot hold
  // the pools, UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(
      const DaemonConfig& config);

  // Shuts down if not done yet, then closes the pools and unlinks the
  // sockets and the lock file.
  ~Daemon();

  // Not copyable or movable: the gRPC server points into it.
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Stops accepting calls, fails waiting calls with UNAVAILABLE, ends every
  // session stream and waits for in-flight calls (at most ~2 s).
  void Shutdown();

  const std::string& address() const { return address_; }
  ObjectStore& store() { return *store_; }

 private:
  Daemon() = default;
  // Every 200 ms until Shutdown: ends the detached sessions of processes
  // that exited, forgets connections gRPC closed.
  void ReapLoop();

  std::string address_;
  std::string socket_path_;  // Empty unless address is "unix:".
  std::string descriptor_path_;
  std::string lock_path_;
  int lock_fd_ = -1;
  bool owns_address_ = false;  // This instance holds the address lock.
  // Start made the socket's directory, or it is the daemon's own
  // (DaemonConfig::owns_socket_directory): removed at exit.
  bool created_directory_ = false;
  std::unique_ptr<ObjectStore> store_;
  std::unique_ptr<ConnectionTable> connections_;
  std::unique_ptr<UnixListener> listener_;
  std::unique_ptr<DescriptorServer> descriptors_;
  std::unique_ptr<ObjectStoreService> service_;
  std::unique_ptr<MonitorService> monitor_;
  std::unique_ptr<grpc::Server> server_;
  bool shut_down_ = false;
  absl::Mutex reaper_mu_;
  bool stopping_ ABSL_GUARDED_BY(reaper_mu_) = false;
  std::thread reaper_;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_DAEMON_H_
