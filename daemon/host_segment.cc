#include "daemon/host_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/permissions.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shmtensor::daemon {
namespace bip = boost::interprocess;

namespace {

std::string RandomHex128() {
  std::random_device rd;
  return absl::StrFormat("%08x%08x%08x%08x", rd(), rd(), rd(), rd());
}

// The one adapter around Boost.Interprocess: creates the shm object with mode
// 0600 and returns its file descriptor's owner, or a Status.
absl::StatusOr<bip::shared_memory_object> CreateShm(const std::string& name) {
  try {
    bip::permissions perm;
    perm.set_permissions(0600);
    // Boost takes the name without the leading '/'.
    return bip::shared_memory_object(bip::create_only, name.c_str() + 1,
                                     bip::read_write, perm);
  } catch (const bip::interprocess_exception& e) {
    return absl::InternalError(
        absl::StrCat("cannot create shared memory '", name, "': ", e.what()));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostSegment>> HostSegment::Create(
    const std::string& name_prefix, uint64_t size_bytes, int gid) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (size_bytes == 0) {
    return absl::InvalidArgumentError("pool size must be > 0 bytes");
  }
  size_bytes = (size_bytes + page - 1) / page * page;
  const std::string name = absl::StrCat("/", name_prefix, RandomHex128());
  absl::StatusOr<bip::shared_memory_object> shm = CreateShm(name);
  if (!shm.ok()) return shm.status();
  const int fd = shm->get_mapping_handle().handle;
  // Boost applies the permissions through the umask; make them exact.
  if (gid >= 0 && fchown(fd, static_cast<uid_t>(-1), gid) != 0) {
    const int e = errno;
    bip::shared_memory_object::remove(name.c_str() + 1);
    return absl::PermissionDeniedError(
        absl::StrFormat("cannot give pool segment %s group %d: %s", name, gid,
                        std::strerror(e)));
  }
  fchmod(fd, gid >= 0 ? 0660 : 0600);
  // posix_fallocate both reserves tmpfs pages (ENOSPC now, not SIGBUS later)
  // and allocates them, so no client ever faults a fresh page in.
  const int err = posix_fallocate(fd, 0, static_cast<off_t>(size_bytes));
  if (err != 0) {
    bip::shared_memory_object::remove(name.c_str() + 1);
    if (err == ENOSPC || err == ENOMEM) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "cannot reserve %d bytes for a pool in /dev/shm: %s; free space in "
          "/dev/shm or start with a smaller --pool-size",
          size_bytes, std::strerror(err)));
    }
    return absl::InternalError(
        absl::StrFormat("posix_fallocate(%s, %d bytes): %s", name, size_bytes,
                        std::strerror(err)));
  }
  return std::unique_ptr<HostSegment>(new HostSegment(name, size_bytes, page));
}

int HostSegment::RemoveLeftovers(const std::string& name_prefix) {
  int removed = 0;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  while (struct dirent* entry = readdir(dir)) {
    if (absl::StartsWith(entry->d_name, name_prefix)) {
      if (bip::shared_memory_object::remove(entry->d_name)) ++removed;
    }
  }
  closedir(dir);
  return removed;
}

HostSegment::~HostSegment() {
  bip::shared_memory_object::remove(shm_name_.c_str() + 1);
}

}  // namespace shmtensor::daemon
