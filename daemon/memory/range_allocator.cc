#include "daemon/memory/range_allocator.h"

#include <cassert>

namespace shmtensor::daemon {

RangeAllocator::RangeAllocator(uint64_t size, uint64_t granule)
    : size_(size & ~(granule - 1)), granule_(granule), free_bytes_(0) {
  assert(granule != 0 && (granule & (granule - 1)) == 0);
  if (size_ > 0) Insert(0, size_);
}

std::optional<uint64_t> RangeAllocator::RoundUp(uint64_t bytes) const {
  if (bytes > UINT64_MAX - (granule_ - 1)) return std::nullopt;
  return (bytes + granule_ - 1) & ~(granule_ - 1);
}

std::optional<uint64_t> RangeAllocator::Allocate(uint64_t capacity,
                                                 uint64_t alignment, End end) {
  assert(capacity > 0 && capacity % granule_ == 0);
  if (alignment == 0) alignment = granule_;
  assert((alignment & (alignment - 1)) == 0 && alignment >= granule_);
  // Ranges are visited smallest first; with alignment above the granule the
  // first ones may not hold an aligned range, so keep looking (the scan is
  // bounded by the number of free ranges at least `capacity` long).
  for (auto fit = by_size_.lower_bound({capacity, 0}); fit != by_size_.end();
       ++fit) {
    const uint64_t length = fit->first;
    const uint64_t offset = fit->second;
    const uint64_t limit = offset + length;
    const uint64_t lowest = (offset + alignment - 1) & ~(alignment - 1);
    if (lowest - offset > length - capacity) continue;
    const uint64_t start =
        end == End::kLow ? lowest : (limit - capacity) & ~(alignment - 1);
    Erase(by_offset_.find(offset));
    if (start > offset) Insert(offset, start - offset);
    if (limit > start + capacity) {
      Insert(start + capacity, limit - start - capacity);
    }
    return start;
  }
  return std::nullopt;
}

bool RangeAllocator::AllocateAt(uint64_t offset, uint64_t capacity) {
  assert(capacity > 0 && capacity % granule_ == 0 && offset % granule_ == 0);
  if (offset > size_ || capacity > size_ - offset) return false;
  auto it = by_offset_.upper_bound(offset);
  if (it == by_offset_.begin()) return false;
  --it;  // The free range starting at or below `offset`.
  const uint64_t start = it->first;
  const uint64_t limit = start + it->second;
  if (offset + capacity > limit) return false;  // Not (wholly) free.
  if (offset != start && offset + capacity != limit) return false;
  Erase(it);
  if (offset > start) Insert(start, offset - start);
  if (limit > offset + capacity) {
    Insert(offset + capacity, limit - offset - capacity);
  }
  return true;
}

bool RangeAllocator::CanAllocateAt(uint64_t offset, uint64_t capacity) const {
  if (capacity == 0 || offset > size_ || capacity > size_ - offset) {
    return false;
  }
  auto it = by_offset_.upper_bound(offset);
  if (it == by_offset_.begin()) return false;
  --it;
  const uint64_t start = it->first;
  const uint64_t limit = start + it->second;
  return offset + capacity <= limit &&
         (offset == start || offset + capacity == limit);
}

bool RangeAllocator::Reserve(uint64_t offset, uint64_t capacity) {
  if (capacity == 0 || offset % granule_ != 0 || capacity % granule_ != 0 ||
      offset > size_ || capacity > size_ - offset) {
    return false;
  }
  auto it = by_offset_.upper_bound(offset);
  if (it == by_offset_.begin()) return false;
  --it;
  const uint64_t start = it->first;
  const uint64_t length = it->second;
  if (offset + capacity > start + length) return false;
  Erase(it);
  if (offset > start) Insert(start, offset - start);
  if (offset + capacity < start + length) {
    Insert(offset + capacity, start + length - offset - capacity);
  }
  return true;
}

void RangeAllocator::Free(uint64_t offset, uint64_t capacity) {
  assert(capacity > 0 && offset % granule_ == 0 && capacity % granule_ == 0);
  assert(offset + capacity <= size_);
  uint64_t start = offset;
  uint64_t end = offset + capacity;
  auto next = by_offset_.lower_bound(offset);
  // Invariant: the freed range overlaps no free range.
  assert(next == by_offset_.end() || next->first >= end);
  if (next != by_offset_.begin()) {
    auto prev = std::prev(next);
    assert(prev->first + prev->second <= start);
    if (prev->first + prev->second == start) {
      start = prev->first;
      Erase(prev);
    }
  }
  if (next != by_offset_.end() && next->first == end) {
    end += next->second;
    Erase(next);
  }
  Insert(start, end - start);
}

uint64_t RangeAllocator::largest_free() const {
  return by_size_.empty() ? 0 : by_size_.rbegin()->first;
}

void RangeAllocator::Insert(uint64_t offset, uint64_t length) {
  by_offset_.emplace(offset, length);
  by_size_.emplace(length, offset);
  free_bytes_ += length;
}

void RangeAllocator::Erase(std::map<uint64_t, uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  free_bytes_ -= it->second;
  by_offset_.erase(it);
}

}  // namespace shmtensor::daemon
