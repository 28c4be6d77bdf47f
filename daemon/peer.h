// Who is calling: whether a gRPC peer is on this host, and what /proc says of
// a client process.
//
// Thread safety: pure functions (DescribePeer reads /proc).
#ifndef SHMTENSOR_DAEMON_PEER_H_
#define SHMTENSOR_DAEMON_PEER_H_

#include <string>

#include "absl/strings/string_view.h"
#include "daemon/object_store.h"

namespace shmtensor::daemon {

// True for a peer that shares this host's memory: a Unix socket peer
// ("unix:..."), or TCP over loopback ("ipv4:127.x.x.x:port",
// "ipv6:[::1]:port", also percent-encoded). Shared memory is local only, so
// the data plane serves these peers alone.
bool IsLocalPeer(absl::string_view peer);

// The peer string, and for a pid this daemon can see in /proc, the owner uid
// and the command line (arguments joined by spaces, at most 4 KiB).
PeerInfo DescribePeer(const std::string& peer, int pid);

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_PEER_H_
