// A client's connection to its daemon, checked before anything is sent: the
// socket is connected here (not by gRPC), and the process serving it must run
// as this user, as root, or as the uid the user named (ClientOptions::
// daemon_uid, or $SHMTENSOR_DAEMON_UID). Another user who put a socket at
// the address first (a squatter, a fake daemon) never receives a byte.
//
// Thread safety: pure functions.
#ifndef SHMTENSOR_CLIENT_DAEMON_SOCKET_H_
#define SHMTENSOR_CLIENT_DAEMON_SOCKET_H_

#include <sys/types.h>

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace shmtensor::internal {

// The socket path of a "unix:" address ("unix:/p", "unix:///p"), or
// INVALID_ARGUMENT naming the address: the data plane is served on a Unix
// socket only.
absl::StatusOr<std::string> SocketPathOf(const std::string& address);

// Connects a socket of `type` (SOCK_STREAM for gRPC, SOCK_SEQPACKET for the
// descriptor socket) to the daemon's socket at `path`, trying again while it
// is missing or refuses (a daemon still starting) until `deadline`, and
// checks the uid of the process that serves it (SO_PEERCRED): this process's
// real or effective uid, root, `allowed_uid`, or $SHMTENSOR_DAEMON_UID.
// Returns a connected, non-blocking, close-on-exec socket.
// UNAVAILABLE naming the address when nothing answers in time;
// PERMISSION_DENIED naming the uid and pid that serve it otherwise, and
// INVALID_ARGUMENT for a bad $SHMTENSOR_DAEMON_UID.
absl::StatusOr<int> ConnectDaemonSocket(const std::string& path,
                                        absl::Time deadline,
                                        std::optional<uid_t> allowed_uid,
                                        int type);

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_DAEMON_SOCKET_H_
