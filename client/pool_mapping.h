// A client process's mappings of one host pool.
//
// A pool has no name to open: the process maps it from the descriptor the
// daemon handed over (pool_descriptors.h), O_RDONLY for a session that may
// only read it, O_RDWR for one that may write. Each pool is mapped at most
// twice per process, once each, however many clients the process has, for
// as long as any of them uses it (never per object):
//  - read-only: mmap(PROT_READ) of the first descriptor received. Every
//    read view points here; a write through it faults.
//  - writable, made on first need: mmap(PROT_READ) of an O_RDWR descriptor,
//    which only a session with write access to the
//    pool ever receives; without one, writable use fails PERMISSION_DENIED,
//    and no mapping of an O_RDONLY descriptor can be made writable. Only
//    the ranges of buffers this process may write (its unsealed buffers, and
//    the transfers it took) are opened to PROT_READ|PROT_WRITE with
//    mprotect. Sealing (shared or exclusive) and releasing close the range
//    back to PROT_READ, so a write through an old writable pointer faults;
//    unless no such pointer can exist (WriteRevocation::kWhenExposed: no
//    raw pointer was ever handed out into the range, see MarkExposed; or
//    kDeferred: the holder vouches for it, view.h): then the range stays
//    open, and a later writable use of memory that is still open needs no
//    mprotect. The
//    mapping remembers which ranges are open, so in steady state a recycled
//    buffer costs no page-table change at all. No view ever points into an
//    open range it does not hold: readers read through the read-only
//    mapping.
// The daemon allocated every page of the pool up front, so a first touch in
// a client only maps an existing page (a minor fault, once per page and
// process); mprotect keeps page-table entries, and the allocator hands the
// same ranges out again, so a steady-state lifecycle takes no page fault.
// A range written for the first time in this process has its entries
// filled in one system call when it is opened (Protect), not one fault per
// 4 KiB page as the writer touches it (on a VM a fault costs several µs:
// docs/performance.md, "Kept puts"); the stock opens its buffers so ahead
// of need, off the put's path (stock.h). Readers may ask the same of the
// read-only mapping (FillForRead). Nothing is pre-populated at map time:
// connecting costs the same for a 64 MiB and a 64 GiB pool. A pool with huge
// pages (PoolInfo.huge_page_size) is mapped at a huge-page-aligned address, so
// the kernel maps each of its huge pages with one page-table entry, and opening
// or closing an object of whole huge pages changes one entry per huge page
// instead of 512.
//
// Thread safety: thread-safe.
#ifndef SHMTENSOR_CLIENT_POOL_MAPPING_H_
#define SHMTENSOR_CLIENT_POOL_MAPPING_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "absl/status/statusor.h"
#include "client/range_set.h"
#include "shmtensor/v1/shmtensor.pb.h"

namespace shmtensor::internal {

enum class Access { kRead, kReadWrite };

class PoolMapping {
 public:
  // The process's mapping of the pool whose descriptor `fd` is (owned:
  // kept by a new mapping, or by a live one as its writable descriptor when
  // it is O_RDWR and the mapping has none yet, else closed), made
  // (read-only) on first use and shared by
  // every client of the process (the same memory is the same inode);
  // unmapped when the last holder lets go. INVALID_ARGUMENT when `fd` is
  // smaller than the pool, INTERNAL for system errors.
  static absl::StatusOr<std::shared_ptr<PoolMapping>> Get(
      const v1::PoolInfo& info, int fd);
  ~PoolMapping();

  // Not copyable or movable: pointers into the mappings are handed out.
  PoolMapping(const PoolMapping&) = delete;
  PoolMapping& operator=(const PoolMapping&) = delete;

  // True when `p` lies in a mapping (read-only or writable) of a pool that
  // this process maps now: memory a lease of some client of the process
  // may cover. A lock and a few comparisons per live pool.
  static bool Contains(const void* p);
  // For a fork whose hold the daemon refused (ClientCore::PrepareFork): the
  // range [offset, offset + capacity) of this pool, as the child inherits
  // it, is made inaccessible there (PROT_NONE in both mappings, so an
  // access faults), last of the child's fork work; and the mapping is no
  // longer handed to the child's new clients (they map the pool afresh).
  // The parent is unchanged. Called only from a prepare handler that runs
  // after PrepareFork (which locked every mapping), on the forking thread.
  void RevokeInChild(uint64_t offset, uint64_t capacity);

  const v1::PoolInfo& info() const { return info_; }
  const uint8_t* read_base() const { return ro_; }

  // Sets this process's access to [offset, offset+capacity) through the
  // writable mapping (mapped here on first use) and returns its base.
  // Opening a range makes it ready to write: besides the mprotect (none
  // when it is open already), its page-table entries are filled in one step
  // (MADV_POPULATE_READ once it is writable) the first time this process
  // opens it,
  // so the writer takes no fault per page; opening a range that is open and
  // filled already makes no system call. Closing always calls mprotect (see
  // open_) and keeps the entries (a later opening needs no fill).
  // INVALID_ARGUMENT for a range outside the pool or not page-aligned.
  absl::StatusOr<uint8_t*> Protect(uint64_t offset, uint64_t capacity,
                                   Access access);

  // Fills this process's page-table entries of [offset, offset+capacity)
  // of the read-only mapping in one step (MADV_POPULATE_READ), the first
  // time for a range: a reader about to read all of it then takes no fault
  // per page (View::Populate). Best effort: on a kernel without the advice
  // (before Linux 5.14), or on any error, the pages fault in on first
  // touch as before. A range outside the pool is ignored.
  void FillForRead(uint64_t offset, uint64_t capacity);

  // Records that a raw pointer into [offset, offset+capacity) of the
  // writable mapping was handed out (Buffer::data(), View::mutable_data()).
  // Such a pointer may outlive its buffer, so under
  // WriteRevocation::kWhenExposed every later writable use of any of these
  // bytes in this process closes its range at once. Never forgotten.
  void MarkExposed(uint64_t offset, uint64_t capacity);
  // True when some byte of [offset, offset+capacity) was marked exposed.
  bool Exposed(uint64_t offset, uint64_t capacity) const;

  // mprotect calls this mapping made, for tests and benchmarks.
  uint64_t protect_calls() const {
    return protect_calls_.load(std::memory_order_relaxed);
  }

 private:
  PoolMapping(v1::PoolInfo info, uint8_t* ro, int ro_fd)
      : info_(std::move(info)), ro_(ro), ro_fd_(ro_fd) {}

  // fork() handlers: lock the registry and every live mapping's mu_ before
  // fork, unlock after it in parent and child, so that a child never
  // inherits a lock held by a thread it does not have (a forked DataLoader
  // worker would hang on its first writable buffer).
  static void PrepareFork();
  static void AfterFork();
  // The child's: closes every range of the writable mapping first.
  static void AfterForkInChild();

  const v1::PoolInfo info_;
  uint8_t* const ro_;
  // The descriptor the read-only mapping was made from (O_RDONLY, or the
  // O_RDWR one of a session that may write), held for the mapping's life:
  // the pool's memory is this process's through it, as the kernel shows
  // (/proc/self/fd).
  const int ro_fd_;
  // Maps the writable mapping on first use. Called under mu_.
  absl::Status EnsureWritableLocked();
  // madvise(at, length, advice), advice MADV_POPULATE_READ or _WRITE; false
  // when the entries were not filled (the kernel lacks the advice, or
  // refused). Without mu_: it walks every page, and may block on memory.
  bool Populate(uint8_t* at, uint64_t length, int advice);

  // Guards what follows. A pthread mutex (std::mutex), not absl::Mutex:
  // it is held across fork() and unlocked in the child, which a pthread
  // mutex allows. Never held across a system call that can block long.
  mutable std::mutex mu_;
  uint8_t* rw_ = nullptr;  // The writable mapping, once made.
  // O_RDWR, once a session with write access gave it (may be ro_fd_).
  int rw_fd_ = -1;
  // The ranges of the writable mapping known to be PROT_READ|PROT_WRITE. A
  // subset of what is open: a child forked while a thread was between its
  // mprotect and the set's update misses that range, which costs one
  // redundant mprotect there, never a missed one, because closing does not
  // trust the set.
  RangeSet open_;
  // Ranges a raw writable pointer was ever handed out into (MarkExposed).
  RangeSet exposed_;
  // Ranges of the writable (filled_) and read-only (read_filled_) mapping
  // whose page-table entries this process filled (Protect, FillForRead). A
  // hint, never trusted for safety: the kernel may drop entries (a shmem
  // page swapped out), which costs a fault on touch, as before. Emptied in
  // a forked child, whose shared mappings start with no entries.
  RangeSet filled_;
  RangeSet read_filled_;
  std::atomic<uint64_t> protect_calls_{0};
};

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_POOL_MAPPING_H_
