// The store's sessions: who opened each (by the kernel's word), the stream
// attached to it, what it holds and waits for, and what every uid uses, with
// the limits on all of that (StoreLimits).
//
// A session's id is its secret: drawn at random, never 0. Its client id is
// public and acts for nothing.
//
// Thread safety: not thread-safe; the owner (ObjectStore) serializes access.
#ifndef SHMTENSOR_DAEMON_STORE_SESSION_TABLE_H_
#define SHMTENSOR_DAEMON_STORE_SESSION_TABLE_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "daemon/os/peer.h"
#include "daemon/store/limits.h"
#include "daemon/store/release_log.h"
#include "daemon/store/session_ring.h"
#include "shmtensor/v1/shmtensor.pb.h"

namespace shmtensor::daemon {

// Who a session belongs to, by the kernel's word (peer.h): never what a
// request claims.
struct PeerInfo {
  PeerCredentials process;
  OwnerKey owner;  // Who may act for the session (peer.h).
  // Follows the process; null only in tests that run the store without
  // processes (then a session whose stream ends without a clean close is
  // ended at once, as if its process were gone).
  std::shared_ptr<const UniqueFd> pidfd;
  std::string command_line;  // For operators, from /proc.
  // The serial of the connection the session's stream opened or last
  // resumed on (Connection::serial; 0: an in-process session): its calls
  // on an older connection are refused (ObjectStore::Admit).
  uint64_t connection = 0;
};

// Bytes of SessionOpened.descriptor_secret.
inline constexpr size_t kDescriptorSecretBytes = 32;

// The `slot` of SessionTable::CheckHold for an object not created yet.
inline constexpr uint32_t kNoSlot = UINT32_MAX;

// FAILED_PRECONDITION (SESSION_ENDED) for session `id`: one message for a
// session that ended, one never opened and one of another process, so it
// tells a caller nothing it did not know.
absl::Status SessionNotOpenError(uint64_t id);

class SessionTable {
 public:
  struct Session {
    std::string client_name;
    int pid = 0;             // The kernel's, as peer.process.pid.
    uint64_t client_id = 0;  // Public id (opening order).
    // The stream attached now (0: detached, the process lost its
    // connection); each attach gets a new number.
    uint64_t stream = 0;
    uint32_t waiters = 0;  // Calls of the session waiting now.
    absl::flat_hash_set<uint64_t> leases;
    absl::flat_hash_set<uint32_t> pending_transfers;  // Slots it offered.
    ReleaseLog releases;  // Its ReleaseLeases messages applied.
    PeerInfo peer;
    absl::Time opened;
    uint64_t serial = 0;  // Opening order, for oldest-first listings.
    // Leases per object it holds, and the capacity of those objects plus of
    // its untaken transfers: what max_bytes_per_client limits.
    absl::flat_hash_map<uint32_t, uint32_t> held_slots;
    uint64_t bytes_held = 0;
    // By pool id: what the session may do with each pool.
    std::vector<v1::PoolAccess> access;
    bool read_only = false;  // OpenSession.read_only.
    std::string descriptor_secret;
    // A session adopted from a predecessor knows only its secret's SHA-256
    // (the ledger's); descriptor_secret is empty then.
    std::string descriptor_secret_hash;
    bool descriptors_granted = false;  // GrantDescriptors answered it.
    // Its stock: unsealed objects it made ahead of need (Object::stock),
    // and their capacity (limits.max_stock_bytes_per_client).
    uint64_t stock_objects = 0;
    uint64_t stock_bytes = 0;
    // Its release ring (session_ring.h), made by GrantDescriptors for a
    // session that may write a host pool; dropped by a resume (its client
    // stops posting there), and none in a successor, until its client asks
    // for a new one (GrantRing). ReleaseLeases messages read from its
    // rings, for operators, and rings made for it by this daemon
    // (kMaxRingsPerSession).
    std::unique_ptr<SessionRing> ring;
    uint64_t ring_messages = 0;
    uint32_t rings_made = 0;
  };

  // [P24] What one uid takes of every table the daemon shares between uids
  // (its sessions, waiting calls, objects, leases, pins and stock, and the
  // bytes it holds), each under the uid's share (StoreLimits, resolved by
  // ResolveUidShares): one uid never takes what another needs.
  struct UidUsage {
    uint64_t bytes = 0;
    uint32_t sessions = 0;
    uint32_t waiters = 0;
    uint64_t objects = 0;      // Live objects it created (records, whatever
                               // their size: a zero-byte one counts too).
    uint64_t leases = 0;       // Leases its sessions hold.
    uint64_t pins = 0;         // Offer and fork-held object records.
    uint64_t stock_bytes = 0;  // Capacity of its sessions' stock.
    bool empty() const {
      return bytes == 0 && sessions == 0 && waiters == 0 && objects == 0 &&
             leases == 0 && pins == 0 && stock_bytes == 0;
    }
  };

  // `random` draws session ids and descriptor secrets, and is called only
  // from Open.
  SessionTable(StoreLimits limits, std::function<uint64_t()> random);

  // Not copyable or movable: the owner's callbacks refer to it.
  SessionTable(const SessionTable&) = delete;
  SessionTable& operator=(const SessionTable&) = delete;

  // Opens a session of `peer`, with `access` by pool id, and attaches a
  // stream to it. Its client id and serial are `serial` (the owner's count,
  // which objects share). Returns its id. RESOURCE_EXHAUSTED naming the
  // limit when the peer's uid has limits.max_sessions_per_uid sessions open.
  absl::StatusOr<uint64_t> Open(std::string client_name, PeerInfo peer,
                                std::vector<v1::PoolAccess> access,
                                bool read_only, uint64_t serial);
  // A successor's session, adopted from its predecessor's ledger: `s`
  // (detached) under a new random id that nobody knows, counted against its
  // uid without the limits. Returns the id. Rekey moves it to the id its
  // process presents when it resumes (which must not be open).
  uint64_t Restore(Session s);
  void Rekey(uint64_t old_id, uint64_t new_id);
  // A new random descriptor secret for `s`.
  void NewDescriptorSecret(Session& s);

  // Session `id`, or SessionNotOpenError. Every Session pointer or
  // reference the table hands out lives until the next Open or Close.
  absl::StatusOr<Session*> Find(uint64_t id);
  // The same, and SessionNotOpenError too for a session of another `owner`.
  absl::StatusOr<Session*> FindOwned(uint64_t id, OwnerKey owner);
  // Session `id`, or null when it is not open.
  Session* FindOrNull(uint64_t id);
  const Session* FindOrNull(uint64_t id) const;
  // Attaches a new stream to `s` and returns its number (never 0).
  uint64_t Attach(Session& s);
  // Forgets open session `id`; its uid has one session fewer. Its leases,
  // holdings and waiters must be gone (bytes held are given back with
  // Unhold/Charge before).
  void Close(uint64_t id);
  // Whether `secret` is the descriptor secret of `s`, in time that does not
  // tell how much of it matched.
  static bool SecretMatches(const Session& s, absl::string_view secret);

  // Records lease `lease_id` of `s` on the object in `slot`, of `capacity`
  // bytes (one more lease of its uid): the first lease on an object charges
  // its capacity to `s` and its uid. Unhold undoes it; the last lease on an
  // object gives it back.
  void Hold(Session& s, uint64_t lease_id, uint32_t slot, uint64_t capacity);
  void Unhold(Session& s, uint64_t lease_id, uint32_t slot, uint64_t capacity);
  // Adds `delta` to the bytes `s` holds, and to its uid's.
  void Charge(Session& s, int64_t delta);
  // Adds `delta` to the bytes uid `uid` holds outside any session (its
  // fork holds, which outlive sessions): max_bytes_per_uid counts them.
  void ChargeUid(uid_t uid, int64_t delta);
  // RESOURCE_EXHAUSTED naming the client and the limit if `s` taking one
  // more lease, on the object in `slot` (kNoSlot: one not created yet) of
  // `capacity` bytes, would break a per-client or per-uid limit (the uid's
  // share of leases included), or the daemon's lease limit with
  // `leases_held` leases held in all.
  absl::Status CheckHold(const Session& s, uint32_t slot, uint64_t capacity,
                         size_t leases_held) const;

  // Per-uid shares of the object, pin and stock tables: Check* returns
  // RESOURCE_EXHAUSTED (LIMIT_EXCEEDED) naming the uid, its use and the
  // limit when `uid` taking `n` more would pass its share; Count* adds
  // `delta` (negative: gives back).
  absl::Status CheckUidObjects(uid_t uid) const;
  void CountObjects(uid_t uid, int64_t delta);
  absl::Status CheckUidPins(uid_t uid, uint64_t n) const;
  void CountPins(uid_t uid, int64_t delta);
  absl::Status CheckUidStock(uid_t uid, uint64_t bytes) const;
  void CountStock(uid_t uid, int64_t delta);

  // Counts one more waiting call of `s`. RESOURCE_EXHAUSTED naming the
  // limit it would pass (per session, per uid, in all). Every OK is paired
  // with one EndWait(id of s, its uid), which may come after Close.
  absl::Status BeginWait(Session& s);
  void EndWait(uint64_t session_id, uid_t uid);

  // "'name' pid 12" of session `id`, or "session <id> (ended)".
  std::string ClientString(uint64_t id) const;
  size_t size() const { return sessions_.size(); }
  // Sessions with no stream attached.
  uint64_t detached() const;
  // Calls waiting now, all sessions.
  uint32_t waiters() const { return waiters_; }
  // Bytes held by every session of `uid` (0 for a uid with none).
  uint64_t uid_bytes(uid_t uid) const;
  // What each uid with anything in the daemon uses now.
  const absl::flat_hash_map<uid_t, UidUsage>& uids() const { return uids_; }
  const StoreLimits& limits() const { return limits_; }
  // Every open session, by id.
  const absl::flat_hash_map<uint64_t, Session>& all() const {
    return sessions_;
  }
  // Calls f(id, session) for every open session (which it may change, but
  // not open or close any).
  template <typename F>
  void ForEach(F f) {
    for (auto& [id, s] : sessions_) f(id, s);
  }

 private:
  // What `uid` uses (all zero for a uid with nothing).
  const UidUsage& UsageOf(uid_t uid) const;
  // Forgets `uid`'s entry once it uses nothing.
  void MaybeForget(uid_t uid);

  const StoreLimits limits_;
  const std::function<uint64_t()> random_;
  absl::flat_hash_map<uint64_t, Session> sessions_;
  absl::flat_hash_map<uid_t, UidUsage> uids_;
  uint32_t waiters_ = 0;
  uint64_t next_stream_ = 1;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_STORE_SESSION_TABLE_H_
