// ObjectStore: a successor's adoption of its predecessor's ledger
// (take-over, restart).
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
    // [P23] A record the successor cannot trust is refused alone, with what
    // it belonged to; every other session and object is served as before.
    uint64_t refused = state.refused_records;
    for (const LedgerRefusal& r : state.refusals) {
      spdlog::error("ledger: refused {}", r.why);
    }
    // A refused object's slot is never used again; its range, when the
    // record placed it inside its pool and no other object has it, is kept
    // from reuse (a view of it may be alive).
    auto retire = [&](const LedgerRetiredSlot& r) {
      objects_.RestoreRetired(r.slot);
      if (r.range_known && r.pool < pools_.size() &&
          pools_[r.pool]->RestoreObject(r.offset, r.capacity)) {
        quarantined_bytes_ += r.capacity;
      }
    };
    for (const LedgerRetiredSlot& r : state.retired_slots) retire(r);
    for (const LedgerObject& lo : state.objects) {
      Pool& pool = *pools_[lo.pool];
      auto refuse = [&](const std::string& why, bool range_known) {
        ++refused;
        spdlog::error(
            "ledger: refused the object record in slot {} ({}): its slot is "
            "retired{}",
            lo.slot, why, range_known ? ", its range kept from reuse" : "");
        retire({lo.slot, range_known, lo.pool, lo.offset, lo.capacity});
        // Withdrawn, as Ledger::Adopt withdraws what it refuses.
        ledger_->FreeObject(lo.slot,
                            lo.generation + 1 == 0 ? 1 : lo.generation + 1);
      };
      Object obj;
      obj.pool = lo.pool;
      obj.offset = lo.offset;
      obj.size = lo.size;
      obj.capacity = lo.capacity;
      obj.state = static_cast<State>(lo.state);
      if (!obj.layout.ParseFromString(lo.layout) ||
          !LayoutExtent(obj.layout).ok()) {
        // A one-way seal cut short by a crash (Ledger::SetObjectLayout):
        // the object is unsealed, and its creator's resume seals it again
        // with the layout (OpenSession.pending_seals) or it goes.
        if (obj.state == State::kWriting) {
          obj.layout.Clear();
          obj.size = obj.capacity;
        } else {
          refuse("a sealed object's layout does not parse", true);
          continue;
        }
      }
      if (lo.named) {
        if (!ValidateName(lo.name).ok() || objects_.Named(lo.name)) {
          refuse("its name is bad or bound twice", true);
          continue;
        }
        obj.name = lo.name;
      }
      if (!pool.RestoreObject(lo.offset, lo.capacity)) {
        refuse(absl::StrFormat("its range %d+%d of pool '%s' overlaps another "
                               "object's",
                               lo.offset, lo.capacity, pool.name()),
               false);
        continue;
      }
      obj.creator = session_of(lo.creator);
      // The record's uid (0 from a daemon that did not record it: then the
      // creator's session's, when it is still there).
      obj.uid = lo.uid;
      if (const Session* creator = sessions_.FindOrNull(obj.creator);
          creator != nullptr && lo.uid == 0) {
        obj.uid = creator->peer.process.uid;
      }
      obj.created = absl::FromUnixNanos(lo.created_ns);
      obj.serial = lo.serial;
      obj.nonce = lo.nonce;
      sessions_.CountObjects(obj.uid, +1);
      objects_.Restore(lo.slot, lo.generation, std::move(obj));
      if (const uint64_t c = session_of(lo.creator); c != 0) {
        adopted_created_[c].slots.push_back(lo.slot);
      }
    }
    for (const auto& [slot, generation] : state.free_generations) {
      objects_.RestoreFree(slot, generation);
    }
    objects_.FinishRestore();
    // What a refused lease or pin, or a lease of a refused session, may
    // have stood for is a view that may be alive: its object stays for this
    // daemon's life.
    const absl::flat_hash_set<uint64_t> refused_clients(
        state.refused_clients.begin(), state.refused_clients.end());
    absl::flat_hash_set<uint32_t> quarantine(state.quarantined_slots.begin(),
                                             state.quarantined_slots.end());
    for (const LedgerLease& ll : state.leases) {
      if (refused_clients.contains(ll.client_id)) {
        quarantine.insert(ll.slot);
        continue;  // Its record stays, as its session's does.
      }
    }
    for (const LedgerPin& p : state.pins) {
      if (refused_clients.contains(p.client_id)) quarantine.insert(p.slot);
    }
    for (uint32_t slot : quarantine) {
      if (!objects_.live(slot)) continue;
      Object& obj = objects_.object(slot);
      ++obj.holds;
      quarantined_bytes_ += obj.capacity;
      spdlog::warn(
          "ledger: the object in slot {} ({} bytes) is kept for this "
          "daemon's life: a refused record may have stood for a view of it",
          slot, obj.capacity);
    }
    for (const LedgerLease& ll : state.leases) {
      if (refused_clients.contains(ll.client_id)) continue;
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
      pools_[obj.pool]->RestoreLease();
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
      sessions_.CountPins(p.uid, +1);
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
        pool->ForgetWriters();
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
        "gone), {} offers, {} fork holds; {} records refused",
        epoch_, objects_.live(), leases_.size(), dropped_leases,
        sessions_.size(), gone.size(), offers_.size(), fork_holds_.size(),
        refused);
    refused_records_ = refused;
  }
  for (uint64_t id : gone) EndSession(id);
  return absl::OkStatus();
}

}  // namespace shmtensor::daemon
