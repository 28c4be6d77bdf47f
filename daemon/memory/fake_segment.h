// A Segment of offsets only, for tests and fuzzers that run the store
// without shared memory: it has no bytes, so Clear has nothing to do. It
// stands for host memory, or with Cuda() for the memory of a CUDA device.
//
// Thread safety: immutable.
#ifndef SHMTENSOR_DAEMON_MEMORY_FAKE_SEGMENT_H_
#define SHMTENSOR_DAEMON_MEMORY_FAKE_SEGMENT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "daemon/memory/segment.h"

namespace shmtensor::daemon {

class FakeSegment final : public Segment {
 public:
  explicit FakeSegment(uint64_t size, uint64_t huge_page_size = 0,
                       uint64_t page_size = 4096)
      : size_(size), huge_(huge_page_size), page_(page_size) {}
  // A segment that says it is on CUDA device `device`.
  static std::unique_ptr<FakeSegment> Cuda(uint64_t size, int device) {
    auto s = std::make_unique<FakeSegment>(size, 0, 256);
    s->cuda_device_ = device;
    return s;
  }
  v1::MemoryKind kind() const override {
    return cuda_device_ < 0 ? v1::MEMORY_KIND_HOST
                            : v1::MEMORY_KIND_CUDA_DEVICE;
  }
  int cuda_device() const override { return cuda_device_; }
  const std::string& handle() const override { return handle_; }
  uint64_t size_bytes() const override { return size_; }
  uint64_t page_size() const override { return page_; }
  uint64_t huge_page_size() const override { return huge_; }
  absl::Status Clear(uint64_t, uint64_t) const override {
    return absl::OkStatus();
  }

 private:
  uint64_t size_;
  uint64_t huge_;
  uint64_t page_;
  int cuda_device_ = -1;
  std::string handle_;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_MEMORY_FAKE_SEGMENT_H_
