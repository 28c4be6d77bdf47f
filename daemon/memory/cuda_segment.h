// CUDA device segment: one cudaMalloc per pool, shared with clients by one
// CUDA IPC memory handle. Objects are offsets inside it, so a client opens
// the handle once per process and pool (cudaIpcOpenMemHandle), never per
// object (P13).
//
// Built only with SHMTENSOR_WITH_CUDA (the CUDA toolkit found at configure
// time; cudart linked statically, so the daemon needs no CUDA library path at
// run time). Without it, or on a machine without a usable GPU, Create fails
// with UNAVAILABLE and says why; the daemon then serves its other pools and
// reports the CUDA pool as unavailable.
//
// Thread safety: immutable after Create.
#ifndef SHMTENSOR_DAEMON_MEMORY_CUDA_SEGMENT_H_
#define SHMTENSOR_DAEMON_MEMORY_CUDA_SEGMENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/memory/segment.h"

namespace shmtensor::daemon {

// Allocation granule and alignment of objects in a CUDA pool.
inline constexpr uint64_t kCudaAlignment = 256;

class CudaSegment final : public Segment {
 public:
  // Allocates `size_bytes` (> 0, rounded up to kCudaAlignment) on `device`
  // and exports its IPC handle. UNAVAILABLE when this build has no CUDA, no
  // driver or no such device is present (the message names the device and
  // the CUDA error); RESOURCE_EXHAUSTED when the device lacks the memory.
  static absl::StatusOr<std::unique_ptr<CudaSegment>> Create(
      int device, uint64_t size_bytes);

  // What this process can see: "N CUDA devices" or why none is usable.
  static std::string DescribeDevices();

  // Frees the device memory. Clients that opened the handle keep their
  // mapping until they close it (the driver frees the memory after both).
  ~CudaSegment() override;

  CudaSegment(const CudaSegment&) = delete;
  CudaSegment& operator=(const CudaSegment&) = delete;

  v1::MemoryKind kind() const override { return v1::MEMORY_KIND_CUDA_DEVICE; }
  // The cudaIpcMemHandle_t, 64 raw bytes.
  const std::string& handle() const override { return ipc_handle_; }
  uint64_t size_bytes() const override { return size_bytes_; }
  // cudaMemset on the daemon's own allocation, then a device sync.
  absl::Status Clear(uint64_t offset, uint64_t length) const override;
  uint64_t page_size() const override { return kCudaAlignment; }
  uint64_t huge_page_size() const override { return 0; }
  int cuda_device() const override { return device_; }

 private:
  CudaSegment(int device, void* base, uint64_t size_bytes, std::string handle)
      : device_(device),
        base_(base),
        size_bytes_(size_bytes),
        ipc_handle_(std::move(handle)) {}

  const int device_;
  void* const base_;  // Device pointer from cudaMalloc.
  const uint64_t size_bytes_;
  const std::string ipc_handle_;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_MEMORY_CUDA_SEGMENT_H_
