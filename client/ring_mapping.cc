#include "client/ring_mapping.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"

namespace shmtensor::internal {

absl::StatusOr<std::unique_ptr<RingMapping>> RingMapping::Map(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0 ||
      static_cast<uint64_t>(st.st_size) < kReleaseRingBytes) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrFormat(
        "the daemon's release ring has %d bytes, at least %d expected",
        static_cast<long long>(st.st_size), kReleaseRingBytes));
  }
  void* base = mmap(nullptr, kReleaseRingBytes, PROT_READ | PROT_WRITE,
                    MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (base == MAP_FAILED) {
    return absl::InternalError(
        absl::StrFormat("mmap of the release ring: %s", std::strerror(err)));
  }
  if (madvise(base, kReleaseRingBytes, MADV_DONTFORK) != 0) {
    const int e = errno;
    munmap(base, kReleaseRingBytes);
    return absl::InternalError(absl::StrFormat(
        "madvise(MADV_DONTFORK) of the release ring: %s", std::strerror(e)));
  }
  absl::StatusOr<ReleaseRingWriter> writer =
      ReleaseRingWriter::Attach(base, kReleaseRingBytes);
  if (!writer.ok()) {
    munmap(base, kReleaseRingBytes);
    return writer.status();
  }
  return std::unique_ptr<RingMapping>(
      new RingMapping(base, *std::move(writer)));
}

RingMapping::~RingMapping() { munmap(base_, kReleaseRingBytes); }

}  // namespace shmtensor::internal
