// Host shared-memory segment: unnamed memory on a tmpfs, handed to clients by
// descriptor only. By default a memfd (memfd_create: shmem with no name in
// any file system, not even for a moment); for a pool `directory` (a tmpfs
// the operator mounts, typically huge=always for 2 MiB pages) an O_TMPFILE
// file there, opened O_EXCL so that no one can ever link it into the
// directory. Nothing is left to clean up after a crash, however the daemon
// dies: the memory lives exactly as long as some process holds a descriptor
// or a mapping of it (the daemon, and each client that maps it).
//
// Every byte is reserved, allocated and zeroed at creation (ftruncate,
// posix_fallocate, then pwrite of zeros), so a too-small tmpfs or memory
// limit fails here with RESOURCE_EXHAUSTED instead of with SIGBUS in a client
// later, and no page is allocated or zeroed on first touch (what creation
// costs: docs/performance.md, "Pool creation"). A memfd is then sealed
// against growing and shrinking (F_SEAL_GROW, F_SEAL_SHRINK, F_SEAL_SEAL):
// no client holding its writable descriptor can truncate it under the
// others. The daemon never keeps a mapping of the segment: it only hands out
// offsets (it maps one huge page briefly at creation to learn whether the
// kernel backs the file with huge pages).
//
// The segment keeps one O_RDWR descriptor. Each client gets a reopen of it
// through /proc/self/fd (a memfd has no path): a new open file description,
// O_RDWR for a writer, O_RDONLY for a reader. The file is mode 0600 and the
// daemon's user's, so a reader of another user cannot reopen its
// descriptor writable through /proc.
//
// Thread safety: immutable after Create.
#ifndef SHMTENSOR_DAEMON_MEMORY_HOST_SEGMENT_H_
#define SHMTENSOR_DAEMON_MEMORY_HOST_SEGMENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/memory/segment.h"
#include "daemon/os/peer.h"

namespace shmtensor::daemon {

// Whether a pool uses transparent huge pages.
enum class HugePages {
  kAuto,     // When the tmpfs gives them (huge=always/within_size).
  kRequire,  // Creation fails unless it does.
  kOff,      // Never align objects to huge pages, whatever the tmpfs does.
};

struct HostSegmentOptions {
  // Empty: a memfd. Else a tmpfs directory for an O_TMPFILE file.
  std::string directory;
  std::string label;        // The pool's name: the memfd's name, for logs.
  uint64_t size_bytes = 0;  // > 0; rounded up to the page size.
  HugePages huge_pages = HugePages::kAuto;
};

class HostSegment final : public Segment {
 public:
  // Creates and reserves a segment. Fails with RESOURCE_EXHAUSTED when the
  // tmpfs or the memory limit cannot hold it; INVALID_ARGUMENT when the
  // directory is missing or not a tmpfs (pool memory must never be written
  // back to a disk), or is a hugetlbfs; FAILED_PRECONDITION under kRequire
  // when the kernel gives the file no huge pages, or when /proc is not
  // mounted (clients' descriptors are reopens through it); INTERNAL for
  // other system errors. Messages name the pool, directory and size.
  static absl::StatusOr<std::unique_ptr<HostSegment>> Create(
      const HostSegmentOptions& options);

  // A predecessor's segment, handed over as `fd` (take-over, or systemd's
  // file descriptor store): the same memory, with every byte as it was.
  // FAILED_PRECONDITION naming the pool when it is not a read-write tmpfs
  // file of this daemon's uid of exactly `size_bytes`; `page_size` and
  // `huge_page_size` are what the predecessor found (the file's pages do
  // not change).
  static absl::StatusOr<std::unique_ptr<HostSegment>> Adopt(
      UniqueFd fd, const std::string& label, uint64_t size_bytes,
      uint64_t page_size, uint64_t huge_page_size);

  // The daemon's own read-write descriptor, for handing the segment to a
  // successor (never to a client). Valid while the segment lives.
  int descriptor() const { return rw_.get(); }

  // Closes the daemon's descriptor. Clients that still map the memory keep
  // it; it goes back to the system when the last mapping goes.
  ~HostSegment() override = default;

  HostSegment(const HostSegment&) = delete;
  HostSegment& operator=(const HostSegment&) = delete;

  v1::MemoryKind kind() const override { return v1::MEMORY_KIND_HOST; }
  const std::string& handle() const override { return no_handle_; }
  absl::StatusOr<UniqueFd> OpenDescriptor(bool writable) const override;
  uint64_t size_bytes() const override { return size_bytes_; }
  // pwrite(2) of zeros through the daemon's descriptor (the daemon keeps no
  // mapping): about as fast as memset, and the pages stay allocated.
  absl::Status Clear(uint64_t offset, uint64_t length) const override;
  uint64_t page_size() const override { return page_size_; }
  uint64_t huge_page_size() const override { return huge_page_size_; }
  // "memfd" or the directory, for logs.
  const std::string& where() const { return where_; }

 private:
  HostSegment(UniqueFd rw, std::string where, uint64_t size_bytes,
              uint64_t page_size, uint64_t huge_page_size)
      : rw_(std::move(rw)),
        where_(std::move(where)),
        size_bytes_(size_bytes),
        page_size_(page_size),
        huge_page_size_(huge_page_size) {}

  const UniqueFd rw_;  // O_RDWR; never handed out itself.
  const std::string where_;
  const std::string no_handle_;
  const uint64_t size_bytes_;
  const uint64_t page_size_;
  const uint64_t huge_page_size_;  // 0: base pages only.
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_MEMORY_HOST_SEGMENT_H_
