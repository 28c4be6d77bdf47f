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
// A daemon may be succeeded without its clients noticing (docs/operations.md,
// "Restarts"): it keeps what a successor needs in a ledger (ledger.h), and
// hands it, its pools and its listening sockets over as named descriptors
// (kLedgerFdName ...): to systemd's file descriptor store as it starts
// (FDSTORE=1, when $NOTIFY_SOCKET is set), so that a restart after a crash
// gets them back as $LISTEN_FDS; to a new image of itself on SIGHUP
// (ReExec); or to a successor that asks over the descriptor socket
// (shmtensord --take-over, RequestTakeOver). Start adopts what it is given
// when the ledger checks out, else starts fresh and says why in one line.
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
#include "daemon/os/sd_daemon.h"
#include "daemon/server/connections.h"
#include "daemon/server/descriptor_server.h"
#include "daemon/server/monitor_service.h"
#include "daemon/server/service.h"
#include "daemon/server/unix_listener.h"
#include "daemon/store/object_store.h"

namespace shmtensor::daemon {

// Names of the descriptors a daemon hands over (FDNAME=).
inline constexpr char kLedgerFdName[] = "shmtensor.ledger";
inline constexpr char kPoolFdPrefix[] = "shmtensor.pool.";
inline constexpr char kListenFdName[] = "shmtensor.listen";
inline constexpr char kDescriptorListenFdName[] = "shmtensor.listen.fd";
// Most descriptors a take-over hands over in all (as many as the systemd
// unit's FileDescriptorStoreMax=).
inline constexpr size_t kMaxTakeOverFds = 4096;

struct StartOptions {
  // What a predecessor left: adopted when its ledger checks out (an unused
  // or refused descriptor is closed).
  std::vector<NamedFd> inherited;
  // How long to wait for the address lock: a predecessor that was taken
  // over releases it when it exits.
  absl::Duration lock_wait = absl::ZeroDuration();
  // A take-over's connection to its predecessor (RequestTakeOver), which
  // serves on until this daemon says it is ready. Start then adopts a
  // private copy of the ledger (nothing the predecessor would read again
  // is written), does everything that can fail, says so
  // (DescriptorRequest.take_over_ready), waits for the predecessor's last
  // word (it exits), and only then takes the address lock and serves. Any
  // failure before that (a ledger or a pool that does not check out
  // included) fails Start, and the predecessor serves on with every
  // session. Without it (systemd's store, a reload) the ledger is adopted
  // in place, and one that does not check out means a fresh start.
  UniqueFd take_over;
};

// What a take-over is handed: the predecessor's descriptors, and the
// connection to say "ready" on (StartOptions::take_over); none when the
// predecessor is of a version that does not wait for it (it exits as it
// hands over: the successor adopts in place, as before).
struct TakeOverGrant {
  std::vector<NamedFd> fds;
  UniqueFd connection;
};

// Asks the daemon serving `config.listen` to hand itself over to this
// process (only root or that daemon's uid may; the daemon checks the
// pools of `config` against its own). Returns its descriptors, to start
// with, and the connection; the predecessor exits once Start says ready on
// it, and serves on if the connection closes first. FAILED_PRECONDITION
// naming the pool that differs, PERMISSION_DENIED, or UNAVAILABLE when no
// daemon answers.
absl::StatusOr<TakeOverGrant> RequestTakeOver(const DaemonConfig& config);

class Daemon {
 public:
  // Validates `config` and starts serving. FAILED_PRECONDITION when another
  // daemon holds the address, RESOURCE_EXHAUSTED when memory cannot hold
  // the pools, UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(
      const DaemonConfig& config, StartOptions options = {});

  // Replaces this process's image with `exe` (`argv`), in place (same pid,
  // as systemd wants of a reload): stops every change, then passes the
  // ledger, pools and listening sockets to the new image as $LISTEN_FDS.
  // Returns only when it could not (FAILED_PRECONDITION for an `exe` that
  // cannot be executed: nothing was stopped then, and the daemon serves
  // on); after a failed execve(2) the process exits.
  absl::Status ReExec(const std::string& exe, char* const* argv);

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
  // A take-over over the descriptor socket (TakeOverHandler).
  absl::StatusOr<HandOver> HandOverTo(const v1::TakeOver& successor);
  // Copies of the descriptors a successor needs, named.
  absl::StatusOr<std::vector<NamedFd>> HandOverFds() const;
  // Tells systemd's store (when $NOTIFY_SOCKET is set) what to keep.
  void StoreFds(bool adopted, const std::vector<std::string>& stale_names,
                bool new_ledger = false);
  // Every 200 ms until Shutdown: ends the detached sessions of processes
  // that exited, forgets connections gRPC closed.
  void ReapLoop();

  std::string address_;
  std::vector<std::string> pool_names_;  // By pool id.
  std::string socket_path_;              // Empty unless address is "unix:".
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
