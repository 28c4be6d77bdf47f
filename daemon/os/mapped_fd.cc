#include "daemon/os/mapped_fd.h"

#include <sys/mman.h>

#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/mapped_region.hpp>
#include <utility>

#include "absl/strings/str_format.h"

namespace shmtensor::daemon {
namespace {

namespace bip = boost::interprocess;

// The MemoryMappable concept over a descriptor the caller owns.
class FdMappable {
 public:
  explicit FdMappable(int fd) : fd_(fd) {}
  bip::mapping_handle_t get_mapping_handle() const {
    return bip::ipcdetail::mapping_handle_from_file_handle(fd_);
  }

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<MappedFd> MappedFd::Map(int fd, uint64_t offset, size_t size,
                                       Options options) {
  if (size == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot map 0 bytes of descriptor %d", fd));
  }
  try {
    // Boost XORs MAP_SHARED into the flags itself.
    const bip::map_options_t flags = options.extra_flags == 0
                                         ? bip::default_map_options
                                         : options.extra_flags;
    auto region = std::make_unique<bip::mapped_region>(
        FdMappable(fd), options.writable ? bip::read_write : bip::read_only,
        static_cast<bip::offset_t>(offset), size, options.address, flags);
    return MappedFd(std::move(region));
  } catch (const bip::interprocess_exception& e) {
    return absl::InternalError(
        absl::StrFormat("cannot map %d bytes at offset %d of descriptor %d: %s",
                        size, offset, fd, e.what()));
  }
}

MappedFd::MappedFd(std::unique_ptr<bip::mapped_region> r)
    : region_(std::move(r)) {}
MappedFd::MappedFd(MappedFd&&) noexcept = default;
MappedFd& MappedFd::operator=(MappedFd&&) noexcept = default;
MappedFd::~MappedFd() = default;

void* MappedFd::data() const { return region_->get_address(); }
size_t MappedFd::size() const { return region_->get_size(); }

}  // namespace shmtensor::daemon
