// Defaults the daemon and every client agree on.
#ifndef SHMTENSOR_CLIENT_INCLUDE_SHMTENSOR_DEFAULTS_H_
#define SHMTENSOR_CLIENT_INCLUDE_SHMTENSOR_DEFAULTS_H_

#include <string>

namespace shmtensor {

// Environment variable that overrides the default address, for the daemon
// and for clients alike.
inline constexpr char kAddressEnv[] = "SHMTENSOR_ADDRESS";

// The address the daemon listens on and clients connect to when none is
// given: $SHMTENSOR_ADDRESS if set, else "unix:/tmp/shmtensord-<uid>.sock"
// (per user, so two users on one machine never share a daemon by accident).
std::string DefaultAddress();

}  // namespace shmtensor

#endif  // SHMTENSOR_CLIENT_INCLUDE_SHMTENSOR_DEFAULTS_H_
