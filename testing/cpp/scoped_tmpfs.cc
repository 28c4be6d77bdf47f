#include "testing/cpp/scoped_tmpfs.h"

#include <mntent.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace shmtensor::testing {

int ScopedTmpfs::SweepOrphans() {
  FILE* mounts = setmntent("/proc/self/mounts", "r");
  if (mounts == nullptr) return 0;
  std::vector<std::string> orphans;
  while (const mntent* m = getmntent(mounts)) {
    if (std::strcmp(m->mnt_type, "tmpfs") != 0) continue;
    const absl::string_view source = m->mnt_fsname;
    for (absl::string_view prefix :
         {"shmtensor-test-", "shmtensor-bench-", "shmtensor-pytest-"}) {
      int pid = 0;
      if (absl::StartsWith(source, prefix) &&
          absl::SimpleAtoi(source.substr(prefix.size()), &pid) && pid > 0 &&
          kill(pid, 0) != 0 && errno == ESRCH) {
        orphans.push_back(m->mnt_dir);
      }
    }
  }
  endmntent(mounts);
  int swept = 0;
  for (const std::string& dir : orphans) {
    if (umount2(dir.c_str(), MNT_DETACH) == 0) {
      ++swept;
      rmdir(dir.c_str());
    }
  }
  return swept;
}

absl::StatusOr<std::unique_ptr<ScopedTmpfs>> ScopedTmpfs::Mount(
    const std::string& options) {
  SweepOrphans();
  char dir[] = "/tmp/shmtensor-tmpfs-XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", strerror(errno)));
  }
  const std::string source = absl::StrCat("shmtensor-test-", getpid());
  if (mount(source.c_str(), dir, "tmpfs", MS_NOSUID | MS_NODEV,
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
