// The daemon's table of accepted data-plane connections: which process (by
// the kernel's word, peer.h) is at the other end of each socket gRPC serves.
//
// The daemon accepts on its Unix socket itself (unix_listener.h), reads the
// peer's credentials and a pidfd, records them here under the descriptor,
// and only then hands the descriptor to gRPC, which names the connection's
// peer "fd:<n>" in every call on it. A call then learns who sent it with
// Find(ctx->peer()). gRPC closes the descriptor when the connection ends
// without telling anyone, so each entry also keeps the socket's inode: an
// entry whose number now names another file (or none) is dead, and a new
// connection on a reused number replaces it.
//
// A call's number names its own connection from the call's start until its
// reactor is done: in gRPC 1.51 (Debian 12 and 13) every stream holds a
// reference on its transport, and a broken connection's descriptor is only
// shut down, then closed when the transport is destroyed (tcp_free, from
// ~grpc_chttp2_transport), after the last stream. gRPC 1.65 and later close
// it as the connection breaks, calls still running: there a call that
// starts late could find a newer connection on the reused number, and pass
// the session's connection check (ObjectStore::Admit). CMakeLists.txt warns
// at such a version.
//
// Thread safety: thread-safe.
#ifndef SHMTENSOR_DAEMON_SERVER_CONNECTIONS_H_
#define SHMTENSOR_DAEMON_SERVER_CONNECTIONS_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "daemon/os/peer.h"

namespace shmtensor::daemon {

// One accepted connection.
struct Connection {
  PeerCredentials peer;
  // Whose sessions this connection may act for (peer.h).
  OwnerKey owner;
  // Follows the peer process; shared with the sessions opened on this
  // connection, which outlive it when it breaks. Null when the kernel can
  // give none (a peer in another pid namespace, before Linux 6.5): such a
  // session ends with its connection.
  std::shared_ptr<const UniqueFd> pidfd;
  // Counts up from 1 in the order the daemon accepted its connections
  // (ConnectionTable::Add): a session's calls on a connection older than
  // the one its stream last opened or resumed on are refused
  // (ObjectStore::Admit).
  uint64_t serial = 0;
};

class ConnectionTable {
 public:
  // At most `max_per_uid` live connections per user (0: no limit;
  // limits.max_connections_per_uid).
  explicit ConnectionTable(uint32_t max_per_uid) : max_per_uid_(max_per_uid) {}

  ConnectionTable(const ConnectionTable&) = delete;
  ConnectionTable& operator=(const ConnectionTable&) = delete;

  // Records the accepted socket `fd`, with the next serial. RESOURCE_EXHAUSTED
  // naming the uid and the limit when that user has max_per_uid connections
  // open (the caller closes the socket); INTERNAL when `fd` cannot be examined.
  absl::Status Add(int fd, Connection connection);

  // The connection of a call whose gRPC peer is `peer`; nullopt for a peer
  // that did not come through the daemon's own accept (TCP, or a
  // connection that has ended).
  std::optional<Connection> Find(absl::string_view peer) const;

  // Forgets the connections gRPC has closed. Returns how many remain.
  size_t Sweep();

 private:
  struct Entry {
    Connection connection;
    dev_t dev = 0;
    ino_t ino = 0;
  };
  // Whether `fd` still names the socket `e` was made for.
  static bool StillOpen(int fd, const Entry& e);

  const uint32_t max_per_uid_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t last_serial_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_SERVER_CONNECTIONS_H_
