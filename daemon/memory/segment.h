// A segment is the memory behind one pool: unnamed host shared memory handed
// to clients by descriptor (host_segment.h), or CUDA device memory shared by
// IPC handle (cuda_segment.h). The object store only allocates offsets
// inside a segment; the only bytes the daemon ever writes are zeros, over a
// range another user wrote before it goes to a new one (Clear).
//
// Thread safety: implementations are immutable after creation; Clear may be
// called from any thread.
#ifndef SHMTENSOR_DAEMON_MEMORY_SEGMENT_H_
#define SHMTENSOR_DAEMON_MEMORY_SEGMENT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/os/peer.h"
#include "shmtensor/v1/shmtensor.pb.h"

namespace shmtensor::daemon {

class Segment {
 public:
  virtual ~Segment() = default;

  virtual v1::MemoryKind kind() const = 0;
  // For CUDA_DEVICE: the serialised IPC handle clients open. Empty for HOST.
  virtual const std::string& handle() const = 0;
  // For HOST: a new descriptor of the memory, with an open file description
  // of its own (so no holder's fcntl(F_SETFL) reaches another), O_RDWR when
  // `writable`, else O_RDONLY (no mapping of it can ever be made writable);
  // for the descriptor socket to hand to a client. UNIMPLEMENTED for
  // segments that have none (CUDA, fakes in tests); INTERNAL naming errno.
  virtual absl::StatusOr<UniqueFd> OpenDescriptor(bool writable) const {
    (void)writable;
    return absl::UnimplementedError("this pool has no descriptor");
  }
  virtual uint64_t size_bytes() const = 0;
  // Writes zeros over [offset, offset + length), which lies inside the
  // segment and belongs to one new object that no one else can see yet
  // (writer_map.h). RESOURCE_EXHAUSTED or INTERNAL naming the error.
  virtual absl::Status Clear(uint64_t offset, uint64_t length) const = 0;
  // Allocation granule and alignment (>= 64, a power of two).
  virtual uint64_t page_size() const = 0;
  // Huge page size backing the segment (a power of two, a multiple of
  // page_size), or 0 when it has none. Objects of at least half of it are
  // aligned to it and sized in whole huge pages.
  virtual uint64_t huge_page_size() const = 0;
  // CUDA_DEVICE: the device index; -1 for host segments.
  virtual int cuda_device() const { return -1; }
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_MEMORY_SEGMENT_H_
