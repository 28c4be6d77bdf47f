// A mapping of a file descriptor (a memfd, an O_TMPFILE file): the one
// adapter between the daemon and Boost.Interprocess's mapped_region, which
// throws; every error here is an absl::Status naming the descriptor.
//
// FdMappable is the MemoryMappable concept mapped_region asks for (it
// needs only get_mapping_handle()), over a descriptor the caller owns:
// Boost's own shared_memory_object and file_mapping open a name, and pool
// and ledger memory has none.
//
// Ownership: a MappedFd owns its mapping (unmapped on destruction), never
// the descriptor. Thread safety: immutable once made.
#ifndef SHMTENSOR_DAEMON_OS_MAPPED_FD_H_
#define SHMTENSOR_DAEMON_OS_MAPPED_FD_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace boost::interprocess {
class mapped_region;
}  // namespace boost::interprocess

namespace shmtensor::daemon {

class MappedFd {
 public:
  struct Options {
    bool writable = true;
    // 0: wherever the kernel puts it. Else exactly there (MAP_FIXED is
    // never used: an address already taken fails instead).
    void* address = nullptr;
    int extra_flags = 0;  // ORed into mmap's flags (MAP_POPULATE, say).
  };
  // Maps [offset, offset + size) of `fd` MAP_SHARED. INVALID_ARGUMENT for
  // size 0; INTERNAL naming the descriptor and the system's error.
  static absl::StatusOr<MappedFd> Map(int fd, uint64_t offset, size_t size,
                                      Options options);
  static absl::StatusOr<MappedFd> Map(int fd, uint64_t offset, size_t size) {
    return Map(fd, offset, size, Options());
  }

  MappedFd(MappedFd&&) noexcept;
  MappedFd& operator=(MappedFd&&) noexcept;
  ~MappedFd();

  void* data() const;
  size_t size() const;

 private:
  explicit MappedFd(std::unique_ptr<boost::interprocess::mapped_region> r);
  std::unique_ptr<boost::interprocess::mapped_region> region_;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_OS_MAPPED_FD_H_
