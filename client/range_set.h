// A set of byte offsets kept as disjoint half-open intervals [start, end):
// which ranges of a pool mapping are open for writing (pool_mapping.h).
//
// Intervals are merged when they overlap or touch, so the set stays as small
// as the number of separate runs. Every operation is O(log n + k) for k
// intervals it touches.
//
// Thread safety: not thread-safe; the owner serialises access.
#ifndef SHMTENSOR_CLIENT_RANGE_SET_H_
#define SHMTENSOR_CLIENT_RANGE_SET_H_

#include <cstddef>
#include <cstdint>
#include <map>

namespace shmtensor::internal {

class RangeSet {
 public:
  // True when every offset of [start, end) is in the set (and for an empty
  // range).
  bool Covers(uint64_t start, uint64_t end) const;
  // True when some offset of [start, end) is in the set (never for an
  // empty range).
  bool Intersects(uint64_t start, uint64_t end) const;
  // Adds [start, end); no-op for an empty range.
  void Add(uint64_t start, uint64_t end);
  // Removes [start, end), splitting an interval that straddles it.
  void Remove(uint64_t start, uint64_t end);

  // Number of disjoint intervals, and the bytes they hold.
  size_t intervals() const { return ranges_.size(); }
  uint64_t bytes() const;

 private:
  std::map<uint64_t, uint64_t> ranges_;  // start -> end, disjoint, apart.
};

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_RANGE_SET_H_
