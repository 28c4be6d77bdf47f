// A named pool: a segment of memory and the allocator of ranges inside it.
//
// Thread safety: not thread-safe; ObjectStore serialises access under its lock.
#ifndef SHMTENSOR_DAEMON_POOL_H_
#define SHMTENSOR_DAEMON_POOL_H_

#include <memory>
#include <string>

#include "daemon/range_allocator.h"
#include "daemon/segment.h"

namespace shmtensor::daemon {

class Pool {
 public:
  Pool(std::string name, std::unique_ptr<Segment> segment)
      : name_(std::move(name)),
        segment_(std::move(segment)),
        allocator_(segment_->size_bytes(), segment_->page_size()) {}

  // Not copyable: the pool owns its segment.
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  const std::string& name() const { return name_; }
  const Segment& segment() const { return *segment_; }
  RangeAllocator& allocator() { return allocator_; }
  const RangeAllocator& allocator() const { return allocator_; }

  // Counters the owner (ObjectStore) keeps under its lock.
  uint64_t objects = 0;           // Live objects with memory in this pool.
  uint64_t leases = 0;            // Leases on objects of this pool.
  uint64_t high_water_bytes = 0;  // Most bytes ever allocated at once.

 private:
  std::string name_;
  std::unique_ptr<Segment> segment_;
  RangeAllocator allocator_;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_POOL_H_
