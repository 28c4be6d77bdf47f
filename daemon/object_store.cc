#include "daemon/object_store.h"

#include <sys/random.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "daemon/layout.h"
#include "shmtensor/errors.h"
#include "spdlog/spdlog.h"

namespace shmtensor::daemon {
namespace {

absl::Status ShuttingDownError() {
  return absl::UnavailableError("shmtensord is shutting down");
}

// `text` quoted for a message, cut to 64 bytes: a name from a request is
// echoed with its length, never whole (an error's size stays bounded).
std::string Quoted(const std::string& text) {
  if (text.size() <= 64) return absl::StrCat("'", text, "'");
  return absl::StrFormat("'%s...' (%d bytes)", text.substr(0, 64), text.size());
}

absl::Status ValidateName(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("name is empty");
  if (name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("name %s is more than the maximum of %d bytes",
                        Quoted(name), kMaxNameBytes));
  }
  if (name.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("name contains a NUL byte");
  }
  return absl::OkStatus();
}

absl::Status SessionNotOpen(uint64_t id) {
  // One message for a session that ended, one never opened and one of
  // another process: it tells a caller nothing it did not know.
  return WithReason(absl::FailedPreconditionError(absl::StrFormat(
                        "session %016x is not open for this process", id)),
                    kReasonSessionEnded);
}

// Slot argument of CheckClientLimits for an object not created yet.
constexpr uint32_t kNoSlot = UINT32_MAX;

std::string RefString(const v1::ObjectRef& ref) {
  return absl::StrFormat("ref(slot %d, generation %d)", ref.slot(),
                         ref.generation());
}

}  // namespace

ObjectStore::ObjectStore(std::vector<std::unique_ptr<Pool>> pools,
                         uint64_t epoch, StoreLimits limits)
    : epoch_(epoch),
      start_time_(absl::Now()),
      limits_(limits),
      pools_(std::move(pools)) {
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
  UidUsage& uid = uids_[peer.process.uid];
  if (limits_.max_sessions_per_uid > 0 &&
      uid.sessions >= limits_.max_sessions_per_uid) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "uid %d has %d sessions open, the limit "
        "(limits.max_sessions_per_uid = %d); end sessions it no longer uses",
        peer.process.uid, uid.sessions, limits_.max_sessions_per_uid));
  }
  uint64_t id;
  do {
    id = Random64();
  } while (id == 0 || sessions_.contains(id));
  ++uid.sessions;
  Session& s = sessions_[id];
  s.client_name = client_name;
  s.pid = peer.process.pid;
  s.peer = std::move(peer);
  s.opened = absl::Now();
  s.serial = next_serial_++;
  s.client_id = s.serial;
  s.stream = next_stream_++;
  s.access = std::move(access);
  s.read_only = read_only;
  s.descriptor_secret.resize(kDescriptorSecretBytes);
  for (size_t i = 0; i < kDescriptorSecretBytes; i += sizeof(uint64_t)) {
    const uint64_t r = Random64();
    memcpy(&s.descriptor_secret[i], &r, sizeof(r));
  }
  spdlog::info("client {} opened a session: '{}' pid {} uid {}{} ({} open)",
               s.client_id, client_name, s.pid, s.peer.process.uid,
               read_only ? " read-only" : "", sessions_.size());
  return OpenedSession{id, s.client_id, s.stream,
                       0,  PoolsOf(s),  s.descriptor_secret};
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

absl::StatusOr<std::vector<DescriptorGrant>> ObjectStore::GrantDescriptors(
    uint64_t session_id, absl::string_view secret,
    const PeerCredentials& peer) {
  const absl::Status refused = absl::PermissionDeniedError(
      "descriptor request refused: no open session of this process has that "
      "id and secret");
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return refused;
  Session& s = it->second;
  // Constant time in the secret's bytes: no timing tells how much matched.
  uint8_t diff = secret.size() == s.descriptor_secret.size() ? 0 : 1;
  for (size_t i = 0; i < s.descriptor_secret.size(); ++i) {
    diff |= static_cast<uint8_t>(s.descriptor_secret[i] ^
                                 (i < secret.size() ? secret[i] : 0));
  }
  if (diff != 0 || peer.uid != s.peer.process.uid ||
      peer.pid != s.peer.process.pid) {
    return refused;
  }
  if (s.descriptors_granted) {
    return absl::FailedPreconditionError(
        "this session was handed its descriptors already");
  }
  s.descriptors_granted = true;
  std::vector<DescriptorGrant> out;
  for (size_t i = 0; i < pools_.size(); ++i) {
    if (s.access[i] == v1::POOL_ACCESS_UNSPECIFIED ||
        pools_[i]->segment().kind() != v1::MEMORY_KIND_HOST) {
      continue;
    }
    out.push_back({static_cast<uint32_t>(i), s.access[i]});
  }
  return out;
}

absl::StatusOr<OpenedSession> ObjectStore::ResumeSession(uint64_t session_id,
                                                         OwnerKey owner) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return ShuttingDownError();
  auto it = sessions_.find(session_id);
  if (it == sessions_.end() || it->second.peer.owner != owner) {
    return SessionNotOpen(session_id);
  }
  Session& s = it->second;
  const bool was_detached = s.stream == 0;
  s.stream = next_stream_++;
  spdlog::info("client {} ('{}' pid {}) resumed its session{}", s.client_id,
               s.client_name, s.pid,
               was_detached ? "" : " (replacing a stream still open)");
  return OpenedSession{session_id,         s.client_id, s.stream,
                       s.releases_applied, PoolsOf(s),  s.descriptor_secret};
}

void ObjectStore::StreamEnded(uint64_t session_id, uint64_t stream) {
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end() || it->second.stream != stream) return;
    Session& s = it->second;
    if (s.peer.pidfd != nullptr && !ProcessExited(s.peer.pidfd->get())) {
      s.stream = 0;
      spdlog::info(
          "client {} ('{}' pid {}) lost its connection while its process "
          "lives: its {} leases stay until it resumes, closes the session "
          "or exits",
          s.client_id, s.client_name, s.pid, s.leases.size());
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
    for (const auto& [id, s] : sessions_) {
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
  auto it = sessions_.find(session_id);
  if (it == sessions_.end() || it->second.peer.owner != owner) {
    return SessionNotOpen(session_id);
  }
  return absl::OkStatus();
}

void ObjectStore::EndSession(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  uint64_t used_before = 0;
  for (const auto& p : pools_) used_before += p->allocator().used_bytes();
  const std::vector<uint64_t> leases(it->second.leases.begin(),
                                     it->second.leases.end());
  const std::vector<uint32_t> transfers(it->second.pending_transfers.begin(),
                                        it->second.pending_transfers.end());
  for (uint64_t lease : leases) DropLease(lease);
  for (uint32_t slot : transfers) {
    Object& obj = slots_[slot].object;
    // Invariant: a slot in pending_transfers is a live, untaken transfer.
    assert(slots_[slot].live && obj.state == State::kPendingTransfer);
    obj.state = State::kSealed;
    --pending_transfers_;
    HoldTransfer(slot, false);
    MaybeFree(slot);
  }
  uint64_t used_after = 0;
  for (const auto& p : pools_) used_after += p->allocator().used_bytes();
  const Session& s = it->second;
  spdlog::info(
      "client {} ('{}' pid {}) session ended: dropped {} leases, "
      "reclaimed {} transfers, freed {} bytes ({} open)",
      s.client_id, s.client_name, s.pid, leases.size(), transfers.size(),
      used_before - used_after, sessions_.size() - 1);
  auto uid = uids_.find(s.peer.process.uid);
  if (uid != uids_.end()) {
    // Invariant: waiters and bytes were given back before the session went
    // (every wait ends before its call returns; DropLease uncharged all).
    --uid->second.sessions;
    if (uid->second.sessions == 0 && uid->second.waiters == 0 &&
        uid->second.bytes == 0) {
      uids_.erase(uid);
    }
  }
  sessions_.erase(it);
  // Waiters of this session (a Create for memory, a Get for a name) give up
  // now instead of holding on until their timeout.
  Changed();
}

absl::StatusOr<ObjectStore::WaitToken> ObjectStore::BeginWait(
    uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Session*> found = FindSession(session_id);
  if (!found.ok()) return found.status();
  Session& session = **found;
  UidUsage& uid = uids_[session.peer.process.uid];
  if (limits_.max_waiters_per_session > 0 &&
      session.waiters >= limits_.max_waiters_per_session) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("client '%s' pid %d has %d calls waiting, the limit "
                        "(limits.max_waiters_per_session = %d)",
                        session.client_name, session.pid, session.waiters,
                        limits_.max_waiters_per_session));
  }
  if (limits_.max_waiters_per_uid > 0 &&
      uid.waiters >= limits_.max_waiters_per_uid) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "uid %d has %d calls waiting, the limit "
        "(limits.max_waiters_per_uid = %d)",
        session.peer.process.uid, uid.waiters, limits_.max_waiters_per_uid));
  }
  if (limits_.max_waiters > 0 && waiters_ >= limits_.max_waiters) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%d calls are waiting, the limit (limits.max_waiters = %d)", waiters_,
        limits_.max_waiters));
  }
  ++session.waiters;
  ++uid.waiters;
  ++waiters_;
  return WaitToken{session_id, session.peer.process.uid};
}

void ObjectStore::EndWait(const WaitToken& token) {
  absl::MutexLock lock(&mu_);
  --waiters_;
  --uids_[token.uid].waiters;
  auto it = sessions_.find(token.session_id);
  if (it != sessions_.end()) --it->second.waiters;
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
  absl::StatusOr<Session*> session = FindSession(args.session_id);
  if (!session.ok()) return session.status();
  uint32_t pool_id = 0;
  if (!args.pool.empty()) {
    // A pool the session may not use is one it does not know of.
    pool_id = static_cast<uint32_t>(pools_.size());
    for (uint32_t i = 0; i < pools_.size(); ++i) {
      if (pools_[i]->name() == args.pool &&
          (**session).access[i] != v1::POOL_ACCESS_UNSPECIFIED) {
        pool_id = i;
      }
    }
    if (pool_id == pools_.size()) {
      return absl::NotFoundError(
          absl::StrCat("no pool named ", Quoted(args.pool)));
    }
  } else {
    // The first host pool the session may write, else the first it may
    // use (whose check below names why it may not).
    pool_id = static_cast<uint32_t>(pools_.size());
    for (v1::PoolAccess want :
         {v1::POOL_ACCESS_READ_WRITE, v1::POOL_ACCESS_READ}) {
      for (uint32_t i = 0; i < pools_.size() && pool_id == pools_.size(); ++i) {
        if ((**session).access[i] == want &&
            pools_[i]->segment().kind() == v1::MEMORY_KIND_HOST) {
          pool_id = i;
        }
      }
    }
    if (pool_id == pools_.size()) {
      return absl::NotFoundError(
          "this session may use no host pool; name the pool to create in");
    }
  }
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
      return WithReason(
          absl::InvalidArgumentError(absl::StrFormat(
              "size %d bytes exceeds pool '%s' of %d bytes", *bytes,
              pool.name(), pool.allocator().size())),
          kReasonLargerThanPool);
    }
    capacity = place->capacity;
    alignment = place->alignment;
    end = place->end;
  }
  if (!args.name.empty() && names_.contains(args.name)) {
    return absl::AlreadyExistsError(absl::StrCat(
        "name ", Quoted(args.name), " is already bound to an object"));
  }
  if (slots_.size() >= kMaxObjects && free_slots_.empty()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%d objects alive, the most the daemon holds", kMaxObjects));
  }
  if (limits_.max_objects > 0 && live_objects_ >= limits_.max_objects) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%d objects alive, the limit (limits.max_objects = %d)",
                        live_objects_, limits_.max_objects));
  }
  if (absl::Status s = CheckClientLimits(**session, kNoSlot, capacity);
      !s.ok()) {
    return s;
  }
  uint64_t offset = 0;
  if (capacity > 0) {
    std::optional<uint64_t> got =
        Allocate(**session, pool_id, capacity, alignment, end);
    if (!got.has_value()) {
      if (!last_try) return std::nullopt;
      return absl::ResourceExhaustedError(DescribePressure(pool_id, capacity));
    }
    offset = *got;
  }
  uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  Slot& s = slots_[slot];
  s.live = true;
  Object& obj = s.object;
  obj = Object();
  obj.pool = pool_id;
  obj.offset = offset;
  obj.size = *bytes;
  obj.capacity = capacity;
  obj.layout = args.layout;
  obj.creator = args.session_id;
  obj.created = absl::Now();
  if (args.shared_writable) obj.state = State::kSharedWritable;
  obj.serial = next_serial_++;
  obj.nonce = Random64();
  by_serial_.emplace(obj.serial, slot);
  pool.high_water_bytes =
      std::max(pool.high_water_bytes, pool.allocator().used_bytes());
  if (!args.name.empty()) {
    obj.name = args.name;
    names_.emplace(args.name, slot);
  }
  ++pool.objects;
  ++live_objects_;
  const uint64_t lease = AddLease(args.session_id, **session, slot, true);
  return MakeHandout(slot, lease, true);
}

absl::StatusOr<SealResult> ObjectStore::Seal(uint64_t session_id,
                                             uint64_t lease_id,
                                             bool exclusive) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return ShuttingDownError();
  absl::StatusOr<Lease*> lease = FindLease(session_id, lease_id);
  if (!lease.ok()) return lease.status();
  const uint32_t slot = (*lease)->slot;
  Object& obj = slots_[slot].object;
  if (obj.state == State::kSharedWritable) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is shared-writable: it is never sealed", RefString(MakeRef(slot))));
  }
  if (!(*lease)->write || obj.state != State::kWriting) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "lease %d is not the write lease of an unsealed object: %s is "
        "already sealed",
        lease_id, RefString(MakeRef(slot))));
  }
  if (exclusive && !obj.name.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "object named '", obj.name,
        "' cannot be sealed for exclusive transfer; only unnamed objects can"));
  }
  SealResult result;
  if (!exclusive) {
    obj.state = State::kSealed;
    (*lease)->write = false;
    result.lease_id = lease_id;
    if (!obj.name.empty()) Changed();
  } else {
    obj.state = State::kPendingTransfer;
    ++pending_transfers_;
    sessions_.at(session_id).pending_transfers.insert(slot);
    HoldTransfer(slot, true);
    DropLease(lease_id);  // Cannot free: the transfer now holds the object.
  }
  result.ref = MakeRef(slot);
  return result;
}

absl::StatusOr<Handout> ObjectStore::Get(uint64_t session_id,
                                         const v1::ObjectRef& ref) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return ShuttingDownError();
  absl::StatusOr<Session*> session = FindSession(session_id);
  if (!session.ok()) return session.status();
  absl::StatusOr<uint32_t> slot = ResolveRef(ref);
  if (!slot.ok()) return slot.status();
  Object& obj = slots_[*slot].object;
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
      return absl::FailedPreconditionError(
          absl::StrCat(RefString(ref), " is not sealed yet"));
    case State::kTaken:
      return WithReason(
          absl::FailedPreconditionError(absl::StrCat(
              RefString(ref),
              " was sealed for exclusive transfer and was already taken")),
          kReasonAlreadyTaken);
    case State::kPendingTransfer: {
      if (absl::Status s = CheckClientLimits(**session, *slot, obj.capacity);
          !s.ok()) {
        return s;
      }
      obj.state = State::kTaken;
      --pending_transfers_;
      auto creator = sessions_.find(obj.creator);
      if (creator != sessions_.end()) {
        creator->second.pending_transfers.erase(*slot);
      }
      HoldTransfer(*slot, false);
      // A session that may only read the pool takes it to read.
      const uint64_t lease = AddLease(session_id, **session, *slot, can_write);
      return MakeHandout(*slot, lease, can_write);
    }
    case State::kSealed:
    case State::kSharedWritable: {
      if (absl::Status s = CheckClientLimits(**session, *slot, obj.capacity);
          !s.ok()) {
        return s;
      }
      const bool write = obj.state == State::kSharedWritable;
      const uint64_t lease = AddLease(session_id, **session, *slot, write);
      return MakeHandout(*slot, lease, write);
    }
  }
  return absl::InternalError("unreachable object state");
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
  absl::StatusOr<Session*> session = FindSession(session_id);
  if (!session.ok()) return session.status();
  auto it = names_.find(name);
  if (it != names_.end() && slots_[it->second].object.state == State::kSealed) {
    const uint32_t pool = slots_[it->second].object.pool;
    if (!Allowed(**session, pool, false)) {
      return AccessError(**session, pool,
                         absl::StrCat("get of ", Quoted(name)));
    }
    if (absl::Status s = CheckClientLimits(**session, it->second,
                                           slots_[it->second].object.capacity);
        !s.ok()) {
      return s;
    }
    const uint64_t lease = AddLease(session_id, **session, it->second, false);
    return MakeHandout(it->second, lease, false);
  }
  if (timeout <= absl::ZeroDuration()) {
    return absl::NotFoundError(
        absl::StrCat("no sealed object named ", Quoted(name),
                     it != names_.end() ? " (one is being written)" : ""));
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

absl::Status ObjectStore::ReleaseBatch(uint64_t session_id, uint64_t seq,
                                       const std::vector<uint64_t>& lease_ids) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = FindSession(session_id);
  if (!session.ok()) return session.status();
  // Applied already, from the copy a unary request carried.
  if (seq <= (*session)->releases_applied) return absl::OkStatus();
  if (seq != (*session)->releases_applied + 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ReleaseLeases seq %d out of order: expected %d", seq,
                        (*session)->releases_applied + 1));
  }
  (*session)->releases_applied = seq;
  Changed();
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
  if (unknown.empty()) return absl::OkStatus();
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
  absl::StatusOr<Session*> session = FindSession(session_id);
  if (!session.ok()) return session.status();
  if ((*session)->releases_applied >= seq) return true;
  if (!last_try) return false;
  return absl::DeadlineExceededError(absl::StrFormat(
      "releases_through %d not reached: session applied ReleaseLeases "
      "through %d only",
      seq, (*session)->releases_applied));
}

absl::StatusOr<bool> ObjectStore::Delete(uint64_t session_id,
                                         const std::string& name) {
  if (absl::Status s = ValidateName(name); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return ShuttingDownError();
  absl::StatusOr<Session*> session = FindSession(session_id);
  if (!session.ok()) return session.status();
  auto it = names_.find(name);
  if (it == names_.end()) {
    return absl::NotFoundError(absl::StrCat("no object named ", Quoted(name)));
  }
  if (const uint32_t pool = slots_[it->second].object.pool;
      !Allowed(**session, pool, true)) {
    return AccessError(**session, pool,
                       absl::StrCat("delete of ", Quoted(name)));
  }
  const uint32_t slot = it->second;
  names_.erase(it);
  slots_[slot].object.name.clear();
  return MaybeFree(slot);
}

v1::StatsResponse ObjectStore::Stats(uint64_t session_id,
                                     const PeerCredentials* caller) const {
  absl::MutexLock lock(&mu_);
  v1::StatsResponse out;
  out.set_daemon_epoch(epoch_);
  auto session = sessions_.find(session_id);
  for (size_t i = 0; i < pools_.size(); ++i) {
    // A session that ended meanwhile sees no pool at all.
    v1::PoolAccess access = v1::POOL_ACCESS_READ_WRITE;
    if (session_id != 0) {
      access = session != sessions_.end() ? session->second.access[i]
                                          : v1::POOL_ACCESS_UNSPECIFIED;
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
    const RangeAllocator& a = pools_[i]->allocator();
    ps->set_used_bytes(a.used_bytes());
    ps->set_free_bytes(a.free_bytes());
    ps->set_largest_free_bytes(a.largest_free());
    ps->set_objects(pools_[i]->objects);
  }
  out.set_sessions(sessions_.size());
  out.set_objects(live_objects_);
  out.set_named_objects(names_.size());
  out.set_leases(leases_.size());
  out.set_pending_transfers(pending_transfers_);
  out.set_uptime_ms(absl::ToInt64Milliseconds(absl::Now() - start_time_));
  return out;
}

void ObjectStore::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  Changed();
}

absl::StatusOr<ObjectStore::Session*> ObjectStore::FindSession(uint64_t id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return SessionNotOpen(id);
  return &it->second;
}

absl::StatusOr<uint32_t> ObjectStore::ResolveRef(
    const v1::ObjectRef& ref) const {
  if (ref.daemon_epoch() != epoch_) {
    return WithReason(
        absl::NotFoundError(absl::StrFormat(
            "stale reference: %s was issued by another daemon instance "
            "(epoch %016x, this one is %016x)",
            RefString(ref), ref.daemon_epoch(), epoch_)),
        kReasonStaleReference);
  }
  if (ref.slot() >= slots_.size() || ref.generation() == 0 ||
      ref.generation() > slots_[ref.slot()].generation ||
      (ref.generation() == slots_[ref.slot()].generation &&
       !slots_[ref.slot()].live)) {
    return absl::InvalidArgumentError(
        absl::StrCat(RefString(ref), " was never issued by this daemon"));
  }
  const Slot& s = slots_[ref.slot()];
  if (ref.generation() == s.generation && ref.nonce() != s.object.nonce) {
    return absl::InvalidArgumentError(
        absl::StrCat(RefString(ref), " was never issued by this daemon"));
  }
  if (ref.generation() != s.generation) {
    return WithReason(absl::NotFoundError(absl::StrCat(
                          "stale reference: the object of ", RefString(ref),
                          " is gone and its memory may have been reused")),
                      kReasonStaleReference);
  }
  return ref.slot();
}

absl::StatusOr<ObjectStore::Lease*> ObjectStore::FindLease(uint64_t session_id,
                                                           uint64_t lease_id) {
  if (shutting_down_) return ShuttingDownError();
  return LookupLease(session_id, lease_id);
}

absl::StatusOr<ObjectStore::Lease*> ObjectStore::LookupLease(
    uint64_t session_id, uint64_t lease_id) {
  if (absl::StatusOr<Session*> s = FindSession(session_id); !s.ok()) {
    return s.status();
  }
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    if (lease_id != 0 && lease_id < next_lease_id_) {
      return absl::FailedPreconditionError(
          absl::StrFormat("lease %d was already released", lease_id));
    }
    return absl::NotFoundError(
        absl::StrFormat("lease %d was never issued", lease_id));
  }
  if (it->second.session != session_id) {
    return absl::PermissionDeniedError(
        absl::StrFormat("lease %d belongs to another session", lease_id));
  }
  return &it->second;
}

uint64_t ObjectStore::AddLease(uint64_t session_id, Session& session,
                               uint32_t slot, bool write) {
  const uint64_t id = next_lease_id_++;
  leases_.emplace(id, Lease{session_id, slot, write});
  session.leases.insert(id);
  Object& obj = slots_[slot].object;
  ++obj.leases;
  ++pools_[obj.pool]->leases;
  if (session.held_slots[slot]++ == 0) Charge(session, obj.capacity);
  if (write && obj.capacity > 0) {
    std::vector<WrittenRange>& w = session.written;
    auto same = std::find_if(w.begin(), w.end(), [&](const WrittenRange& r) {
      return r.pool == obj.pool && r.offset == obj.offset &&
             r.capacity == obj.capacity;
    });
    if (same == w.end()) {
      if (w.size() < kWrittenRanges) w.emplace_back();
      same = w.end() - 1;
    }
    std::rotate(w.begin(), same, same + 1);  // Most recent first.
    w.front() = WrittenRange{obj.pool, obj.offset, obj.capacity};
  }
  return id;
}

std::optional<uint64_t> ObjectStore::Allocate(const Session& session,
                                              uint32_t pool, uint64_t capacity,
                                              uint64_t alignment,
                                              RangeAllocator::End end) {
  // A process's first touch of a page costs a page fault (tens of
  // microseconds on a VM that shadows page tables), once per page and
  // process, however warm the pool is. A client that keeps creating objects
  // of one size (a DataLoader worker's batches) is therefore better served
  // by a range it wrote before than by whichever the pool cycles to next: it
  // settles on fewer ranges, so it takes fewer first touches. (While all of
  // its own are in use it still gets another's.) Only a range of exactly
  // this capacity that starts or ends its free range is taken: like best
  // fit, this never splits a free range in two.
  RangeAllocator& allocator = pools_[pool]->allocator();
  for (const WrittenRange& r : session.written) {
    if (r.pool != pool || r.capacity != capacity) continue;
    if (alignment != 0 && r.offset % alignment != 0) continue;
    if (allocator.AllocateAt(r.offset, capacity)) return r.offset;
  }
  return allocator.Allocate(capacity, alignment, end);
}

bool ObjectStore::DropLease(uint64_t lease_id) {
  auto it = leases_.find(lease_id);
  assert(it != leases_.end());
  const Lease lease = it->second;
  leases_.erase(it);
  Object& obj = slots_[lease.slot].object;
  auto session = sessions_.find(lease.session);
  if (session != sessions_.end()) {
    Session& s = session->second;
    s.leases.erase(lease_id);
    auto held = s.held_slots.find(lease.slot);
    if (held != s.held_slots.end() && --held->second == 0) {
      s.held_slots.erase(held);
      Charge(s, -static_cast<int64_t>(obj.capacity));
    }
  }
  // Invariant: a live object's lease count equals the leases naming it.
  assert(obj.leases > 0);
  --obj.leases;
  --pools_[obj.pool]->leases;
  if (lease.write && obj.state == State::kWriting && !obj.name.empty()) {
    // An unsealed object is discarded: its name was never visible.
    names_.erase(obj.name);
    obj.name.clear();
  }
  return MaybeFree(lease.slot);
}

bool ObjectStore::MaybeFree(uint32_t slot) {
  Slot& s = slots_[slot];
  Object& obj = s.object;
  if (obj.leases > 0 || !obj.name.empty() ||
      obj.state == State::kPendingTransfer) {
    return false;
  }
  Pool& pool = *pools_[obj.pool];
  if (obj.capacity > 0) pool.allocator().Free(obj.offset, obj.capacity);
  --pool.objects;
  --live_objects_;
  s.live = false;
  by_serial_.erase(obj.serial);
  if (++s.generation == 0) s.generation = 1;
  free_slots_.push_back(slot);
  Changed();
  return true;
}

absl::Status ObjectStore::CheckClientLimits(const Session& session,
                                            uint32_t slot,
                                            uint64_t capacity) const {
  if (limits_.max_leases_per_client > 0 &&
      session.leases.size() >= limits_.max_leases_per_client) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "client '%s' pid %d holds %d leases, the limit "
        "(limits.max_leases_per_client = %d); release views it no longer "
        "needs",
        session.client_name, session.pid, session.leases.size(),
        limits_.max_leases_per_client));
  }
  if (limits_.max_leases > 0 && leases_.size() >= limits_.max_leases) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%d leases are held, the limit (limits.max_leases = %d)",
        leases_.size(), limits_.max_leases));
  }
  const bool new_hold = slot == kNoSlot || !session.held_slots.contains(slot);
  if (limits_.max_bytes_per_uid > 0 && new_hold) {
    auto uid = uids_.find(session.peer.process.uid);
    const uint64_t held = uid == uids_.end() ? 0 : uid->second.bytes;
    if (held + capacity > limits_.max_bytes_per_uid) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "uid %d holds %d bytes in all its sessions; %d more would pass the "
          "limit (limits.max_bytes_per_uid = %d)",
          session.peer.process.uid, held, capacity, limits_.max_bytes_per_uid));
    }
  }
  if (limits_.max_bytes_per_client > 0 && new_hold &&
      session.bytes_held + capacity > limits_.max_bytes_per_client) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "client '%s' pid %d holds %d bytes; %d more would pass the limit "
        "(limits.max_bytes_per_client = %d)",
        session.client_name, session.pid, session.bytes_held, capacity,
        limits_.max_bytes_per_client));
  }
  return absl::OkStatus();
}

void ObjectStore::Charge(Session& session, int64_t delta) {
  session.bytes_held += delta;
  uids_[session.peer.process.uid].bytes += delta;
}

void ObjectStore::HoldTransfer(uint32_t slot, bool hold) {
  const Object& obj = slots_[slot].object;
  auto it = sessions_.find(obj.creator);
  if (it == sessions_.end()) return;
  Charge(it->second, hold ? static_cast<int64_t>(obj.capacity)
                          : -static_cast<int64_t>(obj.capacity));
}

std::string ObjectStore::ClientString(uint64_t session_id) const {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return absl::StrFormat("session %016x (ended)", session_id);
  }
  return absl::StrFormat("'%s' pid %d", it->second.client_name, it->second.pid);
}

v1::DaemonStatus ObjectStore::Status(const PeerCredentials* viewer) const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  v1::DaemonStatus out;
  out.set_daemon_epoch(epoch_);
  out.set_uptime_ms(absl::ToInt64Milliseconds(now - start_time_));
  out.set_time_unix_ms(absl::ToUnixMillis(now));
  const std::vector<bool> visible = VisiblePools(viewer);
  for (size_t i = 0; i < pools_.size(); ++i) {
    if (!visible[i]) continue;
    const Pool& pool = *pools_[i];
    v1::PoolStatus* ps = out.add_pools();
    *ps->mutable_info() = pool_infos_[i];
    // Monitoring answers anyone who can connect (and TCP callers): never
    // the handle that maps a CUDA pool.
    ps->mutable_info()->clear_cuda_ipc_handle();
    ps->set_used_bytes(pool.allocator().used_bytes());
    ps->set_free_bytes(pool.allocator().free_bytes());
    ps->set_largest_free_bytes(pool.allocator().largest_free());
    ps->set_high_water_bytes(pool.high_water_bytes);
    ps->set_objects(pool.objects);
    ps->set_leases(pool.leases);
  }
  out.set_sessions(sessions_.size());
  out.set_objects(live_objects_);
  out.set_named_objects(names_.size());
  out.set_leases(leases_.size());
  out.set_pending_transfers(pending_transfers_);
  v1::Limits* limits = out.mutable_limits();
  limits->set_max_objects(limits_.max_objects);
  limits->set_max_leases_per_client(limits_.max_leases_per_client);
  limits->set_max_bytes_per_client(limits_.max_bytes_per_client);
  limits->set_max_leases(limits_.max_leases);
  limits->set_max_bytes_per_uid(limits_.max_bytes_per_uid);
  limits->set_max_sessions_per_uid(limits_.max_sessions_per_uid);
  limits->set_max_waiters(limits_.max_waiters);
  out.set_serving(!shutting_down_);
  out.set_waiters(waiters_);
  uint64_t detached = 0;
  for (const auto& [id, session] : sessions_) detached += session.stream == 0;
  out.set_detached_sessions(detached);
  return out;
}

v1::ListObjectsResponse ObjectStore::ListObjects(
    uint32_t limit, uint64_t page_token, const PeerCredentials* viewer) const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (limit == 0 || limit > kMaxListPage) limit = kMaxListPage;
  v1::ListObjectsResponse out;
  const std::vector<bool> visible = VisiblePools(viewer);
  uint64_t total = 0;
  for (size_t i = 0; i < pools_.size(); ++i) {
    if (visible[i]) total += pools_[i]->objects;
  }
  out.set_total(viewer == nullptr ? live_objects_ : total);
  auto it = by_serial_.upper_bound(page_token);
  uint64_t scanned = 0;
  for (uint32_t n = 0; it != by_serial_.end() && n < limit &&
                       scanned < uint64_t{4} * kMaxListPage;
       ++it, ++scanned) {
    const uint32_t slot = it->second;
    const Object& obj = slots_[slot].object;
    if (!visible[obj.pool]) continue;
    ++n;
    v1::ObjectStatus* o = out.add_objects();
    *o->mutable_ref() = MakeRef(slot);
    o->mutable_ref()->clear_nonce();  // Listed, not usable.
    o->set_name(obj.name);
    o->set_pool(pools_[obj.pool]->name());
    o->set_offset(obj.offset);
    o->set_size_bytes(obj.size);
    o->set_capacity_bytes(obj.capacity);
    *o->mutable_layout() = obj.layout;
    switch (obj.state) {
      case State::kWriting:
        o->set_state(v1::OBJECT_STATE_WRITING);
        break;
      case State::kSealed:
        o->set_state(v1::OBJECT_STATE_SEALED);
        break;
      case State::kPendingTransfer:
        o->set_state(v1::OBJECT_STATE_PENDING_TRANSFER);
        break;
      case State::kTaken:
        o->set_state(v1::OBJECT_STATE_TAKEN);
        break;
      case State::kSharedWritable:
        o->set_state(v1::OBJECT_STATE_SHARED_WRITABLE);
        break;
    }
    o->set_leases(obj.leases);
    o->set_age_ms(absl::ToInt64Milliseconds(now - obj.created));
    auto creator = sessions_.find(obj.creator);
    o->set_creator_client_id(
        creator == sessions_.end() ? 0 : creator->second.client_id);
    o->set_creator(ClientString(obj.creator));
  }
  if (it != by_serial_.end() && scanned > 0) {
    out.set_next_page_token(std::prev(it)->first);
  }
  return out;
}

std::vector<bool> ObjectStore::VisiblePools(
    const PeerCredentials* viewer) const {
  std::vector<bool> visible(pools_.size(), true);
  if (viewer == nullptr) return visible;
  for (size_t i = 0; i < pools_.size(); ++i) {
    visible[i] =
        pools_[i]->access().AccessOf(*viewer) != v1::POOL_ACCESS_UNSPECIFIED;
  }
  return visible;
}

v1::ListClientsResponse ObjectStore::ListClients(
    const PeerCredentials* viewer) const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  std::vector<const std::pair<const uint64_t, Session>*> open;
  for (const auto& entry : sessions_) {
    if (viewer == nullptr || entry.second.peer.process.uid == viewer->uid) {
      open.push_back(&entry);
    }
  }
  std::sort(open.begin(), open.end(), [](const auto* a, const auto* b) {
    return a->second.serial < b->second.serial;
  });
  v1::ListClientsResponse out;
  for (const auto* entry : open) {
    const Session& s = entry->second;
    v1::ClientStatus* c = out.add_clients();
    c->set_client_id(s.client_id);
    c->set_client_name(s.client_name);
    c->set_pid(s.pid);
    c->set_has_process(true);
    c->set_uid(s.peer.process.uid);
    c->set_connected(s.stream != 0);
    c->set_command_line(s.peer.command_line);
    c->set_leases(s.leases.size());
    c->set_bytes_held(s.bytes_held);
    c->set_pending_transfers(s.pending_transfers.size());
    c->set_age_ms(absl::ToInt64Milliseconds(now - s.opened));
    c->set_peer(s.stream != 0 ? "unix:" : "");
    c->set_read_only(s.read_only);
    for (size_t i = 0; i < pools_.size(); ++i) {
      if (s.access[i] == v1::POOL_ACCESS_UNSPECIFIED) continue;
      v1::PoolGrant* g = c->add_pools();
      g->set_pool_id(static_cast<uint32_t>(i));
      g->set_pool(pools_[i]->name());
      g->set_access(s.access[i]);
    }
  }
  return out;
}

v1::ObjectRef ObjectStore::MakeRef(uint32_t slot) const {
  v1::ObjectRef ref;
  ref.set_daemon_epoch(epoch_);
  ref.set_slot(slot);
  ref.set_generation(slots_[slot].generation);
  ref.set_nonce(slots_[slot].object.nonce);
  const State st = slots_[slot].object.state;
  ref.set_exclusive(st == State::kPendingTransfer || st == State::kTaken);
  return ref;
}

Handout ObjectStore::MakeHandout(uint32_t slot, uint64_t lease_id,
                                 bool writable) const {
  const Object& obj = slots_[slot].object;
  Handout h;
  h.ref = MakeRef(slot);
  h.placement.set_pool_id(obj.pool);
  h.placement.set_offset(obj.offset);
  h.placement.set_size_bytes(obj.size);
  h.placement.set_capacity_bytes(obj.capacity);
  h.layout = obj.layout;
  h.lease_id = lease_id;
  h.writable = writable;
  return h;
}

std::string ObjectStore::DescribePressure(uint32_t pool_id,
                                          uint64_t capacity) const {
  const Pool& pool = *pools_[pool_id];
  absl::flat_hash_map<uint64_t, uint64_t> held;  // session -> bytes
  for (const auto& [id, lease] : leases_) {
    const Object& obj = slots_[lease.slot].object;
    if (obj.pool == pool_id) held[lease.session] += obj.capacity;
  }
  for (const auto& [id, session] : sessions_) {
    for (uint32_t slot : session.pending_transfers) {
      if (slots_[slot].object.pool == pool_id) {
        held[id] += slots_[slot].object.capacity;
      }
    }
  }
  std::vector<std::pair<uint64_t, uint64_t>> top(held.begin(), held.end());
  std::sort(top.begin(), top.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string holders;
  for (size_t i = 0; i < top.size() && i < 3; ++i) {
    const Session& s = sessions_.at(top[i].first);
    absl::StrAppendFormat(&holders, "%s'%s' pid %d holds %d bytes",
                          i ? ", " : "", s.client_name, s.pid, top[i].second);
  }
  if (holders.empty()) holders = "no client holds leases (named objects only)";
  return absl::StrFormat(
      "pool '%s' is full: asked for %d bytes, %d of %d bytes free (largest "
      "free block %d); most held by: %s",
      pool.name(), capacity, pool.allocator().free_bytes(),
      pool.allocator().size(), pool.allocator().largest_free(), holders);
}

}  // namespace shmtensor::daemon
