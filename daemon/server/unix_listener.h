// The data plane's Unix socket, accepted by the daemon itself so that every
// connection is tied to its peer process before gRPC serves it (see
// connections.h): gRPC's own listener gives a call no way to learn its
// peer's credentials.
//
// The accept thread keeps accepting when descriptors run out: on EMFILE or
// ENFILE it logs (rate-limited), waits 100 ms and tries again, so the
// daemon serves new clients as soon as descriptors come back (gRPC's own
// listener stops for good there). A user past limits.max_connections_per_uid
// has the connection closed at once.
//
// Thread safety: Start and Stop from one thread; the accept thread is
// internal.
#ifndef SHMTENSOR_DAEMON_SERVER_UNIX_LISTENER_H_
#define SHMTENSOR_DAEMON_SERVER_UNIX_LISTENER_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "daemon/os/peer.h"
#include "daemon/server/connections.h"

namespace shmtensor::daemon {

// A listening Unix socket of `type` (SOCK_STREAM, SOCK_SEQPACKET) at `path`
// (an existing socket there is replaced: the caller holds the address lock),
// non-blocking and close-on-exec, with mode `mode` from birth and, for
// gid >= 0, that group. UNAVAILABLE naming the path when it cannot be bound;
// PERMISSION_DENIED when the group cannot be given; INVALID_ARGUMENT for a
// path that does not fit a socket address.
absl::StatusOr<UniqueFd> BindUnixSocket(const std::string& path, int type,
                                        mode_t mode, int gid);

// `fd`, a predecessor's listening socket, checked: a listening Unix socket
// of `type` bound to `path` (made non-blocking and close-on-exec).
// INVALID_ARGUMENT naming what differs.
absl::StatusOr<UniqueFd> AdoptUnixSocket(UniqueFd fd, const std::string& path,
                                         int type);

class UnixListener {
 public:
  // Binds and listens on `path` (BindUnixSocket, SOCK_STREAM); with a valid
  // `adopted`, serves that socket instead (AdoptUnixSocket).
  static absl::StatusOr<std::unique_ptr<UnixListener>> Bind(
      const std::string& path, mode_t mode, int gid,
      UniqueFd adopted = UniqueFd());
  // The listening socket, for a successor.
  int listen_fd() const { return listen_fd_.get(); }
  // Stops accepting (if started) and closes the socket; the caller unlinks.
  ~UnixListener();

  // Not copyable or movable: the accept thread points to it.
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  // Starts the accept thread: each connection is recorded in `table` and
  // handed to `server` (which must be started and outlive Stop()).
  void Start(grpc::Server* server, ConnectionTable* table);
  // Stops the accept thread. Connections already handed over are gRPC's.
  void Stop();

 private:
  UnixListener(UniqueFd listen_fd, UniqueFd wake_fd)
      : listen_fd_(std::move(listen_fd)), wake_fd_(std::move(wake_fd)) {}
  void AcceptLoop(grpc::Server* server, ConnectionTable* table);

  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // An eventfd: written by Stop.
  std::thread thread_;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_SERVER_UNIX_LISTENER_H_
