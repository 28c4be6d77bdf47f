// Limits an operator sets on the store (config [limits]).
#ifndef SHMTENSOR_DAEMON_LIMITS_H_
#define SHMTENSOR_DAEMON_LIMITS_H_

#include <cstdint>

namespace shmtensor::daemon {

// 0 means no limit. A request that would pass one fails RESOURCE_EXHAUSTED
// at once, naming the client and the limit.
struct StoreLimits {
  uint64_t max_objects = 0;            // Live objects, all sessions.
  uint64_t max_leases_per_client = 0;  // Leases one session holds.
  // Capacity of the distinct objects one session holds leases on, plus its
  // untaken exclusive transfers.
  uint64_t max_bytes_per_client = 0;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_LIMITS_H_
