// ScopedTmpfs: a mount left by a process that died is swept by the next
// Mount; a live process's mount is not. Needs the privilege to mount (root):
// skips, saying why, without it.
#include "testing/cpp/scoped_tmpfs.h"

#include <mntent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "gtest/gtest.h"

namespace shmtensor::testing {
namespace {

// True when `dir` is the mount point of a tmpfs in this mount namespace.
bool IsTmpfsMount(const std::string& dir) {
  FILE* mounts = setmntent("/proc/self/mounts", "r");
  if (mounts == nullptr) return false;
  bool found = false;
  while (const mntent* m = getmntent(mounts)) {
    found |= dir == m->mnt_dir && std::strcmp(m->mnt_type, "tmpfs") == 0;
  }
  endmntent(mounts);
  return found;
}

TEST(ScopedTmpfsTest, NextMountSweepsTheMountOfAProcessKilledBeforeCleanup) {
  absl::StatusOr<std::unique_ptr<ScopedTmpfs>> mine =
      ScopedTmpfs::Mount("size=1m,mode=0700");
  if (!mine.ok()) GTEST_SKIP() << mine.status();
  ASSERT_TRUE(IsTmpfsMount((*mine)->path()));

  // A child mounts, tells us where, and is killed with its mount in place.
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    absl::StatusOr<std::unique_ptr<ScopedTmpfs>> t =
        ScopedTmpfs::Mount("size=1m,mode=0700");
    const std::string path = t.ok() ? (*t)->path() : "";
    (void)!write(pipe_fds[1], path.data(), path.size());
    close(pipe_fds[1]);
    pause();  // Until SIGKILL: the destructor never runs.
    _exit(0);
  }
  close(pipe_fds[1]);
  char buf[256] = {};
  const ssize_t n = read(pipe_fds[0], buf, sizeof(buf) - 1);
  close(pipe_fds[0]);
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_GT(n, 0) << "the child could not mount";
  const std::string orphan(buf, n);
  ASSERT_TRUE(IsTmpfsMount(orphan)) << orphan;

  // The next Mount sweeps the orphan, and leaves the live process's mount.
  absl::StatusOr<std::unique_ptr<ScopedTmpfs>> next =
      ScopedTmpfs::Mount("size=1m,mode=0700");
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_FALSE(IsTmpfsMount(orphan));
  EXPECT_NE(access(orphan.c_str(), F_OK), 0) << "directory left: " << orphan;
  EXPECT_TRUE(IsTmpfsMount((*mine)->path()));
  EXPECT_TRUE(IsTmpfsMount((*next)->path()));
  EXPECT_EQ(ScopedTmpfs::SweepOrphans(), 0);
}

}  // namespace
}  // namespace shmtensor::testing
