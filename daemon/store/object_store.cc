#include "daemon/store/object_store.h"

#include <sys/random.h>

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
#include "daemon/store/store_views.h"
#include "shmtensor/errors.h"
#include "spdlog/spdlog.h"

namespace shmtensor::daemon {
namespace {

absl::Status ShuttingDownError() {
  return absl::UnavailableError("shmtensord is shutting down");
}

}  // namespace

namespace {

// With a ledger, the limits of 0 ("none") are its tables' sizes.
StoreLimits Bounded(StoreLimits limits, const Ledger* ledger) {
  if (ledger == nullptr) return limits;
  const LedgerCapacity& cap = ledger->capacity();
  if (limits.max_objects == 0 || limits.max_objects > cap.objects) {
    limits.max_objects = cap.objects;
  }
  if (limits.max_leases == 0 || limits.max_leases > cap.leases) {
    limits.max_leases = cap.leases;
  }
  return limits;
}

}  // namespace

LedgerCapacity LedgerCapacityFor(const StoreLimits& limits) {
  LedgerCapacity cap;
  // Sparse: a record's pages are allocated when it is first written.
  cap.objects = static_cast<uint32_t>(
      limits.max_objects > 0
          ? std::min<uint64_t>(limits.max_objects, kMaxObjects)
          : uint64_t{1} << 22);
  cap.leases = static_cast<uint32_t>(
      limits.max_leases > 0 ? std::min<uint64_t>(limits.max_leases, 1u << 28)
                            : uint64_t{1} << 23);
  cap.sessions = 1u << 16;
  cap.pins = 1u << 20;
  return cap;
}

ObjectStore::ObjectStore(std::vector<std::unique_ptr<Pool>> pools,
                         uint64_t epoch, StoreLimits limits,
                         std::unique_ptr<Ledger> ledger)
    : epoch_(epoch),
      start_time_(absl::Now()),
      limits_(Bounded(limits, ledger.get())),
      pools_(std::move(pools)),
      // The tables draw randomness only from calls the store makes under
      // mu_.
      sessions_(limits,
                [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return Random64(); }),
      objects_(epoch,
               [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return Random64(); }),
      ledger_(std::move(ledger)) {
  assert(!pools_.empty());
  for (size_t i = 0; i < pools_.size(); ++i) {
    const Segment& seg = pools_[i]->segment();
    v1::PoolInfo info;
    info.set_pool_id(static_cast<uint32_t>(i));
    info.set_name(pools_[i]->name());
    info.set_kind(seg.kind());
    if (seg.kind() == v1::MEMORY_KIND_CUDA_DEVICE) {
      info.set_cuda_device(seg.cuda_device());
      info.set_cuda_ipc_handle(seg.handle());
    }
    info.set_size_bytes(seg.size_bytes());
    info.set_page_size(seg.page_size());
    info.set_huge_page_size(seg.huge_page_size());
    pool_infos_.push_back(std::move(info));
  }
}

uint64_t ObjectStore::Random64() {
  if (random_next_ == random_.size()) {
    size_t got = 0;
    while (got < sizeof(random_)) {
      const ssize_t n = getrandom(reinterpret_cast<char*>(random_.data()) + got,
                                  sizeof(random_) - got, 0);
      if (n > 0) got += n;
      // Invariant: getrandom(2) with flags 0 only fails with EINTR once the
      // pool is initialised (always, long before a daemon starts).
      assert(n > 0 || errno == EINTR);
    }
    random_next_ = 0;
  }
  return random_[random_next_++];
}

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
    ledger_->AddSession(rec);
  }
  spdlog::info("client {} opened a session: '{}' pid {} uid {}{} ({} open)",
               s.client_id, client_name, s.pid, s.peer.process.uid,
               read_only ? " read-only" : "", sessions_.size());
  return OpenedSession{*id, s.client_id, s.stream,
                       0,   PoolsOf(s),  s.descriptor_secret};
}

std::vector<v1::PoolInfo> ObjectStore::PoolsOf(const Session& s) const {
  std::vector<v1::PoolInfo> out;
  for (size_t i = 0; i < pool_infos_.size(); ++i) {
    if (s.access[i] == v1::POOL_ACCESS_UNSPECIFIED) continue;
    out.push_back(pool_infos_[i]);
    out.back().set_access(s.access[i]);
  }
  return out;
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
  const uint32_t none = static_cast<uint32_t>(pools_.size());
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
  // The first host pool the session may write, else the first it may use
  // (whose access check then names why it may not).
  for (v1::PoolAccess want :
       {v1::POOL_ACCESS_READ_WRITE, v1::POOL_ACCESS_READ}) {
    for (uint32_t i = 0; i < none; ++i) {
      if (s.access[i] == want &&
          pools_[i]->segment().kind() == v1::MEMORY_KIND_HOST) {
        return i;
      }
    }
  }
  return absl::NotFoundError(
      "this session may use no host pool; name the pool to create in");
}

absl::StatusOr<std::vector<DescriptorGrant>> ObjectStore::GrantDescriptors(
    uint64_t session_id, absl::string_view secret, const OwnerKey& peer) {
  const absl::Status refused = absl::PermissionDeniedError(
      "descriptor request refused: no open session of this process has that "
      "id and secret");
  absl::MutexLock lock(&mu_);
  // A session opened just before its daemon was replaced asks the
  // successor.
  TakeAdopted(session_id, peer, /*exact=*/false);
  Session* s = sessions_.FindOrNull(session_id);
  if (s == nullptr) return refused;
  if (!SessionTable::SecretMatches(*s, secret) ||
      !SameProcess(s->peer.owner, peer)) {
    return refused;
  }
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
  return out;
}

absl::StatusOr<ForkHoldGrant> ObjectStore::HoldForFork(uint64_t session_id,
                                                       absl::string_view secret,
                                                       const OwnerKey& peer) {
  const absl::Status refused = absl::PermissionDeniedError(
      "fork hold refused: no open session of this process has that id and "
      "secret");
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return ShuttingDownError();
  TakeAdopted(session_id, peer, /*exact=*/false);
  Session* s = sessions_.FindOrNull(session_id);
  if (s == nullptr) return refused;
  if (!SessionTable::SecretMatches(*s, secret) ||
      !SameProcess(s->peer.owner, peer)) {
    return refused;
  }
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
      ledger_->AddPin(pin);
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
  for (uint32_t slot : hold.slots) {
    Object& obj = objects_.object(slot);
    assert(obj.holds > 0);
    --obj.holds;
    MaybeFree(slot);
  }
}

absl::StatusOr<OpenedSession> ObjectStore::ResumeSession(
    uint64_t session_id, OwnerKey owner, const LeaseAccount* account) {
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
  const bool was_detached = s.stream == 0;
  sessions_.Attach(s);
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
    if (absl::Status r = ApplyOneWaySeal(opened->id, seal); !r.ok()) {
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

absl::StatusOr<std::unique_ptr<ObjectStore>> ObjectStore::Adopt(
    std::vector<std::unique_ptr<Pool>> pools, StoreLimits limits,
    std::unique_ptr<Ledger> ledger, LedgerState state) {
  if (state.pools.size() != pools.size()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the previous daemon had %d pools, the config has %d",
                        state.pools.size(), pools.size()));
  }
  for (size_t i = 0; i < pools.size(); ++i) {
    const LedgerPool& was = state.pools[i];
    const Segment& seg = pools[i]->segment();
    if (was.name != pools[i]->name() || was.size_bytes != seg.size_bytes() ||
        was.kind != static_cast<uint32_t>(seg.kind())) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "pool %d was '%s' of %d bytes in the previous daemon and is '%s' "
          "of %d bytes in the config",
          i, was.name, was.size_bytes, pools[i]->name(), seg.size_bytes()));
    }
  }
  const uint64_t epoch = state.epoch;
  std::unique_ptr<ObjectStore> store(
      new ObjectStore(std::move(pools), epoch, limits, std::move(ledger)));
  if (absl::Status s = store->Restore(std::move(state)); !s.ok()) return s;
  return store;
}

absl::Status ObjectStore::Restore(LedgerState state) {
  std::vector<uint64_t> gone;
  size_t dropped_leases = 0;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    absl::flat_hash_map<uint64_t, uint64_t> by_client;  // -> session id
    for (const LedgerSession& ls : state.sessions) {
      Session s;
      s.client_name = ls.client_name;
      s.pid = ls.pid;
      s.client_id = ls.client_id;
      s.serial = ls.serial;
      s.opened = absl::FromUnixNanos(ls.opened_ns);
      s.read_only = ls.read_only;
      s.access.assign(pools_.size(), v1::POOL_ACCESS_UNSPECIFIED);
      for (size_t i = 0; i < ls.access.size() && i < pools_.size(); ++i) {
        if (ls.access[i] <= v1::POOL_ACCESS_READ_WRITE) {
          s.access[i] = static_cast<v1::PoolAccess>(ls.access[i]);
        }
      }
      s.peer.process.pid = ls.pid;
      s.peer.process.uid = ls.uid;
      s.peer.process.gid = ls.gid;
      s.peer.owner = OwnerKey{ls.uid, ls.pid, ls.instance};
      s.releases.Restore(ls.releases_applied);
      // Whether the predecessor handed the descriptors over is not
      // recorded: a session opened just before the restart may ask now.
      // Once more at most per restart, as for a new session.
      s.descriptors_granted = false;
      s.descriptor_secret_hash.assign(ls.secret_hash.begin(),
                                      ls.secret_hash.end());
      // Alive: the same process (its start time) behind a pidfd taken
      // before the check. One the daemon could not see (pid 0) is kept
      // until it resumes.
      bool alive = ls.pid == 0;
      if (ls.pid > 0) {
        absl::StatusOr<UniqueFd> pidfd = OpenPidfd(ls.pid);
        absl::StatusOr<uint64_t> start = ProcessStartTime(ls.pid);
        if (pidfd.ok() && start.ok() && *start == ls.instance &&
            !ProcessExited(pidfd->get())) {
          alive = true;
          s.peer.pidfd = std::make_shared<const UniqueFd>(*std::move(pidfd));
          s.peer.command_line = CommandLineOf(ls.pid);
        }
      }
      const uint64_t id = sessions_.Restore(std::move(s));
      by_client[ls.client_id] = id;
      std::string hash(ls.id_hash.begin(), ls.id_hash.end());
      adopted_[hash] = id;
      adopted_created_[id].hash = std::move(hash);
      if (!alive) gone.push_back(id);
    }
    auto session_of = [&](uint64_t client_id) -> uint64_t {
      auto it = by_client.find(client_id);
      return it == by_client.end() ? 0 : it->second;
    };
    for (const LedgerObject& lo : state.objects) {
      Pool& pool = *pools_[lo.pool];
      if (lo.capacity > 0 &&
          !pool.allocator().Reserve(lo.offset, lo.capacity)) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "ledger refused: the object in slot %d at %d+%d of pool '%s' "
            "overlaps another",
            lo.slot, lo.offset, lo.capacity, pool.name()));
      }
      Object obj;
      obj.pool = lo.pool;
      obj.offset = lo.offset;
      obj.size = lo.size;
      obj.capacity = lo.capacity;
      obj.state = static_cast<State>(lo.state);
      if (!obj.layout.ParseFromString(lo.layout)) {
        // A one-way seal cut short by a crash (Ledger::SetObjectLayout):
        // the object is unsealed, and its creator's resume seals it again
        // with the layout (OpenSession.pending_seals) or it goes.
        if (obj.state == State::kWriting) {
          obj.layout.Clear();
          obj.size = obj.capacity;
        } else {
          return absl::FailedPreconditionError(absl::StrFormat(
              "ledger refused: the layout of the object in slot %d does not "
              "parse",
              lo.slot));
        }
      }
      if (lo.named) {
        if (ValidateName(lo.name).ok() && !objects_.Named(lo.name)) {
          obj.name = lo.name;
        } else {
          return absl::FailedPreconditionError(absl::StrFormat(
              "ledger refused: the name of the object in slot %d is bad or "
              "bound twice",
              lo.slot));
        }
      }
      obj.creator = session_of(lo.creator);
      obj.created = absl::FromUnixNanos(lo.created_ns);
      obj.serial = lo.serial;
      obj.nonce = lo.nonce;
      objects_.Restore(lo.slot, lo.generation, std::move(obj));
      if (const uint64_t c = session_of(lo.creator); c != 0) {
        adopted_created_[c].slots.push_back(lo.slot);
      }
      ++pool.objects;
      pool.high_water_bytes =
          std::max(pool.high_water_bytes, pool.allocator().used_bytes());
    }
    for (const auto& [slot, generation] : state.free_generations) {
      objects_.RestoreFree(slot, generation);
    }
    objects_.FinishRestore();
    for (const LedgerLease& ll : state.leases) {
      const uint64_t session_id = session_of(ll.client_id);
      if (session_id == 0 || !objects_.live(ll.slot)) {
        ledger_->DropLease(ll.id);  // Of no session: none can use it.
        ++dropped_leases;
        continue;
      }
      Object& obj = objects_.object(ll.slot);
      // Sealing turns the creator's write lease into a read lease.
      const bool write = ll.write && (obj.state == State::kWriting ||
                                      obj.state == State::kTaken ||
                                      obj.state == State::kSharedWritable);
      leases_.Restore(ll.id, {session_id, ll.slot, write});
      ++obj.leases;
      ++pools_[obj.pool]->leases;
      sessions_.Hold(*sessions_.FindOrNull(session_id), ll.id, ll.slot,
                     obj.capacity);
    }
    leases_.SetNextId(std::max(state.next_lease_id, leases_.next_id()));
    for (const auto& [serial, slot] : objects_.by_serial()) {
      const Object& obj = objects_.object(slot);
      if (obj.state != State::kPendingTransfer) continue;
      if (Session* creator = sessions_.FindOrNull(obj.creator)) {
        creator->pending_transfers.insert(slot);
        HoldTransfer(slot, true);
      } else {
        objects_.SetState(slot, State::kSealed);
        JournalObject(slot);
      }
    }
    // A fork hold none of whose records was marked granted was never
    // told to its client (the predecessor died before): it pins nothing.
    absl::flat_hash_set<uint64_t> granted_holds;
    for (const LedgerPin& p : state.pins) {
      if (p.kind == LedgerPin::kForkHold && p.expires_ns != kForkHoldPending) {
        granted_holds.insert(p.key);
      }
    }
    for (const LedgerPin& p : state.pins) {
      if (p.kind == LedgerPin::kForkHold && !granted_holds.contains(p.key)) {
        ledger_->DropForkHold(p.key);
        continue;
      }
      if (!objects_.live(p.slot) ||
          objects_.generation(p.slot) != p.generation) {
        if (p.kind == LedgerPin::kOffer) {
          ledger_->DropOffer(p.key);
        } else {
          ledger_->DropForkHold(p.key);
        }
        continue;
      }
      ++objects_.object(p.slot).holds;
      sessions_.ChargeUid(p.uid, static_cast<int64_t>(p.bytes));
      if (p.kind == LedgerPin::kOffer) {
        OfferTable::Offer o;
        o.slot = p.slot;
        o.generation = p.generation;
        o.session_id = session_of(p.client_id);
        o.uid = p.uid;
        o.bytes = p.bytes;
        if (p.expires_ns != INT64_MAX) {
          o.expires = absl::FromUnixNanos(p.expires_ns);
        } else if (o.session_id == 0) {
          o.expires = now + absl::Milliseconds(limits_.offer_grace_ms);
          ledger_->SetOfferExpiry(p.key, absl::ToUnixNanos(o.expires));
        }
        offers_.Restore(p.key, o);
      } else {
        auto [it, fresh] = fork_holds_.try_emplace(p.key);
        ForkHold& hold = it->second;
        if (fresh) {
          hold.uid = p.uid;
          hold.session_id = session_of(p.client_id);
          ++fork_holds_per_uid_[p.uid];
        }
        hold.slots.push_back(p.slot);
        hold.bytes += p.bytes;
        hold.stranded = true;
        stranded_hold_bytes_ += p.bytes;
      }
    }
    next_fork_hold_ = std::max(next_fork_hold_, state.next_fork_hold);
    next_serial_ = std::max(next_serial_, state.next_serial);
    for (const auto& pool : pools_) {
      // [P21] Who wrote what is not in the ledger: every range counts as
      // written by several uids, so the next creator of any uid gets it
      // cleared.
      if (pool->segment().kind() == v1::MEMORY_KIND_HOST) {
        pool->writers().Share(0, pool->allocator().size(), WriterMap::kMixed);
      }
    }
    // What nothing holds any more (the predecessor died before freeing it,
    // or before its creator heard of it) goes now.
    std::vector<uint32_t> slots;
    for (const auto& [serial, slot] : objects_.by_serial()) {
      slots.push_back(slot);
    }
    for (uint32_t slot : slots) MaybeFree(slot);
    spdlog::info(
        "adopted the previous daemon's ledger (epoch {:016x}): {} objects, "
        "{} leases ({} of no session dropped), {} sessions ({} of processes "
        "gone), {} offers, {} fork holds",
        epoch_, objects_.live(), leases_.size(), dropped_leases,
        sessions_.size(), gone.size(), offers_.size(), fork_holds_.size());
  }
  for (uint64_t id : gone) EndSession(id);
  return absl::OkStatus();
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
  uint64_t used_before = 0;
  for (const auto& p : pools_) used_before += p->allocator().used_bytes();
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
  for (const auto& p : pools_) used_after += p->allocator().used_bytes();
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

absl::StatusOr<ObjectStore::WaitToken> ObjectStore::BeginWait(
    uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = sessions_.Find(session_id);
  if (!session.ok()) return session.status();
  if (absl::Status s = sessions_.BeginWait(**session); !s.ok()) return s;
  return WaitToken{session_id, (*session)->peer.process.uid};
}

void ObjectStore::EndWait(const WaitToken& token) {
  absl::MutexLock lock(&mu_);
  sessions_.EndWait(token.session_id, token.uid);
}

void ObjectStore::Changed() {
  ++changes_;
  if (listener_) listener_();
}

void ObjectStore::SetChangeListener(std::function<void()> listener) {
  absl::MutexLock lock(&mu_);
  listener_ = std::move(listener);
}

uint64_t ObjectStore::changes() const {
  absl::MutexLock lock(&mu_);
  return changes_;
}

void ObjectStore::WaitForChange(uint64_t seen, absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return changes_ != seen;
  };
  mu_.AwaitWithDeadline(absl::Condition(&changed), deadline);
}

template <typename T, typename Attempt>
absl::StatusOr<T> ObjectStore::Block(uint64_t session_id, absl::Time deadline,
                                     const CancelledFn& cancelled,
                                     Attempt attempt) {
  std::optional<WaitToken> token;
  absl::StatusOr<T> result = absl::UnknownError("unset");
  while (true) {
    const uint64_t seen = changes();
    auto r = attempt(absl::Now() >= deadline);
    if (!r.ok()) {
      result = r.status();
      break;
    }
    if (r->has_value()) {
      result = **std::move(r);
      break;
    }
    if (cancelled && cancelled()) {
      result = absl::CancelledError("the caller cancelled the call");
      break;
    }
    if (!token.has_value()) {
      absl::StatusOr<WaitToken> t = BeginWait(session_id);
      if (!t.ok()) {
        result = t.status();
        break;
      }
      token = *t;
    }
    WaitForChange(seen,
                  std::min(deadline, absl::Now() + absl::Milliseconds(100)));
  }
  if (token.has_value()) EndWait(*token);
  return result;
}

absl::StatusOr<Handout> ObjectStore::Create(const CreateArgs& args) {
  return Block<Handout>(
      args.session_id, absl::Now() + args.timeout, args.cancelled,
      [&](bool last_try) { return TryCreate(args, last_try); });
}

absl::StatusOr<std::optional<Handout>> ObjectStore::TryCreate(
    const CreateArgs& args, bool last_try) {
  absl::StatusOr<uint64_t> bytes = RequestedBytes(args.size_bytes, args.layout);
  if (!bytes.ok()) return bytes.status();
  if (args.stock && (!args.name.empty() || args.shared_writable ||
                     args.layout.dtype() != v1::DTYPE_UNSPECIFIED)) {
    return absl::InvalidArgumentError(
        "stock buffers are untyped and unnamed, never shared-writable");
  }
  if (!args.name.empty()) {
    if (absl::Status s = ValidateName(args.name); !s.ok()) return s;
    if (args.shared_writable) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a shared-writable object cannot have a name (got ",
          Quoted(args.name), "): pass its ref to the processes that share it"));
    }
  }
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return ShuttingDownError();
  absl::StatusOr<Session*> session = sessions_.Find(args.session_id);
  if (!session.ok()) return session.status();
  absl::StatusOr<uint32_t> chosen = PoolFor(**session, args.pool);
  if (!chosen.ok()) return chosen.status();
  const uint32_t pool_id = *chosen;
  if (!Allowed(**session, pool_id, true)) {
    return AccessError(**session, pool_id, "create");
  }
  Pool& pool = *pools_[pool_id];
  uint64_t capacity = 0;
  uint64_t alignment = 0;
  RangeAllocator::End end = RangeAllocator::End::kLow;
  if (*bytes > 0) {
    std::optional<Pool::Placement> place = pool.Place(*bytes);
    if (!place || place->capacity > pool.allocator().size()) {
      return WithReason(absl::InvalidArgumentError(absl::StrFormat(
                            "size %d bytes exceeds pool '%s' of %d bytes",
                            *bytes, pool.name(), pool.allocator().size())),
                        kReasonLargerThanPool);
    }
    capacity = place->capacity;
    alignment = place->alignment;
    end = place->end;
  }
  if (!args.name.empty() && objects_.Named(args.name).has_value()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "name ", Quoted(args.name), " is already bound to an object"));
  }
  if (objects_.full()) {
    return LimitExceededError(absl::StrFormat(
        "%d objects alive, the most the daemon holds", kMaxObjects));
  }
  if (limits_.max_objects > 0 && objects_.live() >= limits_.max_objects) {
    return LimitExceededError(
        absl::StrFormat("%d objects alive, the limit (limits.max_objects = %d)",
                        objects_.live(), limits_.max_objects));
  }
  if (absl::Status s =
          sessions_.CheckHold(**session, kNoSlot, capacity, leases_.size());
      !s.ok()) {
    return s;
  }
  if (args.stock && limits_.max_stock_bytes_per_client > 0 &&
      (*session)->stock_bytes + capacity > limits_.max_stock_bytes_per_client) {
    return LimitExceededError(absl::StrFormat(
        "client %d holds %d bytes of stock (buffers made ahead of its puts); "
        "%d more would pass limits.max_stock_bytes_per_client = %d",
        (*session)->client_id, (*session)->stock_bytes, capacity,
        limits_.max_stock_bytes_per_client));
  }
  uint64_t offset = 0;
  if (capacity > 0) {
    std::optional<uint64_t> got =
        pool.Allocate(args.session_id, capacity, alignment, end);
    if (!got.has_value()) {
      if (!last_try) return std::nullopt;
      return absl::ResourceExhaustedError(
          DescribePoolPressure(View(), pool_id, capacity));
    }
    offset = *got;
  }
  Object obj;
  obj.pool = pool_id;
  obj.offset = offset;
  obj.size = *bytes;
  obj.capacity = capacity;
  obj.layout = args.layout;
  obj.name = args.name;
  obj.creator = args.session_id;
  obj.created = absl::Now();
  if (args.shared_writable) obj.state = State::kSharedWritable;
  obj.stock = args.stock;
  if (args.stock) {
    ++(*session)->stock_objects;
    (*session)->stock_bytes += capacity;
    pool.stock_bytes += capacity;
  }
  obj.serial = next_serial_++;
  const uint32_t slot = objects_.Add(std::move(obj));
  JournalNewObject(slot);
  pool.high_water_bytes =
      std::max(pool.high_water_bytes, pool.allocator().used_bytes());
  ++pool.objects;
  std::vector<WriterMap::Range> stale;
  if (capacity > 0) {
    // [P21] Bytes another uid wrote are cleared before this one gets them.
    stale =
        pool.writers().Claim(offset, capacity, (*session)->peer.process.uid);
    for (const WriterMap::Range& r : stale) pool.cleared_bytes += r.length;
  }
  const uint64_t lease = AddLease(args.session_id, **session, slot, true);
  Handout h = MakeHandout(slot, lease, true);
  if (!stale.empty()) ++objects_.object(slot).holds;  // Until ClearStale.
  h.stale = std::move(stale);
  h.slot = slot;
  return h;
}

absl::Status ObjectStore::ClearStale(uint64_t session_id,
                                     const Handout& handout) {
  if (handout.stale.empty()) return absl::OkStatus();
  const uint32_t pool_id = handout.placement.pool_id();
  const Segment& seg = segment(pool_id);
  absl::Status cleared;
  for (const WriterMap::Range& r : handout.stale) {
    cleared = seg.Clear(r.offset, r.length);
    if (!cleared.ok()) break;
  }
  {
    absl::MutexLock lock(&mu_);
    if (!cleared.ok()) {
      for (const WriterMap::Range& r : handout.stale) {
        pools_[pool_id]->writers().Share(r.offset, r.length, WriterMap::kMixed);
      }
    }
    Object& obj = objects_.object(handout.slot);
    assert(obj.holds > 0);
    --obj.holds;
    MaybeFree(handout.slot);
  }
  if (!cleared.ok()) (void)Release(session_id, handout.lease_id);
  return cleared;
}

absl::StatusOr<SealResult> ObjectStore::Seal(uint64_t session_id,
                                             uint64_t lease_id,
                                             bool exclusive) {
  SealArgs args;
  args.exclusive = exclusive;
  return Seal(session_id, lease_id, args);
}

absl::StatusOr<SealResult> ObjectStore::Seal(uint64_t session_id,
                                             uint64_t lease_id,
                                             const SealArgs& args) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return ShuttingDownError();
  return SealLocked(session_id, lease_id, args);
}

absl::StatusOr<SealResult> ObjectStore::SealLocked(uint64_t session_id,
                                                   uint64_t lease_id,
                                                   const SealArgs& args) {
  absl::StatusOr<Lease*> lease = FindLease(session_id, lease_id);
  if (!lease.ok()) return lease.status();
  const uint32_t slot = (*lease)->slot;
  Object& obj = objects_.object(slot);
  if (obj.state == State::kSharedWritable) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s is shared-writable: it is never sealed",
                        RefString(objects_.MakeRef(slot))));
  }
  if (!(*lease)->write || obj.state != State::kWriting) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "lease %d is not the write lease of an unsealed object: %s is "
        "already sealed",
        lease_id, RefString(objects_.MakeRef(slot))));
  }
  const bool exclusive = args.exclusive;
  if (exclusive && !obj.name.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "object named '", obj.name,
        "' cannot be sealed for exclusive transfer; only unnamed objects can"));
  }
  if (args.relayout) {
    absl::StatusOr<uint64_t> bytes =
        RequestedBytes(args.size_bytes, args.layout);
    if (!bytes.ok()) return bytes.status();
    if (*bytes > obj.capacity) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "seal of %s with %d bytes: its buffer holds %d",
          RefString(objects_.MakeRef(slot)), *bytes, obj.capacity));
    }
    obj.size = *bytes;
    obj.layout = args.layout;
    if (ledger_ != nullptr) {
      std::string layout;
      obj.layout.SerializeToString(&layout);
      if (layout.size() > kMaxLedgerLayoutBytes) {
        return absl::InvalidArgumentError(
            absl::StrFormat("layout of %d bytes, at most %d", layout.size(),
                            kMaxLedgerLayoutBytes));
      }
      ledger_->SetObjectLayout(slot, obj.size, layout);
    }
  }
  Unstock(slot);
  SealResult result;
  if (!exclusive) {
    objects_.SetState(slot, State::kSealed);
    JournalObject(slot);
    (*lease)->write = false;
    result.lease_id = lease_id;
  } else {
    objects_.SetState(slot, State::kPendingTransfer);
    JournalObject(slot);
    sessions_.FindOrNull(session_id)->pending_transfers.insert(slot);
    HoldTransfer(slot, true);
    DropLease(lease_id);  // Cannot free: the transfer now holds the object.
  }
  // Wakes the Gets waiting for this seal (by name, or by ref).
  Changed();
  result.ref = objects_.MakeRef(slot);
  return result;
}

void ObjectStore::Unstock(uint32_t slot) {
  Object& obj = objects_.object(slot);
  if (!obj.stock) return;
  obj.stock = false;
  pools_[obj.pool]->stock_bytes -= obj.capacity;
  if (Session* s = sessions_.FindOrNull(obj.creator); s != nullptr) {
    --s->stock_objects;
    s->stock_bytes -= obj.capacity;
  }
}

absl::Status ObjectStore::ApplyOneWaySeal(uint64_t session_id,
                                          const v1::OneWaySeal& seal) {
  SealArgs args;
  args.exclusive = seal.exclusive();
  args.relayout = seal.size_bytes() != 0 || seal.has_layout();
  args.size_bytes = seal.size_bytes();
  args.layout = seal.layout();
  absl::StatusOr<SealResult> r = SealLocked(session_id, seal.lease_id(), args);
  if (r.ok()) return absl::OkStatus();
  // Refused: a write lease of an unsealed object goes with its object, so
  // that a Get waiting for the seal fails instead of waiting on.
  absl::StatusOr<Lease*> lease = LookupLease(session_id, seal.lease_id());
  if (lease.ok() && (*lease)->write &&
      objects_.object((*lease)->slot).state == State::kWriting) {
    DropLease(seal.lease_id());
    Changed();
  }
  return absl::NotFoundError(absl::StrFormat(
      "one-way seal of lease %d refused (the object is discarded): %s",
      seal.lease_id(), r.status().message()));
}

absl::StatusOr<Handout> ObjectStore::Get(uint64_t session_id,
                                         const v1::ObjectRef& ref,
                                         uint64_t offer_token) {
  absl::StatusOr<std::optional<Handout>> h =
      TryGet(session_id, ref, offer_token, /*wait=*/false, /*last_try=*/true);
  if (!h.ok()) return h.status();
  return **std::move(h);
}

absl::StatusOr<std::optional<Handout>> ObjectStore::TryGet(
    uint64_t session_id, const v1::ObjectRef& ref, uint64_t offer_token,
    bool wait, bool last_try) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return ShuttingDownError();
  return GetLocked(session_id, ref, offer_token, wait, last_try);
}

absl::StatusOr<std::optional<std::vector<absl::StatusOr<Handout>>>>
ObjectStore::TryGetMany(uint64_t session_id,
                        const std::vector<v1::ObjectRef>& refs, bool wait,
                        bool last_try) {
  if (refs.size() > kMaxBatch) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GetMany of %d refs, at most %d", refs.size(), kMaxBatch));
  }
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return ShuttingDownError();
  if (wait && !last_try) {
    for (const v1::ObjectRef& ref : refs) {
      absl::StatusOr<uint32_t> slot = objects_.ResolveRef(ref);
      if (slot.ok() && objects_.object(*slot).state == State::kWriting) {
        return std::nullopt;  // Nothing taken: all or none wait.
      }
    }
  }
  std::vector<absl::StatusOr<Handout>> out;
  out.reserve(refs.size());
  for (const v1::ObjectRef& ref : refs) {
    absl::StatusOr<std::optional<Handout>> h =
        GetLocked(session_id, ref, 0, wait, /*last_try=*/true);
    if (h.ok()) {
      out.push_back(**std::move(h));
    } else {
      out.push_back(h.status());
    }
  }
  return out;
}

absl::StatusOr<std::optional<Handout>> ObjectStore::GetLocked(
    uint64_t session_id, const v1::ObjectRef& ref, uint64_t offer_token,
    bool wait, bool last_try) {
  absl::StatusOr<Session*> session = sessions_.Find(session_id);
  if (!session.ok()) return session.status();
  absl::StatusOr<uint32_t> slot = objects_.ResolveRef(ref);
  if (!slot.ok() && wait && offer_token == 0 &&
      IsStaleReference(slot.status())) {
    return WithReason(
        absl::NotFoundError(absl::StrCat(
            slot.status().message(),
            " (or it was never sealed: its creator discarded it, or its "
            "session ended, before the seal)")),
        kReasonStaleReference);
  }
  if (!slot.ok()) {
    if (offer_token == 0 || !IsStaleReference(slot.status()) ||
        ref.daemon_epoch() != epoch_) {
      return slot.status();
    }
    // A live offer would have kept the object: it was taken by another
    // Get, or expired.
    return WithReason(
        absl::NotFoundError(absl::StrFormat(
            "%s (it was sent by reference, and its offer was taken by "
            "another receiver or expired: limits.offer_grace_ms = %d after "
            "the sender's session ended)",
            slot.status().message(), limits_.offer_grace_ms)),
        kReasonStaleReference);
  }
  const Object& obj = objects_.object(*slot);
  const bool can_write =
      (**session).access[obj.pool] == v1::POOL_ACCESS_READ_WRITE;
  if (!Allowed(**session, obj.pool, obj.state == State::kSharedWritable)) {
    return AccessError(**session, obj.pool,
                       absl::StrCat(obj.state == State::kSharedWritable
                                        ? "get of shared-writable "
                                        : "get of ",
                                    RefString(ref)));
  }
  switch (obj.state) {
    case State::kWriting:
      if (!wait) {
        return absl::FailedPreconditionError(
            absl::StrCat(RefString(ref), " is not sealed yet"));
      }
      if (!last_try) return std::nullopt;
      return absl::DeadlineExceededError(absl::StrCat(
          RefString(ref),
          " was not sealed within the wait: its creator has not sent the "
          "seal (it still holds it writable)"));
    case State::kTaken:
      return WithReason(
          absl::FailedPreconditionError(absl::StrCat(
              RefString(ref),
              " was sealed for exclusive transfer and was already taken")),
          kReasonAlreadyTaken);
    case State::kPendingTransfer: {
      if (absl::Status s = sessions_.CheckHold(**session, *slot, obj.capacity,
                                               leases_.size());
          !s.ok()) {
        return s;
      }
      objects_.SetState(*slot, State::kTaken);
      JournalObject(*slot);
      if (Session* creator = sessions_.FindOrNull(obj.creator);
          creator != nullptr) {
        creator->pending_transfers.erase(*slot);
      }
      HoldTransfer(*slot, false);
      // A session that may only read the pool takes it to read.
      const uint64_t lease = AddLease(session_id, **session, *slot, can_write);
      return MakeHandout(*slot, lease, can_write);
    }
    case State::kSealed:
    case State::kSharedWritable: {
      // An offer this Get takes over: its charge moves to the new lease,
      // so that the limits do not count the object twice.
      const OfferTable::Offer* offered =
          offer_token == 0 ? nullptr
                           : offers_.Find(offer_token, *slot, ref.generation());
      if (offered != nullptr) {
        sessions_.ChargeUid(offered->uid,
                            -static_cast<int64_t>(offered->bytes));
      }
      if (absl::Status s = sessions_.CheckHold(**session, *slot, obj.capacity,
                                               leases_.size());
          !s.ok()) {
        if (offered != nullptr) {
          sessions_.ChargeUid(offered->uid,
                              static_cast<int64_t>(offered->bytes));
        }
        return s;
      }
      const bool write = obj.state == State::kSharedWritable;
      const uint64_t lease = AddLease(session_id, **session, *slot, write);
      if (offered != nullptr) {
        offers_.Take(offer_token, *slot, ref.generation());
        if (ledger_ != nullptr) ledger_->DropOffer(offer_token);
        --objects_.object(*slot).holds;  // The new lease holds it now.
      }
      return MakeHandout(*slot, lease, write);
    }
  }
  return absl::InternalError("unreachable object state");
}

absl::StatusOr<OfferGrant> ObjectStore::Offer(uint64_t session_id,
                                              uint64_t lease_id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Lease*> lease = FindLease(session_id, lease_id);
  if (!lease.ok()) return lease.status();
  const uint32_t slot = (*lease)->slot;
  Object& obj = objects_.object(slot);
  if ((*lease)->write || obj.state != State::kSealed) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "lease %d is not a read lease of a sealed shared object: only those "
        "travel by reference (an unsealed buffer, a shared-writable object "
        "or an exclusive take must be copied)",
        lease_id));
  }
  const size_t open = offers_.CountOf(session_id);
  if (limits_.max_offers_per_session > 0 &&
      open >= limits_.max_offers_per_session) {
    return LimitExceededError(
        absl::StrFormat("the session has %d offers nobody took yet "
                        "(limits.max_offers_per_session = %d)",
                        open, limits_.max_offers_per_session));
  }
  if (absl::Status room = CheckPinRoom(1); !room.ok()) return room;
  Session& s = *sessions_.FindOrNull(session_id);  // FindLease checked it.
  uint64_t token = Random64();
  while (token == 0 || offers_.Contains(token)) token = Random64();
  OfferTable::Offer offer;
  offer.slot = slot;
  offer.generation = objects_.MakeRef(slot).generation();
  offer.session_id = session_id;
  offer.uid = s.peer.process.uid;
  offer.bytes = obj.capacity;
  ++obj.holds;
  // What an offer pins counts against the sender's uid
  // (max_bytes_per_uid) until it is taken: no way around the limit.
  sessions_.ChargeUid(offer.uid, static_cast<int64_t>(offer.bytes));
  offers_.Add(token, offer);
  if (ledger_ != nullptr) {
    LedgerPin pin;
    pin.kind = LedgerPin::kOffer;
    pin.key = token;
    pin.slot = slot;
    pin.generation = offer.generation;
    pin.client_id = s.client_id;
    pin.uid = offer.uid;
    pin.bytes = offer.bytes;
    ledger_->AddPin(pin);
  }
  return OfferGrant{objects_.MakeRef(slot), token};
}

int ObjectStore::ExpireOffers(absl::Time now) {
  absl::MutexLock lock(&mu_);
  const std::vector<OfferTable::Offer> expired = offers_.Expire(now);
  for (const OfferTable::Offer& offer : expired) EndOffer(offer);
  return static_cast<int>(expired.size());
}

void ObjectStore::EndOffer(const OfferTable::Offer& offer) {
  if (ledger_ != nullptr) ledger_->DropOffer(offer.token);
  sessions_.ChargeUid(offer.uid, -static_cast<int64_t>(offer.bytes));
  Object& obj = objects_.object(offer.slot);
  assert(obj.holds > 0);
  --obj.holds;
  MaybeFree(offer.slot);
}

absl::StatusOr<Handout> ObjectStore::GetByName(uint64_t session_id,
                                               const std::string& name,
                                               absl::Duration timeout,
                                               const CancelledFn& cancelled) {
  return Block<Handout>(
      session_id, absl::Now() + timeout, cancelled, [&](bool last_try) {
        return TryGetByName(session_id, name, timeout, last_try);
      });
}

absl::StatusOr<std::optional<Handout>> ObjectStore::TryGetByName(
    uint64_t session_id, const std::string& name, absl::Duration timeout,
    bool last_try) {
  if (absl::Status s = ValidateName(name); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return ShuttingDownError();
  absl::StatusOr<Session*> session = sessions_.Find(session_id);
  if (!session.ok()) return session.status();
  const std::optional<uint32_t> slot = objects_.Named(name);
  if (slot.has_value() && objects_.object(*slot).state == State::kSealed) {
    const Object& obj = objects_.object(*slot);
    if (!Allowed(**session, obj.pool, false)) {
      return AccessError(**session, obj.pool,
                         absl::StrCat("get of ", Quoted(name)));
    }
    if (absl::Status s =
            sessions_.CheckHold(**session, *slot, obj.capacity, leases_.size());
        !s.ok()) {
      return s;
    }
    const uint64_t lease = AddLease(session_id, **session, *slot, false);
    return MakeHandout(*slot, lease, false);
  }
  if (timeout <= absl::ZeroDuration()) {
    return absl::NotFoundError(
        absl::StrCat("no sealed object named ", Quoted(name),
                     slot.has_value() ? " (one is being written)" : ""));
  }
  if (!last_try) return std::nullopt;
  return absl::DeadlineExceededError(
      absl::StrCat("no sealed object named ", Quoted(name), " after ",
                   absl::FormatDuration(timeout)));
}

absl::StatusOr<bool> ObjectStore::Release(uint64_t session_id,
                                          uint64_t lease_id) {
  absl::MutexLock lock(&mu_);
  // Applied even while shutting down: dropping a lease is always safe.
  absl::StatusOr<Lease*> lease = LookupLease(session_id, lease_id);
  if (!lease.ok()) return lease.status();
  return DropLease(lease_id);
}

absl::Status ObjectStore::ReleaseBatch(
    uint64_t session_id, uint64_t seq, const std::vector<uint64_t>& lease_ids,
    const std::vector<v1::OneWaySeal>& seals) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = sessions_.Find(session_id);
  if (!session.ok()) return session.status();
  absl::StatusOr<bool> due = (*session)->releases.Apply(seq);
  if (!due.ok()) return due.status();
  // Applied already, from the copy a unary request carried.
  if (!*due) return absl::OkStatus();
  Changed();
  absl::Status refused;
  for (const v1::OneWaySeal& seal : seals) {
    if (absl::Status r = ApplyOneWaySeal(session_id, seal);
        !r.ok() && refused.ok()) {
      refused = r;
    }
  }
  std::vector<uint64_t> unknown;
  for (uint64_t id : lease_ids) {
    // Applied even while shutting down (releases in flight when SIGTERM
    // came are not errors).
    if (LookupLease(session_id, id).ok()) {
      DropLease(id);
    } else {
      unknown.push_back(id);
    }
  }
  if (ledger_ != nullptr) {
    ledger_->SetReleasesApplied((*session)->client_id, seq);
  }
  if (unknown.empty()) return refused;
  // At most 8 ids named: the message is logged, and a client can send
  // millions.
  const size_t named = std::min<size_t>(unknown.size(), 8);
  return absl::NotFoundError(absl::StrFormat(
      "ReleaseLeases seq %d: session holds no lease %s%s", seq,
      absl::StrJoin(unknown.begin(), unknown.begin() + named, ", "),
      named < unknown.size()
          ? absl::StrFormat(" and %d more", unknown.size() - named)
          : ""));
}

absl::Status ObjectStore::AwaitReleases(uint64_t session_id, uint64_t seq,
                                        absl::Duration timeout,
                                        const CancelledFn& cancelled) {
  if (seq == 0) return absl::OkStatus();
  return Block<bool>(session_id, absl::Now() + timeout, cancelled,
                     [&](bool last_try) -> absl::StatusOr<std::optional<bool>> {
                       absl::StatusOr<bool> done =
                           TryAwaitReleases(session_id, seq, last_try);
                       if (!done.ok()) return done.status();
                       if (!*done) return std::nullopt;
                       return true;
                     })
      .status();
}

absl::StatusOr<bool> ObjectStore::TryAwaitReleases(uint64_t session_id,
                                                   uint64_t seq,
                                                   bool last_try) {
  if (seq == 0) return true;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return ShuttingDownError();
  absl::StatusOr<Session*> session = sessions_.Find(session_id);
  if (!session.ok()) return session.status();
  if ((*session)->releases.Reached(seq)) return true;
  if (!last_try) return false;
  return (*session)->releases.NotReachedError(seq);
}

absl::StatusOr<bool> ObjectStore::Delete(uint64_t session_id,
                                         const std::string& name) {
  if (absl::Status s = ValidateName(name); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return ShuttingDownError();
  absl::StatusOr<Session*> session = sessions_.Find(session_id);
  if (!session.ok()) return session.status();
  const std::optional<uint32_t> slot = objects_.Named(name);
  if (!slot.has_value()) {
    return absl::NotFoundError(absl::StrCat("no object named ", Quoted(name)));
  }
  if (const uint32_t pool = objects_.object(*slot).pool;
      !Allowed(**session, pool, true)) {
    return AccessError(**session, pool,
                       absl::StrCat("delete of ", Quoted(name)));
  }
  objects_.Unbind(*slot);
  JournalObject(*slot);
  return MaybeFree(*slot);
}

v1::StatsResponse ObjectStore::Stats(uint64_t session_id,
                                     const PeerCredentials* caller) const {
  absl::MutexLock lock(&mu_);
  v1::StatsResponse out;
  out.set_daemon_epoch(epoch_);
  const Session* session = sessions_.FindOrNull(session_id);
  for (size_t i = 0; i < pools_.size(); ++i) {
    // A session that ended meanwhile sees no pool at all.
    v1::PoolAccess access = v1::POOL_ACCESS_READ_WRITE;
    if (session_id != 0) {
      access =
          session != nullptr ? session->access[i] : v1::POOL_ACCESS_UNSPECIFIED;
    } else if (caller != nullptr) {
      access = pools_[i]->access().AccessOf(*caller);
    }
    if (access == v1::POOL_ACCESS_UNSPECIFIED) continue;
    v1::PoolStats* ps = out.add_pools();
    *ps->mutable_info() = pool_infos_[i];
    if (session_id != 0 || caller != nullptr) {
      ps->mutable_info()->set_access(access);
    }
    // A CUDA pool's IPC handle goes to sessions only (SessionOpened, and
    // their Stats): whoever opens it maps the pool.
    if (session_id == 0) ps->mutable_info()->clear_cuda_ipc_handle();
    const Pool::Usage usage = pools_[i]->usage();
    ps->set_used_bytes(usage.used_bytes);
    ps->set_free_bytes(usage.free_bytes);
    ps->set_largest_free_bytes(usage.largest_free_bytes);
    ps->set_objects(usage.objects);
    ps->set_stock_bytes(usage.stock_bytes);
  }
  out.set_sessions(sessions_.size());
  out.set_objects(objects_.live());
  out.set_named_objects(objects_.named());
  out.set_leases(leases_.size());
  out.set_pending_transfers(objects_.pending_transfers());
  uint64_t holds = 0;
  for (const auto& [id, hold] : fork_holds_) {
    holds += session_id == 0 || hold.session_id == session_id;
  }
  out.set_fork_holds(holds);
  out.set_offers(session_id == 0 ? offers_.size()
                                 : offers_.CountOf(session_id));
  uint64_t stock_objects = 0, stock_bytes = 0;
  if (session_id != 0) {
    if (session != nullptr) {
      stock_objects = session->stock_objects;
      stock_bytes = session->stock_bytes;
    }
  } else {
    for (const auto& [id, s] : sessions_.all()) {
      stock_objects += s.stock_objects;
      stock_bytes += s.stock_bytes;
    }
  }
  out.set_stock_objects(stock_objects);
  out.set_stock_bytes(stock_bytes);
  out.set_uptime_ms(absl::ToInt64Milliseconds(absl::Now() - start_time_));
  return out;
}

v1::DaemonStatus ObjectStore::Status(const PeerCredentials* viewer) const {
  absl::MutexLock lock(&mu_);
  return BuildStatus(View(), viewer);
}

v1::ListObjectsResponse ObjectStore::ListObjects(
    uint32_t limit, uint64_t page_token, const PeerCredentials* viewer) const {
  absl::MutexLock lock(&mu_);
  return BuildObjectList(View(), limit, page_token, viewer);
}

v1::ListClientsResponse ObjectStore::ListClients(
    const PeerCredentials* viewer) const {
  absl::MutexLock lock(&mu_);
  return BuildClientList(View(), viewer);
}

StoreView ObjectStore::View() const {
  return StoreView{
      epoch_,          start_time_,        limits_,        pool_infos_,
      pools_,          sessions_,          objects_,       leases_,
      !shutting_down_, fork_holds_.size(), offers_.size(), AdoptedLocked()};
}

void ObjectStore::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  Changed();
}

absl::StatusOr<ObjectStore::Lease*> ObjectStore::FindLease(uint64_t session_id,
                                                           uint64_t lease_id) {
  if (shutting_down_) return ShuttingDownError();
  return LookupLease(session_id, lease_id);
}

absl::StatusOr<ObjectStore::Lease*> ObjectStore::LookupLease(
    uint64_t session_id, uint64_t lease_id) {
  if (absl::StatusOr<Session*> s = sessions_.Find(session_id); !s.ok()) {
    return s.status();
  }
  return leases_.Lookup(session_id, lease_id);
}

uint64_t ObjectStore::AddLease(uint64_t session_id, Session& session,
                               uint32_t slot, bool write) {
  const uint64_t id = leases_.Add(session_id, slot, write);
  if (ledger_ != nullptr) {
    ledger_->NoteLeaseId(id);
    ledger_->AddLease({id, session.client_id, slot, write});
  }
  Object& obj = objects_.object(slot);
  ++obj.leases;
  Pool& pool = *pools_[obj.pool];
  ++pool.leases;
  sessions_.Hold(session, id, slot, obj.capacity);
  if (write && obj.capacity > 0) {
    pool.NoteWritten(session_id, obj.offset, obj.capacity);
    pool.writers().Share(obj.offset, obj.capacity, session.peer.process.uid);
  }
  return id;
}

bool ObjectStore::DropLease(uint64_t lease_id) {
  const Lease lease = leases_.Remove(lease_id);
  if (ledger_ != nullptr) ledger_->DropLease(lease_id);
  Object& obj = objects_.object(lease.slot);
  if (Session* s = sessions_.FindOrNull(lease.session); s != nullptr) {
    sessions_.Unhold(*s, lease_id, lease.slot, obj.capacity);
  }
  // Invariant: a live object's lease count equals the leases naming it.
  assert(obj.leases > 0);
  --obj.leases;
  --pools_[obj.pool]->leases;
  if (lease.write && obj.state == State::kWriting) {
    // An unsealed object is discarded: its name was never visible.
    Unstock(lease.slot);
    objects_.Unbind(lease.slot);
    JournalObject(lease.slot);
  }
  return MaybeFree(lease.slot);
}

bool ObjectStore::MaybeFree(uint32_t slot) {
  const Object& obj = objects_.object(slot);
  if (obj.leases > 0 || obj.holds > 0 || !obj.name.empty() ||
      obj.state == State::kPendingTransfer) {
    return false;
  }
  Unstock(slot);
  Pool& pool = *pools_[obj.pool];
  if (obj.capacity > 0) pool.allocator().Free(obj.offset, obj.capacity);
  --pool.objects;
  objects_.Free(slot);
  if (ledger_ != nullptr) ledger_->FreeObject(slot, objects_.generation(slot));
  Changed();
  return true;
}

void ObjectStore::JournalObject(uint32_t slot) {
  if (ledger_ == nullptr) return;
  const Object& obj = objects_.object(slot);
  ledger_->SetObjectState(slot, static_cast<uint32_t>(obj.state),
                          !obj.name.empty());
}

void ObjectStore::JournalNewObject(uint32_t slot) {
  if (ledger_ == nullptr) return;
  const Object& obj = objects_.object(slot);
  ledger_->NoteSerial(obj.serial);
  LedgerObject rec;
  rec.slot = slot;
  rec.generation = objects_.generation(slot);
  rec.pool = obj.pool;
  rec.offset = obj.offset;
  rec.size = obj.size;
  rec.capacity = obj.capacity;
  rec.nonce = obj.nonce;
  rec.creator = ClientIdOf(obj.creator);
  rec.serial = obj.serial;
  rec.created_ns = absl::ToUnixNanos(obj.created);
  rec.state = static_cast<uint32_t>(obj.state);
  rec.named = !obj.name.empty();
  rec.name = obj.name;
  obj.layout.SerializeToString(&rec.layout);
  ledger_->PutObject(rec);
}

uint64_t ObjectStore::ClientIdOf(uint64_t session_id) const {
  const Session* s = sessions_.FindOrNull(session_id);
  return s == nullptr ? 0 : s->client_id;
}

absl::Status ObjectStore::CheckPinRoom(size_t n) const {
  if (ledger_ == nullptr || ledger_->has_pin_room(n)) return absl::OkStatus();
  return LimitExceededError(absl::StrFormat(
      "the daemon's ledger holds at most %d offers and fork-held objects",
      ledger_->capacity().pins));
}

void ObjectStore::FreezeForHandover() { mu_.Lock(); }

void ObjectStore::Thaw() { mu_.Unlock(); }

AdoptedState ObjectStore::adopted() const {
  absl::MutexLock lock(&mu_);
  return AdoptedLocked();
}

AdoptedState ObjectStore::AdoptedLocked() const {
  AdoptedState out;
  out.sessions = adopted_.size();
  out.quarantined_bytes = stranded_hold_bytes_;
  for (const auto& [hash, id] : adopted_) {
    if (const Session* s = sessions_.FindOrNull(id); s != nullptr) {
      out.quarantined_bytes += s->bytes_held;
    }
  }
  return out;
}

void ObjectStore::HoldTransfer(uint32_t slot, bool hold) {
  const Object& obj = objects_.object(slot);
  Session* creator = sessions_.FindOrNull(obj.creator);
  if (creator == nullptr) return;
  sessions_.Charge(*creator, hold ? static_cast<int64_t>(obj.capacity)
                                  : -static_cast<int64_t>(obj.capacity));
}

Handout ObjectStore::MakeHandout(uint32_t slot, uint64_t lease_id,
                                 bool writable) const {
  const Object& obj = objects_.object(slot);
  Handout h;
  h.ref = objects_.MakeRef(slot);
  h.placement.set_pool_id(obj.pool);
  h.placement.set_offset(obj.offset);
  h.placement.set_size_bytes(obj.size);
  h.placement.set_capacity_bytes(obj.capacity);
  h.layout = obj.layout;
  h.lease_id = lease_id;
  h.writable = writable;
  return h;
}

}  // namespace shmtensor::daemon
