#include "client/pool_mapping.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace shmtensor::internal {
namespace {

// The file a pool lives in: its path, or its shm name under /dev/shm (a
// daemon that predates PoolInfo.path).
std::string PoolPath(const v1::PoolInfo& info) {
  return info.path().empty() ? "/dev/shm" + info.shm_name() : info.path();
}

// mmap(PROT_READ, MAP_SHARED) of the whole pool; at a huge-page-aligned
// address when the pool has huge pages, so that every huge page of it can be
// mapped by one page-table entry.
void* MapPool(const v1::PoolInfo& info, int fd) {
  const uint64_t huge = info.huge_page_size();
  if (huge == 0 || (huge & (huge - 1)) != 0) {
    return mmap(nullptr, info.size_bytes(), PROT_READ, MAP_SHARED, fd, 0);
  }
  // Reserve address space with room to align, map over it, trim the rest.
  const uint64_t span = info.size_bytes() + huge;
  void* reserve = mmap(nullptr, span, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserve == MAP_FAILED) return MAP_FAILED;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(reserve);
  const uintptr_t at = (lo + huge - 1) & ~(huge - 1);
  void* p = mmap(reinterpret_cast<void*>(at), info.size_bytes(), PROT_READ,
                 MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    munmap(reserve, span);
    errno = err;
    return MAP_FAILED;
  }
  if (at > lo) munmap(reserve, at - lo);
  const uintptr_t end = at + info.size_bytes();
  if (lo + span > end) munmap(reinterpret_cast<void*>(end), lo + span - end);
  return p;
}

// Maps the pool PROT_READ. With `writable`, opens it O_RDWR and hands the fd
// to `*fd_out` (kept for pwrite); else closes it.
absl::StatusOr<uint8_t*> MapShm(const v1::PoolInfo& info, bool writable,
                                int* fd_out = nullptr) {
  const std::string path = PoolPath(info);
  const int fd =
      open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC, 0);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot open pool '%s' (%s): %s; is shmtensord still running?",
        info.name(), path, std::strerror(errno)));
  }
  // PROT_READ for both: the writable mapping opens ranges one by one.
  void* p = MapPool(info, fd);
  const int err = errno;
  if (fd_out != nullptr && p != MAP_FAILED) {
    *fd_out = fd;
  } else {
    close(fd);
  }
  if (p == MAP_FAILED) {
    return absl::InternalError(
        absl::StrFormat("mmap of pool '%s' (%d bytes): %s", info.name(),
                        info.size_bytes(), std::strerror(err)));
  }
  return static_cast<uint8_t*>(p);
}

}  // namespace

namespace {

// Every live mapping of the process, by path (unique per daemon instance
// and pool). Locked across fork() with the mappings (PrepareFork).
std::mutex& RegistryMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}
absl::flat_hash_map<std::string, std::weak_ptr<PoolMapping>>& Registry() {
  static auto* mappings =
      new absl::flat_hash_map<std::string, std::weak_ptr<PoolMapping>>();
  return *mappings;
}
// The mappings PrepareFork locked, kept alive until AfterFork unlocks them.
std::vector<std::shared_ptr<PoolMapping>>* forking = nullptr;

}  // namespace

void PoolMapping::PrepareFork() {
  RegistryMutex().lock();
  auto* held = new std::vector<std::shared_ptr<PoolMapping>>();
  for (auto& [path, weak] : Registry()) {
    if (std::shared_ptr<PoolMapping> m = weak.lock()) {
      m->mu_.lock();
      held->push_back(std::move(m));
    }
  }
  forking = held;
}

void PoolMapping::AfterFork() {
  std::vector<std::shared_ptr<PoolMapping>>* held = forking;
  forking = nullptr;
  for (const std::shared_ptr<PoolMapping>& m : *held) m->mu_.unlock();
  RegistryMutex().unlock();
  delete held;  // May unmap a mapping whose last other holder let go.
}

absl::StatusOr<std::shared_ptr<PoolMapping>> PoolMapping::Get(
    const v1::PoolInfo& info) {
  if (info.kind() != v1::MEMORY_KIND_HOST) {
    return absl::UnimplementedError(absl::StrFormat(
        "pool '%s' is of memory kind %d, which this client cannot map",
        info.name(), info.kind()));
  }
  static std::once_flag fork_handlers;
  std::call_once(fork_handlers,
                 [] { pthread_atfork(PrepareFork, AfterFork, AfterFork); });
  const std::string path = PoolPath(info);
  std::lock_guard<std::mutex> lock(RegistryMutex());
  std::weak_ptr<PoolMapping>& slot = Registry()[path];
  if (std::shared_ptr<PoolMapping> live = slot.lock()) return live;
  absl::StatusOr<uint8_t*> ro = MapShm(info, false);
  if (!ro.ok()) {
    Registry().erase(path);
    return ro.status();
  }
  std::shared_ptr<PoolMapping> mapping(new PoolMapping(info, *ro));
  slot = mapping;
  return mapping;
}

PoolMapping::~PoolMapping() {
  munmap(ro_, info_.size_bytes());
  if (rw_ != nullptr) munmap(rw_, info_.size_bytes());
  if (rw_fd_ >= 0) close(rw_fd_);
}

absl::StatusOr<uint8_t*> PoolMapping::Protect(uint64_t offset,
                                              uint64_t capacity,
                                              Access access) {
  const uint64_t page = info_.page_size();
  if (offset % page != 0 || capacity % page != 0 ||
      offset > info_.size_bytes() || capacity > info_.size_bytes() - offset) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "range [%d, +%d) is not a page-aligned range of pool '%s' (%d bytes)",
        offset, capacity, info_.name(), info_.size_bytes()));
  }
  const uint64_t end = offset + capacity;
  {
    // One lock per call: first use of the writable mapping, then the set.
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = EnsureWritableLocked(); !s.ok()) return s;
    if (capacity == 0) return rw_ + offset;
    if (access == Access::kReadWrite) {
      if (open_.Covers(offset, end)) return rw_ + offset;
    } else {
      // Forget the range before it closes: a concurrent opener of memory
      // that overlaps it (none can, while this lease holds it) must not
      // skip its mprotect on the strength of this range.
      open_.Remove(offset, end);
    }
  }
  const int prot =
      access == Access::kReadWrite ? PROT_READ | PROT_WRITE : PROT_READ;
  protect_calls_.fetch_add(1, std::memory_order_relaxed);
  if (mprotect(rw_ + offset, capacity, prot) != 0) {
    return absl::InternalError(
        absl::StrFormat("mprotect of [%d, +%d) in pool '%s': %s", offset,
                        capacity, info_.name(), std::strerror(errno)));
  }
  if (access == Access::kReadWrite) {
    std::lock_guard<std::mutex> lock(mu_);
    open_.Add(offset, end);
  }
  return rw_ + offset;
}

void PoolMapping::MarkExposed(uint64_t offset, uint64_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  exposed_.Add(offset, offset + capacity);
}

bool PoolMapping::Exposed(uint64_t offset, uint64_t capacity) const {
  std::lock_guard<std::mutex> lock(mu_);
  return exposed_.Intersects(offset, offset + capacity);
}

absl::Status PoolMapping::EnsureWritableLocked() {
  if (!rw_tried_) {
    rw_tried_ = true;
    absl::StatusOr<uint8_t*> rw = MapShm(info_, true, &rw_fd_);
    if (rw.ok()) {
      rw_ = *rw;
    } else {
      rw_status_ = rw.status();
    }
  }
  return rw_ != nullptr ? absl::OkStatus() : rw_status_;
}

absl::Status PoolMapping::Write(uint64_t offset, const void* data,
                                uint64_t size) {
  if (offset > info_.size_bytes() || size > info_.size_bytes() - offset) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "write of %d bytes at %d is outside pool '%s' (%d bytes)", size, offset,
        info_.name(), info_.size_bytes()));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = EnsureWritableLocked(); !s.ok()) return s;
  }
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = pwrite(rw_fd_, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(absl::StrFormat(
          "pwrite into pool '%s' at %d: %s", info_.name(), offset,
          n < 0 ? std::strerror(errno) : "wrote nothing"));
    }
    p += n;
    offset += n;
    size -= n;
  }
  return absl::OkStatus();
}

}  // namespace shmtensor::internal
