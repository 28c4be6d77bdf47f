// ObjectStore: sessions (open, resume, fork holds, descriptors, end).
#include <algorithm>
#include <cassert>
#include <cerrno>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "daemon/store/layout.h"
#include "daemon/store/object_store.h"
#include "daemon/store/store_views.h"
#include "shmtensor/errors.h"
#include "spdlog/spdlog.h"

namespace shmtensor::daemon {

absl::StatusOr<OpenedSession> ObjectStore::OpenSession(
    const std::string& client_name, PeerInfo peer, bool read_only) {
  if (client_name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("client name %s is more than %d bytes",
                        Quoted(client_name), kMaxNameBytes));
  }
  std::vector<v1::PoolAccess> access;
  bool any = false;
  for (const std::unique_ptr<Pool>& pool : pools_) {
    v1::PoolAccess a = pool->access().AccessOf(peer.process);
    if (read_only && a == v1::POOL_ACCESS_READ_WRITE) a = v1::POOL_ACCESS_READ;
    any = any || a != v1::POOL_ACCESS_UNSPECIFIED;
    access.push_back(a);
  }
  if (!any) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "uid %d (pid %d) may use no pool of this daemon; the operator grants "
        "pools with 'users', 'groups', 'read_only_users' or "
        "'read_only_groups' in the daemon's [[pool]] config",
        peer.process.uid, peer.process.pid));
  }
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return ShuttingDownError();
  if (ledger_ != nullptr && !ledger_->has_session_room()) {
    return LimitExceededError(
        absl::StrFormat("%d sessions open, the most the daemon's ledger holds",
                        ledger_->capacity().sessions));
  }
  absl::StatusOr<uint64_t> id = sessions_.Open(
      client_name, std::move(peer), std::move(access), read_only, next_serial_);
  if (!id.ok()) return id.status();
  ++next_serial_;
  const Session& s = *sessions_.FindOrNull(*id);
  if (ledger_ != nullptr) {
    ledger_->NoteSerial(s.serial);
    LedgerSession rec;
    rec.client_id = s.client_id;
    rec.id_hash = HashSessionId(*id);
    rec.secret_hash = HashSecret(s.descriptor_secret);
    rec.uid = s.peer.process.uid;
    rec.gid = s.peer.process.gid;
    rec.pid = s.peer.owner.pid;
    rec.instance = s.peer.owner.instance;
    rec.serial = s.serial;
    rec.opened_ns = absl::ToUnixNanos(s.opened);
    rec.read_only = s.read_only;
    rec.access.assign(s.access.begin(), s.access.end());
    rec.client_name = s.client_name;
    if (absl::Status recorded = ledger_->AddSession(rec); !recorded.ok()) {
      // Nothing was written: the session goes as it came.
      sessions_.Close(*id);
      return recorded;
    }
  }
  spdlog::info("client {} opened a session: '{}' pid {} uid {}{} ({} open)",
               s.client_id, client_name, s.pid, s.peer.process.uid,
               read_only ? " read-only" : "", sessions_.size());
  return OpenedSession{*id, s.client_id, s.stream,
                       0,   PoolsOf(s),  s.descriptor_secret};
}

std::vector<v1::PoolInfo> ObjectStore::PoolsOf(const Session& s) const {
  std::vector<v1::PoolInfo> out;
  for (uint32_t i = 0; i < pool_infos_.size(); ++i) {
    if (s.access[i] == v1::POOL_ACCESS_UNSPECIFIED) continue;
    out.push_back(pool_infos_[i]);
    out.back().set_access(s.access[i]);
    out.back().set_default_for_device(DefaultPool(s, pool_infos_[i]) == i);
  }
  return out;
}

std::optional<uint32_t> ObjectStore::DefaultPool(
    const Session& s, const v1::PoolInfo& like) const {
  auto same_device = [&like](const v1::PoolInfo& p) {
    return p.kind() == like.kind() &&
           (p.kind() != v1::MEMORY_KIND_CUDA_DEVICE ||
            p.cuda_device() == like.cuda_device());
  };
  for (v1::PoolAccess want :
       {v1::POOL_ACCESS_READ_WRITE, v1::POOL_ACCESS_READ}) {
    for (uint32_t i = 0; i < pool_infos_.size(); ++i) {
      if (s.access[i] == want && same_device(pool_infos_[i])) return i;
    }
  }
  return std::nullopt;
}

absl::Status ObjectStore::AccessError(const Session& s, uint32_t pool_id,
                                      absl::string_view what) const {
  const v1::PoolAccess a = s.access[pool_id];
  const std::string& pool = pools_[pool_id]->name();
  if (a == v1::POOL_ACCESS_READ) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s needs write access to pool '%s', and this session (uid %d) may "
        "only read it%s",
        what, pool, s.peer.process.uid,
        s.read_only ? " (it was opened read-only)" : ""));
  }
  return absl::PermissionDeniedError(absl::StrFormat(
      "%s: uid %d may not use pool '%s'", what, s.peer.process.uid, pool));
}

absl::StatusOr<uint32_t> ObjectStore::PoolFor(const Session& s,
                                              absl::string_view name) const {
  if (!name.empty()) {
    // A pool the session may not use is one it does not know of.
    for (uint32_t i = 0; i < pools_.size(); ++i) {
      if (pools_[i]->name() == name &&
          s.access[i] != v1::POOL_ACCESS_UNSPECIFIED) {
        return i;
      }
    }
    return absl::NotFoundError(
        absl::StrCat("no pool named ", Quoted(std::string(name))));
  }
  v1::PoolInfo host;
  host.set_kind(v1::MEMORY_KIND_HOST);
  if (std::optional<uint32_t> chosen = DefaultPool(s, host)) return *chosen;
  return absl::NotFoundError(
      "this session may use no host pool; name the pool to create in");
}

ObjectStore::Session* ObjectStore::ProvenSession(uint64_t session_id,
                                                 absl::string_view secret,
                                                 const OwnerKey& peer) {
  TakeAdopted(session_id, peer, /*exact=*/false);
  Session* s = sessions_.FindOrNull(session_id);
  if (s == nullptr || !SessionTable::SecretMatches(*s, secret) ||
      !SameProcess(s->peer.owner, peer)) {
    return nullptr;
  }
  return s;
}

absl::StatusOr<std::vector<DescriptorGrant>> ObjectStore::GrantDescriptors(
    uint64_t session_id, absl::string_view secret, const OwnerKey& peer,
    UniqueFd* ring) {
  const absl::Status refused = absl::PermissionDeniedError(
      "descriptor request refused: no open session of this process has that "
      "id and secret");
  absl::MutexLock lock(&mu_);
  Session* s = ProvenSession(session_id, secret, peer);
  if (s == nullptr) return refused;
  if (s->descriptors_granted) {
    return absl::FailedPreconditionError(
        "this session was handed its descriptors already");
  }
  s->descriptors_granted = true;
  std::vector<DescriptorGrant> out;
  for (size_t i = 0; i < pools_.size(); ++i) {
    if (s->access[i] == v1::POOL_ACCESS_UNSPECIFIED ||
        pools_[i]->segment().kind() != v1::MEMORY_KIND_HOST) {
      continue;
    }
    out.push_back({static_cast<uint32_t>(i), s->access[i]});
  }
  const bool writes_host =
      std::any_of(out.begin(), out.end(), [](const DescriptorGrant& g) {
        return g.access == v1::POOL_ACCESS_READ_WRITE;
      });
  // A session of a successor may have asked for a ring alone first.
  if (ring != nullptr && writes_host && s->ring == nullptr) {
    if (absl::Status made = MakeRingLocked(*s, ring); !made.ok()) {
      spdlog::warn("client {}: no release ring ({}); it seals on its stream",
                   s->client_id, std::string(made.message()));
    }
  }
  return out;
}

absl::Status ObjectStore::GrantRing(uint64_t session_id,
                                    absl::string_view secret,
                                    const OwnerKey& peer, UniqueFd* ring) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return ShuttingDownError();
  Session* s = ProvenSession(session_id, secret, peer);
  if (s == nullptr) {
    return absl::PermissionDeniedError(
        "release ring refused: no open session of this process has that id "
        "and secret");
  }
  if (s->ring != nullptr) {
    return absl::FailedPreconditionError(
        "release ring refused: this session has one");
  }
  bool writes_host = false;
  for (size_t i = 0; i < pools_.size() && i < s->access.size(); ++i) {
    writes_host =
        writes_host || (s->access[i] == v1::POOL_ACCESS_READ_WRITE &&
                        pools_[i]->segment().kind() == v1::MEMORY_KIND_HOST);
  }
  if (!writes_host) {
    return absl::FailedPreconditionError(
        "release ring refused: this session may write no host pool");
  }
  if (s->rings_made >= kMaxRingsPerSession) {
    return LimitExceededError(absl::StrFormat(
        "release ring refused: this daemon made %d for this session already "
        "(at most %d); its seals and releases go on its stream",
        s->rings_made, kMaxRingsPerSession));
  }
  return MakeRingLocked(*s, ring);
}

absl::Status ObjectStore::MakeRingLocked(Session& s, UniqueFd* ring) {
  absl::StatusOr<std::unique_ptr<SessionRing>> made = SessionRing::Create(ring);
  if (!made.ok()) return made.status();
  s.ring = *std::move(made);
  ++s.rings_made;
  // What the session's messages so far did is settled: a client that reads
  // `applied` to confirm them reads the truth from the first.
  s.ring->reader().PublishApplied(s.releases.applied());
  return absl::OkStatus();
}

absl::StatusOr<ForkHoldGrant> ObjectStore::HoldForFork(uint64_t session_id,
                                                       absl::string_view secret,
                                                       const OwnerKey& peer) {
  const absl::Status refused = absl::PermissionDeniedError(
      "fork hold refused: no open session of this process has that id and "
      "secret");
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return ShuttingDownError();
  Session* s = ProvenSession(session_id, secret, peer);
  if (s == nullptr) return refused;
  // The hold pins the session's objects as its process sees them: with the
  // seals it posted applied.
  DrainRing(session_id, *s);
  const uid_t uid = s->peer.process.uid;
  uint64_t& of_uid = fork_holds_per_uid_[uid];
  if (limits_.max_fork_holds_per_uid > 0 &&
      of_uid >= limits_.max_fork_holds_per_uid) {
    return LimitExceededError(absl::StrFormat(
        "uid %d has %d fork holds (limits.max_fork_holds_per_uid = %d): its "
        "forked children must exit before it forks again while holding views",
        uid, of_uid, limits_.max_fork_holds_per_uid));
  }
  if (absl::Status room = CheckPinRoom(s->held_slots.size()); !room.ok()) {
    return room;
  }
  // [P24] Each object a hold pins is a pin record of its uid's share.
  if (absl::Status share = sessions_.CheckUidPins(uid, s->held_slots.size());
      !share.ok()) {
    return share;
  }
  ++of_uid;
  ForkHold hold{uid, session_id, {}, 0};
  hold.slots.reserve(s->held_slots.size());
  for (const auto& [slot, count] : s->held_slots) {
    Object& obj = objects_.object(slot);
    ++obj.holds;
    hold.slots.push_back(slot);
    hold.bytes += obj.capacity;
  }
  // What the children keep counts against the uid (max_bytes_per_uid),
  // as long as they keep it: a hold is no way around the limit.
  sessions_.ChargeUid(uid, static_cast<int64_t>(hold.bytes));
  sessions_.CountPins(uid, static_cast<int64_t>(hold.slots.size()));
  const uint64_t id = next_fork_hold_++;
  if (ledger_ != nullptr) {
    ledger_->NoteForkHold(id);
    for (uint32_t slot : hold.slots) {
      LedgerPin pin;
      pin.kind = LedgerPin::kForkHold;
      pin.key = id;
      pin.slot = slot;
      pin.generation = objects_.generation(slot);
      pin.client_id = s->client_id;
      pin.uid = uid;
      pin.bytes = objects_.object(slot).capacity;
      pin.expires_ns = kForkHoldPending;  // Until ForkHoldGranted.
      // Room was checked (CheckPinRoom, exact); a refusal here would leave
      // a pending hold a successor drops, which pins nothing there.
      if (absl::Status added = ledger_->AddPin(pin); !added.ok()) {
        spdlog::error("fork hold {}: {}", id, std::string(added.message()));
      }
    }
  }
  const auto objects = static_cast<uint32_t>(hold.slots.size());
  fork_holds_.emplace(id, std::move(hold));
  return ForkHoldGrant{id, objects};
}

void ObjectStore::ForkHoldGranted(uint64_t hold_id) {
  absl::MutexLock lock(&mu_);
  if (ledger_ != nullptr && fork_holds_.contains(hold_id)) {
    ledger_->MarkForkHoldGranted(hold_id);
  }
}

bool ObjectStore::ClaimForkHold(uint64_t hold_id) {
  absl::MutexLock lock(&mu_);
  auto it = fork_holds_.find(hold_id);
  if (it == fork_holds_.end() || !it->second.stranded) return false;
  it->second.stranded = false;
  stranded_hold_bytes_ -= it->second.bytes;
  return true;
}

void ObjectStore::EndForkHold(uint64_t hold_id) {
  absl::MutexLock lock(&mu_);
  auto it = fork_holds_.find(hold_id);
  if (it == fork_holds_.end()) return;
  if (it->second.stranded) stranded_hold_bytes_ -= it->second.bytes;
  ForkHold hold = std::move(it->second);
  fork_holds_.erase(it);
  if (ledger_ != nullptr) ledger_->DropForkHold(hold_id);
  if (auto u = fork_holds_per_uid_.find(hold.uid);
      u != fork_holds_per_uid_.end() && --u->second == 0) {
    fork_holds_per_uid_.erase(u);
  }
  sessions_.ChargeUid(hold.uid, -static_cast<int64_t>(hold.bytes));
  sessions_.CountPins(hold.uid, -static_cast<int64_t>(hold.slots.size()));
  for (uint32_t slot : hold.slots) {
    Object& obj = objects_.object(slot);
    assert(obj.holds > 0);
    --obj.holds;
    MaybeFree(slot);
  }
}

absl::StatusOr<OpenedSession> ObjectStore::ResumeSession(
    uint64_t session_id, OwnerKey owner, const LeaseAccount* account,
    uint64_t connection) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return ShuttingDownError();
  TakeAdopted(session_id, owner, /*exact=*/true);
  absl::StatusOr<Session*> found = sessions_.FindOwned(session_id, owner);
  if (!found.ok()) return found.status();
  Session& s = **found;
  if (account != nullptr) {
    if (account->held.size() > limits_.max_leases_per_client) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "resume presents %d leases; a session holds at most %d",
          account->held.size(), limits_.max_leases_per_client));
    }
    if (account->releases_through < s.releases.applied()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "resume says its last release was seq %d, but seq %d was applied",
          account->releases_through, s.releases.applied()));
    }
    if (account->seals.size() > kMaxPendingSeals) {
      return absl::InvalidArgumentError(
          absl::StrFormat("resume presents %d pending seals, at most %d",
                          account->seals.size(), kMaxPendingSeals));
    }
  }
  // A resuming client posts no more in its ring (its messages there are
  // in its account, or sent again): what it holds is applied, and the ring
  // goes.
  if (s.ring != nullptr) {
    DrainRing(session_id, s);
    s.ring.reset();
  }
  const bool was_detached = s.stream == 0;
  sessions_.Attach(s);
  // From here on, its calls on older connections are refused (Admit).
  // (A resume the client gave up on may be served after a later one.)
  s.peer.connection = std::max(s.peer.connection, connection);
  OpenedSession opened{session_id,           s.client_id, s.stream,
                       s.releases.applied(), PoolsOf(s),  s.descriptor_secret};
  if (account != nullptr) ReconcileLeases(s, *account, &opened);
  spdlog::info("client {} ('{}' pid {}) resumed its session{}{}", s.client_id,
               s.client_name, s.pid,
               was_detached ? "" : " (replacing a stream still open)",
               account == nullptr
                   ? ""
                   : absl::StrFormat(": %d leases kept, %d dropped, %d refused",
                                     s.leases.size(), opened.dropped,
                                     opened.refused.size()));
  return opened;
}

void ObjectStore::ReconcileLeases(Session& s, const LeaseAccount& account,
                                  OpenedSession* opened) {
  // Seals first: one that arrived before the break is skipped (its lease
  // is no unsealed write lease any more); an exclusive one gives its lease
  // up, which the account no longer names.
  for (const v1::OneWaySeal& seal : account.seals) {
    absl::StatusOr<Lease*> lease = LookupLease(opened->id, seal.lease_id());
    if (!lease.ok() || !(*lease)->write ||
        objects_.object((*lease)->slot).state != State::kWriting) {
      continue;
    }
    if (absl::Status r = ApplyOneWaySeal(opened->id, s, seal); !r.ok()) {
      spdlog::warn("client {}: {}", s.client_id, std::string(r.message()));
    }
  }
  const absl::flat_hash_set<uint64_t> claimed(account.held.begin(),
                                              account.held.end());
  std::vector<uint64_t> drop;
  for (uint64_t id : s.leases) {
    if (!claimed.contains(id)) drop.push_back(id);
  }
  for (uint64_t id : claimed) {
    if (!s.leases.contains(id)) opened->refused.push_back(id);
  }
  for (uint64_t id : drop) DropLease(id);
  opened->dropped = drop.size();
  s.releases.Restore(account.releases_through);
  if (ledger_ != nullptr) {
    ledger_->SetReleasesApplied(s.client_id, account.releases_through);
  }
  opened->releases_applied = account.releases_through;
  opened->reconciled = true;
  if (!drop.empty()) Changed();
}

void ObjectStore::TakeAdopted(uint64_t session_id, const OwnerKey& owner,
                              bool exact) {
  if (adopted_.empty() || sessions_.FindOrNull(session_id) != nullptr) return;
  // A session of the predecessor's, known here by its id's hash.
  const SessionHash hash = HashSessionId(session_id);
  auto it = adopted_.find(std::string(hash.begin(), hash.end()));
  if (it == adopted_.end()) return;
  const uint64_t adopted_id = it->second;
  Session& s = *sessions_.FindOrNull(adopted_id);
  // A process the daemon could not see resumes by its uid and the
  // secret; its new connection is its instance from now on.
  const bool invisible =
      s.peer.owner.pid == 0 && owner.pid == 0 && s.peer.owner.uid == owner.uid;
  const bool same =
      exact ? s.peer.owner == owner : SameProcess(s.peer.owner, owner);
  if ((exact && invisible) || same) {
    if (exact && invisible) {
      s.peer.owner = owner;
      if (ledger_ != nullptr) {
        ledger_->SetSessionInstance(s.client_id, owner.instance);
      }
    }
    adopted_.erase(it);
    sessions_.Rekey(adopted_id, session_id);
    Session& now = *sessions_.FindOrNull(session_id);
    for (uint64_t lease : now.leases) leases_.SetSession(lease, session_id);
    for (uint32_t slot : adopted_created_[adopted_id].slots) {
      if (objects_.live(slot) && objects_.object(slot).creator == adopted_id) {
        objects_.object(slot).creator = session_id;
      }
    }
    adopted_created_.erase(adopted_id);
    offers_.Rekey(adopted_id, session_id);
    for (auto& [id, hold] : fork_holds_) {
      if (hold.session_id == adopted_id) hold.session_id = session_id;
    }
    spdlog::info(
        "client {} ('{}' pid {}) resumed its session from the previous "
        "daemon with {} leases ({} sessions still to resume)",
        now.client_id, now.client_name, now.pid, now.leases.size(),
        adopted_.size());
  }
}

void ObjectStore::StreamEnded(uint64_t session_id, uint64_t stream) {
  {
    absl::MutexLock lock(&mu_);
    Session* s = sessions_.FindOrNull(session_id);
    if (s == nullptr || s->stream != stream) return;
    if (s->peer.pidfd != nullptr && !ProcessExited(s->peer.pidfd->get())) {
      s->stream = 0;
      spdlog::info(
          "client {} ('{}' pid {}) lost its connection while its process "
          "lives: its {} leases stay until it resumes, closes the session "
          "or exits",
          s->client_id, s->client_name, s->pid, s->leases.size());
      Changed();  // Its waiting calls end with their connection.
      return;
    }
  }
  EndSession(session_id);
}

int ObjectStore::ReapExitedProcesses() {
  std::vector<uint64_t> gone;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, s] : sessions_.all()) {
      if (s.stream == 0 && s.peer.pidfd != nullptr &&
          ProcessExited(s.peer.pidfd->get())) {
        gone.push_back(id);
      }
    }
  }
  for (uint64_t id : gone) EndSession(id);
  return static_cast<int>(gone.size());
}

absl::Status ObjectStore::Authorize(uint64_t session_id, OwnerKey owner) const {
  absl::MutexLock lock(&mu_);
  const Session* s = sessions_.FindOrNull(session_id);
  if (s == nullptr || s->peer.owner != owner) {
    return SessionNotOpenError(session_id);
  }
  return absl::OkStatus();
}

void ObjectStore::EndSession(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  Session* found = sessions_.FindOrNull(session_id);
  if (found == nullptr) return;
  Session& s = *found;
  // What the session posted in its ring comes before its end, as its
  // stream's messages do: what it sealed there ends as sealed (an untaken
  // hand-off is reclaimed), not discarded as never sealed.
  DrainRing(session_id, s);
  uint64_t used_before = 0;
  for (const auto& p : pools_) used_before += p->used_bytes();
  const std::vector<uint64_t> leases(s.leases.begin(), s.leases.end());
  const std::vector<uint32_t> transfers(s.pending_transfers.begin(),
                                        s.pending_transfers.end());
  for (uint64_t lease : leases) DropLease(lease);
  for (uint32_t slot : transfers) {
    // Invariant: a slot in pending_transfers is a live, untaken transfer.
    assert(objects_.object(slot).state == State::kPendingTransfer);
    objects_.SetState(slot, State::kSealed);
    JournalObject(slot);
    HoldTransfer(slot, false);
    MaybeFree(slot);
  }
  uint64_t used_after = 0;
  for (const auto& p : pools_) used_after += p->used_bytes();
  spdlog::info(
      "client {} ('{}' pid {}) session ended: dropped {} leases, "
      "reclaimed {} transfers, freed {} bytes ({} open)",
      s.client_id, s.client_name, s.pid, leases.size(), transfers.size(),
      used_before - used_after, sessions_.size() - 1);
  for (const auto& p : pools_) p->ForgetClient(session_id);
  // Its untaken offers outlive it by the grace; with none, they end now.
  const absl::Time now = absl::Now();
  const std::vector<uint64_t> tokens = offers_.SessionEnded(
      session_id, now, absl::Milliseconds(limits_.offer_grace_ms));
  if (ledger_ != nullptr) {
    const int64_t expires =
        absl::ToUnixNanos(now + absl::Milliseconds(limits_.offer_grace_ms));
    for (uint64_t token : tokens) ledger_->SetOfferExpiry(token, expires);
    ledger_->DropSession(s.client_id);
  }
  for (const OfferTable::Offer& offer : offers_.Expire(now)) EndOffer(offer);
  if (auto a = adopted_created_.find(session_id); a != adopted_created_.end()) {
    adopted_.erase(a->second.hash);
    adopted_created_.erase(a);
  }
  sessions_.Close(session_id);
  // Waiters of this session (a Create for memory, a Get for a name) give up
  // now instead of holding on until their timeout.
  Changed();
}

}  // namespace shmtensor::daemon
