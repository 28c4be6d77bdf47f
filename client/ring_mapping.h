// The client's end of its session's release ring (common/release_ring.h,
// docs/shm_layout.md, "The release ring"): the daemon's memory mapped
// shared and writable, left out of forked children (MADV_DONTFORK: a child
// is not the session's process and must never post), and the writer over
// it.
//
// Ownership: owns the mapping (unmapped on destruction). Not copyable or
// movable: the writer points into the mapping. Thread safety: Post is the
// caller's to serialize (ClientCore posts under its outbox's lock); the
// other members may be called from any thread.
#ifndef SHMTENSOR_CLIENT_RING_MAPPING_H_
#define SHMTENSOR_CLIENT_RING_MAPPING_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/release_ring.h"

namespace shmtensor::internal {

class RingMapping {
 public:
  // Maps the ring of descriptor `fd` (closed here, whatever happens).
  // FAILED_PRECONDITION for memory that is not a ring this client knows;
  // INTERNAL naming the system call that failed.
  static absl::StatusOr<std::unique_ptr<RingMapping>> Map(int fd);
  ~RingMapping();

  RingMapping(const RingMapping&) = delete;
  RingMapping& operator=(const RingMapping&) = delete;

  ReleaseRingWriter& writer() { return writer_; }

 private:
  RingMapping(void* base, ReleaseRingWriter writer)
      : base_(base), writer_(std::move(writer)) {}

  void* base_;
  ReleaseRingWriter writer_;
};

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_RING_MAPPING_H_
