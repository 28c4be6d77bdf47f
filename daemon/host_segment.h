// Host shared-memory segment: a file on a tmpfs, /dev/shm by default (created
// there with Boost.Interprocess) or a pool directory the operator names,
// typically a tmpfs mounted with huge=always for 2 MiB pages.
//
// Created with mode 0600 (0660 and a group, for a daemon shared by a group)
// under an unguessable name "<prefix><128-bit hex>".
// Every byte is reserved, allocated and zeroed at creation (ftruncate,
// posix_fallocate, then pwrite of zeros on the tmpfs file), so a too-small
// tmpfs fails here with ENOSPC instead of with SIGBUS in a client later, and
// no page is allocated or zeroed on first touch (about 0.1 s per GiB). The
// daemon never keeps a mapping of the segment: it only hands out offsets (it
// maps one huge page briefly at creation to learn whether the kernel backs the
// file with huge pages).
//
// Liveness: the daemon holds a shared flock on each of its segments from
// before the file gets its size until it unlinks it, and the kernel drops
// the lock when the daemon dies, however it dies. So a segment with a size
// whose lock anyone can take exclusively was left by a daemon that is gone:
// RemoveOrphans unlinks those, whatever address (and name prefix) their
// daemon served, and never a live daemon's, in any PID namespace that shares
// the directory.
//
// Thread safety: immutable after Create.
#ifndef SHMTENSOR_DAEMON_HOST_SEGMENT_H_
#define SHMTENSOR_DAEMON_HOST_SEGMENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/segment.h"

namespace shmtensor::daemon {

// Whether a pool uses transparent huge pages.
enum class HugePages {
  kAuto,     // When the directory's tmpfs gives them (huge=always/within_size).
  kRequire,  // Creation fails unless it does.
  kOff,      // Never align objects to huge pages, whatever the tmpfs does.
};

// The default pool directory.
inline constexpr char kShmDirectory[] = "/dev/shm";

struct HostSegmentOptions {
  std::string directory = kShmDirectory;  // Must be on a tmpfs.
  std::string name_prefix;                // Daemon::SegmentPrefix.
  uint64_t size_bytes = 0;                // > 0; rounded up to the page size.
  int gid = -1;  // >= 0: the segment gets this group and mode 0660.
  HugePages huge_pages = HugePages::kAuto;
};

class HostSegment final : public Segment {
 public:
  // Creates and reserves a segment. Fails with RESOURCE_EXHAUSTED when the
  // tmpfs cannot hold it; INVALID_ARGUMENT when the directory is missing or
  // not a tmpfs (pool memory must never be written back to a disk), or is a
  // hugetlbfs; FAILED_PRECONDITION under kRequire when the kernel gives the
  // file no huge pages; INTERNAL for other system errors. Messages name the
  // directory and the size.
  static absl::StatusOr<std::unique_ptr<HostSegment>> Create(
      const HostSegmentOptions& options);

  // Removes the segments in `directory` named `name_prefix`... of daemons
  // that died without cleaning up, whatever their address: those no process
  // holds the lock of (see the class comment). Returns how many it removed.
  static int RemoveOrphans(const std::string& directory,
                           const std::string& name_prefix);

  // Unlinks the segment and drops its lock. Clients that still map it keep
  // their mapping; the memory goes back when the last mapping goes.
  ~HostSegment() override;

  // Not copyable or movable: the object owns the name it unlinks.
  HostSegment(const HostSegment&) = delete;
  HostSegment& operator=(const HostSegment&) = delete;

  v1::MemoryKind kind() const override { return v1::MEMORY_KIND_HOST; }
  // The shm_open name ("/shmtensor-...") under /dev/shm, else empty.
  const std::string& handle() const override { return shm_name_; }
  const std::string& path() const override { return path_; }
  uint64_t size_bytes() const override { return size_bytes_; }
  uint64_t page_size() const override { return page_size_; }
  uint64_t huge_page_size() const override { return huge_page_size_; }

 private:
  HostSegment(std::string shm_name, std::string path, int lock_fd,
              uint64_t size_bytes, uint64_t page_size, uint64_t huge_page_size)
      : shm_name_(std::move(shm_name)),
        path_(std::move(path)),
        lock_fd_(lock_fd),
        size_bytes_(size_bytes),
        page_size_(page_size),
        huge_page_size_(huge_page_size) {}

  const std::string shm_name_;  // With the leading '/'; empty off /dev/shm.
  const std::string path_;      // Absolute.
  const int lock_fd_;           // Open on the file, holding LOCK_SH.
  const uint64_t size_bytes_;
  const uint64_t page_size_;
  const uint64_t huge_page_size_;  // 0: base pages only.
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_HOST_SEGMENT_H_
