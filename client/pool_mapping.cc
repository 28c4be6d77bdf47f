#include "client/pool_mapping.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace shmtensor::internal {
namespace {

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

// Writable use of a pool this process received only O_RDONLY descriptors of.
absl::Status ReadOnlyError(const v1::PoolInfo& info) {
  return absl::PermissionDeniedError(absl::StrFormat(
      "this process may only read pool '%s': none of its sessions may write "
      "it",
      info.name()));
}

// Maps `fd` PROT_READ (both mappings: the writable one opens ranges one by
// one).
absl::StatusOr<uint8_t*> MapFd(const v1::PoolInfo& info, int fd) {
  void* p = MapPool(info, fd);
  if (p == MAP_FAILED) {
    return absl::InternalError(
        absl::StrFormat("mmap of pool '%s' (%d bytes): %s", info.name(),
                        info.size_bytes(), std::strerror(errno)));
  }
  return static_cast<uint8_t*>(p);
}

}  // namespace

namespace {

// Every live mapping of the process, by the (device, inode) of its memory:
// one per pool of each daemon instance, whatever descriptor of it a
// session received. Locked across fork() with the mappings (PrepareFork).
using MemoryKey = std::pair<uint64_t, uint64_t>;
std::mutex& RegistryMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}
absl::flat_hash_map<MemoryKey, std::weak_ptr<PoolMapping>>& Registry() {
  static auto* mappings =
      new absl::flat_hash_map<MemoryKey, std::weak_ptr<PoolMapping>>();
  return *mappings;
}
// The mappings PrepareFork locked, kept alive until AfterFork unlocks them.
std::vector<std::shared_ptr<PoolMapping>>* forking = nullptr;
// The ranges RevokeInChild named for this fork: made in the prepare
// handlers (which may allocate), applied in the child's, dropped by both.
struct Revoked {
  PoolMapping* mapping;  // Alive: `forking` holds it.
  uint64_t offset;
  uint64_t capacity;
};
std::vector<Revoked>* revoking = nullptr;

}  // namespace

void PoolMapping::PrepareFork() {
  RegistryMutex().lock();
  auto* held = new std::vector<std::shared_ptr<PoolMapping>>();
  for (auto& [key, weak] : Registry()) {
    if (std::shared_ptr<PoolMapping> m = weak.lock()) {
      m->mu_.lock();
      held->push_back(std::move(m));
    }
  }
  forking = held;
}

void PoolMapping::AfterForkInChild() {
  // [P1, P18] Nothing the parent may write is writable here: an unsealed
  // buffer the parent seals later, a range it left open for its next
  // buffer. One mprotect per pool (a forked child's page tables hold no
  // entry of a shared mapping yet, so it changes nothing there); the open
  // set starts empty, so the child's own writable buffers open their
  // ranges afresh.
  for (const std::shared_ptr<PoolMapping>& m : *forking) {
    if (m->rw_ != nullptr) {
      mprotect(m->rw_, m->info_.size_bytes(), PROT_READ);
      m->open_.Remove(0, m->info_.size_bytes());
    }
    // A child inherits no page-table entry of a shared mapping: its first
    // use of a range fills them again.
    m->filled_.Remove(0, m->info_.size_bytes());
    m->read_filled_.Remove(0, m->info_.size_bytes());
  }
  // A refused fork hold fails closed: what the child inherited of the
  // sessions the daemon pins nothing for faults instead of showing bytes a
  // later put wrote. After the mprotect above, which would undo it.
  if (revoking != nullptr) {
    for (const Revoked& r : *revoking) {
      PoolMapping& m = *r.mapping;
      mprotect(m.ro_ + r.offset, r.capacity, PROT_NONE);
      if (m.rw_ != nullptr) mprotect(m.rw_ + r.offset, r.capacity, PROT_NONE);
      // The child's own clients get a mapping of their own (erasing from
      // the map allocates nothing).
      absl::erase_if(Registry(), [&m](const auto& entry) {
        return entry.second.lock().get() == &m;
      });
    }
  }
  AfterFork();
}

void PoolMapping::RevokeInChild(uint64_t offset, uint64_t capacity) {
  if (capacity == 0 || offset >= info_.size_bytes()) return;
  capacity = std::min(capacity, info_.size_bytes() - offset);
  if (revoking == nullptr) revoking = new std::vector<Revoked>();
  revoking->push_back({this, offset, capacity});
}

void PoolMapping::AfterFork() {
  delete revoking;
  revoking = nullptr;
  std::vector<std::shared_ptr<PoolMapping>>* held = forking;
  forking = nullptr;
  for (const std::shared_ptr<PoolMapping>& m : *held) m->mu_.unlock();
  RegistryMutex().unlock();
  delete held;  // May unmap a mapping whose last other holder let go.
}

bool PoolMapping::Contains(const void* p) {
  const auto* b = static_cast<const uint8_t*>(p);
  std::lock_guard<std::mutex> lock(RegistryMutex());
  for (const auto& [key, weak] : Registry()) {
    std::shared_ptr<PoolMapping> m = weak.lock();
    if (m == nullptr) continue;
    const uint64_t size = m->info_.size_bytes();
    if (b >= m->ro_ && b < m->ro_ + size) return true;
    std::lock_guard<std::mutex> mapping_lock(m->mu_);
    if (m->rw_ != nullptr && b >= m->rw_ && b < m->rw_ + size) return true;
  }
  return false;
}

absl::StatusOr<std::shared_ptr<PoolMapping>> PoolMapping::Get(
    const v1::PoolInfo& info, int fd) {
  // Owns `fd` until it is handed to a mapping.
  struct Owned {
    int fd;
    ~Owned() {
      if (fd >= 0) close(fd);
    }
  } owned{fd};
  if (info.kind() != v1::MEMORY_KIND_HOST) {
    return absl::UnimplementedError(absl::StrFormat(
        "pool '%s' is of memory kind %d, which this client cannot map",
        info.name(), info.kind()));
  }
  struct stat st;
  const int flags = fcntl(fd, F_GETFL);
  if (fstat(fd, &st) != 0 || flags < 0) {
    return absl::InternalError(absl::StrFormat(
        "descriptor of pool '%s': %s", info.name(), std::strerror(errno)));
  }
  if (static_cast<uint64_t>(st.st_size) < info.size_bytes()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "descriptor of pool '%s' holds %d bytes, not the pool's %d",
        info.name(), st.st_size, info.size_bytes()));
  }
  const bool writable = (flags & O_ACCMODE) == O_RDWR;
  static std::once_flag fork_handlers;
  std::call_once(fork_handlers, [] {
    pthread_atfork(PrepareFork, AfterFork, AfterForkInChild);
  });
  const MemoryKey key{static_cast<uint64_t>(st.st_dev),
                      static_cast<uint64_t>(st.st_ino)};
  std::lock_guard<std::mutex> lock(RegistryMutex());
  // Forget the mappings gone (pools of daemons since stopped), so the
  // registry holds only live ones.
  absl::erase_if(Registry(),
                 [](const auto& entry) { return entry.second.expired(); });
  std::weak_ptr<PoolMapping>& slot = Registry()[key];
  if (std::shared_ptr<PoolMapping> live = slot.lock()) {
    std::lock_guard<std::mutex> mapping_lock(live->mu_);
    if (writable && live->rw_fd_ < 0) {
      live->rw_fd_ = owned.fd;
      owned.fd = -1;
    }
    return live;
  }
  absl::StatusOr<uint8_t*> ro = MapFd(info, fd);
  if (!ro.ok()) {
    Registry().erase(key);
    return ro.status();
  }
  std::shared_ptr<PoolMapping> mapping(new PoolMapping(info, *ro, owned.fd));
  if (writable) mapping->rw_fd_ = owned.fd;
  owned.fd = -1;
  slot = mapping;
  return mapping;
}

PoolMapping::~PoolMapping() {
  munmap(ro_, info_.size_bytes());
  if (rw_ != nullptr) munmap(rw_, info_.size_bytes());
  if (rw_fd_ >= 0 && rw_fd_ != ro_fd_) close(rw_fd_);
  close(ro_fd_);
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
  bool open = false;
  bool filled = false;
  {
    // One lock per call: first use of the writable mapping, then the sets.
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = EnsureWritableLocked(); !s.ok()) return s;
    if (capacity == 0) return rw_ + offset;
    if (access == Access::kReadWrite) {
      open = open_.Covers(offset, end);
      filled = filled_.Covers(offset, end);
      if (open && filled) return rw_ + offset;
    } else {
      // Forget the range before it closes: a concurrent opener of memory
      // that overlaps it (none can, while this lease holds it) must not
      // skip its mprotect on the strength of this range.
      open_.Remove(offset, end);
    }
  }
  if (!open) {
    const int prot =
        access == Access::kReadWrite ? PROT_READ | PROT_WRITE : PROT_READ;
    protect_calls_.fetch_add(1, std::memory_order_relaxed);
    if (mprotect(rw_ + offset, capacity, prot) != 0) {
      return absl::InternalError(
          absl::StrFormat("mprotect of [%d, +%d) in pool '%s': %s", offset,
                          capacity, info_.name(), std::strerror(errno)));
    }
  }
  if (access == Access::kRead) return rw_ + offset;
  // Read faults, now that the range is writable: the kernel maps up to 16
  // pages per fault (fault-around), where a write fault maps one, and a
  // shared mapping of tmpfs memory keeps no dirty accounting, so the entries
  // it makes are writable already (half the cost of MADV_POPULATE_WRITE
  // here: docs/performance.md, "Kept puts"). Were they not, a write would
  // take a cheap write-protect fault, as before.
  filled = filled || Populate(rw_ + offset, capacity, MADV_POPULATE_READ);
  std::lock_guard<std::mutex> lock(mu_);
  open_.Add(offset, end);
  if (filled) filled_.Add(offset, end);
  return rw_ + offset;
}

void PoolMapping::FillForRead(uint64_t offset, uint64_t capacity) {
  if (offset > info_.size_bytes() || capacity > info_.size_bytes() - offset ||
      capacity == 0) {
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (read_filled_.Covers(offset, offset + capacity)) return;
  }
  // A range need not be page-aligned here (a view of part of an object):
  // madvise wants its start aligned, and fills whole pages.
  const uint64_t page = std::max<uint64_t>(info_.page_size(), 4096);
  const uint64_t start = offset / page * page;
  if (!Populate(const_cast<uint8_t*>(ro_) + start, offset + capacity - start,
                MADV_POPULATE_READ)) {
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  read_filled_.Add(offset, offset + capacity);
}

bool PoolMapping::Populate(uint8_t* at, uint64_t length, int advice) {
  // Whether this kernel has MADV_POPULATE_* (Linux 5.14): learnt from the
  // first EINVAL, for every mapping of the process.
  static std::atomic<bool> unsupported{false};
  if (unsupported.load(std::memory_order_relaxed)) return false;
  if (madvise(at, length, advice) == 0) return true;
  // EINVAL: no such advice here; anything else (ENOMEM, EFAULT, EINTR):
  // the pages fault in on first touch instead, as without the advice.
  if (errno == EINVAL) unsupported.store(true, std::memory_order_relaxed);
  return false;
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
  if (rw_ != nullptr) return absl::OkStatus();
  if (rw_fd_ < 0) {
    return ReadOnlyError(info_);
  }
  absl::StatusOr<uint8_t*> rw = MapFd(info_, rw_fd_);
  if (!rw.ok()) return rw.status();
  rw_ = *rw;
  return absl::OkStatus();
}

}  // namespace shmtensor::internal
