#include "daemon/host_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/permissions.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "spdlog/spdlog.h"

namespace shmtensor::daemon {
namespace bip = boost::interprocess;

namespace {

std::string RandomHex128() {
  std::random_device rd;
  return absl::StrFormat("%08x%08x%08x%08x", rd(), rd(), rd(), rd());
}

// The one adapter around Boost.Interprocess: creates the shm object and
// returns its file descriptor (a dup the caller owns), or a Status.
absl::StatusOr<int> CreateShm(const std::string& name) {
  try {
    bip::permissions perm;
    perm.set_permissions(0600);
    // Boost takes the name without the leading '/'.
    bip::shared_memory_object shm(bip::create_only, name.c_str() + 1,
                                  bip::read_write, perm);
    const int fd = fcntl(shm.get_mapping_handle().handle, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
      const int e = errno;
      bip::shared_memory_object::remove(name.c_str() + 1);
      return absl::InternalError(absl::StrCat("dup of shared memory '", name,
                                              "': ", std::strerror(e)));
    }
    return fd;
  } catch (const bip::interprocess_exception& e) {
    return absl::InternalError(
        absl::StrCat("cannot create shared memory '", name, "': ", e.what()));
  }
}

// Checks that `directory` is a tmpfs the daemon can create files in.
absl::Status CheckDirectory(const std::string& directory) {
  if (!absl::StartsWith(directory, "/")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool directory '", directory, "' is not an absolute path"));
  }
  struct statfs fs;
  if (statfs(directory.c_str(), &fs) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool directory '", directory, "': ", std::strerror(errno)));
  }
  if (static_cast<uint64_t>(fs.f_type) == HUGETLBFS_MAGIC) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool directory '", directory,
        "' is a hugetlbfs, which shmtensor does not use (no write(2), no "
        "sub-page protection); mount a tmpfs with huge=always instead"));
  }
  if (static_cast<uint64_t>(fs.f_type) != TMPFS_MAGIC) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pool directory '%s' is on a filesystem of type 0x%x, not a tmpfs: "
        "pool memory must never be written back to a disk; use /dev/shm or "
        "a tmpfs mount",
        directory, static_cast<uint64_t>(fs.f_type)));
  }
  return absl::OkStatus();
}

constexpr char kPmdSizeFile[] =
    "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size";

// Size of the PMD-level transparent huge page; NOT_FOUND saying why the
// kernel tells none (no /sys mounted, as in a bare chroot; a kernel without
// transparent huge pages).
absl::StatusOr<uint64_t> PmdHugePageSize() {
  std::ifstream in(kPmdSizeFile);
  if (!in) {
    return absl::NotFoundError(absl::StrFormat(
        "cannot read %s (%s; is /sys mounted?), so the huge-page size is "
        "unknown",
        kPmdSizeFile, std::strerror(errno)));
  }
  uint64_t size = 0;
  in >> size;
  if (!in || size == 0 || (size & (size - 1)) != 0) {
    return absl::NotFoundError(absl::StrFormat(
        "%s holds no power-of-two size, so the huge-page size is unknown",
        kPmdSizeFile));
  }
  return size;
}

// Maps the first `huge` bytes of `fd` at a `huge`-aligned address, faults
// them in and asks /proc/self/smaps whether the kernel mapped them with a
// huge-page entry: true when the tmpfs backs the file with huge pages.
bool ProbeHugePages(int fd, uint64_t huge) {
  void* reserve = mmap(nullptr, 2 * huge, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserve == MAP_FAILED) return false;
  const uintptr_t aligned =
      (reinterpret_cast<uintptr_t>(reserve) + huge - 1) & ~(huge - 1);
  void* p = mmap(reinterpret_cast<void*>(aligned), huge, PROT_READ,
                 MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd, 0);
  bool huge_mapped = false;
  if (p != MAP_FAILED) {
    std::ifstream smaps("/proc/self/smaps");
    const std::string head = absl::StrFormat("%x-", aligned);
    bool in_vma = false;
    for (std::string line; std::getline(smaps, line);) {
      if (absl::StartsWith(line, head)) {
        in_vma = true;
        continue;
      }
      if (!in_vma) continue;
      absl::string_view rest = line;
      if (absl::ConsumePrefix(&rest, "ShmemPmdMapped:") ||
          absl::ConsumePrefix(&rest, "FilePmdMapped:")) {
        rest = absl::StripAsciiWhitespace(rest);
        absl::ConsumeSuffix(&rest, "kB");
        uint64_t kb = 0;
        if (absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &kb) && kb > 0)
          huge_mapped = true;
      } else if (absl::StartsWith(line, "VmFlags:")) {
        break;  // The last line of this mapping's entry.
      }
    }
  }
  munmap(reserve, 2 * huge);  // Also unmaps the fixed mapping inside it.
  return huge_mapped;
}

// Writes zeros over [0, size) of `fd` with pwrite(2).
absl::Status ZeroFill(int fd, uint64_t size) {
  const std::vector<char> zeros(uint64_t{1} << 20, 0);
  uint64_t done = 0;
  while (done < size) {
    const size_t chunk =
        static_cast<size_t>(std::min<uint64_t>(zeros.size(), size - done));
    const ssize_t n = pwrite(fd, zeros.data(), chunk, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = n < 0 ? errno : EIO;
      if (e == ENOSPC || e == ENOMEM) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "zeroing at %d of %d bytes: %s", done, size, std::strerror(e)));
      }
      return absl::InternalError(absl::StrFormat(
          "zeroing at %d of %d bytes: %s", done, size, std::strerror(e)));
    }
    done += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostSegment>> HostSegment::Create(
    const HostSegmentOptions& options) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (options.size_bytes == 0) {
    return absl::InvalidArgumentError("pool size must be > 0 bytes");
  }
  if (options.size_bytes > UINT64_MAX / 2) {
    return absl::InvalidArgumentError(
        absl::StrFormat("pool size %d bytes is too large", options.size_bytes));
  }
  const std::string& dir = options.directory;
  if (absl::Status s = CheckDirectory(dir); !s.ok()) return s;
  const uint64_t size_bytes = (options.size_bytes + page - 1) / page * page;
  const std::string base = absl::StrCat(options.name_prefix, RandomHex128());
  const bool in_shm = dir == kShmDirectory;
  const std::string path = absl::StrCat(absl::StripSuffix(dir, "/"), "/", base);
  const std::string shm_name = in_shm ? absl::StrCat("/", base) : "";
  int fd;
  if (in_shm) {
    absl::StatusOr<int> shm = CreateShm(shm_name);
    if (!shm.ok()) return shm.status();
    fd = *shm;
  } else {
    fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
              0600);
    if (fd < 0) {
      return absl::InternalError(absl::StrFormat(
          "cannot create pool file %s: %s", path, std::strerror(errno)));
    }
  }
  // Undoes the creation on every failure below.
  auto fail = [&](absl::Status status) {
    unlink(path.c_str());
    close(fd);
    return status;
  };
  // Before the file gets a size: a size without the lock means an orphan
  // (see RemoveOrphans). Blocks only while a RemoveOrphans looks at it.
  while (flock(fd, LOCK_SH) != 0) {
    if (errno != EINTR) {
      return fail(absl::InternalError(
          absl::StrFormat("flock(%s): %s", path, std::strerror(errno))));
    }
  }
  // Boost and open(2) apply the umask; make the permissions exact.
  if (options.gid >= 0 && fchown(fd, static_cast<uid_t>(-1), options.gid)) {
    return fail(absl::PermissionDeniedError(
        absl::StrFormat("cannot give pool segment %s group %d: %s", path,
                        options.gid, std::strerror(errno))));
  }
  fchmod(fd, options.gid >= 0 ? 0660 : 0600);
  // The size first (tmpfs huge=within_size allocates huge pages only inside
  // it), then posix_fallocate, which both reserves tmpfs pages (ENOSPC now,
  // not SIGBUS later) and allocates them, so no client ever faults a fresh
  // page in.
  if (ftruncate(fd, static_cast<off_t>(size_bytes)) != 0) {
    return fail(
        absl::InternalError(absl::StrFormat("ftruncate(%s, %d bytes): %s", path,
                                            size_bytes, std::strerror(errno))));
  }
  const int err = posix_fallocate(fd, 0, static_cast<off_t>(size_bytes));
  if (err == ENOSPC || err == ENOMEM) {
    return fail(absl::ResourceExhaustedError(absl::StrFormat(
        "cannot reserve %d bytes for a pool in %s: %s; free space in %s or "
        "start with a smaller --pool-size",
        size_bytes, dir, std::strerror(err), dir)));
  }
  if (err != 0) {
    return fail(absl::InternalError(
        absl::StrFormat("posix_fallocate(%s, %d bytes): %s", path, size_bytes,
                        std::strerror(err))));
  }
  // tmpfs leaves fallocated pages unwritten, to be zeroed by whoever first
  // touches them; that would land on a client's data path (a 2 MiB huge
  // page, zeroed and, on a VM, backed by the host, costs milliseconds).
  // Zero every page now, through the file (no mapping, no page table).
  if (absl::Status s = ZeroFill(fd, size_bytes); !s.ok()) {
    return fail(absl::Status(
        s.code(), absl::StrCat("pool file ", path, ": ", s.message())));
  }
  uint64_t huge = 0;
  if (options.huge_pages != HugePages::kOff) {
    const absl::StatusOr<uint64_t> pmd = PmdHugePageSize();
    if (!pmd.ok()) {
      if (options.huge_pages == HugePages::kRequire) {
        return fail(absl::FailedPreconditionError(absl::StrFormat(
            "pool directory %s: huge_pages = \"require\", but %s", dir,
            pmd.status().message())));
      }
      spdlog::info("pool file {}: {}; serving 4 KiB pages", path,
                   std::string(pmd.status().message()));
    } else if (*pmd > page && size_bytes >= *pmd && ProbeHugePages(fd, *pmd)) {
      huge = *pmd;
    }
    if (huge == 0 && options.huge_pages == HugePages::kRequire) {
      return fail(absl::FailedPreconditionError(absl::StrFormat(
          "pool directory %s gives no huge pages to a %d-byte pool (huge_pages "
          "= \"require\"): mount a tmpfs there with huge=always, e.g. "
          "'mount -t tmpfs -o huge=always,size=SIZE,mode=1777 shmtensor %s'",
          dir, size_bytes, dir)));
    }
  }
  return std::unique_ptr<HostSegment>(
      new HostSegment(shm_name, path, fd, size_bytes, page, huge));
}

int HostSegment::RemoveOrphans(const std::string& directory,
                               const std::string& name_prefix) {
  int removed = 0;
  DIR* dir = opendir(directory.c_str());
  if (dir == nullptr) return 0;
  const int dir_fd = dirfd(dir);
  while (struct dirent* entry = readdir(dir)) {
    if (!absl::StartsWith(entry->d_name, name_prefix)) continue;
    const int fd = openat(dir_fd, entry->d_name,
                          O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat locked, named;
    // Exclusively lockable: no daemon holds it. With a size: its daemon had
    // locked it, so it is not one being created right now either. Still the
    // file at that name: not replaced meanwhile.
    if (flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &locked) == 0 &&
        S_ISREG(locked.st_mode) && locked.st_size > 0 &&
        fstatat(dir_fd, entry->d_name, &named, AT_SYMLINK_NOFOLLOW) == 0 &&
        named.st_dev == locked.st_dev && named.st_ino == locked.st_ino &&
        unlinkat(dir_fd, entry->d_name, 0) == 0) {
      ++removed;
    }
    close(fd);
  }
  closedir(dir);
  return removed;
}

HostSegment::~HostSegment() {
  unlink(path_.c_str());
  close(lock_fd_);  // Drops the lock, after the name is gone.
}

}  // namespace shmtensor::daemon
