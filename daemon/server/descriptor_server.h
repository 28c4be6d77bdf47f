// The descriptor socket: hands each session's process the descriptors of the
// host pools it may use, over SCM_RIGHTS, so that pool memory needs no name
// in any file system (host_segment.h). The protocol is DescriptorRequest /
// DescriptorReply in shmtensor.proto; the spec is docs/shm_layout.md.
//
// A SOCK_SEQPACKET Unix socket at "<socket path>.fd", beside the gRPC one,
// with the same mode and group (so any user the operator lets reach the
// daemon can ask, and only the kernel's word decides what they get). Each
// connection may send one request, at most kMaxRequestBytes, within the
// request timeout; it gets one reply and is closed. Descriptors go only to
// the process that opened the session (ObjectStore::GrantDescriptors: its
// SO_PEERCRED pid and uid, and the session's secret); every refusal gets
// PERMISSION_DENIED (or INVALID_ARGUMENT for bytes that are no request), no
// descriptor, and a log line (rate-limited). A session is answered once.
// A fork hold request (DescriptorRequest.fork_hold) is answered without
// descriptors, and its connection then stays open, unread, until the
// client's end closes (POLLHUP: the forked children that inherited it are
// gone); the hold ends then (ObjectStore::EndForkHold). Held connections
// are bounded per uid by limits.max_fork_holds_per_uid.
// Each descriptor sent is a new open file description of the pool, the
// receiver's alone. Descriptors a peer sends are never accepted (the kernel
// closes them). Pending connections are bounded, in all and per uid: one
// past either bound is closed at once, so a user who floods the socket
// delays only itself. Out of descriptors (EMFILE), the server closes
// waiting connections one by one with a reserved descriptor, so clients
// see a refusal instead of a full backlog.
//
// Thread safety: Start and Stop from one thread; the serving thread is
// internal.
#ifndef SHMTENSOR_DAEMON_SERVER_DESCRIPTOR_SERVER_H_
#define SHMTENSOR_DAEMON_SERVER_DESCRIPTOR_SERVER_H_

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/os/peer.h"
#include "daemon/os/sd_daemon.h"
#include "daemon/store/object_store.h"

namespace shmtensor::daemon {

// FDNAME prefix of a fork hold's connection (+ its id) handed to a
// successor or systemd's store.
inline constexpr char kHoldFdPrefix[] = "shmtensor.hold.";

// Longest DescriptorRequest accepted, bytes.
// (A take-over names up to kMaxPools pools.)
inline constexpr size_t kMaxDescriptorRequestBytes = 8192;

struct DescriptorServerOptions {
  absl::Duration request_timeout = absl::Seconds(2);
  size_t max_pending = 256;         // Connections waiting for a request.
  size_t max_pending_per_uid = 32;  // Of those, from one user.
};

// What a daemon hands a successor that takes it over (TakeOverHandler).
// Most descriptors one message carries (SCM_MAX_FD).
inline constexpr size_t kMaxFdsPerMessage = 253;

struct HandOver {
  std::vector<NamedFd> fds;
  // Called once: with true when the successor took the descriptors and,
  // if it said it would (TakeOver.says_ready), then said it is ready to
  // serve and was told it may (the caller exits); false when the replies
  // could not be sent, or such a successor hung up, timed out or said
  // anything else first (the caller serves on).
  std::function<void(bool taken_over)> finish;
};
// Checks a take-over request against the daemon (FAILED_PRECONDITION naming
// the first pool that differs) and, when it can go ahead, stops every
// change and returns what to send.
using TakeOverHandler =
    std::function<absl::StatusOr<HandOver>(const v1::TakeOver&)>;

class DescriptorServer {
 public:
  // Binds `path` (replacing what is there: the caller holds the address
  // lock) with `mode` and, for gid >= 0, that group. `store` must outlive
  // the server. Errors as BindUnixSocket (unix_listener.h).
  // With a valid `adopted`, serves that socket instead (a predecessor's
  // listening SOCK_SEQPACKET socket at `path`; INVALID_ARGUMENT when it is
  // not one).
  static absl::StatusOr<std::unique_ptr<DescriptorServer>> Bind(
      const std::string& path, mode_t mode, int gid, ObjectStore& store,
      DescriptorServerOptions options = {}, UniqueFd adopted = UniqueFd());
  // Stops serving (if started) and closes the socket; the caller unlinks.
  ~DescriptorServer();

  DescriptorServer(const DescriptorServer&) = delete;
  DescriptorServer& operator=(const DescriptorServer&) = delete;

  void Start();
  void Stop();
  // Who answers take-over requests (from root or the daemon's uid only);
  // without one they are refused. Set before Start.
  void SetTakeOverHandler(TakeOverHandler handler) {
    take_over_ = std::move(handler);
  }
  // The listening socket, for a successor.
  int listen_fd() const { return listen_fd_.get(); }
  // Fork holds' connections, for a successor: copies, named
  // kHoldFdPrefix<hold id>. Thread-safe.
  std::vector<NamedFd> HoldFds() const;
  // Watches `fd`, a predecessor's connection of fork hold `hold_id`, as
  // its own: the hold ends when the children's ends close. Before Start.
  void AdoptHold(UniqueFd fd, uint64_t hold_id);

  // Requests answered with descriptors, and connections refused or closed
  // without any (bad request, refused, timed out, over a bound). Logged at
  // shutdown.
  uint64_t granted() const { return granted_.load(); }
  uint64_t refused() const { return refused_.load(); }

 private:
  struct Pending;
  DescriptorServer(UniqueFd listen_fd, UniqueFd wake_fd, ObjectStore& store,
                   DescriptorServerOptions options)
      : listen_fd_(std::move(listen_fd)),
        wake_fd_(std::move(wake_fd)),
        store_(store),
        options_(options) {}
  void Loop();
  // Reads and answers the request on `p`: kNotYet when there was nothing to
  // read yet (the connection stays pending), kDone when it was answered or
  // refused (it is closed), kHeld when it now carries fork hold `*hold_id`
  // (kept open until the client's end closes).
  enum class Served { kNotYet, kDone, kHeld };
  Served Serve(const Pending& p, uint64_t* hold_id);

  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // An eventfd: written by Stop.
  ObjectStore& store_;
  const DescriptorServerOptions options_;
  std::atomic<uint64_t> granted_{0};
  std::atomic<uint64_t> refused_{0};
  TakeOverHandler take_over_;
  // Connections that carry a fork hold: open until the client's end
  // closes (each fd owned).
  struct Held {
    int fd;
    uint64_t hold_id;
  };
  mutable absl::Mutex held_mu_;
  std::vector<Held> held_ ABSL_GUARDED_BY(held_mu_);
  std::thread thread_;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_SERVER_DESCRIPTOR_SERVER_H_
