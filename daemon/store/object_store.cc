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

// With a ledger, the limits of 0 ("none") are its tables' sizes; then each
// uid's share of every shared table (limits.h).
StoreLimits Bounded(StoreLimits limits, const Ledger* ledger,
                    const std::vector<std::unique_ptr<Pool>>& pools) {
  SharedTables tables;
  const LedgerCapacity cap =
      ledger != nullptr ? ledger->capacity() : LedgerCapacityFor(limits);
  if (ledger != nullptr) {
    if (limits.max_objects == 0 || limits.max_objects > cap.objects) {
      limits.max_objects = cap.objects;
    }
    if (limits.max_leases == 0 || limits.max_leases > cap.leases) {
      limits.max_leases = cap.leases;
    }
  }
  tables.objects = cap.objects;
  tables.leases = cap.leases;
  tables.sessions = cap.sessions;
  tables.pins = cap.pins;
  for (const auto& pool : pools) {
    if (pool->segment().kind() == v1::MEMORY_KIND_HOST) {
      tables.host_pool_bytes += pool->size_bytes();
    }
  }
  return ResolveUidShares(limits, tables);
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
      limits_(Bounded(limits, ledger.get(), pools)),
      pools_(std::move(pools)),
      // The tables draw randomness only from calls the store makes under
      // mu_.
      sessions_(limits_,
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

absl::Status ObjectStore::ShuttingDownError() {
  return absl::UnavailableError("shmtensord is shutting down");
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

void ObjectStore::SetClientErrorSink(ClientErrorSink sink) {
  absl::MutexLock lock(&mu_);
  client_errors_ = std::move(sink);
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

v1::StatsResponse ObjectStore::Stats(const PeerCredentials* viewer) {
  absl::MutexLock lock(&mu_);
  DrainRings();
  return StatsLocked(0, nullptr, viewer);
}

absl::StatusOr<v1::StatsResponse> ObjectStore::SessionStats(
    const Caller& caller) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Admit(caller);
  if (!session.ok()) return session.status();
  // Its pools' usage counts every seal made, whoever made it.
  DrainRings();
  return StatsLocked(caller.session_id, *session, nullptr);
}

v1::StatsResponse ObjectStore::StatsLocked(
    uint64_t session_id, const Session* session,
    const PeerCredentials* caller) const {
  v1::StatsResponse out;
  out.set_daemon_epoch(epoch_);
  for (size_t i = 0; i < pools_.size(); ++i) {
    v1::PoolAccess access = v1::POOL_ACCESS_READ_WRITE;
    if (session != nullptr) {
      access = session->access[i];
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
  if (session != nullptr) {
    stock_objects = session->stock_objects;
    stock_bytes = session->stock_bytes;
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

v1::DaemonStatus ObjectStore::Status(const PeerCredentials* viewer) {
  absl::MutexLock lock(&mu_);
  DrainRings();
  return BuildStatus(View(), viewer);
}

v1::ListObjectsResponse ObjectStore::ListObjects(
    uint32_t limit, uint64_t page_token, const PeerCredentials* viewer) {
  absl::MutexLock lock(&mu_);
  DrainRings();
  return BuildObjectList(View(), limit, page_token, viewer);
}

v1::ListClientsResponse ObjectStore::ListClients(
    const PeerCredentials* viewer) {
  absl::MutexLock lock(&mu_);
  DrainRings();
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
  return leases_.Lookup(session_id, lease_id);
}

uint64_t ObjectStore::AddLease(uint64_t session_id, Session& session,
                               uint32_t slot, bool write) {
  const uint64_t id = leases_.Add(session_id, slot, write);
  if (ledger_ != nullptr) {
    ledger_->NoteLeaseId(id);
    // Room is certain: max_leases is at most the ledger's records, and
    // LeasesCounted() counts the records a refused predecessor's lease
    // keeps. Should it fail all the same, the lease lives unrecorded: a
    // successor would not know of it, so this daemon says so.
    if (absl::Status added =
            ledger_->AddLease({id, session.client_id, slot, write});
        !added.ok()) {
      spdlog::error("lease {} is not in the ledger: {}", id,
                    std::string(added.message()));
    }
  }
  Object& obj = objects_.object(slot);
  ++obj.leases;
  pools_[obj.pool]->AddLease(session_id, session.peer.process.uid, obj.offset,
                             obj.capacity, write);
  sessions_.Hold(session, id, slot, obj.capacity);
  return id;
}

bool ObjectStore::DropLease(uint64_t lease_id, Session* holder) {
  const Lease lease = leases_.Remove(lease_id);
  if (ledger_ != nullptr) ledger_->DropLease(lease_id);
  Object& obj = objects_.object(lease.slot);
  if (Session* s =
          holder != nullptr ? holder : sessions_.FindOrNull(lease.session);
      s != nullptr) {
    sessions_.Unhold(*s, lease_id, lease.slot, obj.capacity);
  }
  // Invariant: a live object's lease count equals the leases naming it.
  assert(obj.leases > 0);
  --obj.leases;
  pools_[obj.pool]->DropLease();
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
  pools_[obj.pool]->FreeObject(obj.offset, obj.capacity);
  sessions_.CountObjects(obj.uid, -1);
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

absl::Status ObjectStore::JournalNewObject(uint32_t slot) {
  if (ledger_ == nullptr) return absl::OkStatus();
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
  rec.uid = obj.uid;
  rec.name = obj.name;
  obj.layout.SerializeToString(&rec.layout);
  return ledger_->PutObject(rec);
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

void ObjectStore::FreezeForHandover() {
  mu_.Lock();
  // What the sessions posted in their rings goes into the handed state:
  // the successor has no rings.
  DrainRings();
}

void ObjectStore::Thaw() { mu_.Unlock(); }

AdoptedState ObjectStore::adopted() const {
  absl::MutexLock lock(&mu_);
  return AdoptedLocked();
}

AdoptedState ObjectStore::AdoptedLocked() const {
  AdoptedState out;
  out.sessions = adopted_.size();
  out.quarantined_bytes = stranded_hold_bytes_ + quarantined_bytes_;
  out.refused_records = refused_records_;
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
