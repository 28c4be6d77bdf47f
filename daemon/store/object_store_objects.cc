// ObjectStore: objects (create, seal, get, offer, release, delete).
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
#include "common/release_protocol.h"
#include "daemon/store/layout.h"
#include "daemon/store/object_store.h"
#include "daemon/store/store_views.h"
#include "shmtensor/errors.h"

namespace shmtensor::daemon {
namespace {

// The smallest buffer whose create pulls the release rings to find a range
// its session wrote before (CreateLocked).
constexpr uint64_t kPullForRangeBytes = 1 << 20;

}  // namespace

CreateArgs CreateArgsOf(const v1::CreateRequest& request) {
  CreateArgs args;
  args.pool = request.pool();
  args.size_bytes = request.size_bytes();
  args.layout = request.layout();
  args.name = request.name();
  args.shared_writable = request.shared_writable();
  return args;
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
  absl::StatusOr<std::optional<Handout>> h =
      CreateLocked(args, *bytes, /*last_try=*/false);
  // What it lacks (memory, room under a limit) may be freed by releases
  // posted in release rings: pulled before it fails or waits. While it
  // waits, the releases posted later come with a nudge (asked for only
  // then: a nudge costs each ring's client its next post's stream write).
  if (LacksWhatReleasesFree(h) && PullReleases(/*nudge=*/false)) {
    h = CreateLocked(args, *bytes, /*last_try=*/false);
  }
  if (h.ok() && !h->has_value() && !last_try && PullReleases(/*nudge=*/true)) {
    h = CreateLocked(args, *bytes, /*last_try=*/false);
  }
  if (h.ok() && !h->has_value() && last_try) {
    h = CreateLocked(args, *bytes, /*last_try=*/true);
  }
  return h;
}

absl::StatusOr<std::optional<Handout>> ObjectStore::CreateLocked(
    const CreateArgs& args, uint64_t requested_bytes, bool last_try) {
  const std::optional<uint64_t> bytes = requested_bytes;
  absl::StatusOr<Session*> session = Admit(args.caller);
  if (!session.ok()) return session.status();
  if (shutting_down_) return ShuttingDownError();
  const uint64_t session_id = args.caller.session_id;
  // The caller wants back the range of an object of its own that it let go
  // of (its releases are applied: Admit): while the object is alive, the
  // release that frees it may be posted in a reader's release ring, pulled
  // before the buffer is placed, so that Pool::PlaceRange (the range the
  // caller wrote last that is free, first) may find it free. Another
  // session's object is no reason to.
  if (args.reuse_range_of.has_value()) {
    const absl::StatusOr<uint32_t> slot =
        objects_.ResolveRef(*args.reuse_range_of);
    if (slot.ok() && objects_.object(*slot).creator == session_id) {
      DrainRings();
    }
  }
  absl::StatusOr<uint32_t> chosen = PoolFor(**session, args.pool);
  if (!chosen.ok()) return chosen.status();
  const uint32_t pool_id = *chosen;
  if (!Allowed(**session, pool_id, true)) {
    return AccessError(**session, pool_id, "create");
  }
  Pool& pool = *pools_[pool_id];
  Pool::Placement place{0, 0, RangeAllocator::End::kLow};
  if (*bytes > 0) {
    std::optional<Pool::Placement> placed = pool.Place(*bytes);
    if (!placed || placed->capacity > pool.size_bytes()) {
      return WithReason(absl::InvalidArgumentError(absl::StrFormat(
                            "size %d bytes exceeds pool '%s' of %d bytes",
                            *bytes, pool.name(), pool.size_bytes())),
                        kReasonLargerThanPool);
    }
    place = *placed;
  }
  const uint64_t capacity = place.capacity;
  if (!args.name.empty() && objects_.Named(args.name).has_value()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "name ", Quoted(args.name), " is already bound to an object"));
  }
  if (objects_.full()) {
    return LimitExceededError(absl::StrFormat(
        "%d objects alive, the most the daemon holds", kMaxObjects));
  }
  if (limits_.max_objects > 0 &&
      objects_.live() + objects_.retired() >= limits_.max_objects) {
    return LimitExceededError(
        absl::StrFormat("%d objects alive, the limit (limits.max_objects = %d)",
                        objects_.live(), limits_.max_objects));
  }
  const uid_t uid = (*session)->peer.process.uid;
  if (absl::Status s = sessions_.CheckUidObjects(uid); !s.ok()) return s;
  if (absl::Status s =
          sessions_.CheckHold(**session, kNoSlot, capacity, LeasesCounted());
      !s.ok()) {
    return s;
  }
  if (args.stock) {
    if (absl::Status s = sessions_.CheckUidStock(uid, capacity); !s.ok()) {
      return s;
    }
  }
  // [P23] What goes into the object's ledger record fits it (the layout was
  // bounded where it arrived: RequestedBytes; PutObject checks again where
  // it writes). Its size, not a serialisation: JournalNewObject makes that.
  if (ledger_ != nullptr) {
    if (absl::Status s = Ledger::CheckObjectFits(args.name.size(),
                                                 args.layout.ByteSizeLong());
        !s.ok()) {
      return s;
    }
  }
  if (args.stock && limits_.max_stock_bytes_per_client > 0 &&
      (*session)->stock_bytes + capacity > limits_.max_stock_bytes_per_client) {
    return LimitExceededError(absl::StrFormat(
        "client %d holds %d bytes of stock (buffers made ahead of its puts); "
        "%d more would pass limits.max_stock_bytes_per_client = %d",
        (*session)->client_id, (*session)->stock_bytes, capacity,
        limits_.max_stock_bytes_per_client));
  }
  // A big buffer (no stock serves it) of a size this session made before,
  // whose ranges it wrote are all in use: the release that frees the last
  // may be posted in a reader's release ring (a broadcast's ranks drop their
  // views one way), pulled before the buffer is placed, so that it lands on
  // a range already in the writer's and the readers' page tables, not a
  // range each must map afresh (milliseconds per 64 MiB and process). Not
  // for stock, whose refills while a producer keeps its buffers would pull
  // every ring each time; nor below kPullForRangeBytes, whose mapping costs
  // less than pulling every session's ring might.
  if (!args.stock && capacity >= kPullForRangeBytes &&
      pool.WrittenRangesInUse(session_id, place)) {
    DrainRings();
  }
  const std::optional<uint64_t> got =
      pool.AllocateObject(session_id, place, args.stock);
  if (!got.has_value()) {
    if (!last_try) return std::nullopt;
    return absl::ResourceExhaustedError(
        DescribePoolPressure(View(), pool_id, capacity));
  }
  const uint64_t offset = *got;
  Object obj;
  obj.pool = pool_id;
  obj.offset = offset;
  obj.size = *bytes;
  obj.capacity = capacity;
  obj.layout = args.layout;
  obj.name = args.name;
  obj.creator = session_id;
  obj.uid = uid;
  obj.created = absl::Now();
  if (args.shared_writable) obj.state = State::kSharedWritable;
  obj.stock = args.stock;
  if (args.stock) {
    ++(*session)->stock_objects;
    (*session)->stock_bytes += capacity;
    sessions_.CountStock(uid, static_cast<int64_t>(capacity));
  }
  obj.serial = next_serial_++;
  const uint32_t slot = objects_.Add(std::move(obj));
  sessions_.CountObjects(uid, +1);
  if (absl::Status s = JournalNewObject(slot); !s.ok()) {
    // The ledger refused the record (it wrote nothing): the object goes as
    // it came, before anyone heard of it (MaybeFree undoes its stock and
    // its count too).
    objects_.Unbind(slot);
    MaybeFree(slot);
    return s;
  }
  // [P21] Bytes another uid wrote are cleared before this one gets them.
  std::vector<WriterMap::Range> stale =
      pool.ClaimForWriter(offset, capacity, (*session)->peer.process.uid);
  const uint64_t lease = AddLease(session_id, **session, slot, true);
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
    if (!cleared.ok()) pools_[pool_id]->ClearFailed(handout.stale);
    Object& obj = objects_.object(handout.slot);
    assert(obj.holds > 0);
    --obj.holds;
    MaybeFree(handout.slot);
  }
  if (!cleared.ok()) (void)Release(session_id, handout.lease_id);
  return cleared;
}

absl::StatusOr<SealResult> ObjectStore::Seal(const Caller& caller,
                                             uint64_t lease_id,
                                             bool exclusive) {
  SealArgs args;
  args.exclusive = exclusive;
  return Seal(caller, lease_id, args);
}

absl::StatusOr<SealResult> ObjectStore::Seal(const Caller& caller,
                                             uint64_t lease_id,
                                             const SealArgs& args) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Admit(caller);
  if (!session.ok()) return session.status();
  if (shutting_down_) return ShuttingDownError();
  return SealLocked(caller.session_id, **session, lease_id, args);
}

absl::StatusOr<SealResult> ObjectStore::SealLocked(uint64_t session_id,
                                                   Session& s,
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
    if (ledger_ != nullptr) {
      // Written, and checked, before the object changes: a refusal leaves
      // it as it was.
      std::string layout;
      args.layout.SerializeToString(&layout);
      if (absl::Status s = ledger_->SetObjectLayout(slot, *bytes, layout);
          !s.ok()) {
        return s;
      }
    }
    obj.size = *bytes;
    obj.layout = args.layout;
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
    s.pending_transfers.insert(slot);
    HoldTransfer(slot, true);
    // Cannot free: the transfer now holds the object.
    DropLease(lease_id, &s);
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
  pools_[obj.pool]->Unstock(obj.capacity);
  if (Session* s = sessions_.FindOrNull(obj.creator); s != nullptr) {
    --s->stock_objects;
    s->stock_bytes -= obj.capacity;
  }
  sessions_.CountStock(obj.uid, -static_cast<int64_t>(obj.capacity));
}

absl::Status ObjectStore::ApplyOneWaySeal(uint64_t session_id, Session& s,
                                          const v1::OneWaySeal& seal) {
  SealArgs args;
  args.exclusive = seal.exclusive();
  args.relayout = seal.size_bytes() != 0 || seal.has_layout();
  args.size_bytes = seal.size_bytes();
  args.layout = seal.layout();
  absl::StatusOr<SealResult> r =
      SealLocked(session_id, s, seal.lease_id(), args);
  if (r.ok()) return absl::OkStatus();
  // Refused: a write lease of an unsealed object goes with its object, so
  // that a Get waiting for the seal fails instead of waiting on.
  absl::StatusOr<Lease*> lease = LookupLease(session_id, seal.lease_id());
  bool discarded = false;
  if (lease.ok() && (*lease)->write &&
      objects_.object((*lease)->slot).state == State::kWriting) {
    DropLease(seal.lease_id(), &s);
    Changed();
    discarded = true;
  }
  // Says what happened: a seal refused for a lease that is no unsealed
  // object's write lease of the session changes nothing.
  return absl::NotFoundError(absl::StrFormat(
      "one-way seal of lease %d refused: %s; %s", seal.lease_id(),
      r.status().message(),
      discarded ? "its unsealed object is discarded (a Get waiting for its "
                  "seal fails)"
                : "nothing changed (the lease is no unsealed object's write "
                  "lease of this session)"));
}

absl::StatusOr<Handout> ObjectStore::Get(const Caller& caller,
                                         const v1::ObjectRef& ref,
                                         uint64_t offer_token) {
  absl::StatusOr<std::optional<Handout>> h =
      TryGet(caller, ref, offer_token, /*wait=*/false, /*last_try=*/true);
  if (!h.ok()) return h.status();
  return **std::move(h);
}

absl::StatusOr<std::optional<Handout>> ObjectStore::TryGet(
    const Caller& caller, const v1::ObjectRef& ref, uint64_t offer_token,
    bool wait, bool last_try) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Admit(caller);
  if (!session.ok()) return session.status();
  if (shutting_down_) return ShuttingDownError();
  absl::StatusOr<std::optional<Handout>> h =
      GetLocked(caller.session_id, **session, ref, offer_token, wait, last_try);
  // Past a limit that releases posted in release rings may lift: pulled,
  // and tried again (the object may have gone meanwhile: GetLocked looks
  // it up again).
  if (!h.ok() && LacksWhatReleasesFree(h.status()) &&
      PullReleases(/*nudge=*/false)) {
    h = GetLocked(caller.session_id, **session, ref, offer_token, wait,
                  last_try);
  }
  return h;
}

absl::StatusOr<std::optional<std::vector<absl::StatusOr<Handout>>>>
ObjectStore::TryGetMany(const Caller& caller,
                        const std::vector<v1::ObjectRef>& refs, bool wait,
                        bool last_try) {
  if (refs.size() > kMaxBatch) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GetMany of %d refs, at most %d", refs.size(), kMaxBatch));
  }
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Admit(caller);
  if (!session.ok()) return session.status();
  if (shutting_down_) return ShuttingDownError();
  if (wait && !last_try) {
    for (const v1::ObjectRef& ref : refs) {
      absl::StatusOr<uint32_t> slot = objects_.ResolveRef(ref);
      if (slot.ok() && objects_.object(*slot).state == State::kWriting &&
          PullSealOf(*slot, /*nudge=*/true)) {
        slot = objects_.ResolveRef(ref);
      }
      if (slot.ok() && objects_.object(*slot).state == State::kWriting) {
        return std::nullopt;  // Nothing taken: all or none wait.
      }
    }
  }
  std::vector<absl::StatusOr<Handout>> out;
  out.reserve(refs.size());
  for (const v1::ObjectRef& ref : refs) {
    absl::StatusOr<std::optional<Handout>> h =
        GetLocked(caller.session_id, **session, ref, 0, wait,
                  /*last_try=*/true);
    // As TryGet's.
    if (!h.ok() && LacksWhatReleasesFree(h.status()) &&
        PullReleases(/*nudge=*/false)) {
      h = GetLocked(caller.session_id, **session, ref, 0, wait,
                    /*last_try=*/true);
    }
    if (h.ok()) {
      out.push_back(**std::move(h));
    } else {
      out.push_back(h.status());
    }
  }
  return out;
}

absl::StatusOr<std::optional<Handout>> ObjectStore::GetLocked(
    uint64_t session_id, Session& session, const v1::ObjectRef& ref,
    uint64_t offer_token, bool wait, bool last_try) {
  absl::StatusOr<uint32_t> slot = objects_.ResolveRef(ref);
  // Its seal may be in its creator's release ring; a Get that will wait
  // for it asks for a nudge as well.
  if (slot.ok() && objects_.object(*slot).state == State::kWriting &&
      PullSealOf(*slot, wait && !last_try)) {
    slot = objects_.ResolveRef(ref);
  }
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
  const bool can_write = session.access[obj.pool] == v1::POOL_ACCESS_READ_WRITE;
  if (!Allowed(session, obj.pool, obj.state == State::kSharedWritable)) {
    return AccessError(session, obj.pool,
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
      if (absl::Status s = sessions_.CheckHold(session, *slot, obj.capacity,
                                               LeasesCounted());
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
      const uint64_t lease = AddLease(session_id, session, *slot, can_write);
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
      if (absl::Status s = sessions_.CheckHold(session, *slot, obj.capacity,
                                               LeasesCounted());
          !s.ok()) {
        if (offered != nullptr) {
          sessions_.ChargeUid(offered->uid,
                              static_cast<int64_t>(offered->bytes));
        }
        return s;
      }
      const bool write = obj.state == State::kSharedWritable;
      const uint64_t lease = AddLease(session_id, session, *slot, write);
      if (offered != nullptr) {
        sessions_.CountPins(offered->uid, -1);
        offers_.Take(offer_token, *slot, ref.generation());
        if (ledger_ != nullptr) ledger_->DropOffer(offer_token);
        --objects_.object(*slot).holds;  // The new lease holds it now.
      }
      return MakeHandout(*slot, lease, write);
    }
  }
  return absl::InternalError("unreachable object state");
}

absl::StatusOr<OfferGrant> ObjectStore::Offer(const Caller& caller,
                                              uint64_t lease_id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Admit(caller);
  if (!session.ok()) return session.status();
  const uint64_t session_id = caller.session_id;
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
  Session& s = **session;
  if (absl::Status share = sessions_.CheckUidPins(s.peer.process.uid, 1);
      !share.ok()) {
    return share;
  }
  uint64_t token = Random64();
  while (token == 0 || offers_.Contains(token)) token = Random64();
  OfferTable::Offer offer;
  offer.slot = slot;
  offer.generation = objects_.MakeRef(slot).generation();
  offer.session_id = session_id;
  offer.uid = s.peer.process.uid;
  offer.bytes = obj.capacity;
  if (ledger_ != nullptr) {
    LedgerPin pin;
    pin.kind = LedgerPin::kOffer;
    pin.key = token;
    pin.slot = slot;
    pin.generation = offer.generation;
    pin.client_id = s.client_id;
    pin.uid = offer.uid;
    pin.bytes = offer.bytes;
    if (absl::Status room = ledger_->AddPin(pin); !room.ok()) {
      return WithReason(room, kReasonLimitExceeded);
    }
  }
  ++obj.holds;
  // What an offer pins counts against the sender's uid
  // (max_bytes_per_uid, max_pins_per_uid) until it is taken or ends: no way
  // around the limits.
  sessions_.ChargeUid(offer.uid, static_cast<int64_t>(offer.bytes));
  sessions_.CountPins(offer.uid, +1);
  offers_.Add(token, offer);
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
  sessions_.CountPins(offer.uid, -1);
  Object& obj = objects_.object(offer.slot);
  assert(obj.holds > 0);
  --obj.holds;
  MaybeFree(offer.slot);
}

absl::StatusOr<std::optional<Handout>> ObjectStore::TryGetByName(
    const Caller& caller, const std::string& name, absl::Duration timeout,
    bool last_try) {
  if (absl::Status s = ValidateName(name); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Admit(caller);
  if (!session.ok()) return session.status();
  if (shutting_down_) return ShuttingDownError();
  const uint64_t session_id = caller.session_id;
  const std::optional<uint32_t> slot = objects_.Named(name);
  if (slot.has_value() && objects_.object(*slot).state == State::kSealed) {
    if (!Allowed(**session, objects_.object(*slot).pool, false)) {
      return AccessError(**session, objects_.object(*slot).pool,
                         absl::StrCat("get of ", Quoted(name)));
    }
    absl::Status held = sessions_.CheckHold(
        **session, *slot, objects_.object(*slot).capacity, LeasesCounted());
    // As TryGet's: a named object stays bound, so the lookup stands.
    if (!held.ok() && LacksWhatReleasesFree(held) &&
        PullReleases(/*nudge=*/false)) {
      held = sessions_.CheckHold(
          **session, *slot, objects_.object(*slot).capacity, LeasesCounted());
    }
    if (!held.ok()) return held;
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

absl::StatusOr<bool> ObjectStore::Release(const Caller& caller,
                                          uint64_t lease_id) {
  absl::MutexLock lock(&mu_);
  // Applied even while shutting down: dropping a lease is always safe.
  absl::StatusOr<Session*> session = Admit(caller);
  if (!session.ok()) return session.status();
  absl::StatusOr<Lease*> lease = LookupLease(caller.session_id, lease_id);
  if (!lease.ok()) return lease.status();
  return DropLease(lease_id, *session);
}

absl::StatusOr<ObjectStore::Session*> ObjectStore::Admit(const Caller& caller) {
  Session* s = sessions_.FindOrNull(caller.session_id);
  if (s == nullptr ||
      (caller.owner.has_value() && s->peer.owner != *caller.owner)) {
    return SessionNotOpenError(caller.session_id);
  }
  if (caller.connection != 0 && caller.connection < s->peer.connection) {
    return absl::UnavailableError(absl::StrFormat(
        "client %d's session is on a newer connection than this call's "
        "(a call from before its last resume): call again",
        s->client_id));
  }
  // What the session posted in its ring comes before what it asks now.
  DrainRing(caller.session_id, *s);
  if (caller.carried != nullptr && !caller.carried->empty()) {
    if (static_cast<size_t>(caller.carried->size()) >
        kDaemonMaxCarriedReleases) {
      return absl::InvalidArgumentError(
          absl::StrFormat("request carries %d ReleaseLeases copies, at most %d",
                          caller.carried->size(), kDaemonMaxCarriedReleases));
    }
    std::vector<v1::OneWaySeal> seals;
    for (const v1::ReleaseLeases& message : *caller.carried) {
      // A seq applied already (its stream message, or this request's
      // earlier try) is skipped at once.
      if (s->releases.Reached(message.seq())) continue;
      seals.assign(message.seals().begin(), message.seals().end());
      absl::Status r =
          ReleaseBatchLocked(caller.session_id, *s, message.seq(),
                             absl::MakeConstSpan(message.lease_ids().data(),
                                                 message.lease_ids().size()),
                             seals);
      if (absl::IsInvalidArgument(r)) break;  // A gap: the stream has the rest.
      if (absl::IsNotFound(r)) {
        if (caller.skipped != nullptr) *caller.skipped = r;
      } else if (!r.ok()) {
        return r;
      }
    }
    // The copies may have applied the message the ring's next ones waited
    // for (DrainRing stops at a seq not due yet): those are due now.
    if (!s->releases.Reached(caller.releases_through)) {
      DrainRing(caller.session_id, *s);
    }
  }
  if (!s->releases.Reached(caller.releases_through)) {
    if (caller.releases_last_try) {
      return s->releases.NotReachedError(caller.releases_through);
    }
    return AwaitingReleasesError(caller.releases_through,
                                 s->releases.applied());
  }
  return s;
}

absl::Status ObjectStore::ReleaseBatch(
    uint64_t session_id, uint64_t seq, const std::vector<uint64_t>& lease_ids,
    const std::vector<v1::OneWaySeal>& seals) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = sessions_.Find(session_id);
  if (!session.ok()) return session.status();
  absl::Status r =
      ReleaseBatchLocked(session_id, **session, seq, lease_ids, seals);
  if ((*session)->ring != nullptr) {
    DrainRing(session_id, **session);
    // The stream brought the message a nudge asked for (or a later one):
    // the calls waiting for this session's seals try again, and ask again
    // if they still wait.
    if ((*session)->ring->reader().TakeNudge()) Changed();
  }
  return r;
}

bool ObjectStore::DrainRing(uint64_t session_id, Session& s) {
  if (s.ring == nullptr) return false;
  bool applied = false;
  absl::Status refused;
  v1::ReleaseLeases message;
  std::vector<v1::OneWaySeal> seals;
  using Take = ReleaseRingReader::Take;
  const absl::Status broke =
      s.ring->reader().Drain([&](absl::string_view record) {
        if (!message.ParseFromArray(record.data(),
                                    static_cast<int>(record.size())) ||
            message.seq() == 0) {
          return Take::kMalformed;
        }
        if (s.releases.Reached(message.seq())) return Take::kConsumed;
        if (message.seq() != s.releases.applied() + 1) return Take::kLater;
        seals.assign(message.seals().begin(), message.seals().end());
        absl::Status r =
            ReleaseBatchLocked(session_id, s, message.seq(),
                               absl::MakeConstSpan(message.lease_ids().data(),
                                                   message.lease_ids().size()),
                               seals);
        if (!r.ok() && refused.ok()) refused = r;
        applied = true;
        ++s.ring_messages;
        return Take::kConsumed;
      });
  if (client_errors_) {
    if (!broke.ok()) {
      client_errors_(
          session_id,
          absl::Status(broke.code(), absl::StrCat("client ", s.client_id, ": ",
                                                  broke.message(),
                                                  "; its messages come by its "
                                                  "stream only")));
    }
    if (!refused.ok()) {
      client_errors_(
          session_id,
          absl::Status(refused.code(),
                       absl::StrCat("release ring of client ", s.client_id,
                                    ": ", refused.message())));
    }
  }
  return applied;
}

bool ObjectStore::DrainRings() {
  bool applied = false;
  sessions_.ForEach(
      [&](uint64_t id, Session& s) { applied |= DrainRing(id, s); });
  return applied;
}

bool ObjectStore::PullReleases(bool nudge) {
  if (nudge) {
    // Before the drains, as PullSealOf's.
    sessions_.ForEach([](uint64_t, Session& s) {
      if (s.ring != nullptr) s.ring->reader().RequestNudge();
    });
  }
  return DrainRings();
}

bool ObjectStore::LacksWhatReleasesFree(const absl::Status& status) {
  return absl::IsResourceExhausted(status);
}

bool ObjectStore::LacksWhatReleasesFree(
    const absl::StatusOr<std::optional<Handout>>& h) {
  return h.ok() ? !h->has_value() : LacksWhatReleasesFree(h.status());
}

bool ObjectStore::PullSealOf(uint32_t slot, bool nudge) {
  const uint64_t creator_id = objects_.object(slot).creator;
  Session* creator = sessions_.FindOrNull(creator_id);
  if (creator == nullptr || creator->ring == nullptr) return false;
  const uint32_t generation = objects_.generation(slot);
  bool applied = DrainRing(creator_id, *creator);
  // Found (sealed, or gone): no nudge. A nudge left set would make the
  // creator's next post (its next put's seal, or release) a stream write as
  // well, and wake the daemon for it, once for every object got this way.
  const bool still_unsealed = objects_.live(slot) &&
                              objects_.generation(slot) == generation &&
                              objects_.object(slot).state == State::kWriting;
  if (nudge && still_unsealed) {
    // Then drain again: a post the first drain missed is found by the
    // second, or sees the nudge (ReleaseRingWriter::NudgeRequested).
    creator->ring->reader().RequestNudge();
    applied |= DrainRing(creator_id, *creator);
  }
  return applied;
}

absl::Status ObjectStore::ReleaseBatchLocked(
    uint64_t session_id, Session& s, uint64_t seq,
    absl::Span<const uint64_t> lease_ids,
    absl::Span<const v1::OneWaySeal> seals) {
  absl::StatusOr<bool> due = s.releases.Apply(seq);
  if (!due.ok()) return due.status();
  // Applied already, from the copy a unary request carried.
  if (!*due) return absl::OkStatus();
  Changed();
  absl::Status refused;
  for (const v1::OneWaySeal& seal : seals) {
    if (absl::Status r = ApplyOneWaySeal(session_id, s, seal);
        !r.ok() && refused.ok()) {
      refused = r;
    }
  }
  std::vector<uint64_t> unknown;
  for (uint64_t id : lease_ids) {
    // Applied even while shutting down (releases in flight when SIGTERM
    // came are not errors).
    if (LookupLease(session_id, id).ok()) {
      DropLease(id, &s);
    } else {
      unknown.push_back(id);
    }
  }
  if (ledger_ != nullptr) {
    ledger_->SetReleasesApplied(s.client_id, seq);
  }
  if (s.ring != nullptr) s.ring->reader().PublishApplied(seq);
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

absl::StatusOr<bool> ObjectStore::Delete(const Caller& caller,
                                         const std::string& name) {
  if (absl::Status s = ValidateName(name); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Admit(caller);
  if (!session.ok()) return session.status();
  if (shutting_down_) return ShuttingDownError();
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

}  // namespace shmtensor::daemon
