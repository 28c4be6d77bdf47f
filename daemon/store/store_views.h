// The monitoring views of the store (monitor.proto): DaemonStatus,
// ListObjectsResponse and ListClientsResponse, built from the store's parts;
// and the account of a full pool an exhausted Create reports.
// ObjectStore::Status, ListObjects and ListClients take the store's lock and
// call these; include this header to use them (it brings their messages).
//
// A view with a `viewer` (a caller who is neither root nor the daemon's
// user) shows only what that user may see: the pools it may use and their
// objects, and its own sessions; null shows everything (operators). No view
// shows a CUDA pool's IPC handle, or a usable ref (nonces are cleared).
//
// Thread safety: the functions only read `store`, whose owner keeps it from
// changing meanwhile (ObjectStore holds its lock).
#ifndef SHMTENSOR_DAEMON_STORE_STORE_VIEWS_H_
#define SHMTENSOR_DAEMON_STORE_STORE_VIEWS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "daemon/memory/pool.h"
#include "daemon/os/peer.h"
#include "daemon/store/lease_table.h"
#include "daemon/store/limits.h"
#include "daemon/store/object_store.h"
#include "daemon/store/object_table.h"
#include "daemon/store/session_table.h"
#include "shmtensor/v1/monitor.pb.h"
#include "shmtensor/v1/shmtensor.pb.h"

namespace shmtensor::daemon {

// The parts of the store a view reads, borrowed for one call: the
// references live as long as the owner's lock is held.
struct StoreView {
  uint64_t epoch = 0;
  absl::Time start_time;
  const StoreLimits& limits;
  const std::vector<v1::PoolInfo>& pool_infos;  // By pool id.
  const std::vector<std::unique_ptr<Pool>>& pools;
  const SessionTable& sessions;
  const ObjectTable& objects;
  const LeaseTable& leases;
  bool serving = true;      // False once the store is shutting down.
  uint64_t fork_holds = 0;  // Live fork holds (ObjectStore::HoldForFork).
  uint64_t offers = 0;      // Offers not taken (ObjectStore::Offer).
  AdoptedState adopted;     // ObjectStore::adopted().
};

// The store's part of DaemonStatus: pools, counts, limits, uptime, epoch.
v1::DaemonStatus BuildStatus(const StoreView& store,
                             const PeerCredentials* viewer);
// One page of live objects, oldest first, as ObjectStore::ListObjects says.
v1::ListObjectsResponse BuildObjectList(const StoreView& store, uint32_t limit,
                                        uint64_t page_token,
                                        const PeerCredentials* viewer);
// The open sessions, oldest first.
v1::ListClientsResponse BuildClientList(const StoreView& store,
                                        const PeerCredentials* viewer);

// Why pool `pool_id` has no range of `capacity` bytes, for the
// RESOURCE_EXHAUSTED a Create that waited in vain returns: "pool 'default'
// is full: asked for N bytes, F of S bytes free (largest free block L); most
// held by: 'loader' pid 12 holds B bytes, ..." (the three sessions whose
// leases and offered transfers hold most of the pool). Names only what the
// caller could see in ListClients as an operator: client names and pids.
std::string DescribePoolPressure(const StoreView& store, uint32_t pool_id,
                                 uint64_t capacity);

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_STORE_STORE_VIEWS_H_
