// Best-fit allocator of byte ranges inside one pool.
//
// The allocator's bookkeeping lives in the daemon's private memory, never in
// the pool it manages: clients map pools but can neither see nor corrupt it,
// and no lock is ever taken in shared memory.
//
// Every range is a multiple of the granule (the pool's page size) and starts
// at a multiple of it, so ranges can be protected page by page. Free ranges are
// coalesced with their neighbours on Free.
//
// Thread safety: not thread-safe; the owner (ObjectStore) serialises calls.
#ifndef SHMTENSOR_DAEMON_MEMORY_RANGE_ALLOCATOR_H_
#define SHMTENSOR_DAEMON_MEMORY_RANGE_ALLOCATOR_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace shmtensor::daemon {

class RangeAllocator {
 public:
  // Manages [0, size). `granule` must be a power of two; `size` is rounded
  // down to a multiple of it.
  RangeAllocator(uint64_t size, uint64_t granule);

  // Movable, not copyable: there is one owner of a pool's free list.
  RangeAllocator(const RangeAllocator&) = delete;
  RangeAllocator& operator=(const RangeAllocator&) = delete;
  RangeAllocator(RangeAllocator&&) = default;
  RangeAllocator& operator=(RangeAllocator&&) = default;

  // Bytes reserved for a request of `bytes`: rounded up to the granule.
  // Returns nullopt on overflow.
  std::optional<uint64_t> RoundUp(uint64_t bytes) const;

  // Which end of the chosen free range an allocation is carved from.
  enum class End { kLow, kHigh };

  // Reserves `capacity` bytes (a non-zero multiple of the granule, as returned
  // by RoundUp) starting at a multiple of `alignment` (0: the granule; else a
  // power of two >= the granule) and returns the offset, or nullopt when no
  // free range fits. Best fit: the smallest free range that holds an aligned
  // range of `capacity` bytes; the range is carved from that free range's
  // `end` (its lowest or highest aligned place); what is left of it on either
  // side stays free. Carving two classes of objects from opposite ends keeps
  // them apart (see Pool::Place).
  std::optional<uint64_t> Allocate(uint64_t capacity, uint64_t alignment = 0,
                                   End end = End::kLow);

  // Reserves exactly [offset, offset + capacity) if it is free and touches
  // an end of the free range that holds it, so carving it leaves at most one
  // piece of that free range (as Allocate does) and never splits it in two.
  // Returns false, changing nothing, otherwise. `offset` and `capacity` are
  // multiples of the granule. For placing an object where one of the same
  // size lay before (see ObjectStore::Create).
  bool AllocateAt(uint64_t offset, uint64_t capacity);
  // Whether AllocateAt(offset, capacity) would succeed now; changes nothing.
  bool CanAllocateAt(uint64_t offset, uint64_t capacity) const;

  // Reserves exactly [offset, offset + capacity) wherever it lies inside a
  // free range, splitting that range as needed (a successor rebuilding the
  // pool from its predecessor's ledger). Returns false, changing nothing,
  // when any of it is not free or it is not granule-aligned.
  bool Reserve(uint64_t offset, uint64_t capacity);

  // Returns a range from Allocate. Invariant: [offset, offset+capacity) is
  // allocated; freeing anything else is a bug and asserts.
  void Free(uint64_t offset, uint64_t capacity);

  uint64_t size() const { return size_; }
  uint64_t granule() const { return granule_; }
  uint64_t free_bytes() const { return free_bytes_; }
  uint64_t used_bytes() const { return size_ - free_bytes_; }
  uint64_t largest_free() const;
  size_t free_ranges() const { return by_offset_.size(); }

 private:
  void Insert(uint64_t offset, uint64_t length);
  void Erase(std::map<uint64_t, uint64_t>::iterator it);

  uint64_t size_;
  uint64_t granule_;
  uint64_t free_bytes_;
  std::map<uint64_t, uint64_t> by_offset_;           // offset -> length
  std::set<std::pair<uint64_t, uint64_t>> by_size_;  // (length, offset)
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_MEMORY_RANGE_ALLOCATOR_H_
