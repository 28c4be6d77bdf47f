// The core of shmtensord: sessions, objects, leases, names and transfers.
//
// Lifetime rules (the contract the whole system rests on):
//  - Create gives the creator's session a write lease on an unsealed object.
//    Nobody else can get it; it is never visible by name until sealed.
//  - Seal turns the write lease into a read lease held by the creator's ref,
//    or, with exclusive=true, gives the lease up to a pending transfer that
//    keeps the object alive until exactly one Get takes it (the taker gets a
//    write lease) or the creator's session ends.
//  - Get takes a read lease on a sealed object. Release drops one lease.
//  - A bound name keeps its object alive; Delete unbinds it at once and the
//    memory follows when the last lease goes (deferred delete).
//  - An object's memory returns to its pool exactly when no lease, no name
//    and no pending transfer refers to it. Its slot's generation is bumped
//    then, so every ref to it is stale from that moment on.
//  - EndSession drops every lease of the session, discards its unsealed
//    objects (and their names) and reclaims its untaken transfers.
//
// The store never touches pool bytes; it only hands out offsets.
//
// Thread safety: every public method is thread-safe. Create and GetByName may
// block (up to their timeout) waiting for memory or a sealed name; they do not
// hold the lock while waiting.
#ifndef SHMTENSOR_DAEMON_OBJECT_STORE_H_
#define SHMTENSOR_DAEMON_OBJECT_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/limits.h"
#include "daemon/pool.h"
#include "shmtensor/v1/monitor.pb.h"
#include "shmtensor/v1/shmtensor.pb.h"

namespace shmtensor::daemon {

// Longest object name, in bytes.
inline constexpr size_t kMaxNameBytes = 255;
// Most objects alive at once (slots in the object table).
inline constexpr uint32_t kMaxObjects = 1u << 24;

// What the daemon knows of a client's process (from /proc, where visible).
struct PeerInfo {
  std::string peer;  // gRPC peer string.
  bool has_process = false;
  uint32_t uid = 0;
  std::string command_line;
};

struct CreateArgs {
  uint64_t session_id = 0;
  std::string pool;  // Empty: the first pool.
  uint64_t size_bytes = 0;
  v1::Layout layout;
  std::string name;  // Empty: unnamed.
  absl::Duration timeout = absl::ZeroDuration();
  // Never sealed; every Get of it is writable (CreateRequest.shared_writable).
  bool shared_writable = false;
};

// What Create and Get hand out: where the bytes are and the lease on them.
struct Handout {
  v1::ObjectRef ref;
  v1::Placement placement;
  v1::Layout layout;
  uint64_t lease_id = 0;
  bool writable = false;
};

struct SealResult {
  v1::ObjectRef ref;
  uint64_t lease_id = 0;  // 0 for an exclusive seal.
};

class ObjectStore {
 public:
  // Takes the pools (at least one); `epoch` is this daemon instance's id.
  ObjectStore(std::vector<std::unique_ptr<Pool>> pools, uint64_t epoch,
              StoreLimits limits = {});

  // Not copyable or movable: sessions and waiters refer to it.
  ObjectStore(const ObjectStore&) = delete;
  ObjectStore& operator=(const ObjectStore&) = delete;

  uint64_t epoch() const { return epoch_; }
  // Descriptions of every pool, indexed by pool id. Immutable.
  const std::vector<v1::PoolInfo>& pool_infos() const { return pool_infos_; }

  // Opens a session and returns its unguessable id. UNAVAILABLE after
  // Shutdown; INVALID_ARGUMENT for a client name over kMaxNameBytes.
  absl::StatusOr<uint64_t> OpenSession(const std::string& client_name, int pid,
                                       PeerInfo peer = {});
  // Ends a session (idempotent): drops its leases, discards its unsealed
  // objects, reclaims its untaken transfers.
  void EndSession(uint64_t session_id);

  absl::StatusOr<Handout> Create(const CreateArgs& args);
  absl::StatusOr<SealResult> Seal(uint64_t session_id, uint64_t lease_id,
                                  bool exclusive);
  absl::StatusOr<Handout> Get(uint64_t session_id, const v1::ObjectRef& ref);
  absl::StatusOr<Handout> GetByName(uint64_t session_id,
                                    const std::string& name,
                                    absl::Duration timeout);
  // Returns true when the release freed the object's memory. Releases (this
  // and ReleaseBatch) still apply while shutting down.
  absl::StatusOr<bool> Release(uint64_t session_id, uint64_t lease_id);

  // Applies one ReleaseLeases message of the session (from its stream, or a
  // copy a unary request carried): drops each lease the session holds (an id
  // it does not hold is skipped and named in the returned NOT_FOUND, which
  // the caller logs) and records `seq` as applied. A seq applied already is
  // skipped (OK, nothing dropped): the other copy came first.
  // INVALID_ARGUMENT when `seq` is past the next one due;
  // FAILED_PRECONDITION (SESSION_ENDED) when the session is not open.
  absl::Status ReleaseBatch(uint64_t session_id, uint64_t seq,
                            const std::vector<uint64_t>& lease_ids);
  // Blocks until the session applied every ReleaseLeases through `seq`
  // (returns at once for seq 0). Fails SESSION_ENDED if the session ends
  // first, DEADLINE_EXCEEDED naming both seqs after `timeout`.
  absl::Status AwaitReleases(uint64_t session_id, uint64_t seq,
                             absl::Duration timeout);
  // Returns true when the memory was freed now (false: deferred).
  absl::StatusOr<bool> Delete(uint64_t session_id, const std::string& name);

  v1::StatsResponse Stats() const;

  // Monitoring snapshots (one lock each). Status fills the store's part of
  // DaemonStatus: pools, counts, limits, uptime, epoch.
  v1::DaemonStatus Status() const;
  // The `limit` oldest live objects (0: all).
  v1::ListObjectsResponse ListObjects(uint32_t limit) const;
  v1::ListClientsResponse ListClients() const;

  // Fails every waiter and every later call with UNAVAILABLE. Sessions stay
  // until EndSession.
  void Shutdown();

 private:
  enum class State {
    kWriting,
    kSealed,
    kPendingTransfer,
    kTaken,
    kSharedWritable
  };

  struct Object {
    uint32_t pool = 0;
    uint64_t offset = 0;
    uint64_t size = 0;
    uint64_t capacity = 0;
    v1::Layout layout;
    State state = State::kWriting;
    std::string name;      // Non-empty while a name is bound to it.
    uint64_t creator = 0;  // Session that created it.
    uint32_t leases = 0;
    absl::Time created;
    uint64_t serial = 0;  // Creation order, for oldest-first listings.
  };
  struct Slot {
    uint32_t generation = 1;  // Never 0, so an all-zero ref is never valid.
    bool live = false;
    Object object;
  };
  struct Lease {
    uint64_t session = 0;
    uint32_t slot = 0;
    bool write = false;
  };
  struct WrittenRange {
    uint32_t pool = 0;
    uint64_t offset = 0;
    uint64_t capacity = 0;
  };
  static constexpr size_t kWrittenRanges = 16;
  struct Session {
    std::string client_name;
    int pid = 0;
    absl::flat_hash_set<uint64_t> leases;
    absl::flat_hash_set<uint32_t> pending_transfers;  // Slots it offered.
    uint64_t releases_applied = 0;  // Last ReleaseLeases seq applied.
    PeerInfo peer;
    absl::Time opened;
    uint64_t serial = 0;  // Opening order, for oldest-first listings.
    // Leases per object it holds, and the capacity of those objects plus of
    // its untaken transfers: what max_bytes_per_client limits.
    absl::flat_hash_map<uint32_t, uint32_t> held_slots;
    uint64_t bytes_held = 0;
    // Ranges this client was given writable (created, or taken from an
    // exclusive hand-off), most recent first, at most kWrittenRanges: their
    // pages are in its page tables. Create places a new object of the same
    // size on one of them when it is free (see Allocate).
    std::vector<WrittenRange> written;
  };

  absl::StatusOr<Session*> FindSession(uint64_t id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<uint32_t> ResolveRef(const v1::ObjectRef& ref) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The lease `lease_id` of session `session_id`; UNAVAILABLE while
  // shutting down, else as LookupLease.
  absl::StatusOr<Lease*> FindLease(uint64_t session_id, uint64_t lease_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same lookup during shutdown too (for releases): FAILED_PRECONDITION
  // for a session not open or a lease already released, NOT_FOUND for one
  // never issued, PERMISSION_DENIED for another session's.
  absl::StatusOr<Lease*> LookupLease(uint64_t session_id, uint64_t lease_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t AddLease(uint64_t session_id, Session& session, uint32_t slot,
                    bool write) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops a lease; discards the object if it was the unsealed writer's.
  // Returns true when the object was freed.
  bool DropLease(uint64_t lease_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reserves `capacity` bytes of `pool` for a Create by `session`: on a
  // range the session was given writable before when one of that capacity is
  // free, else where the pool's placement puts it. nullopt when nothing fits.
  std::optional<uint64_t> Allocate(const Session& session, uint32_t pool,
                                   uint64_t capacity, uint64_t alignment,
                                   RangeAllocator::End end)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the object's memory if nothing refers to it any more.
  bool MaybeFree(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Handout MakeHandout(uint32_t slot, uint64_t lease_id, bool writable) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::ObjectRef MakeRef(uint32_t slot) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED naming the client and the limit if taking one more
  // lease on `slot` (of `capacity` bytes) would break a per-client limit.
  absl::Status CheckClientLimits(const Session& session, uint32_t slot,
                                 uint64_t capacity) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the capacity of an offered transfer into or out of its creator's
  // holdings.
  void HoldTransfer(uint32_t slot, bool hold)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "'name' pid 12" of a session, or "session <id> (ended)".
  std::string ClientString(uint64_t session_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "pool 'default' has 123 bytes free ...; most held by ..." for errors.
  std::string DescribePressure(uint32_t pool, uint64_t capacity) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t epoch_;
  const absl::Time start_time_;
  const StoreLimits limits_;
  std::vector<v1::PoolInfo> pool_infos_;

  mutable absl::Mutex mu_;
  absl::CondVar memory_freed_;  // Signalled when a pool range is freed.
  absl::CondVar sealed_;        // Signalled when a named object is sealed.
  absl::CondVar released_;      // Signalled when a ReleaseLeases is applied.
  std::vector<std::unique_ptr<Pool>> pools_ ABSL_GUARDED_BY(mu_);
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_slots_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> names_ ABSL_GUARDED_BY(mu_);
  uint64_t next_lease_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_serial_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t live_objects_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pending_transfers_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::BitGen bitgen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_OBJECT_STORE_H_
