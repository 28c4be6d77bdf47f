// A segment is the memory behind one pool: host shared memory today, CUDA
// device memory shared by IPC handle later. The object store only allocates
// offsets inside a segment; it never touches the bytes.
//
// Thread safety: implementations are immutable after creation.
#ifndef SHMTENSOR_DAEMON_SEGMENT_H_
#define SHMTENSOR_DAEMON_SEGMENT_H_

#include <cstdint>
#include <string>

#include "shmtensor/v1/shmtensor.pb.h"

namespace shmtensor::daemon {

class Segment {
 public:
  virtual ~Segment() = default;

  virtual v1::MemoryKind kind() const = 0;
  // What a client needs to map the segment: for HOST, the POSIX shm name
  // ("/shmtensor-...", empty outside /dev/shm); for CUDA_DEVICE, the
  // serialised IPC handle.
  virtual const std::string& handle() const = 0;
  // For HOST: the absolute path of the file clients map. Empty otherwise.
  virtual const std::string& path() const = 0;
  virtual uint64_t size_bytes() const = 0;
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

#endif  // SHMTENSOR_DAEMON_SEGMENT_H_
