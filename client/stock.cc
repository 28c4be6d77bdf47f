#include "client/stock.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "client/call_canceller.h"
#include "client/client_core.h"
#include "client/pool_mapping.h"

namespace shmtensor::internal {
namespace {

// How often the refill thread looks for idle classes when nothing wakes it.
constexpr absl::Duration kTick = absl::Milliseconds(250);
// The refill thread readies about this many bytes of a class at a time
// (at least one buffer): what a take that finds the class empty meanwhile
// waits for (filling entries costs ~0.1 ms per MiB here).
constexpr uint64_t kReadyBytes = uint64_t{1} << 20;

}  // namespace

Stock::Stock(ClientCore& core, uint64_t budget_bytes, absl::Duration idle)
    : core_(core), budget_(budget_bytes), idle_(idle) {
  thread_ = std::thread([this] { Loop(); });
}

Stock::~Stock() { Stop(); }

void Stock::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  refilled_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Stock::PauseForFork() { fork_gate_.Pause(); }

void Stock::ResumeAfterFork() { fork_gate_.Resume(); }

size_t Stock::buffers() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const Class& c : classes_) n += c.buffers.size();
  return n;
}

uint64_t Stock::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (const Class& c : classes_) n += c.buffers.size() * c.capacity;
  return n;
}

uint64_t Stock::made() const {
  std::lock_guard<std::mutex> lock(mu_);
  return made_;
}

uint64_t Stock::surplus() const {
  std::lock_guard<std::mutex> lock(mu_);
  return surplus_;
}

size_t Stock::ready_buffers() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const Class& c : classes_) {
    n += std::count_if(c.buffers.begin(), c.buffers.end(),
                       [](const StockBuffer& b) { return b.ready; });
  }
  return n;
}

uint64_t Stock::misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return misses_;
}

uint64_t Stock::BudgetFor(const v1::PoolInfo& pool) const {
  return std::min(budget_, pool.size_bytes() / 8);
}

Stock::Class& Stock::ClassOf(const v1::PoolInfo& pool, uint64_t capacity,
                             std::vector<uint64_t>* evicted) {
  if (Class* c = FindLocked(pool.pool_id(), capacity); c != nullptr) {
    return *c;
  }
  if (classes_.size() == kMaxClasses) {
    auto lru = std::min_element(classes_.begin(), classes_.end(),
                                [](const Class& a, const Class& b) {
                                  return a.last_take < b.last_take;
                                });
    EraseLocked(lru, evicted);
  }
  Class c;
  c.pool_id = pool.pool_id();
  c.pool = pool.name();
  c.capacity = capacity;
  c.cap = static_cast<uint32_t>(std::clamp<uint64_t>(
      BudgetFor(pool) / 4 / capacity, 1, uint64_t{kMaxPerClass}));
  c.target = std::min(c.cap, kFirstTarget);
  c.last_take = absl::Now();
  classes_.push_back(std::move(c));
  return classes_.back();
}

Stock::Class* Stock::FindLocked(uint32_t pool_id, uint64_t capacity) {
  for (Class& c : classes_) {
    if (c.pool_id == pool_id && c.capacity == capacity) return &c;
  }
  return nullptr;
}

std::optional<StockBuffer> Stock::PopLocked(Class& c) {
  while (!c.buffers.empty()) {
    // The newest ready buffer, else the newest.
    auto it = std::find_if(c.buffers.rbegin(), c.buffers.rend(),
                           [](const StockBuffer& b) { return b.ready; });
    auto at = it == c.buffers.rend() ? c.buffers.end() - 1 : it.base() - 1;
    StockBuffer b = std::move(*at);
    c.buffers.erase(at);
    // A resume may have refused it since (its lease is no longer held).
    if (core_.Holds(b.lease_id)) return b;
  }
  return std::nullopt;
}

absl::StatusOr<StockBuffer> Stock::Take(const v1::PoolInfo& pool,
                                        uint64_t bytes, bool make_on_miss) {
  const uint64_t page = std::max<uint64_t>(pool.page_size(), 1);
  const uint64_t capacity = (bytes + page - 1) / page * page;
  if (bytes == 0 || capacity > BudgetFor(pool) / 4) {
    return absl::NotFoundError(absl::StrFormat(
        "%d bytes: past what the stock serves in pool '%s' (a quarter of its "
        "%d bytes)",
        bytes, pool.name(), BudgetFor(pool)));
  }
  uint32_t want = 0;
  uint64_t call = 0;  // The id of this take's own call (a miss's).
  std::optional<v1::ObjectRef> reuse;
  std::vector<uint64_t> evicted;
  std::optional<StockBuffer> hit;
  {
    std::unique_lock<std::mutex> lock(mu_);
    Class* c = &ClassOf(pool, capacity, &evicted);
    c->last_take = absl::Now();
    if (c->takes < UINT32_MAX) ++c->takes;
    // Its last take still held: a producer that keeps what it puts.
    if (c->one() && c->taken_lease != 0) c->kept = true;
    hit = PopLocked(*c);
    if (hit.has_value()) TakenLocked(*c, *hit);
    if (!hit.has_value() && make_on_miss && c->takes > c->target) {
      // Run dry in use: the takes outpace the refill, whose call lands
      // later than the class's lower half lasts. Twice the stock, up to
      // its cap, so that the next refill starts earlier and brings more.
      c->target = std::min(c->target * 2, c->cap);
    }
    // A call for this class is out (the refill thread's, or another take's
    // miss): take from what it brings rather than make a second call, whose
    // buffers would come back as surplus (work for the daemon twice over).
    // Not in a forked child (the call it sees out is its parent's), nor
    // under a canceller (a wait here is no call that Cancel could end).
    std::optional<std::chrono::steady_clock::time_point> until;
    while (!hit.has_value() && make_on_miss && c->call_out != 0 && !stopping_ &&
           !core_.inherited() && ThreadCanceller() == nullptr) {
      if (!until.has_value()) {  // Not read on a take that does not wait.
        until = std::chrono::steady_clock::now() +
                absl::ToChronoNanoseconds(kRpcDeadline);
      }
      const bool timed_out =
          refilled_.wait_until(lock, *until) == std::cv_status::timeout;
      c = &ClassOf(pool, capacity, &evicted);  // It may have gone meanwhile.
      hit = PopLocked(*c);
      if (hit.has_value()) TakenLocked(*c, *hit);
      if (timed_out) break;
    }
    // A class of one buffer is refilled when its object is let go of
    // (Released), not now, unless its takes are kept.
    if ((hit.has_value() || !make_on_miss) &&
        (c->one() ? c->kept : c->buffers.size() < (c->want() + 1) / 2)) {
      refill_due_ = true;
      // Waking a sleeping thread costs this take a cross-CPU wake-up (on a
      // VM, tens of µs), once per refill: the takes after it find the
      // thread busy or woken, and their signal costs no system call. A
      // caller that takes many wakes it after its last take (WakeIfDue).
      if (make_on_miss) wake_.notify_one();
    }
    want = c->want();
    // A kept class of one buffer: the next take's buffer comes with this
    // one (landed, it is readied in the background), so that the next take
    // does not race the refill thread's call.
    if (c->one() && c->kept) want = 2;
    // A miss makes the class's call: the refill thread and other takes
    // wait for it rather than make their own. In a class of one buffer it
    // asks for the range of the object let go of last.
    if (!hit.has_value() && make_on_miss) {
      ++misses_;
      c->call_out = call = ++next_call_;
      reuse = std::move(c->freed);
      c->freed.reset();
    }
  }
  GiveBack(evicted);
  if (hit.has_value()) return *std::move(hit);
  if (!make_on_miss) {
    return absl::NotFoundError("the stock has no buffer of this size now");
  }
  // A miss: this buffer and the class's refill in one round trip.
  absl::StatusOr<std::vector<StockBuffer>> made =
      Make(pool.name(), capacity, want, reuse);
  std::optional<StockBuffer> first;
  if (made.ok() && !made->empty()) {
    first = std::move(made->front());
    made->erase(made->begin());
  }
  std::vector<uint64_t> surplus;
  {
    std::lock_guard<std::mutex> lock(mu_);
    surplus = LandLocked(pool.pool_id(), capacity, call, made);
    Class* c = FindLocked(pool.pool_id(), capacity);
    if (first.has_value() && c != nullptr) TakenLocked(*c, *first);
    // The refill thread readies what landed beside this take's own buffer
    // (its Protect opens that one), and refills a kept class of one.
    if (c != nullptr && (c->unready() || c->kept)) {
      refill_due_ = true;
      wake_.notify_one();
    }
  }
  GiveBack(surplus);
  if (!made.ok()) return made.status();
  if (!first.has_value()) {
    return absl::ResourceExhaustedError("the daemon made no stock buffer");
  }
  return *std::move(first);
}

std::vector<uint64_t> Stock::LandLocked(
    uint32_t pool_id, uint64_t capacity, uint64_t call,
    absl::StatusOr<std::vector<StockBuffer>>& made, bool fresh) {
  Class* c = FindLocked(pool_id, capacity);
  // Not a class made afresh since, whose call may be out.
  if (c != nullptr && c->call_out == call) c->call_out = 0;
  refilled_.notify_all();
  std::vector<uint64_t> surplus;
  if (!made.ok()) return surplus;
  for (StockBuffer& b : *made) {
    if (fresh) ++made_;
    if (c != nullptr && c->buffers.size() < c->want()) {
      c->buffers.push_back(std::move(b));
    } else {
      surplus.push_back(b.lease_id);
      if (fresh) ++surplus_;
    }
  }
  return surplus;
}

absl::StatusOr<std::vector<StockBuffer>> Stock::Make(
    const std::string& pool, uint64_t capacity, uint32_t count,
    const std::optional<v1::ObjectRef>& reuse) {
  v1::CreateManyRequest req;
  req.set_session_id(core_.session_id());
  req.set_pool(pool);
  req.set_stock(true);
  if (reuse.has_value()) *req.mutable_reuse_range_of() = *reuse;
  for (uint32_t i = 0; i < count; ++i) req.add_sizes(capacity);
  v1::CreateManyResponse resp;
  uint64_t generation = 0;
  if (absl::Status s = core_.CallAfterReleases(
          &v1::ObjectStore::Stub::CreateMany, std::move(req), &resp,
          kRpcDeadline, &generation);
      !s.ok()) {
    return s;
  }
  std::vector<StockBuffer> out;
  out.reserve(resp.created_size());
  for (v1::CreateResponse& c : *resp.mutable_created()) {
    // Not held (a resume began meanwhile): HoldLease released it.
    if (!core_.HoldLease(c.lease_id(), generation).ok()) continue;
    StockBuffer b;
    b.lease_id = c.lease_id();
    b.ref = std::move(*c.mutable_ref());
    b.placement = std::move(*c.mutable_placement());
    out.push_back(std::move(b));
  }
  return out;
}

void Stock::Ready(std::vector<StockBuffer>& buffers) {
  // By offset, so that adjacent ranges (a CreateMany's buffers usually are)
  // open in one call.
  std::sort(
      buffers.begin(), buffers.end(),
      [](const StockBuffer& a, const StockBuffer& b) {
        return std::make_pair(a.placement.pool_id(), a.placement.offset()) <
               std::make_pair(b.placement.pool_id(), b.placement.offset());
      });
  for (size_t i = 0; i < buffers.size();) {
    const v1::Placement& first = buffers[i].placement;
    uint64_t end = first.offset() + first.capacity_bytes();
    size_t j = i + 1;
    while (j < buffers.size() &&
           buffers[j].placement.pool_id() == first.pool_id() &&
           buffers[j].placement.offset() == end) {
      end += buffers[j].placement.capacity_bytes();
      ++j;
    }
    absl::StatusOr<PoolMapping*> m = core_.Mapping(first.pool_id());
    const bool done =
        m.ok() &&
        (*m)->Protect(first.offset(), end - first.offset(), Access::kReadWrite)
            .ok();
    for (; i < j; ++i) {
      buffers[i].ready = done;
      buffers[i].tried = true;
    }
  }
}

bool Stock::ReadyOne(std::unique_lock<std::mutex>& lock) {
  auto c = std::find_if(classes_.begin(), classes_.end(), [](const Class& c) {
    return c.call_out == 0 && c.unready();
  });
  if (c == classes_.end()) return false;
  // The newest unready ones (the next takes'), about kReadyBytes of them.
  absl::StatusOr<std::vector<StockBuffer>> out = std::vector<StockBuffer>();
  const uint64_t count = std::max<uint64_t>(1, kReadyBytes / c->capacity);
  for (size_t i = c->buffers.size(); i-- > 0 && out->size() < count;) {
    if (!c->buffers[i].tried) {
      out->push_back(std::move(c->buffers[i]));
      c->buffers.erase(c->buffers.begin() + i);
    }
  }
  std::reverse(out->begin(), out->end());  // Landed in their order.
  const uint32_t pool_id = c->pool_id;
  const uint64_t capacity = c->capacity;
  const uint64_t call = c->call_out = ++next_call_;
  lock.unlock();
  Ready(*out);
  lock.lock();
  std::vector<uint64_t> surplus =
      LandLocked(pool_id, capacity, call, out, /*fresh=*/false);
  lock.unlock();
  GiveBack(surplus);
  lock.lock();
  return true;
}

void Stock::GiveBack(const std::vector<uint64_t>& lease_ids) {
  for (uint64_t id : lease_ids) {
    core_.ReleaseLease(id, ClientCore::Route::kPost).IgnoreError();
  }
}

void Stock::WakeIfDue() {
  std::lock_guard<std::mutex> lock(mu_);
  if (refill_due_) wake_.notify_one();
}

void Stock::TakenLocked(Class& c, const StockBuffer& b) {
  if (!c.one()) return;
  if (c.taken_lease == 0) taken_out_.fetch_add(1, std::memory_order_relaxed);
  c.taken_lease = b.lease_id;
  c.taken_ref = b.ref;
}

void Stock::EraseLocked(std::vector<Class>::iterator c,
                        std::vector<uint64_t>* leases) {
  for (const StockBuffer& b : c->buffers) leases->push_back(b.lease_id);
  if (c->taken_lease != 0) taken_out_.fetch_sub(1, std::memory_order_relaxed);
  classes_.erase(c);
}

void Stock::Released(uint64_t lease_id, bool named) {
  // Only while this process holds the object of a class of one buffer's
  // last take is there anything to look for (every other release of the
  // process passes here).
  if (taken_out_.load(std::memory_order_relaxed) == 0 || lease_id == 0) {
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (Class& c : classes_) {
    if (c.taken_lease != lease_id) continue;
    c.taken_lease = 0;
    c.kept = false;  // Let go of before the next take.
    taken_out_.fetch_sub(1, std::memory_order_relaxed);
    if (named) {
      c.freed = std::move(c.taken_ref);
    } else {
      c.freed.reset();
    }
    refill_due_ = true;
    wake_.notify_one();
    return;
  }
}

void Stock::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    wake_.wait_for(lock, absl::ToChronoNanoseconds(kTick),
                   [this] { return stopping_ || refill_due_; });
    if (stopping_) break;
    refill_due_ = false;
    // Idle classes give their buffers back (not one with a call out: its
    // buffers are on their way to it).
    const absl::Time now = absl::Now();
    std::vector<uint64_t> idle;
    for (auto it = classes_.begin(); it != classes_.end();) {
      if (now - it->last_take >= idle_ && it->call_out == 0) {
        const size_t at = it - classes_.begin();
        EraseLocked(it, &idle);
        it = classes_.begin() + at;
      } else {
        ++it;
      }
    }
    // One class under half its target, with no call out, is refilled per
    // turn.
    std::string pool;
    uint32_t pool_id = 0;
    uint64_t capacity = 0;
    bool refill = false;
    for (const Class& c : classes_) {
      // A class of one buffer: once its last take's object is let go of.
      // Or, kept, at each take.
      const bool low = c.one()
                           ? (c.taken_lease == 0 || c.kept) && c.buffers.empty()
                           : c.buffers.size() < (c.want() + 1) / 2;
      if (c.takes >= 2 && c.call_out == 0 && low) {
        pool = c.pool;
        pool_id = c.pool_id;
        capacity = c.capacity;
        refill = true;
        refill_due_ = true;  // Look again for the others.
        break;
      }
    }
    const bool unready = std::any_of(
        classes_.begin(), classes_.end(),
        [](const Class& c) { return c.call_out == 0 && c.unready(); });
    if (idle.empty() && !refill && !unready) continue;
    // The calls below go without the lock, and never across a fork: the
    // call is marked out only once the gate is passed, so no take waits
    // for a call that a fork holds back.
    lock.unlock();
    fork_gate_.Enter();
    GiveBack(idle);
    if (unready) {
      lock.lock();
      while (ReadyOne(lock)) {
      }
      lock.unlock();
    }
    uint64_t call = 0;
    uint32_t count = 0;
    std::optional<v1::ObjectRef> reuse;
    if (refill) {
      lock.lock();
      Class* c = FindLocked(pool_id, capacity);
      if (c != nullptr && c->call_out == 0 && c->buffers.size() < c->want()) {
        count = c->want() - static_cast<uint32_t>(c->buffers.size());
        c->call_out = call = ++next_call_;  // Its missing takes wait for it.
        reuse = std::move(c->freed);
        c->freed.reset();
      }
      lock.unlock();
    }
    std::vector<uint64_t> surplus;
    if (call != 0) {
      absl::StatusOr<std::vector<StockBuffer>> made =
          Make(pool, capacity, count, reuse);
      lock.lock();
      surplus = LandLocked(pool_id, capacity, call, made);
      // At the daemon's stock limit, or the pool is full: not now.
      if (!made.ok() || made->empty()) refill_due_ = false;
      // Readied once landed, a few at a time (ReadyOne): a take waits for
      // no more than a few buffers' readying, and finds what was readied
      // already.
      while (ReadyOne(lock)) {
      }
      lock.unlock();
      GiveBack(surplus);
    }
    fork_gate_.Leave();
    lock.lock();
  }
}

}  // namespace shmtensor::internal
