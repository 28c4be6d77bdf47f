#include "daemon/store/session_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"

namespace shmtensor::daemon {
namespace {

#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U  // Linux 6.3; older headers lack it.
#endif

absl::Status Failed(const char* what) {
  return absl::InternalError(
      absl::StrFormat("release ring: %s: %s", what, std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SessionRing>> SessionRing::Create(
    UniqueFd* descriptor) {
  const unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
  int raw = memfd_create("shmtensor-release-ring", flags | MFD_NOEXEC_SEAL);
  if (raw < 0 && errno == EINVAL) {
    raw = memfd_create("shmtensor-release-ring", flags);
  }
  UniqueFd fd(raw);
  if (!fd.valid()) return Failed("memfd_create");
  // No other user may reopen it through /proc.
  if (fchmod(fd.get(), 0600) != 0) return Failed("fchmod");
  if (ftruncate(fd.get(), static_cast<off_t>(kReleaseRingBytes)) != 0) {
    return Failed("ftruncate");
  }
  // The client maps it writable: without these it could shrink it under the
  // daemon's mapping (SIGBUS in the daemon), or seal it against writes.
  if (fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) !=
      0) {
    return Failed("F_ADD_SEALS");
  }
  absl::StatusOr<MappedFd> mapping =
      MappedFd::Map(fd.get(), 0, kReleaseRingBytes);
  if (!mapping.ok()) return mapping.status();
  *descriptor = std::move(fd);
  return std::unique_ptr<SessionRing>(new SessionRing(*std::move(mapping)));
}

SessionRing::SessionRing(MappedFd mapping)
    : mapping_(std::move(mapping)), reader_(mapping_.data()) {}

}  // namespace shmtensor::daemon
