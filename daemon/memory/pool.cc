#include "daemon/memory/pool.h"

#include <algorithm>
#include <cassert>

namespace shmtensor::daemon {

std::optional<uint64_t> Pool::AllocateObject(uint64_t client,
                                             const Placement& place,
                                             bool stock) {
  std::optional<uint64_t> offset = PlaceRange(client, place);
  if (!offset.has_value()) return std::nullopt;
  ++objects_;
  if (stock) stock_bytes_ += place.capacity;
  high_water_bytes_ = std::max(high_water_bytes_, allocator_.used_bytes());
  return offset;
}

std::optional<uint64_t> Pool::PlaceRange(uint64_t client,
                                         const Placement& place) {
  const uint64_t capacity = place.capacity;
  const uint64_t alignment = place.alignment;
  if (capacity == 0) return 0;
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
  return allocator_.Allocate(capacity, alignment, place.end);
}

bool Pool::RestoreObject(uint64_t offset, uint64_t capacity) {
  if (capacity > 0 && !allocator_.Reserve(offset, capacity)) return false;
  ++objects_;
  high_water_bytes_ = std::max(high_water_bytes_, allocator_.used_bytes());
  return true;
}

void Pool::FreeObject(uint64_t offset, uint64_t capacity) {
  assert(objects_ > 0);
  if (capacity > 0) allocator_.Free(offset, capacity);
  --objects_;
}

void Pool::Unstock(uint64_t capacity) {
  assert(stock_bytes_ >= capacity);
  stock_bytes_ -= capacity;
}

std::vector<WriterMap::Range> Pool::ClaimForWriter(uint64_t offset,
                                                   uint64_t capacity,
                                                   uid_t uid) {
  if (capacity == 0) return {};
  std::vector<WriterMap::Range> stale = writers_.Claim(offset, capacity, uid);
  for (const WriterMap::Range& r : stale) cleared_bytes_ += r.length;
  return stale;
}

void Pool::ClearFailed(const std::vector<WriterMap::Range>& ranges) {
  for (const WriterMap::Range& r : ranges) {
    writers_.Share(r.offset, r.length, WriterMap::kMixed);
  }
}

void Pool::ForgetWriters() {
  writers_.Share(0, allocator_.size(), WriterMap::kMixed);
}

void Pool::AddLease(uint64_t client, uid_t uid, uint64_t offset,
                    uint64_t capacity, bool write) {
  ++leases_;
  if (write && capacity > 0) {
    NoteWritten(client, offset, capacity);
    writers_.Share(offset, capacity, uid);
  }
}

void Pool::DropLease() {
  assert(leases_ > 0);
  --leases_;
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

bool Pool::WrittenRangesInUse(uint64_t client, const Placement& place) const {
  auto it = written_.find(client);
  if (it == written_.end()) return false;
  bool any = false;
  for (const Range& r : it->second) {
    if (r.capacity != place.capacity) continue;
    if (place.alignment != 0 && r.offset % place.alignment != 0) continue;
    if (allocator_.CanAllocateAt(r.offset, r.capacity)) return false;
    any = true;
  }
  return any;
}

Pool::Usage Pool::usage() const {
  Usage u;
  u.used_bytes = allocator_.used_bytes();
  u.free_bytes = allocator_.free_bytes();
  u.largest_free_bytes = allocator_.largest_free();
  u.high_water_bytes = high_water_bytes_;
  u.objects = objects_;
  u.leases = leases_;
  u.cleared_bytes = cleared_bytes_;
  u.stock_bytes = stock_bytes_;
  return u;
}

}  // namespace shmtensor::daemon
