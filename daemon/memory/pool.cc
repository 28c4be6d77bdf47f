#include "daemon/memory/pool.h"

#include <algorithm>

namespace shmtensor::daemon {

std::optional<uint64_t> Pool::Allocate(uint64_t client, uint64_t capacity,
                                       uint64_t alignment,
                                       RangeAllocator::End end) {
  // A process's first touch of a page costs a page fault, once per page and
  // process, however warm the pool is (docs/performance.md). A client that
  // keeps creating objects of one size (a DataLoader worker's batches) is
  // therefore better served by a range it wrote before than by whichever the
  // pool cycles to next: it settles on fewer ranges, so it takes fewer first
  // touches. (While all of its own are in use it still gets another's.) Only a
  // range of exactly this capacity that starts or ends its free range is taken:
  // like best fit, this never splits a free range in two.
  if (auto it = written_.find(client); it != written_.end()) {
    for (const Range& r : it->second) {
      if (r.capacity != capacity) continue;
      if (alignment != 0 && r.offset % alignment != 0) continue;
      if (allocator_.AllocateAt(r.offset, capacity)) return r.offset;
    }
  }
  return allocator_.Allocate(capacity, alignment, end);
}

void Pool::NoteWritten(uint64_t client, uint64_t offset, uint64_t capacity) {
  std::vector<Range>& w = written_[client];
  auto same = std::find_if(w.begin(), w.end(), [&](const Range& r) {
    return r.offset == offset && r.capacity == capacity;
  });
  if (same == w.end()) {
    if (w.size() < kWrittenRanges) w.emplace_back();
    same = w.end() - 1;
  }
  std::rotate(w.begin(), same, same + 1);  // Most recent first.
  w.front() = Range{offset, capacity};
}

void Pool::ForgetClient(uint64_t client) { written_.erase(client); }

std::vector<Pool::Range> Pool::written(uint64_t client) const {
  auto it = written_.find(client);
  if (it == written_.end()) return {};
  return it->second;
}

Pool::Usage Pool::usage() const {
  Usage u;
  u.used_bytes = allocator_.used_bytes();
  u.free_bytes = allocator_.free_bytes();
  u.largest_free_bytes = allocator_.largest_free();
  u.high_water_bytes = high_water_bytes;
  u.objects = objects;
  u.leases = leases;
  u.cleared_bytes = cleared_bytes;
  u.stock_bytes = stock_bytes;
  return u;
}

}  // namespace shmtensor::daemon
