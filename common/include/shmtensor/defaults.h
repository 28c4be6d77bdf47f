// Defaults the daemon and every client agree on.
#ifndef SHMTENSOR_COMMON_INCLUDE_SHMTENSOR_DEFAULTS_H_
#define SHMTENSOR_COMMON_INCLUDE_SHMTENSOR_DEFAULTS_H_

#include <cstddef>
#include <string>

namespace shmtensor {

// Environment variable that overrides the default address, for the daemon
// and for clients alike.
inline constexpr char kAddressEnv[] = "SHMTENSOR_ADDRESS";

// The address the daemon listens on and clients connect to when none is
// given: $SHMTENSOR_ADDRESS if set; else "unix:$XDG_RUNTIME_DIR/
// shmtensord.sock" where that is set (systemd's per-user 0700 directory);
// else "unix:/tmp/shmtensor-<uid>/shmtensord.sock", in a directory the daemon
// makes 0700 and checks is its own. Per user, in a place only that user can
// write: no other user can take the address first (a client also checks who
// serves it, ClientOptions::daemon_uid).
std::string DefaultAddress();

// The daemon serves pool descriptors (SCM_RIGHTS) on a second Unix socket
// beside its gRPC one: the gRPC socket's path with this suffix appended
// (DescriptorRequest in shmtensor.proto).
inline constexpr char kDescriptorSocketSuffix[] = ".fd";

// Most pools one daemon serves; pool ids are below it. A client receives
// every host pool's descriptor in one message, and the kernel passes at
// most 253 in one.
inline constexpr size_t kMaxPools = 64;

// Environment variable naming one more uid (or user name) a client accepts
// as its daemon's, besides its own and root: e.g. the service user of a
// shared daemon (deploy/systemd: SHMTENSOR_DAEMON_UID=shmtensor).
inline constexpr char kDaemonUidEnv[] = "SHMTENSOR_DAEMON_UID";

}  // namespace shmtensor

#endif  // SHMTENSOR_COMMON_INCLUDE_SHMTENSOR_DEFAULTS_H_
