// A session's stock: untyped writable buffers the daemon granted ahead of
// need (CreateManyRequest.stock), so that Create and Put of an unnamed host
// object take one without a round trip, and seal it one way
// (docs/shm_layout.md, "Stock and one-way seals").
//
// Policy, decided here only:
//  - Classes: a buffer serves puts of its size class, the size rounded up
//    to the pool's page size (puts of one size recycle one range, which
//    stays faulted in and open in this process's writable mapping). At most
//    kMaxClasses classes; the least recently used goes first.
//  - How many: the budget of a pool is the client's, at most an eighth of
//    the pool; a class keeps up to its target of buffers, and fewer while
//    it is new: its n-th take asks for at most n (a size asked for once
//    takes one buffer, and leaves no stock). The target starts at
//    kFirstTarget and doubles each time a take (not PutMany's) finds the
//    class empty after its first `target` takes (the takes outpace the
//    refill), up to its cap, budget / 4 / capacity, 1 to kMaxPerClass. A
//    size past budget / 4 has no stock (its put makes one round trip for
//    its buffer).
//  - Which: a take takes the class's newest ready buffer (the range its
//    daemon freed last, the likeliest to be in the CPU's caches still). A
//    class of one buffer (cap 1: a size past an eighth of the budget; at
//    the default budget, past 8 MiB, whose copy outweighs a round trip) is
//    refilled when its last take's lease leaves this process (Released),
//    not at the take, and asks for that object's range back
//    (CreateManyRequest.reuse_range_of): when its readers let go first,
//    the next put writes the range the last one wrote, which the caches
//    still hold, where a refill at the take (the object held) would get
//    another, and puts would write two ranges in turn. Unless its takes
//    are kept (below).
//  - When: a take that misses makes the buffer and the class's refill in
//    the same round trip, unless a call for the class is out (the refill
//    thread's, or another take's miss): it then waits for that call's
//    buffers (a second call's would come back as surplus, given back: work
//    for the daemon twice over), up to kRpcDeadline, except in a forked
//    child and under a CallCanceller (the wait is no call Cancel ends); a
//    class evicted and made again meanwhile may still get two. A take that
//    leaves the class under half its target has the refill thread refill
//    it in the background, and wakes it (the first such take pays the
//    wake-up), so that the refill lands before the class runs dry (a class
//    of one buffer: the release of its last take's object, Released). A
//    caller that takes many (PutMany) wakes it after its last take instead
//    (WakeIfDue): a refill racing the batch would top the class up to less
//    than its target, and compete with the batch's own round trip for its
//    misses.
//  - Ready: a buffer is opened for writing and its page-table entries
//    filled (PoolMapping::Protect) before a take gets it, by the refill
//    thread, about 1 MiB at a time, newest first: the buffers its own calls
//    bring, once landed, and those a take's miss brought beside its own,
//    which wake it. A put then only copies, where writing a range this
//    process never wrote takes a fault per 4 KiB page (docs/performance.md,
//    "Kept puts"). A take prefers the newest ready buffer; one that finds
//    only unready ones takes one and opens it itself (one system call or
//    two). A buffer whose readying failed is not tried again.
//  - Kept: a producer that keeps what it puts takes again while its last
//    take is still held. A class of one buffer that sees this stops waiting
//    for the release of its last take (which may never come): its miss
//    brings the next take's buffer with its own, and each take has the
//    class refilled in the background, so that the next put finds a ready
//    buffer; a release before the next take ends it.
//  - Return: a class not taken from for `idle` gives its buffers back
//    (their release discards them), as the session's end does all.
//  - Bound: the daemon's limits.max_stock_bytes_per_client, whatever this
//    asks; past it the stock stops growing (the take falls back).
// Each buffer's lease is held (ClientCore::HoldLease) from its grant on, so
// a resume presents it.
//
// Fork: the refill thread makes gRPC calls, which must not be in flight
// across fork() (fork_guard.h): PauseForFork waits for the call on its way
// (bounded) and holds the next back until ResumeAfterFork.
//
// Thread safety: thread-safe.
#ifndef SHMTENSOR_CLIENT_STOCK_H_
#define SHMTENSOR_CLIENT_STOCK_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/fork_gate.h"
#include "shmtensor/v1/shmtensor.pb.h"

namespace shmtensor::internal {

class ClientCore;

// One stock buffer: its write lease and where it is.
struct StockBuffer {
  uint64_t lease_id = 0;
  v1::ObjectRef ref;
  v1::Placement placement;  // size_bytes: its capacity, untyped.
  // Opened for writing in this process's writable mapping, its page-table
  // entries filled (PoolMapping::Protect), off any put's path. A hint: the
  // take's own Protect finds it so, and makes no system call.
  bool ready = false;
  // Readying was tried (Stock::Ready): done or not, never tried again (a
  // range that failed to open is opened by its take, which reports why).
  bool tried = false;
};

class Stock {
 public:
  static constexpr size_t kMaxClasses = 16;
  // A class's target starts at kFirstTarget buffers and doubles each time
  // the class runs dry in use, up to kMaxPerClass (see the file comment).
  static constexpr uint32_t kFirstTarget = 64;
  static constexpr uint32_t kMaxPerClass = 128;

  // `core` owns the stock and outlives it. `budget_bytes` > 0.
  Stock(ClientCore& core, uint64_t budget_bytes, absl::Duration idle);
  // Stop().
  ~Stock();

  Stock(const Stock&) = delete;
  Stock& operator=(const Stock&) = delete;

  // A buffer of `pool` (a host pool the session may write) for an object
  // of `bytes` (> 0): from the stock when it has one of the class; else
  // made, with the class's refill, in one CreateMany round trip (unless
  // `make_on_miss` is false: NOT_FOUND then; for a caller that makes its
  // misses together, PutMany, which calls WakeIfDue after its last take).
  // NOT_FOUND when `bytes` is past what the stock serves; the daemon's
  // errors (LIMIT_EXCEEDED at its stock limit, RESOURCE_EXHAUSTED when the
  // pool is full: stock never waits) otherwise. The caller then makes its
  // buffer without the stock.
  absl::StatusOr<StockBuffer> Take(const v1::PoolInfo& pool, uint64_t bytes,
                                   bool make_on_miss = true);

  // Wakes the refill thread if a take left a refill due.
  void WakeIfDue();

  // Lease `lease_id` left this process (ClientCore: after its release is
  // queued, so that the refill's call carries it, or applied; or consumed
  // by an exclusive seal, or lost to a resume): when it is the last take of
  // a class of one buffer, that class is refilled now, asking for its
  // object's range back when `named` (let go of: the range may be free;
  // not an object handed over whole, alive with its taker). Cheap while
  // no such take is held. Not under the core's held_mu_ (PopLocked takes
  // it under mu_).
  void Released(uint64_t lease_id, bool named);

  // Stops the refill thread (waiting for its call on the way) and gives
  // nothing back: the session's end discards the buffers. Idempotent.
  void Stop();
  // fork() handlers (see the file comment).
  void PauseForFork();
  void ResumeAfterFork();

  // Buffers held now, and their capacity.
  size_t buffers() const;
  uint64_t bytes() const;
  // Buffers the daemon made for this stock so far, and those of them given
  // back unused because their class was full when they came (surplus).
  uint64_t made() const;
  uint64_t surplus() const;
  // Buffers held now that are ready (StockBuffer::ready); takes that found
  // the class empty and made their buffer in a round trip of their own.
  size_t ready_buffers() const;
  uint64_t misses() const;

 private:
  struct Class {
    uint32_t pool_id = 0;
    std::string pool;
    uint64_t capacity = 0;
    uint32_t cap = 1;     // The most `target` grows to.
    uint32_t target = 1;  // Its most buffers now.
    uint32_t takes = 0;   // Takes so far (the stock it asks for grows).
    // The id of the call out for it (the refill thread's or a take's miss),
    // 0 when none: its takes that miss wait for that call's buffers.
    uint64_t call_out = 0;
    std::deque<StockBuffer> buffers;
    absl::Time last_take;
    // A class of one buffer (see the file comment): the lease of its last
    // take while this process holds it (0: none), and its object; once let
    // go of, that object, for the refill to ask for its range back.
    uint64_t taken_lease = 0;
    v1::ObjectRef taken_ref;
    std::optional<v1::ObjectRef> freed;
    // A class of one buffer taken from while its last take was held (see
    // the file comment): refilled at each take.
    bool kept = false;
    bool one() const { return cap == 1; }
    // Whether some buffer of it waits for its readying.
    bool unready() const {
      return std::any_of(buffers.begin(), buffers.end(),
                         [](const StockBuffer& b) { return !b.tried; });
    }
    // How many buffers it wants now.
    uint32_t want() const { return std::min(target, std::max(takes, 1u)); }
  };
  // The budget for `pool`.
  uint64_t BudgetFor(const v1::PoolInfo& pool) const;
  // The class of (pool_id, capacity), made (evicting the least recently
  // used past kMaxClasses: its buffers go to *evicted) if new. mu_ held.
  Class& ClassOf(const v1::PoolInfo& pool, uint64_t capacity,
                 std::vector<uint64_t>* evicted);
  // One CreateMany(stock) of `count` buffers of `capacity` in `pool`; the
  // buffers whose leases were entered as held. Without mu_.
  // With `reuse`, the first buffer asks for that object's range
  // (CreateManyRequest.reuse_range_of).
  absl::StatusOr<std::vector<StockBuffer>> Make(
      const std::string& pool, uint64_t capacity, uint32_t count,
      const std::optional<v1::ObjectRef>& reuse);
  // The class of (pool_id, capacity), or null. mu_ held.
  Class* FindLocked(uint32_t pool_id, uint64_t capacity);
  // The class's newest buffer whose lease is still held (the others are
  // dropped), or none. mu_ held.
  std::optional<StockBuffer> PopLocked(Class& c);
  // A call for (pool_id, capacity) came back: clears the class's mark if
  // `call` is still its call out, wakes the takes waiting, counts `made`
  // (when `fresh`: the daemon made them, not a readying's return) and adds
  // its buffers to the class up to what it wants. Returns the leases of the
  // rest (surplus, or all if the class went), to give back without mu_.
  // mu_ held.
  std::vector<uint64_t> LandLocked(
      uint32_t pool_id, uint64_t capacity, uint64_t call,
      absl::StatusOr<std::vector<StockBuffer>>& made, bool fresh = true);
  // A take of `b` from `c`: a class of one buffer notes it as its last
  // take (taken_lease). mu_ held.
  void TakenLocked(Class& c, const StockBuffer& b);
  // Removes class `c`, its buffers' leases appended to *leases (to give
  // back without mu_). mu_ held.
  void EraseLocked(std::vector<Class>::iterator c,
                   std::vector<uint64_t>* leases);
  // Releases the leases of buffers given back. Without mu_.
  void GiveBack(const std::vector<uint64_t>& lease_ids);
  // Opens each of `buffers` for writing with its entries filled, adjacent
  // ranges in one call, and marks those done ready. Without mu_.
  void Ready(std::vector<StockBuffer>& buffers);
  // The refill thread's readying, a step: the newest unready buffers of a
  // class with no call out (about 1 MiB of them, at least one), taken out
  // under a call's mark (its takes that find it empty wait for them),
  // readied and landed again. False when no class had any. Called with
  // `lock` held; releases it meanwhile.
  bool ReadyOne(std::unique_lock<std::mutex>& lock);
  void Loop();

  ClientCore& core_;
  const uint64_t budget_;
  const absl::Duration idle_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable refilled_;  // A refill's call came back.
  std::vector<Class> classes_;        // Guarded by mu_.
  bool stopping_ = false;             // Guarded by mu_.
  bool refill_due_ = false;           // Guarded by mu_.
  uint64_t made_ = 0;                 // Guarded by mu_.
  uint64_t surplus_ = 0;              // Guarded by mu_.
  uint64_t misses_ = 0;               // Guarded by mu_.
  uint64_t next_call_ = 0;            // Guarded by mu_.
  // Classes of one buffer whose last take's lease this process holds
  // (taken_lease != 0): Released looks for nothing while there are none.
  // Changed under mu_, read without it.
  std::atomic<uint32_t> taken_out_ = 0;
  ForkGate fork_gate_;  // Around the thread's calls.
  std::thread thread_;
};

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_STOCK_H_
