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
// Admission: every data-plane call takes a Caller (caller.h) and admits it
// under the one lock the call takes (Admit): one session lookup, the
// caller's process checked, the releases its request carries applied, and
// the releases it follows checked. A call whose releases have not all
// arrived fails IsAwaitingReleases, for the service to try again.
//
// Waiting: TryCreate (for memory), TryGetByName (for a name to be sealed)
// and TryAwaitReleases (for a session's releases) never block: they answer,
// or say "not yet" (nullopt / false) for the caller to try again after the
// store changed (changes() moved on) and once more at its deadline
// (last_try), which then gives the timeout's error. The gRPC service waits
// that way, one thread for all waiting calls (waiting_calls.h); tests block
// a thread in the same loop (testing/cpp/blocking_store.h). A waiting call
// is counted against the waiter limits (BeginWait).
//
// Files: object_store.cc (construction, waits, the lease and journal
// internals, the views), object_store_sessions.cc (open, resume, fork
// holds, descriptors, end), object_store_objects.cc (create, seal, get,
// offer, release, delete), object_store_adopt.cc (a successor adopting a
// ledger).
//
// Parts: ObjectStore is the facade and owns the one lock. The parts it owns
// are lock-free and it calls them only under that lock: SessionTable
// (sessions, uid usage and the limits on them; each session's ReleaseLog
// orders its ReleaseLeases), ObjectTable (slots, generations, names, refs),
// LeaseTable (leases) and each Pool (memory, and allocation affinity). The
// monitoring views (Status, ListObjects, ListClients) are built in
// store_views.cc; include daemon/store/store_views.h to use them.
//
// Thread safety: every public method is thread-safe; none holds the lock
// while waiting.
#ifndef SHMTENSOR_DAEMON_STORE_OBJECT_STORE_H_
#define SHMTENSOR_DAEMON_STORE_OBJECT_STORE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "daemon/ledger/ledger.h"
#include "daemon/memory/pool.h"
#include "daemon/memory/writer_map.h"
#include "daemon/os/peer.h"
#include "daemon/store/caller.h"
#include "daemon/store/lease_table.h"
#include "daemon/store/limits.h"
#include "daemon/store/object_table.h"
#include "daemon/store/offer_table.h"
#include "daemon/store/session_table.h"
#include "shmtensor/v1/shmtensor.pb.h"

// The monitoring views' messages (monitor.proto): include
// daemon/store/store_views.h for them whole.
namespace shmtensor::v1 {
class DaemonStatus;
class ListClientsResponse;
class ListObjectsResponse;
}  // namespace shmtensor::v1

namespace shmtensor::daemon {

struct StoreView;  // store_views.h

// What OpenSession and ResumeSession return.
struct OpenedSession {
  uint64_t id = 0;         // The secret: every call of the session names it.
  uint64_t client_id = 0;  // Public, for operators; acts for nothing.
  // The stream now attached; StreamEnded of an older one is ignored.
  uint64_t stream = 0;
  // Last ReleaseLeases seq applied: a resuming client sends the later ones
  // again.
  uint64_t releases_applied = 0;
  // The pools the session may use, each with its access (PoolInfo.access).
  std::vector<v1::PoolInfo> pools;
  // Proof of the session for the descriptor socket (DescriptorGrant).
  std::string descriptor_secret;
  // A resume that presented its leases (LeaseAccount): they were
  // reconciled; `refused` are the ids presented that the session does not
  // hold, `dropped` how many it held that were not presented.
  bool reconciled = false;
  std::vector<uint64_t> refused;
  uint64_t dropped = 0;
};

// What a resuming process says it holds (OpenSession.present_leases).
struct LeaseAccount {
  std::vector<uint64_t> held;     // Every lease it holds; duplicates ignored.
  uint64_t releases_through = 0;  // Seq of the last ReleaseLeases it sent.
  // The one-way seals of its releases not seen applied
  // (OpenSession.pending_seals), at most kMaxPendingSeals.
  std::vector<v1::OneWaySeal> seals;
};
inline constexpr size_t kMaxPendingSeals = 4096;

// What the descriptor socket may hand a session's process: its host pools
// and its access to each.
struct DescriptorGrant {
  uint32_t pool_id = 0;
  v1::PoolAccess access = v1::POOL_ACCESS_UNSPECIFIED;
};

// What HoldForFork pinned.
struct ForkHoldGrant {
  uint64_t hold_id = 0;
  uint32_t objects = 0;  // Distinct objects pinned.
};

// What Offer returns.
struct OfferGrant {
  v1::ObjectRef ref;
  uint64_t token = 0;
};

// Polled while a call waits (for memory, a name, or releases): true once
// the caller has gone (its call was cancelled), so the wait ends at once.
using CancelledFn = std::function<bool()>;

struct CreateArgs {
  Caller caller = Caller(0);
  std::string pool;  // Empty: the first pool.
  uint64_t size_bytes = 0;
  v1::Layout layout;
  std::string name;  // Empty: unnamed.
  absl::Duration timeout = absl::ZeroDuration();
  // Never sealed; every Get of it is writable (CreateRequest.shared_writable).
  bool shared_writable = false;
  // Made ahead of need (CreateManyRequest.stock): untyped, unnamed, counted
  // against limits.max_stock_bytes_per_client (LIMIT_EXCEEDED past it).
  bool stock = false;
  // An object the caller's session created and let go of, whose range it
  // wants for this one (CreateManyRequest.reuse_range_of): while it is
  // alive, every session's release ring is drained before the placement.
  // Ignored when it names no live object of the caller's.
  std::optional<v1::ObjectRef> reuse_range_of;
  CancelledFn cancelled;  // May be empty.
};

// A Create's arguments as a CreateRequest gives them, but its caller and
// its deadline (the adapter's): one home for the conversion, used by the
// gRPC adapter (server/service.cc) and by the fuzzer that drives requests
// into the ledger (tests/fuzz/ledger_fuzzer.cc). Nothing is checked here:
// the store checks what it is given where it arrives.
CreateArgs CreateArgsOf(const v1::CreateRequest& request);

// What a seal gives an unsealed object besides its state: with `relayout`,
// the size and layout it is sealed with (OneWaySeal.size_bytes, layout),
// which must fit its capacity.
struct SealArgs {
  bool exclusive = false;
  bool relayout = false;
  uint64_t size_bytes = 0;
  v1::Layout layout;
};

// What Create and Get hand out: where the bytes are and the lease on them.
struct Handout {
  v1::ObjectRef ref;
  v1::Placement placement;
  v1::Layout layout;
  uint64_t lease_id = 0;
  bool writable = false;
  // Create only: parts of the new object's range that another uid wrote,
  // which ClearStale must zero before the creator learns of the object
  // (the object is pinned until it has: a fork-hold count, see TryCreate).
  std::vector<WriterMap::Range> stale;
  uint32_t slot = 0;
};

struct SealResult {
  v1::ObjectRef ref;
  uint64_t lease_id = 0;  // 0 for an exclusive seal.
};

// The ledger's table sizes for `limits` (its limits of 0 get the ledger's
// own bounds, which then become the limits).
LedgerCapacity LedgerCapacityFor(const StoreLimits& limits);

// What an adopted ledger left for the operator to see (Stats, status).
struct AdoptedState {
  uint64_t sessions = 0;           // Adopted sessions not yet resumed or ended.
  uint64_t quarantined_bytes = 0;  // Capacity of what they, stranded fork
                                   // holds and refused records keep.
  uint64_t refused_records = 0;    // Ledger records this daemon refused.
};

class ObjectStore {
 public:
  // Takes the pools (at least one); `epoch` is this daemon instance's id.
  // With a `ledger` (Ledger::Create for this epoch and these pools), every
  // change is recorded there before the call that made it returns, for a
  // successor (ObjectStore::Adopt).
  ObjectStore(std::vector<std::unique_ptr<Pool>> pools, uint64_t epoch,
              StoreLimits limits = {},
              std::unique_ptr<Ledger> ledger = nullptr);

  // A successor's store: the predecessor's objects, leases, sessions,
  // offers and fork holds as `state` (read from `ledger`, Ledger::Adopt)
  // holds them, under the same epoch, in `pools` (the same memory, by
  // descriptor; checked against the ledger's: FAILED_PRECONDITION naming a
  // pool resized, renamed or missing). Adopted sessions are detached until
  // their process resumes them (ResumeSession, by the session id it knows:
  // the ledger holds only its hash); those whose process is gone end at
  // once, the others hold what they held meanwhile. Fork holds, whose
  // children the daemon can no longer watch, keep their objects for the
  // life of this daemon. FAILED_PRECONDITION for a ledger whose records
  // contradict one another (two objects on one range, say).
  static absl::StatusOr<std::unique_ptr<ObjectStore>> Adopt(
      std::vector<std::unique_ptr<Pool>> pools, StoreLimits limits,
      std::unique_ptr<Ledger> ledger, LedgerState state);

  // Fork hold `hold_id`, adopted from a predecessor, is watched again (its
  // connection was handed over): it ends with its children, no longer
  // stranded. False, changing nothing, for a hold not adopted.
  bool ClaimForkHold(uint64_t hold_id);

  // The ledger's descriptor (-1 without one): what goes to a successor.
  int ledger_fd() const { return ledger_ == nullptr ? -1 : ledger_->fd(); }
  AdoptedState adopted() const;

  // Stops every change for good and returns: the caller hands the pools
  // and the ledger to a successor, which goes on from exactly here. Calls
  // that reach the store from now on wait (their connections end with this
  // process). Only for a take-over: the process must exit after it.
  void FreezeForHandover() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Undoes FreezeForHandover, from the thread that froze it, when the
  // hand-over did not happen.
  void Thaw() ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // Not copyable or movable: sessions and waiters refer to it.
  ObjectStore(const ObjectStore&) = delete;
  ObjectStore& operator=(const ObjectStore&) = delete;

  uint64_t epoch() const { return epoch_; }
  // Descriptions of every pool, indexed by pool id. Immutable.
  const std::vector<v1::PoolInfo>& pool_infos() const { return pool_infos_; }
  // The limits in force: the config's, each per-uid share resolved
  // (limits.h, ResolveUidShares).
  const StoreLimits& limits() const { return limits_; }

  // Opens a session for the process `peer` and returns its unguessable id,
  // its descriptor secret and the pools it may use: per pool, what the
  // pool's rules give the peer's credentials (pool_access.h), at most
  // reading when `read_only`. UNAVAILABLE after Shutdown; INVALID_ARGUMENT
  // for a client name over kMaxNameBytes; PERMISSION_DENIED naming the uid
  // when it may use no pool at all; RESOURCE_EXHAUSTED naming the limit
  // when the peer's uid holds limits.max_sessions_per_uid sessions.
  absl::StatusOr<OpenedSession> OpenSession(const std::string& client_name,
                                            PeerInfo peer,
                                            bool read_only = false);
  // Attaches a new stream to session `session_id`, whose stream broke while
  // its process lived on (or that the process replaces). Only the process
  // that opened it may: `owner` is the new connection's (peer.h).
  // FAILED_PRECONDITION (SESSION_ENDED) for a session that is not open or
  // belongs to another process, with one message for both.
  // With `account`, reconciles the session's leases with the process's
  // (docs/shm_layout.md, "Resuming a session"): held by both, kept; held
  // here only, dropped (released in flight, or granted by a call whose
  // answer never arrived); named by the process only, refused
  // (OpenedSession.refused). Every release through
  // account->releases_through is then settled. INVALID_ARGUMENT naming the
  // counts for more ids than limits.max_leases_per_client, or a
  // releases_through below the seq already applied; nothing changes then.
  // `connection`: the serial of the connection the resume came on
  // (PeerInfo::connection); the session's recorded serial only grows (0
  // leaves it as it is).
  absl::StatusOr<OpenedSession> ResumeSession(
      uint64_t session_id, OwnerKey owner,
      const LeaseAccount* account = nullptr, uint64_t connection = 0);
  // The session's stream `stream` ended without EndSession: if the process
  // is gone the session ends now, else it stays, detached, with every
  // lease, until the process resumes it, ends it, or exits
  // (ReapExitedProcesses): memory a live process may still map is never
  // reused. No-op for a stream that was replaced or a session that ended.
  void StreamEnded(uint64_t session_id, uint64_t stream);
  // Ends the detached sessions whose process has exited. Returns how many.
  int ReapExitedProcesses();
  // Ends a session (idempotent): drops its leases, discards its unsealed
  // objects, reclaims its untaken transfers.
  void EndSession(uint64_t session_id);
  // OK when session `session_id` is open and belongs to `owner` (the
  // caller's connection's, from the kernel); else FAILED_PRECONDITION
  // (SESSION_ENDED) with one message for both, so it tells nothing of other
  // sessions.
  absl::Status Authorize(uint64_t session_id, OwnerKey owner) const;
  // The host pools whose descriptors the process `peer` (the owner key of
  // a descriptor-socket connection, peer.h) may receive for session
  // `session_id`: only when the session is open, `secret` is its
  // descriptor secret (compared in constant time), and `peer` is the
  // session's process (SameProcess). PERMISSION_DENIED otherwise, with one
  // message for every case. Once per
  // session: descriptors in flight count against the daemon's user until
  // their receiver reads them, so a session may not ask again and again
  // without reading (FAILED_PRECONDITION the second time). With `ring` not
  // null, a session that may write a host pool also gets a release ring
  // (docs/shm_layout.md, "The release ring"), whose descriptor is set there
  // (left invalid when the ring could not be made: its client seals on the
  // stream, and the daemon logs why).
  absl::StatusOr<std::vector<DescriptorGrant>> GrantDescriptors(
      uint64_t session_id, absl::string_view secret, const OwnerKey& peer,
      UniqueFd* ring = nullptr);
  // A new release ring for session `session_id`, which has none (a resume
  // dropped it, or this daemon adopted the session), its descriptor set in
  // *ring; authenticated as GrantDescriptors, with the same one refusal.
  // The ring starts with the session's last applied seq as `applied`.
  // FAILED_PRECONDITION when the session has a ring, or may write no host
  // pool; RESOURCE_EXHAUSTED (LIMIT_EXCEEDED) once kMaxRingsPerSession
  // rings were made for it (a client that resumes again and again seals on
  // its stream from then on); UNAVAILABLE after Shutdown; INTERNAL when the
  // ring cannot be made.
  absl::Status GrantRing(uint64_t session_id, absl::string_view secret,
                         const OwnerKey& peer, UniqueFd* ring);
  // [P18] A process is about to fork while it holds views: pins every object
  // session `session_id` holds now, until EndForkHold(hold_id), so that the
  // views its children inherit keep their bytes whatever the parent (or its
  // session) does meanwhile. Authenticated as GrantDescriptors (the
  // session's process, its secret), with the same one refusal;
  // RESOURCE_EXHAUSTED (LIMIT_EXCEEDED) when the uid has
  // limits.max_fork_holds_per_uid holds; UNAVAILABLE while shutting down.
  // The hold outlives the session: it belongs to the children.
  absl::StatusOr<ForkHoldGrant> HoldForFork(uint64_t session_id,
                                            absl::string_view secret,
                                            const OwnerKey& peer);
  // The hold's descriptor is kept where a successor would get it: its
  // client may be told now. A successor drops a hold this was not called
  // for (its client was never told; docs/shm_layout.md, "Fork holds").
  void ForkHoldGranted(uint64_t hold_id);
  // The forked children of a hold are gone: unpins its objects (freeing
  // those nothing else holds). No-op for an unknown id.
  void EndForkHold(uint64_t hold_id);

  // The segment of pool `pool_id` (< pool_infos().size()). Immutable, so
  // usable without the store's lock.
  const Segment& segment(uint32_t pool_id) const {
    return pools_[pool_id]->segment();
  }

  // A write lease on a new object for args.caller; its `stale` ranges must
  // go through ClearStale before the handout reaches the creator.
  absl::StatusOr<std::optional<Handout>> TryCreate(const CreateArgs& args,
                                                   bool last_try);
  // Zeros the handout's stale ranges, without the store's lock (no one but
  // the creator can reach a new object before it is sealed or its ref
  // passed on, and the creator has not yet heard of it), then unpins the
  // object: its range is not reused while the zeros are written, even if
  // the creator's session ends meanwhile. On failure marks the ranges
  // written by several uids again (so they are cleared next time), drops
  // the handout's lease (the object goes) and returns the error.
  absl::Status ClearStale(uint64_t session_id, const Handout& handout);
  absl::StatusOr<SealResult> Seal(const Caller& caller, uint64_t lease_id,
                                  bool exclusive);
  // Seal with a new size and layout (SealArgs). INVALID_ARGUMENT naming the
  // values for a layout that is invalid or does not fit the capacity.
  absl::StatusOr<SealResult> Seal(const Caller& caller, uint64_t lease_id,
                                  const SealArgs& args);
  // A lease on the object `ref` names. With a nonzero `offer_token` of an
  // offer of that object, the new lease takes the offer's pin over (the
  // offer ends); a token that pins nothing (taken, expired, another
  // object's) changes nothing, but words a stale ref's error.
  absl::StatusOr<Handout> Get(const Caller& caller, const v1::ObjectRef& ref,
                              uint64_t offer_token = 0);
  // Get that, with `wait`, says "not yet" (nullopt) for an object not
  // sealed yet (its one-way seal is on its way), until `last_try`, which
  // then fails DEADLINE_EXCEEDED naming the ref. An object its creator
  // discarded meanwhile (or whose session ended) is a stale ref: NOT_FOUND.
  absl::StatusOr<std::optional<Handout>> TryGet(const Caller& caller,
                                                const v1::ObjectRef& ref,
                                                uint64_t offer_token, bool wait,
                                                bool last_try);
  // TryGet of every ref under one lock: "not yet" while any of them waits
  // for its seal (and nothing is taken then), else one result per ref.
  // Most refs a call takes.
  static constexpr size_t kMaxBatch = 1024;
  absl::StatusOr<std::optional<std::vector<absl::StatusOr<Handout>>>>
  TryGetMany(const Caller& caller, const std::vector<v1::ObjectRef>& refs,
             bool wait, bool last_try);
  // [P19] Pins the object of the session's read lease `lease_id` for a
  // receiver in another process (offer_table.h) and returns its ref and the
  // offer's token. FAILED_PRECONDITION for a lease that is not a read lease
  // of a sealed shared object (an unsealed buffer's, a shared-writable
  // object's, an exclusive take's); RESOURCE_EXHAUSTED (LIMIT_EXCEEDED) at
  // limits.max_offers_per_session untaken offers; the lease lookup's errors
  // (FindLease). The pinned capacity is charged to the session's uid until
  // the offer ends.
  absl::StatusOr<OfferGrant> Offer(const Caller& caller, uint64_t lease_id);
  // Ends the offers whose grace after their session's end has passed
  // (limits.offer_grace_ms), freeing what nothing else holds. Returns how
  // many. The daemon calls it with ReapExitedProcesses.
  int ExpireOffers(absl::Time now = absl::Now());
  // `timeout` only words the last try's error (0: NOT_FOUND at once).
  absl::StatusOr<std::optional<Handout>> TryGetByName(const Caller& caller,
                                                      const std::string& name,
                                                      absl::Duration timeout,
                                                      bool last_try);
  // Returns true when the release freed the object's memory. Releases (this
  // and ReleaseBatch) still apply while shutting down.
  absl::StatusOr<bool> Release(const Caller& caller, uint64_t lease_id);

  // Applies one ReleaseLeases message of the session (from its stream, or a
  // copy a unary request carried): drops each lease the session holds (an id
  // it does not hold is skipped and named in the returned NOT_FOUND, which
  // the caller logs) and records `seq` as applied. A seq applied already is
  // skipped (OK, nothing dropped): the other copy came first.
  // INVALID_ARGUMENT when `seq` is past the next one due;
  // FAILED_PRECONDITION (SESSION_ENDED) when the session is not open.
  // `seals` (ReleaseLeases.seals) are applied first, in order; one the
  // store refuses discards its object (its Get waiters fail) and is named
  // in the returned NOT_FOUND too. From the stream: the session's release
  // ring is drained after it, and a nudge it asked for is cleared (the
  // calls waiting for its seals try again, and ask again).
  absl::Status ReleaseBatch(uint64_t session_id, uint64_t seq,
                            const std::vector<uint64_t>& lease_ids,
                            const std::vector<v1::OneWaySeal>& seals = {});
  // True once the session applied every ReleaseLeases through `seq`;
  // false: not yet. Fails SESSION_ENDED if the session ended,
  // DEADLINE_EXCEEDED naming both seqs on `last_try`.
  absl::StatusOr<bool> TryAwaitReleases(uint64_t session_id, uint64_t seq,
                                        bool last_try);

  // How many times the store changed in a way that may let a waiting call
  // through (memory freed, a name sealed, releases applied, a session ended
  // or detached, shutdown). WaitForChange blocks until it differs from
  // `seen`, or until `deadline`.
  uint64_t changes() const;
  void WaitForChange(uint64_t seen, absl::Time deadline) const;
  // `listener` is called on every change, under the store's lock: it must
  // only note it (WaitingCalls::Poke). Set once, before serving.
  void SetChangeListener(std::function<void()> listener);
  // `sink` is told what the store refused of a client's release ring (a
  // release or seal of a lease that is not the session's; a record it could
  // not read, after which the ring is read no more), with the session's id.
  // Called under the store's lock, once per drain that refused something: a
  // client decides how often, so the sink must rate-limit what it logs, as
  // the refusals of a client's stream are (ObjectStoreService::
  // LogClientError). Without a sink they go unlogged. Set once, before
  // serving.
  using ClientErrorSink =
      std::function<void(uint64_t session_id, const absl::Status& refused)>;
  void SetClientErrorSink(ClientErrorSink sink);

  // Counts one waiting call of `session_id` against the waiter limits;
  // RESOURCE_EXHAUSTED naming the limit it would pass, or the session's
  // error. Every OK is paired with one EndWait(token).
  struct WaitToken {
    uint64_t session_id = 0;
    uid_t uid = 0;
  };
  absl::StatusOr<WaitToken> BeginWait(uint64_t session_id);
  void EndWait(const WaitToken& token);
  // Returns true when the memory was freed now (false: deferred).
  absl::StatusOr<bool> Delete(const Caller& caller, const std::string& name);

  // The store's counters and the pools `viewer` may use (all of them when
  // it is null: the daemon's own use), for any process on the socket.
  // Like the monitoring snapshots below, it first applies what every
  // session posted in its release ring, so that it shows every seal a
  // client has made (not const for that).
  v1::StatsResponse Stats(const PeerCredentials* viewer = nullptr);
  // Stats of the caller's session: only the pools it may use, and its own
  // stock (every session's ring drained first, as for Stats).
  absl::StatusOr<v1::StatsResponse> SessionStats(const Caller& caller);

  // Monitoring snapshots (one lock each). Status fills the store's part of
  // DaemonStatus: pools, counts, limits, uptime, epoch. With a `viewer` (a
  // caller who is neither root nor the daemon's user), each shows only what
  // that user may see: the pools it may use and their objects, and its own
  // sessions; null shows everything (operators).
  v1::DaemonStatus Status(const PeerCredentials* viewer = nullptr);
  // Live objects oldest first, one page: at most `limit` (0, or more than
  // kMaxListPage: kMaxListPage) created after the one `page_token` names
  // (0: from the oldest). next_page_token is set when more follow (a
  // viewer's page may be short: at most 4 * kMaxListPage objects are looked
  // at per call). Refs are listed without their nonce: a listing hands out
  // no usable ref.
  static constexpr uint32_t kMaxListPage = 10000;
  v1::ListObjectsResponse ListObjects(uint32_t limit, uint64_t page_token = 0,
                                      const PeerCredentials* viewer = nullptr);
  v1::ListClientsResponse ListClients(const PeerCredentials* viewer = nullptr);

  // Fails every waiter and every later call with UNAVAILABLE. Sessions stay
  // until EndSession.
  void Shutdown();

 private:
  // When `session_id` is a session adopted from a predecessor (its id's
  // hash) and `owner` its process (exactly, for a gRPC connection; by
  // SameProcess for the descriptor socket's), makes it open under that id
  // from now on. No-op otherwise.
  void TakeAdopted(uint64_t session_id, const OwnerKey& owner, bool exact)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The open session `session_id` when `secret` is its descriptor secret
  // and `peer` its process, else null. A session opened just before its
  // daemon was replaced asks the successor: it is adopted first.
  SessionTable::Session* ProvenSession(uint64_t session_id,
                                       absl::string_view secret,
                                       const OwnerKey& peer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  AdoptedState AdoptedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes session `s` a release ring, its descriptor in *ring. INTERNAL
  // from SessionRing::Create.
  absl::Status MakeRingLocked(SessionTable::Session& s, UniqueFd* ring)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stats of session `session` (id `session_id`), or with none (null, 0)
  // of the pools `viewer` may use (all when it is null too).
  v1::StatsResponse StatsLocked(uint64_t session_id,
                                const SessionTable::Session* session,
                                const PeerCredentials* viewer) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A successor's restore from `state` (Adopt).
  absl::Status Restore(LedgerState state);
  // Records the object in `slot` as it is now in the ledger (state, name
  // bound); PutObject for a new one.
  void JournalObject(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status JournalNewObject(uint32_t slot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Leases held, or with a ledger the lease records in use (those of a
  // refused predecessor's record too, never reused): what
  // limits.max_leases, at most the ledger's records, is checked against.
  size_t LeasesCounted() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ledger_ != nullptr
               ? std::max<size_t>(leases_.size(), ledger_->lease_records())
               : leases_.size();
  }
  // The client id of session `session_id` (0: not open).
  uint64_t ClientIdOf(uint64_t session_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED naming the ledger's table when it cannot take `n`
  // more pins.
  absl::Status CheckPinRoom(size_t n) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  using Session = SessionTable::Session;
  using Object = ObjectTable::Object;
  using State = ObjectTable::State;
  using Lease = LeaseTable::Lease;

  // The pool a Create of `s` goes to: the one called `name` if given (a
  // pool `s` may not use counts as unknown: NOT_FOUND), else its default
  // host pool (DefaultPool). Access is checked by the caller.
  absl::StatusOr<uint32_t> PoolFor(const Session& s,
                                   absl::string_view name) const;
  // The one rule for which pool holds what `s` creates on the device of
  // pool `like` (its memory kind and CUDA device) when it names no pool:
  // the first such pool `s` may write, else the first it may read (whose
  // access check then refuses the Create, naming why); nullopt when `s`
  // may use none. Clients learn its answers from PoolsOf
  // (PoolInfo.default_for_device) and never choose by themselves.
  std::optional<uint32_t> DefaultPool(const Session& s,
                                      const v1::PoolInfo& like) const;
  // The pools `s` may use, with its access to each, and the default pool
  // of each device marked.
  std::vector<v1::PoolInfo> PoolsOf(const Session& s) const;
  // Whether `s` may read (or, with `write`, write) pool `pool_id`. Cheap:
  // requests on the data path ask it first and build AccessError only when
  // refused.
  static bool Allowed(const Session& s, uint32_t pool_id, bool write) {
    const v1::PoolAccess a = s.access[pool_id];
    return a == v1::POOL_ACCESS_READ_WRITE ||
           (!write && a == v1::POOL_ACCESS_READ);
  }
  // PERMISSION_DENIED naming the pool, the session's uid and `what` (the
  // request refused), for a request Allowed refused.
  absl::Status AccessError(const Session& s, uint32_t pool_id,
                           absl::string_view what) const;

  // The session of `caller` (caller.h), admitted: open and, when
  // caller.owner is set, that process's (else SESSION_ENDED, one message
  // for both); the ReleaseLeases copies it carries applied; every release
  // through caller.releases_through applied (else AwaitingReleasesError, or
  // on caller.releases_last_try the DEADLINE_EXCEEDED naming both seqs).
  // INVALID_ARGUMENT for more than kDaemonMaxCarriedReleases copies. The
  // one session lookup of a data-plane call; the pointer lives while mu_ is
  // held and no session is opened or ended.
  absl::StatusOr<Session*> Admit(const Caller& caller)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies the messages session `s` (id `session_id`) posted in its
  // release ring since the last drain, in seq order, up to the first that
  // is not due yet (the stream brings the one before it). True when it
  // applied any. A ring found broken is logged and read no more.
  bool DrainRing(uint64_t session_id, Session& s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The object in `slot` is unsealed: drains its creator's ring, where its
  // seal may be. With `nudge` (the caller will wait for the seal), when the
  // object is still unsealed after the drain, asks the creator to send its
  // next seals on the stream as well, and drains again; a seal found in the
  // ring asks for nothing. True when a drain applied anything (the object
  // may be sealed, or gone).
  bool PullSealOf(uint32_t slot, bool nudge) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // DrainRing of every session (the monitoring views). True when it
  // applied any message.
  bool DrainRings() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A call lacks what releases may free (memory, room under a limit), and
  // releases are posted in release rings, which the daemon only reads when
  // it needs to: drains them all (DrainRings; true when that applied any
  // message, and the call should try again). With `nudge` (the call will
  // wait), first asks every ring's client to send what it posts from now
  // on on its stream as well, so that a later release wakes the waiting
  // calls (ReleaseBatch: TakeNudge, Changed).
  bool PullReleases(bool nudge) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a call failed, or says "not yet" (a create: no memory), for
  // want of what releases may free: RESOURCE_EXHAUSTED (a pool with no room
  // for it, LIMIT_EXCEEDED).
  static bool LacksWhatReleasesFree(const absl::Status& status);
  static bool LacksWhatReleasesFree(
      const absl::StatusOr<std::optional<Handout>>& h);
  // TryCreate under the lock, for an object of `bytes` (validated): each
  // try admits the caller again (what it carries is applied once).
  absl::StatusOr<std::optional<Handout>> CreateLocked(const CreateArgs& args,
                                                      uint64_t bytes,
                                                      bool last_try)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ReleaseBatch for the open session `s` (id `session_id`).
  absl::Status ReleaseBatchLocked(uint64_t session_id, Session& s, uint64_t seq,
                                  absl::Span<const uint64_t> lease_ids,
                                  absl::Span<const v1::OneWaySeal> seals)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Seal under the lock (both Seal forms, one-way seals), for the open
  // session `s` (id `session_id`).
  absl::StatusOr<SealResult> SealLocked(uint64_t session_id, Session& s,
                                        uint64_t lease_id, const SealArgs& args)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A one-way seal: SealLocked, and when refused, the write lease dropped
  // (the object discarded) if it is one. Returns the refusal.
  absl::Status ApplyOneWaySeal(uint64_t session_id, Session& s,
                               const v1::OneWaySeal& seal)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Get under the lock, for the open session `s` (id `session_id`);
  // nullopt: not sealed yet, and `wait`.
  absl::StatusOr<std::optional<Handout>> GetLocked(uint64_t session_id,
                                                   Session& s,
                                                   const v1::ObjectRef& ref,
                                                   uint64_t offer_token,
                                                   bool wait, bool last_try)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The object in `slot` leaves the stock (sealed or discarded).
  void Unstock(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The lease `lease_id` of the open session `session_id` (the caller
  // admitted it); UNAVAILABLE while shutting down, else as LookupLease.
  absl::StatusOr<Lease*> FindLease(uint64_t session_id, uint64_t lease_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same lookup during shutdown too (for releases):
  // FAILED_PRECONDITION for a lease already released, NOT_FOUND for one
  // never issued, PERMISSION_DENIED for another session's.
  absl::StatusOr<Lease*> LookupLease(uint64_t session_id, uint64_t lease_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t AddLease(uint64_t session_id, Session& session, uint32_t slot,
                    bool write) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops a lease; discards the object if it was the unsealed writer's.
  // Returns true when the object was freed. `holder`: the lease's session
  // when the caller has it at hand (else it is looked up).
  bool DropLease(uint64_t lease_id, Session* holder = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ResumeSession's reconciliation of session `s`'s leases with `account`
  // (validated), recorded in `opened`.
  void ReconcileLeases(Session& s, const LeaseAccount& account,
                       OpenedSession* opened)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the object's memory if nothing refers to it any more.
  bool MaybeFree(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Handout MakeHandout(uint32_t slot, uint64_t lease_id, bool writable) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // UNAVAILABLE: the store is shutting down.
  static absl::Status ShuttingDownError();
  // Notes a change (see changes()). Called under mu_.
  void Changed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // 64 bits from getrandom(2), drawn 64 at a time.
  uint64_t Random64() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Undoes an offer's pin and charge (taken, or expired: then frees what
  // nothing else holds).
  void EndOffer(const OfferTable::Offer& offer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the capacity of an offered transfer into or out of its creator's
  // holdings.
  void HoldTransfer(uint32_t slot, bool hold)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the monitoring views read (store_views.h); the references live
  // while mu_ is held.
  StoreView View() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t epoch_;
  const absl::Time start_time_;
  const StoreLimits limits_;
  std::vector<v1::PoolInfo> pool_infos_;

  mutable absl::Mutex mu_;
  uint64_t changes_ ABSL_GUARDED_BY(mu_) = 0;  // See changes().
  std::function<void()> listener_ ABSL_GUARDED_BY(mu_);
  ClientErrorSink client_errors_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Pool>> pools_ ABSL_GUARDED_BY(mu_);
  SessionTable sessions_ ABSL_GUARDED_BY(mu_);
  ObjectTable objects_ ABSL_GUARDED_BY(mu_);
  LeaseTable leases_ ABSL_GUARDED_BY(mu_);
  // Opening order of sessions and creation order of objects, one count:
  // client ids come from it too.
  uint64_t next_serial_ ABSL_GUARDED_BY(mu_) = 1;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  struct ForkHold {
    uid_t uid = 0;
    uint64_t session_id = 0;  // Who took it (may have ended since).
    std::vector<uint32_t> slots;
    uint64_t bytes = 0;  // Their capacity, charged to `uid`.
    // Adopted from a predecessor without its connection: nothing ends it.
    bool stranded = false;
  };
  absl::flat_hash_map<uint64_t, ForkHold> fork_holds_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uid_t, uint64_t> fork_holds_per_uid_ ABSL_GUARDED_BY(mu_);
  uint64_t next_fork_hold_ ABSL_GUARDED_BY(mu_) = 1;
  OfferTable offers_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Ledger> ledger_ ABSL_GUARDED_BY(mu_);
  // Adopted sessions not yet resumed: by the hash of their id (what the
  // ledger keeps), the id they are open under meanwhile; and by that id,
  // the hash and the slots each created (whose creator a resume renames).
  absl::flat_hash_map<std::string, uint64_t> adopted_ ABSL_GUARDED_BY(mu_);
  struct AdoptedSession {
    std::string hash;
    std::vector<uint32_t> slots;
  };
  absl::flat_hash_map<uint64_t, AdoptedSession> adopted_created_
      ABSL_GUARDED_BY(mu_);
  // Fork holds adopted from a predecessor: nothing tells when their
  // children exit, so they keep their objects for this daemon's life.
  uint64_t stranded_hold_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Capacity of the objects a refused ledger record keeps from reuse (its
  // range, or a live object a refused lease or pin may have stood for).
  uint64_t quarantined_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_records_ ABSL_GUARDED_BY(mu_) = 0;
  std::array<uint64_t, 64> random_ ABSL_GUARDED_BY(mu_);
  size_t random_next_ ABSL_GUARDED_BY(mu_) = 64;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_STORE_OBJECT_STORE_H_
