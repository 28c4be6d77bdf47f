#include "daemon/store/session_table.h"

#include <cassert>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "daemon/ledger/ledger.h"
#include "shmtensor/errors.h"

namespace shmtensor::daemon {

absl::Status SessionNotOpenError(uint64_t id) {
  return WithReason(absl::FailedPreconditionError(absl::StrFormat(
                        "session %016x is not open for this process", id)),
                    kReasonSessionEnded);
}

SessionTable::SessionTable(StoreLimits limits, std::function<uint64_t()> random)
    : limits_(limits), random_(std::move(random)) {}

absl::StatusOr<uint64_t> SessionTable::Open(std::string client_name,
                                            PeerInfo peer,
                                            std::vector<v1::PoolAccess> access,
                                            bool read_only, uint64_t serial) {
  UidUsage& uid = uids_[peer.process.uid];
  if (limits_.max_sessions_per_uid > 0 &&
      uid.sessions >= limits_.max_sessions_per_uid) {
    return LimitExceededError(absl::StrFormat(
        "uid %d has %d sessions open, the limit "
        "(limits.max_sessions_per_uid = %d); end sessions it no longer uses",
        peer.process.uid, uid.sessions, limits_.max_sessions_per_uid));
  }
  uint64_t id;
  do {
    id = random_();
  } while (id == 0 || sessions_.contains(id));
  ++uid.sessions;
  Session& s = sessions_[id];
  s.client_name = std::move(client_name);
  s.pid = peer.process.pid;
  s.peer = std::move(peer);
  s.opened = absl::Now();
  s.serial = serial;
  s.client_id = serial;
  s.stream = next_stream_++;
  s.access = std::move(access);
  s.read_only = read_only;
  NewDescriptorSecret(s);
  return id;
}

void SessionTable::NewDescriptorSecret(Session& s) {
  s.descriptor_secret.resize(kDescriptorSecretBytes);
  for (size_t i = 0; i < kDescriptorSecretBytes; i += sizeof(uint64_t)) {
    const uint64_t r = random_();
    memcpy(&s.descriptor_secret[i], &r, sizeof(r));
  }
}

uint64_t SessionTable::Restore(Session s) {
  uint64_t id;
  do {
    id = random_();
  } while (id == 0 || sessions_.contains(id));
  ++uids_[s.peer.process.uid].sessions;
  s.stream = 0;
  sessions_[id] = std::move(s);
  return id;
}

void SessionTable::Rekey(uint64_t old_id, uint64_t new_id) {
  auto it = sessions_.find(old_id);
  // Invariant: the caller checked `old_id` is open and `new_id` is not.
  assert(it != sessions_.end() && !sessions_.contains(new_id));
  Session s = std::move(it->second);
  sessions_.erase(it);
  sessions_[new_id] = std::move(s);
}

absl::StatusOr<SessionTable::Session*> SessionTable::Find(uint64_t id) {
  Session* s = FindOrNull(id);
  if (s == nullptr) return SessionNotOpenError(id);
  return s;
}

absl::StatusOr<SessionTable::Session*> SessionTable::FindOwned(uint64_t id,
                                                               OwnerKey owner) {
  Session* s = FindOrNull(id);
  if (s == nullptr || s->peer.owner != owner) return SessionNotOpenError(id);
  return s;
}

SessionTable::Session* SessionTable::FindOrNull(uint64_t id) {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second;
}

const SessionTable::Session* SessionTable::FindOrNull(uint64_t id) const {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second;
}

uint64_t SessionTable::Attach(Session& s) {
  s.stream = next_stream_++;
  return s.stream;
}

void SessionTable::Close(uint64_t id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  auto uid = uids_.find(it->second.peer.process.uid);
  if (uid != uids_.end()) {
    // Invariant: waiters and bytes were given back before the session went
    // (every wait ends before its call returns; Unhold uncharged all).
    --uid->second.sessions;
    if (uid->second.empty()) uids_.erase(uid);
  }
  sessions_.erase(it);
}

bool SessionTable::SecretMatches(const Session& s, absl::string_view secret) {
  // An adopted session compares hashes (ledger.h): the same constant time.
  std::string hashed;
  absl::string_view want = s.descriptor_secret;
  if (want.empty()) {
    if (s.descriptor_secret_hash.empty()) return false;
    const SessionHash h = HashSecret(secret);
    hashed.assign(h.begin(), h.end());
    secret = hashed;
    want = s.descriptor_secret_hash;
  }
  uint8_t diff = secret.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < want.size(); ++i) {
    diff |= static_cast<uint8_t>(want[i] ^ (i < secret.size() ? secret[i] : 0));
  }
  return diff == 0;
}

void SessionTable::Hold(Session& s, uint64_t lease_id, uint32_t slot,
                        uint64_t capacity) {
  if (s.leases.insert(lease_id).second) ++uids_[s.peer.process.uid].leases;
  if (s.held_slots[slot]++ == 0) Charge(s, capacity);
}

void SessionTable::Unhold(Session& s, uint64_t lease_id, uint32_t slot,
                          uint64_t capacity) {
  if (s.leases.erase(lease_id) > 0) --uids_[s.peer.process.uid].leases;
  auto held = s.held_slots.find(slot);
  if (held != s.held_slots.end() && --held->second == 0) {
    s.held_slots.erase(held);
    Charge(s, -static_cast<int64_t>(capacity));
  }
}

void SessionTable::Charge(Session& s, int64_t delta) {
  s.bytes_held += delta;
  uids_[s.peer.process.uid].bytes += delta;
}

void SessionTable::ChargeUid(uid_t uid, int64_t delta) {
  uids_[uid].bytes += delta;
  MaybeForget(uid);
}

void SessionTable::MaybeForget(uid_t uid) {
  auto it = uids_.find(uid);
  if (it != uids_.end() && it->second.empty()) uids_.erase(it);
}

namespace {

// The uid's use of one table against its share (0: none).
absl::Status CheckShare(uid_t uid, uint64_t used, uint64_t more, uint64_t limit,
                        absl::string_view what, absl::string_view key) {
  if (limit == 0 || used + more <= limit) return absl::OkStatus();
  return LimitExceededError(absl::StrFormat(
      "uid %d has %d %s; %d more would pass its share (limits.%s = %d)", uid,
      used, what, more, key, limit));
}

}  // namespace

absl::Status SessionTable::CheckUidObjects(uid_t uid) const {
  return CheckShare(uid, UsageOf(uid).objects, 1, limits_.max_objects_per_uid,
                    "live objects", "max_objects_per_uid");
}

void SessionTable::CountObjects(uid_t uid, int64_t delta) {
  uids_[uid].objects += delta;
  MaybeForget(uid);
}

absl::Status SessionTable::CheckUidPins(uid_t uid, uint64_t n) const {
  return CheckShare(uid, UsageOf(uid).pins, n, limits_.max_pins_per_uid,
                    "objects pinned by offers and fork holds",
                    "max_pins_per_uid");
}

void SessionTable::CountPins(uid_t uid, int64_t delta) {
  uids_[uid].pins += delta;
  MaybeForget(uid);
}

absl::Status SessionTable::CheckUidStock(uid_t uid, uint64_t bytes) const {
  return CheckShare(uid, UsageOf(uid).stock_bytes, bytes,
                    limits_.max_stock_bytes_per_uid, "bytes of stock",
                    "max_stock_bytes_per_uid");
}

void SessionTable::CountStock(uid_t uid, int64_t delta) {
  uids_[uid].stock_bytes += delta;
  MaybeForget(uid);
}

absl::Status SessionTable::CheckHold(const Session& s, uint32_t slot,
                                     uint64_t capacity,
                                     size_t leases_held) const {
  if (limits_.max_leases_per_client > 0 &&
      s.leases.size() >= limits_.max_leases_per_client) {
    return LimitExceededError(absl::StrFormat(
        "client '%s' pid %d holds %d leases, the limit "
        "(limits.max_leases_per_client = %d); release views it no longer "
        "needs",
        s.client_name, s.pid, s.leases.size(), limits_.max_leases_per_client));
  }
  if (absl::Status share = CheckShare(
          s.peer.process.uid, UsageOf(s.peer.process.uid).leases, 1,
          limits_.max_leases_per_uid, "leases", "max_leases_per_uid");
      !share.ok()) {
    return share;
  }
  if (limits_.max_leases > 0 && leases_held >= limits_.max_leases) {
    return LimitExceededError(absl::StrFormat(
        "%d leases are held, the limit (limits.max_leases = %d)", leases_held,
        limits_.max_leases));
  }
  const bool new_hold = slot == kNoSlot || !s.held_slots.contains(slot);
  if (limits_.max_bytes_per_uid > 0 && new_hold) {
    const uint64_t held = uid_bytes(s.peer.process.uid);
    if (held + capacity > limits_.max_bytes_per_uid) {
      return LimitExceededError(absl::StrFormat(
          "uid %d holds %d bytes in all its sessions; %d more would pass the "
          "limit (limits.max_bytes_per_uid = %d)",
          s.peer.process.uid, held, capacity, limits_.max_bytes_per_uid));
    }
  }
  if (limits_.max_bytes_per_client > 0 && new_hold &&
      s.bytes_held + capacity > limits_.max_bytes_per_client) {
    return LimitExceededError(absl::StrFormat(
        "client '%s' pid %d holds %d bytes; %d more would pass the limit "
        "(limits.max_bytes_per_client = %d)",
        s.client_name, s.pid, s.bytes_held, capacity,
        limits_.max_bytes_per_client));
  }
  return absl::OkStatus();
}

absl::Status SessionTable::BeginWait(Session& s) {
  UidUsage& uid = uids_[s.peer.process.uid];
  if (limits_.max_waiters_per_session > 0 &&
      s.waiters >= limits_.max_waiters_per_session) {
    return LimitExceededError(absl::StrFormat(
        "client '%s' pid %d has %d calls waiting, the limit "
        "(limits.max_waiters_per_session = %d)",
        s.client_name, s.pid, s.waiters, limits_.max_waiters_per_session));
  }
  if (limits_.max_waiters_per_uid > 0 &&
      uid.waiters >= limits_.max_waiters_per_uid) {
    return LimitExceededError(absl::StrFormat(
        "uid %d has %d calls waiting, the limit "
        "(limits.max_waiters_per_uid = %d)",
        s.peer.process.uid, uid.waiters, limits_.max_waiters_per_uid));
  }
  if (limits_.max_waiters > 0 && waiters_ >= limits_.max_waiters) {
    return LimitExceededError(absl::StrFormat(
        "%d calls are waiting, the limit (limits.max_waiters = %d)", waiters_,
        limits_.max_waiters));
  }
  ++s.waiters;
  ++uid.waiters;
  ++waiters_;
  return absl::OkStatus();
}

void SessionTable::EndWait(uint64_t session_id, uid_t uid) {
  --waiters_;
  --uids_[uid].waiters;
  MaybeForget(uid);
  if (Session* s = FindOrNull(session_id); s != nullptr) --s->waiters;
}

std::string SessionTable::ClientString(uint64_t id) const {
  const Session* s = FindOrNull(id);
  if (s == nullptr) return absl::StrFormat("session %016x (ended)", id);
  return absl::StrFormat("'%s' pid %d", s->client_name, s->pid);
}

uint64_t SessionTable::detached() const {
  uint64_t n = 0;
  for (const auto& [id, s] : sessions_) n += s.stream == 0;
  return n;
}

uint64_t SessionTable::uid_bytes(uid_t uid) const { return UsageOf(uid).bytes; }

const SessionTable::UidUsage& SessionTable::UsageOf(uid_t uid) const {
  static const UidUsage kNone;
  auto it = uids_.find(uid);
  return it == uids_.end() ? kNone : it->second;
}

}  // namespace shmtensor::daemon
