// The bounds of the release protocol (docs/shm_layout.md, "Releases and
// one-way seals") that the client and the daemon must agree on. Internal:
// not installed (the public headers are under common/include/).
#ifndef SHMTENSOR_COMMON_RELEASE_PROTOCOL_H_
#define SHMTENSOR_COMMON_RELEASE_PROTOCOL_H_

#include <cstddef>

namespace shmtensor {

// Most ReleaseLeases copies a client puts in one request (the oldest it has
// not seen confirmed applied; client/release_outbox.h). The rest reach the
// daemon on the session stream, which the request then waits for.
inline constexpr size_t kClientMaxCarriedReleases = 64;

// Most ReleaseLeases copies the daemon accepts in one request: more fails
// INVALID_ARGUMENT naming both counts (daemon/server/release_intake.h). Above
// the client's, so that a client may carry more without a daemon upgrade.
inline constexpr size_t kDaemonMaxCarriedReleases = 1024;

static_assert(kClientMaxCarriedReleases <= kDaemonMaxCarriedReleases,
              "a client must never carry more than its daemon accepts");

}  // namespace shmtensor

#endif  // SHMTENSOR_COMMON_RELEASE_PROTOCOL_H_
