#include "daemon/memory/host_segment.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "spdlog/spdlog.h"

namespace shmtensor::daemon {

namespace {

#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U  // Linux 6.3; older headers lack it.
#endif

// memfd_create, sealed against exec where the kernel knows how (Linux 6.3+;
// required there under vm.memfd_noexec = 2): pool memory is data only.
int MemfdCreate(const std::string& name) {
  const unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
  const int fd = memfd_create(name.c_str(), flags | MFD_NOEXEC_SEAL);
  if (fd >= 0 || errno != EINVAL) return fd;
  return memfd_create(name.c_str(), flags);
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
        "pool memory must never be written back to a disk; leave the pool "
        "without a directory (a memfd) or use a tmpfs mount",
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

// A number from a one-line file (cgroup's memory.max, memory.current);
// nullopt for "max" or anything unreadable.
std::optional<uint64_t> ReadCount(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  uint64_t v = 0;
  if (!(in >> text) || !absl::SimpleAtoi(text, &v)) return std::nullopt;
  return v;
}

// The value of `key` in a "key value" file (memory.stat), or 0.
uint64_t StatValue(const std::string& path, absl::string_view key) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    absl::string_view rest = line;
    uint64_t v = 0;
    if (absl::ConsumePrefix(&rest, key) && absl::ConsumePrefix(&rest, " ") &&
        absl::SimpleAtoi(rest, &v)) {
      return v;
    }
  }
  return 0;
}

// OK when `size` more bytes of shared memory fit: at most what the kernel
// says is available (MemAvailable), and what the daemon's memory cgroup and
// each of its ancestors leave (pool pages are charged to the daemon, which
// allocates them): limit minus use, not counting inactive file cache, which
// the kernel reclaims first. Neither a memfd nor a cgroup limit gives
// ENOSPC: without this a pool larger than either would be filled page by
// page until the OOM killer ends the daemon. `what` names the pool's kind.
absl::Status CheckMemoryFits(uint64_t size, const char* what) {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "MemAvailable:")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    absl::ConsumeSuffix(&rest, "kB");
    uint64_t kb = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &kb) &&
        size > kb * 1024) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "cannot reserve %d bytes for %s: the system has %d bytes of memory "
          "available (MemAvailable); start with a smaller --pool-size",
          size, what, kb * 1024));
    }
    break;
  }
  // cgroup v2 ("0::/path": memory.max, memory.current) and v1 ("N:...memory
  // ...:/path": memory.limit_in_bytes, memory.usage_in_bytes); a hybrid
  // system lists both. A path not under this mount (a container without a
  // cgroup namespace) is skipped.
  std::ifstream cgroup("/proc/self/cgroup");
  for (std::string line; std::getline(cgroup, line);) {
    const std::vector<std::string> f =
        absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    const bool v2 = f[0] == "0" && f[1].empty();
    const std::vector<std::string> controllers = absl::StrSplit(f[1], ',');
    const bool v1 = std::find(controllers.begin(), controllers.end(),
                              "memory") != controllers.end();
    if (!v1 && !v2) continue;
    const std::string root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    const std::string max_file = v2 ? "memory.max" : "memory.limit_in_bytes";
    const std::string use_file =
        v2 ? "memory.current" : "memory.usage_in_bytes";
    const char* inactive = v2 ? "inactive_file" : "total_inactive_file";
    // The cgroup, then each ancestor up to the root (whose limits bind too).
    for (std::string rel = f[2];;) {
      const std::string dir = absl::StrCat(root, rel);
      const std::optional<uint64_t> max = ReadCount(dir + "/" + max_file);
      // v1 says "no limit" with a number near 2^63.
      if (max.has_value() && *max < (uint64_t{1} << 62)) {
        const uint64_t current = ReadCount(dir + "/" + use_file).value_or(0);
        const uint64_t cache = StatValue(dir + "/memory.stat", inactive);
        const uint64_t used = current > cache ? current - cache : 0;
        const uint64_t room = *max > used ? *max - used : 0;
        if (size > room) {
          return absl::ResourceExhaustedError(absl::StrFormat(
              "cannot reserve %d bytes for %s: the daemon's memory cgroup "
              "(%s) allows %d more bytes (%s %d, in use %d); raise its "
              "memory limit (systemd: MemoryMax=) or start with a smaller "
              "--pool-size",
              size, what, dir, room, max_file, *max, used));
        }
      }
      if (rel.empty() || rel == "/") break;
      const size_t slash = rel.rfind('/');
      rel = slash == std::string::npos ? "" : rel.substr(0, slash);
    }
  }
  return absl::OkStatus();
}

// Writes zeros over [offset, offset + size) of `fd` with pwrite(2).
absl::Status ZeroFill(int fd, uint64_t offset, uint64_t size) {
  // Read-only once made (so any thread may use it); never freed.
  static const std::vector<char>* const kZeros =
      new std::vector<char>(uint64_t{1} << 20, 0);
  const std::vector<char>& zeros = *kZeros;
  uint64_t done = 0;
  while (done < size) {
    const size_t chunk =
        static_cast<size_t>(std::min<uint64_t>(zeros.size(), size - done));
    const ssize_t n =
        pwrite(fd, zeros.data(), chunk, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = n < 0 ? errno : EIO;
      if (e == ENOSPC || e == ENOMEM) {
        return absl::ResourceExhaustedError(
            absl::StrFormat("zeroing at %d of %d bytes from %d: %s", done, size,
                            offset, std::strerror(e)));
      }
      return absl::InternalError(
          absl::StrFormat("zeroing at %d of %d bytes from %d: %s", done, size,
                          offset, std::strerror(e)));
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
  const bool memfd = dir.empty();
  if (!memfd) {
    if (absl::Status s = CheckDirectory(dir); !s.ok()) return s;
  }
  const std::string where = memfd ? std::string("memfd") : dir;
  const uint64_t size_bytes = (options.size_bytes + page - 1) / page * page;
  if (absl::Status s =
          CheckMemoryFits(size_bytes, memfd ? "a memfd pool" : "a pool");
      !s.ok()) {
    return s;
  }
  // Never a name: a memfd has none; an O_TMPFILE file has none, and O_EXCL
  // keeps anyone from giving it one later (linkat through /proc).
  // memfd names are at most 249 bytes; the name is for operators only.
  UniqueFd rw(
      memfd ? MemfdCreate(
                  absl::StrCat("shmtensor:", options.label.substr(0, 200)))
            : open(dir.c_str(), O_TMPFILE | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
  if (!rw.valid()) {
    return absl::InternalError(
        memfd ? absl::StrFormat("memfd_create: %s", std::strerror(errno))
              : absl::StrFormat("cannot create an O_TMPFILE file in %s: %s",
                                dir, std::strerror(errno)));
  }
  const int fd = rw.get();
  // Mode 0600 (open(2) applies the umask, memfd_create gives 0777): no
  // other user can reopen a descriptor of it through /proc.
  if (fchmod(fd, 0600) != 0) {
    return absl::InternalError(absl::StrFormat(
        "fchmod of the pool memory in %s: %s", where, std::strerror(errno)));
  }
  // The size first (tmpfs huge=within_size allocates huge pages only inside
  // it), then posix_fallocate, which both reserves tmpfs pages (ENOSPC now,
  // not SIGBUS later) and allocates them, so no client ever faults a fresh
  // page in.
  if (ftruncate(fd, static_cast<off_t>(size_bytes)) != 0) {
    return absl::InternalError(absl::StrFormat("ftruncate(%s, %d bytes): %s",
                                               where, size_bytes,
                                               std::strerror(errno)));
  }
  const int err = posix_fallocate(fd, 0, static_cast<off_t>(size_bytes));
  if (err == ENOSPC || err == ENOMEM) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "cannot reserve %d bytes for a pool in %s: %s; free memory%s or "
        "start with a smaller --pool-size",
        size_bytes, where, std::strerror(err),
        memfd ? " (or raise the daemon's memory limit)"
              : absl::StrCat(" in ", dir)));
  }
  if (err != 0) {
    return absl::InternalError(
        absl::StrFormat("posix_fallocate(%s, %d bytes): %s", where, size_bytes,
                        std::strerror(err)));
  }
  // tmpfs leaves fallocated pages unwritten, to be zeroed by whoever first
  // touches them; that would land on a client's data path (what it costs:
  // docs/shm_layout.md, "Segments"). Zero every page now, through the file
  // (no mapping, no page table).
  if (absl::Status s = ZeroFill(fd, 0, size_bytes); !s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat("pool memory in ", where, ": ", s.message()));
  }
  if (memfd &&
      fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    return absl::InternalError(absl::StrFormat(
        "sealing the pool memfd's size: %s", std::strerror(errno)));
  }
  // Clients' descriptors are reopens through /proc: make sure one works.
  if (UniqueFd probe(open(absl::StrCat("/proc/self/fd/", fd).c_str(),
                          O_RDONLY | O_CLOEXEC));
      !probe.valid()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot reopen the pool memory through /proc/self/fd/%d: %s (is "
        "/proc mounted?)",
        fd, std::strerror(errno)));
  }
  uint64_t huge = 0;
  if (options.huge_pages != HugePages::kOff) {
    const absl::StatusOr<uint64_t> pmd = PmdHugePageSize();
    if (!pmd.ok()) {
      if (options.huge_pages == HugePages::kRequire) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "pool memory in %s: huge_pages = \"require\", but %s", where,
            pmd.status().message()));
      }
      spdlog::info("pool memory in {}: {}; serving 4 KiB pages", where,
                   std::string(pmd.status().message()));
    } else if (*pmd > page && size_bytes >= *pmd && ProbeHugePages(fd, *pmd)) {
      huge = *pmd;
    }
    if (huge == 0 && options.huge_pages == HugePages::kRequire) {
      if (memfd) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "a %d-byte memfd pool gets no huge pages (huge_pages = "
            "\"require\"): give the pool a directory on a tmpfs mounted "
            "huge=always, e.g. 'mount -t tmpfs -o huge=always,size=SIZE "
            "shmtensor /mnt/shmtensor-huge' and directory = "
            "\"/mnt/shmtensor-huge\"",
            size_bytes));
      }
      return absl::FailedPreconditionError(absl::StrFormat(
          "pool directory %s gives no huge pages to a %d-byte pool (huge_pages "
          "= \"require\"): mount a tmpfs there with huge=always, e.g. "
          "'mount -t tmpfs -o huge=always,size=SIZE,mode=1777 shmtensor %s'",
          dir, size_bytes, dir));
    }
  }
  return std::unique_ptr<HostSegment>(
      new HostSegment(std::move(rw), where, size_bytes, page, huge));
}

absl::StatusOr<std::unique_ptr<HostSegment>> HostSegment::Adopt(
    UniqueFd fd, const std::string& label, uint64_t size_bytes,
    uint64_t page_size, uint64_t huge_page_size) {
  struct stat st;
  struct statfs fs;
  const int flags = fcntl(fd.get(), F_GETFL);
  if (fstat(fd.get(), &st) != 0 || fstatfs(fd.get(), &fs) != 0 || flags < 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("pool '%s': the descriptor handed over: %s", label,
                        std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode) || fs.f_type != TMPFS_MAGIC ||
      st.st_uid != geteuid() || (flags & O_ACCMODE) != O_RDWR ||
      static_cast<uint64_t>(st.st_size) != size_bytes || page_size == 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "pool '%s': the descriptor handed over is not a read-write tmpfs file "
        "of uid %d and %d bytes (uid %d, %d bytes)",
        label, geteuid(), size_bytes, st.st_uid, st.st_size));
  }
  return std::unique_ptr<HostSegment>(
      new HostSegment(std::move(fd), absl::StrCat("adopted ", label),
                      size_bytes, page_size, huge_page_size));
}

absl::Status HostSegment::Clear(uint64_t offset, uint64_t length) const {
  if (offset > size_bytes_ || length > size_bytes_ - offset) {
    return absl::InternalError(
        absl::StrFormat("clearing [%d, +%d) outside %s of %d bytes", offset,
                        length, where_, size_bytes_));
  }
  absl::Status s = ZeroFill(rw_.get(), offset, length);
  if (!s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("clearing ", where_, ": ", s.message()));
  }
  return s;
}

absl::StatusOr<UniqueFd> HostSegment::OpenDescriptor(bool writable) const {
  UniqueFd fd(open(absl::StrCat("/proc/self/fd/", rw_.get()).c_str(),
                   (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC));
  if (!fd.valid()) {
    return absl::InternalError(absl::StrFormat(
        "reopening the pool memory (%s) %s: %s", where_,
        writable ? "read-write" : "read-only", std::strerror(errno)));
  }
  return fd;
}

}  // namespace shmtensor::daemon
