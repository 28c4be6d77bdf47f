// Limits an operator sets on the store (config [limits]).
#ifndef SHMTENSOR_DAEMON_STORE_LIMITS_H_
#define SHMTENSOR_DAEMON_STORE_LIMITS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "shmtensor/errors.h"

namespace shmtensor::daemon {

// 0 means no limit. A request that would pass one fails RESOURCE_EXHAUSTED
// at once, naming the client and the limit. The defaults bound what one
// client, or one user, can make the daemon hold in its own memory (what an
// object, a lease and a session cost it, and so what the caps come to:
// docs/hardening.md, section 5; bench/python/daemon_memory_bench.py).
struct StoreLimits {
  uint64_t max_objects = 262144;           // Live objects, all sessions.
  uint64_t max_leases = 524288;            // Leases, all sessions.
  uint64_t max_leases_per_client = 65536;  // Leases one session holds.
  // Capacity of the distinct objects one session holds leases on, plus its
  // untaken exclusive transfers.
  uint64_t max_bytes_per_client = 0;
  // The same, summed over every session of one uid (a process cannot pass
  // the per-client limit by opening more sessions).
  uint64_t max_bytes_per_uid = 0;
  // Sessions one uid may have open (detached ones included), and connections
  // (each session needs one; monitoring calls use them too).
  uint64_t max_sessions_per_uid = 1024;
  uint64_t max_connections_per_uid = 2048;
  // Calls waiting at once (for memory, a name, or releases). A waiting call
  // holds no thread (waiting_calls.h); the limits keep one client or user
  // from taking every wait.
  uint64_t max_waiters_per_session = 64;
  uint64_t max_waiters_per_uid = 256;
  uint64_t max_waiters = 1024;
  // Fork holds one uid may have at once (ObjectStore::HoldForFork): each
  // keeps a descriptor of the daemon's open and the objects it pins alive
  // for as long as the forked children live.
  uint64_t max_fork_holds_per_uid = 1024;
  // Offers (ObjectStore::Offer) one session may have untaken at once, and
  // how long, in milliseconds, an untaken offer outlives its session (a
  // receiver reads its message after the sender exited). 0 grace: offers
  // end with their session.
  uint64_t max_offers_per_session = 16384;
  uint64_t offer_grace_ms = 300000;
  // Capacity of the buffers one session may hold ahead of need, unsealed
  // (its stock: CreateManyRequest.stock), so that no client hoards a pool
  // for puts it may never make. Stock past it is not made (the client's
  // puts then wait for a Create's round trip); 0: no limit.
  uint64_t max_stock_bytes_per_client = uint64_t{128} << 20;

  // [P24] Every table the daemon shares between uids has a per-uid share,
  // so that no uid takes what another needs (docs/hardening.md, "Tenants").
  // A per-uid limit of 0 below is uid_share_percent of its table: of
  // max_objects, of max_leases, of the ledger's pin records (offers and
  // fork-held objects), and of the host pools' bytes for stock. The share
  // also caps max_sessions_per_uid (of the ledger's session records) and
  // max_waiters_per_uid (of max_waiters). 1 to 100; 100: a uid may take a
  // whole table. A zero-byte object costs its uid its record, as any other.
  uint64_t uid_share_percent = 50;
  uint64_t max_objects_per_uid = 0;
  uint64_t max_leases_per_uid = 0;
  uint64_t max_pins_per_uid = 0;
  uint64_t max_stock_bytes_per_uid = 0;
};

// The records of each shared table: what ResolveUidShares takes its shares
// of. A table without a bound has the ledger's default size.
struct SharedTables {
  uint64_t objects = 0;
  uint64_t leases = 0;
  uint64_t sessions = 0;
  uint64_t pins = 0;
  uint64_t host_pool_bytes = 0;
};

// `limits` with every per-uid limit resolved against `tables` (the policy,
// decided once: limits.h above): a per-uid limit left at 0 becomes the
// share, and one set above the share (or a table's size) comes down to it.
StoreLimits ResolveUidShares(StoreLimits limits, const SharedTables& tables);

// RESOURCE_EXHAUSTED with reason LIMIT_EXCEEDED: a request would pass one of
// the limits above (or a fixed bound of the daemon's); `message` names it.
inline absl::Status LimitExceededError(absl::string_view message) {
  return WithReason(absl::ResourceExhaustedError(message),
                    kReasonLimitExceeded);
}

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_STORE_LIMITS_H_
