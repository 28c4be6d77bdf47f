// A named pool: a segment of memory, the allocator of ranges inside it, who
// may use it (pool_access.h), the ranges each client was given writable
// (for allocation affinity, see AllocateObject), which uid wrote each range
// (writer_map.h: a range goes to another uid only cleared), and the counts
// operators see (Usage). The pool is the one place that allocates, frees
// and counts its memory: its owner says what happens to objects and leases,
// the pool keeps its ranges and figures consistent with that.
//
// Thread safety: not thread-safe; ObjectStore serialises access under its lock.
#ifndef SHMTENSOR_DAEMON_MEMORY_POOL_H_
#define SHMTENSOR_DAEMON_MEMORY_POOL_H_

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "daemon/memory/pool_access.h"
#include "daemon/memory/range_allocator.h"
#include "daemon/memory/segment.h"
#include "daemon/memory/writer_map.h"

namespace shmtensor::daemon {

class Pool {
 public:
  // `access` defaults to the daemon's user and root only.
  Pool(std::string name, std::unique_ptr<Segment> segment,
       PoolAccessRules access = PoolAccessRules(geteuid()))
      : name_(std::move(name)),
        segment_(std::move(segment)),
        access_(std::move(access)),
        allocator_(segment_->size_bytes(), segment_->page_size()) {}

  // Not copyable: the pool owns its segment.
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // Where an object of `bytes` (> 0) goes: `capacity` bytes at a multiple of
  // `alignment`, carved from `end` of a free range. When the segment has huge
  // pages, an object of at least half a huge page takes whole huge pages on a
  // huge-page boundary (so clients map and protect it a page-table entry per
  // huge page; the cost is at most one huge page of rounding) from the low
  // end of the pool, and smaller objects are packed from the high end: a
  // huge page that small objects used keeps small page-table entries in
  // every client that wrote them, and would make a large object that lands
  // there later cost as much as with base pages. In a pool without huge
  // pages, every object is rounded to the page granule, from the low end.
  // nullopt on overflow.
  struct Placement {
    uint64_t capacity;
    uint64_t alignment;
    RangeAllocator::End end;
  };
  std::optional<Placement> Place(uint64_t bytes) const {
    const uint64_t huge = segment_->huge_page_size();
    if (huge > 0 && bytes >= huge / 2) {
      if (bytes > UINT64_MAX - (huge - 1)) return std::nullopt;
      return Placement{(bytes + huge - 1) & ~(huge - 1), huge,
                       RangeAllocator::End::kLow};
    }
    std::optional<uint64_t> rounded = allocator_.RoundUp(bytes);
    if (!rounded) return std::nullopt;
    return Placement{
        *rounded, allocator_.granule(),
        huge > 0 ? RangeAllocator::End::kHigh : RangeAllocator::End::kLow};
  }

  // The pool's size in bytes (a multiple of the page granule).
  uint64_t size_bytes() const { return allocator_.size(); }
  uint64_t used_bytes() const { return allocator_.used_bytes(); }

  // Objects. Each live object with memory in this pool is counted from
  // AllocateObject (or RestoreObject) to FreeObject; `client` is a key the
  // owner picks (ObjectStore: the session id).
  //
  // Reserves `place` (from Place; capacity 0: an object of no bytes, which
  // takes no range) for an object client `client` creates, and counts it,
  // and its capacity as stock (buffers made ahead of need, not sealed) when
  // `stock` (until Unstock). Allocation affinity: the range is one a
  // write lease gave that client (AddLease), of exactly that capacity, when
  // one is free (most recent first), else carved from `place.end` of a free
  // range as the allocator places it. Returns the offset; nullopt, counting
  // nothing, when nothing fits.
  std::optional<uint64_t> AllocateObject(uint64_t client,
                                         const Placement& place, bool stock);
  // Counts an object a predecessor placed at [offset, offset + capacity)
  // (ledger adoption). False, counting nothing, when any of it is taken or
  // it is not granule-aligned.
  bool RestoreObject(uint64_t offset, uint64_t capacity);
  // Frees an object's range and stops counting it. Invariant: the object
  // was allocated or restored, not yet freed, and no longer counts as
  // stock.
  void FreeObject(uint64_t offset, uint64_t capacity);
  // A stock object's capacity stops counting as stock (it was sealed or
  // discarded). Invariant: AllocateObject counted it as stock.
  void Unstock(uint64_t capacity);

  // [P21] A new object of uid `uid` at [offset, offset + capacity): returns
  // the parts another uid (or several) wrote, which the caller clears
  // before `uid` sees them (counted as cleared bytes), and records `uid` as
  // their writer (WriterMap::Claim).
  std::vector<WriterMap::Range> ClaimForWriter(uint64_t offset,
                                               uint64_t capacity, uid_t uid);
  // Clearing `ranges` (from ClaimForWriter) failed: they count as written
  // by several uids again, so the next creator gets them cleared.
  void ClearFailed(const std::vector<WriterMap::Range>& ranges);
  // Who wrote what is unknown (a successor's pool): every range counts as
  // written by several uids.
  void ForgetWriters();

  // Leases. A lease of client `client` (uid `uid`) on the object at
  // [offset, offset + capacity) is counted from AddLease to DropLease. A
  // write lease gives that range to the client writable: noted for
  // allocation affinity (at most kWrittenRanges per client, most recent
  // first) and shared with the uid's writes (WriterMap::Share).
  void AddLease(uint64_t client, uid_t uid, uint64_t offset, uint64_t capacity,
                bool write);
  void DropLease();
  // A lease restored from a predecessor's ledger: counted only (the
  // writers are forgotten, ForgetWriters).
  void RestoreLease() { ++leases_; }

  // Forgets the ranges of client `client` (its session ended).
  void ForgetClient(uint64_t client);
  struct Range {
    uint64_t offset = 0;
    uint64_t capacity = 0;
  };
  static constexpr size_t kWrittenRanges = 16;
  // The ranges noted for `client`, most recent first.
  std::vector<Range> written(uint64_t client) const;
  // Whether `client` was given ranges of `place`'s capacity (and alignment)
  // and none of them could be placed now: all are in use.
  bool WrittenRangesInUse(uint64_t client, const Placement& place) const;

  // The pool's figures now, for Stats and monitoring.
  struct Usage {
    uint64_t used_bytes = 0;
    uint64_t free_bytes = 0;
    uint64_t largest_free_bytes = 0;
    uint64_t high_water_bytes = 0;  // Most bytes ever allocated at once.
    uint64_t objects = 0;
    uint64_t leases = 0;
    // Bytes cleared for a new object because another uid wrote them.
    uint64_t cleared_bytes = 0;
    uint64_t stock_bytes = 0;
  };
  Usage usage() const;

  const std::string& name() const { return name_; }
  const Segment& segment() const { return *segment_; }
  const PoolAccessRules& access() const { return access_; }
  // The writer of the byte at `offset` (WriterMap::WriterAt), for tests.
  std::optional<uid_t> WriterAt(uint64_t offset) const {
    return writers_.WriterAt(offset);
  }

 private:
  // The range of AllocateObject, uncounted.
  std::optional<uint64_t> PlaceRange(uint64_t client, const Placement& place);
  // Notes that client `client` was given [offset, offset + capacity)
  // writable: its pages are in the client's page tables. Keeps the
  // kWrittenRanges most recent.
  void NoteWritten(uint64_t client, uint64_t offset, uint64_t capacity);

  std::string name_;
  std::unique_ptr<Segment> segment_;
  PoolAccessRules access_;
  RangeAllocator allocator_;
  WriterMap writers_;
  uint64_t objects_ = 0;
  uint64_t leases_ = 0;
  uint64_t high_water_bytes_ = 0;
  uint64_t cleared_bytes_ = 0;
  uint64_t stock_bytes_ = 0;
  // By client: ranges it was given writable, most recent first, at most
  // kWrittenRanges.
  absl::flat_hash_map<uint64_t, std::vector<Range>> written_;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_MEMORY_POOL_H_
