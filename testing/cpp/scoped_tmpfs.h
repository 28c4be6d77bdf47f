// A tmpfs mounted for the length of a test or benchmark, e.g. one with
// huge=always to give pools 2 MiB pages.
//
// Mounting needs CAP_SYS_ADMIN (root, or a user namespace that owns the
// mount namespace); without it Mount says why, and callers skip.
//
// A run killed before its destructors (a test's timeout, SIGKILL) would
// leave its mount, and the pages in it, until reboot. So every mount of ours
// is named after its owner, "shmtensor-test-<pid>" (so are the Python
// launcher's, testing/python/shmtensor_testing.py), and Mount first unmounts
// those whose owner is gone; the sweep also recognises
// "shmtensor-bench-<pid>" and "shmtensor-pytest-<pid>".
//
// Thread safety: not thread-safe; one owner.
#ifndef SHMTENSOR_TESTING_CPP_SCOPED_TMPFS_H_
#define SHMTENSOR_TESTING_CPP_SCOPED_TMPFS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace shmtensor::testing {

class ScopedTmpfs {
 public:
  // Mounts a tmpfs with `options` (mount(8) -o syntax, e.g.
  // "huge=always,size=512m,mode=0700") at a fresh directory under /tmp,
  // after SweepOrphans(). PERMISSION_DENIED without the privilege, INTERNAL
  // for other failures.
  static absl::StatusOr<std::unique_ptr<ScopedTmpfs>> Mount(
      const std::string& options);
  // Unmounts (lazily, so open mappings elsewhere do not block it) and removes
  // the directory.
  ~ScopedTmpfs();

  ScopedTmpfs(const ScopedTmpfs&) = delete;
  ScopedTmpfs& operator=(const ScopedTmpfs&) = delete;

  const std::string& path() const { return path_; }

  // Unmounts (lazily) every tmpfs named "shmtensor-{test,bench,pytest}-<pid>"
  // whose process <pid> no longer exists, and removes its directory when
  // empty. Returns how many it unmounted. Best effort: without the
  // privilege it unmounts nothing.
  static int SweepOrphans();

 private:
  explicit ScopedTmpfs(std::string path) : path_(std::move(path)) {}
  const std::string path_;
};

}  // namespace shmtensor::testing

#endif  // SHMTENSOR_TESTING_CPP_SCOPED_TMPFS_H_
