// Host shared-memory segment under /dev/shm, created with Boost.Interprocess.
//
// Created with mode 0600 (0660 and a group, for a daemon shared by a group)
// under an unguessable name "/<prefix><128-bit hex>".
// Every byte is reserved and faulted in at creation (posix_fallocate on the
// tmpfs file), so a too-small /dev/shm fails here with ENOSPC instead of with
// SIGBUS in a client later, and no page is allocated on first touch.
// The daemon never maps the segment: it only hands out offsets.
//
// Thread safety: immutable after Create.
#ifndef SHMTENSOR_DAEMON_HOST_SEGMENT_H_
#define SHMTENSOR_DAEMON_HOST_SEGMENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/segment.h"

namespace shmtensor::daemon {

class HostSegment final : public Segment {
 public:
  // Creates and reserves a segment of `size_bytes` (> 0, rounded up to the
  // page size). Fails with RESOURCE_EXHAUSTED when /dev/shm cannot hold it,
  // with INTERNAL for other system errors; the message names the size.
  // With `gid` >= 0 the segment gets that group and mode 0660.
  static absl::StatusOr<std::unique_ptr<HostSegment>> Create(
      const std::string& name_prefix, uint64_t size_bytes, int gid = -1);

  // Removes every /dev/shm entry whose name starts with `name_prefix`: the
  // segments an earlier instance left behind when it crashed. Returns how many
  // were removed.
  static int RemoveLeftovers(const std::string& name_prefix);

  // Unlinks the segment. Clients that still map it keep their mapping; the
  // memory goes back when the last mapping goes.
  ~HostSegment() override;

  // Not copyable or movable: the object owns the name it unlinks.
  HostSegment(const HostSegment&) = delete;
  HostSegment& operator=(const HostSegment&) = delete;

  v1::MemoryKind kind() const override { return v1::MEMORY_KIND_HOST; }
  const std::string& handle() const override { return shm_name_; }
  uint64_t size_bytes() const override { return size_bytes_; }
  uint64_t page_size() const override { return page_size_; }

 private:
  HostSegment(std::string shm_name, uint64_t size_bytes, uint64_t page_size)
      : shm_name_(std::move(shm_name)),
        size_bytes_(size_bytes),
        page_size_(page_size) {}

  const std::string shm_name_;  // With the leading '/'.
  const uint64_t size_bytes_;
  const uint64_t page_size_;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_HOST_SEGMENT_H_
