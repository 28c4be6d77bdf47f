// A named pool: a segment of memory, the allocator of ranges inside it, who
// may use it (pool_access.h), the ranges each client was given writable
// (for allocation affinity, see Allocate), and which uid wrote each range
// (writer_map.h: a range goes to another uid only cleared).
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

  // Allocation affinity. `client` is a key the owner picks (ObjectStore: the
  // session id).
  //
  // Reserves `capacity` bytes at a multiple of `alignment` (0: any) for an
  // object client `client` creates: on a range NoteWritten noted for that
  // client, of exactly `capacity` bytes, when one is free (most recent
  // first), else carved from `end` of a free range as the allocator places
  // it. Returns the offset; nullopt when nothing fits.
  std::optional<uint64_t> Allocate(uint64_t client, uint64_t capacity,
                                   uint64_t alignment, RangeAllocator::End end);
  // Notes that client `client` was given [offset, offset + capacity)
  // writable (created, or taken from an exclusive hand-off): its pages are
  // in the client's page tables. Keeps the kWrittenRanges most recent.
  void NoteWritten(uint64_t client, uint64_t offset, uint64_t capacity);
  // Forgets the ranges of client `client` (its session ended).
  void ForgetClient(uint64_t client);
  struct Range {
    uint64_t offset = 0;
    uint64_t capacity = 0;
  };
  static constexpr size_t kWrittenRanges = 16;
  // The ranges noted for `client`, most recent first.
  std::vector<Range> written(uint64_t client) const;

  // The pool's figures now, for Stats and monitoring.
  struct Usage {
    uint64_t used_bytes = 0;
    uint64_t free_bytes = 0;
    uint64_t largest_free_bytes = 0;
    uint64_t high_water_bytes = 0;
    uint64_t objects = 0;
    uint64_t leases = 0;
    uint64_t cleared_bytes = 0;
    uint64_t stock_bytes = 0;
  };
  Usage usage() const;

  const std::string& name() const { return name_; }
  const Segment& segment() const { return *segment_; }
  const PoolAccessRules& access() const { return access_; }
  RangeAllocator& allocator() { return allocator_; }
  const RangeAllocator& allocator() const { return allocator_; }
  WriterMap& writers() { return writers_; }

  // Counters the owner (ObjectStore) keeps under its lock.
  uint64_t objects = 0;           // Live objects with memory in this pool.
  uint64_t leases = 0;            // Leases on objects of this pool.
  uint64_t high_water_bytes = 0;  // Most bytes ever allocated at once.
  // Bytes cleared for a new object because another uid wrote them.
  uint64_t cleared_bytes = 0;
  // Capacity of the stock buffers (made ahead of need, not sealed) in it.
  uint64_t stock_bytes = 0;

 private:
  std::string name_;
  std::unique_ptr<Segment> segment_;
  PoolAccessRules access_;
  RangeAllocator allocator_;
  WriterMap writers_;
  // By client: ranges it was given writable, most recent first, at most
  // kWrittenRanges.
  absl::flat_hash_map<uint64_t, std::vector<Range>> written_;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_MEMORY_POOL_H_
