#include "client/range_set.h"

#include <algorithm>
#include <iterator>

namespace shmtensor::internal {

bool RangeSet::Covers(uint64_t start, uint64_t end) const {
  if (start >= end) return true;
  auto it = ranges_.upper_bound(start);  // First interval starting after.
  if (it == ranges_.begin()) return false;
  --it;  // The interval starting at or before `start`.
  return it->second >= end;
}

bool RangeSet::Intersects(uint64_t start, uint64_t end) const {
  if (start >= end) return false;
  auto it = ranges_.lower_bound(start);  // First interval starting at or after.
  if (it != ranges_.end() && it->first < end) return true;
  if (it == ranges_.begin()) return false;
  return std::prev(it)->second > start;  // The one starting before `start`.
}

void RangeSet::Add(uint64_t start, uint64_t end) {
  if (start >= end) return;
  // The first interval that could touch [start, end): the one before the
  // first starting after `start`, if it reaches `start`.
  auto it = ranges_.upper_bound(start);
  if (it != ranges_.begin() && std::prev(it)->second >= start) --it;
  // Absorb every interval that overlaps or touches.
  while (it != ranges_.end() && it->first <= end) {
    start = std::min(start, it->first);
    end = std::max(end, it->second);
    it = ranges_.erase(it);
  }
  ranges_.emplace(start, end);
}

void RangeSet::Remove(uint64_t start, uint64_t end) {
  if (start >= end) return;
  auto it = ranges_.upper_bound(start);
  if (it != ranges_.begin() && std::prev(it)->second > start) --it;
  while (it != ranges_.end() && it->first < end) {
    const uint64_t lo = it->first;
    const uint64_t hi = it->second;
    it = ranges_.erase(it);
    if (lo < start) ranges_.emplace(lo, start);
    if (hi > end) {
      ranges_.emplace(end, hi);
      break;
    }
  }
}

uint64_t RangeSet::bytes() const {
  uint64_t n = 0;
  for (const auto& [start, end] : ranges_) n += end - start;
  return n;
}

}  // namespace shmtensor::internal
