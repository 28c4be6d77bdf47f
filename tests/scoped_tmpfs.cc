#include "tests/scoped_tmpfs.h"

#include <stdlib.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace shmtensor::testing {

absl::StatusOr<std::unique_ptr<ScopedTmpfs>> ScopedTmpfs::Mount(
    const std::string& options) {
  char dir[] = "/tmp/shmtensor-tmpfs-XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", strerror(errno)));
  }
  if (mount("shmtensor-test", dir, "tmpfs", MS_NOSUID | MS_NODEV,
            options.c_str()) != 0) {
    const int e = errno;
    rmdir(dir);
    const std::string why = absl::StrCat("cannot mount a tmpfs (-o ", options,
                                         ") at ", dir, ": ", strerror(e));
    return e == EPERM ? absl::PermissionDeniedError(
                            absl::StrCat(why, " (needs CAP_SYS_ADMIN)"))
                      : absl::InternalError(why);
  }
  return std::unique_ptr<ScopedTmpfs>(new ScopedTmpfs(dir));
}

ScopedTmpfs::~ScopedTmpfs() {
  umount2(path_.c_str(), MNT_DETACH);
  rmdir(path_.c_str());
}

}  // namespace shmtensor::testing
