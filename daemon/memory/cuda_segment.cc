#include "daemon/memory/cuda_segment.h"

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

#ifdef SHMTENSOR_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace shmtensor::daemon {

#ifdef SHMTENSOR_WITH_CUDA

namespace {

std::string CudaError(cudaError_t e) {
  return absl::StrFormat("%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
}

}  // namespace

std::string CudaSegment::DescribeDevices() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return "no usable CUDA device: " + CudaError(e);
  return absl::StrFormat("%d CUDA device%s", n, n == 1 ? "" : "s");
}

absl::StatusOr<std::unique_ptr<CudaSegment>> CudaSegment::Create(
    int device, uint64_t size_bytes) {
  if (size_bytes == 0) {
    return absl::InvalidArgumentError("pool size must be > 0 bytes");
  }
  size_bytes = (size_bytes + kCudaAlignment - 1) & ~(kCudaAlignment - 1);
  int n = 0;
  if (cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess) {
    return absl::UnavailableError(absl::StrFormat(
        "CUDA pools are unavailable: no usable CUDA device: %s", CudaError(e)));
  }
  if (device < 0 || device >= n) {
    return absl::UnavailableError(
        absl::StrFormat("CUDA pools are unavailable on device %d: this "
                        "machine has %d CUDA device%s",
                        device, n, n == 1 ? "" : "s"));
  }
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrFormat("cudaSetDevice(%d): %s", device, CudaError(e)));
  }
  void* base = nullptr;
  if (cudaError_t e = cudaMalloc(&base, size_bytes); e != cudaSuccess) {
    const std::string why =
        absl::StrFormat("cudaMalloc(%d bytes) on device %d: %s", size_bytes,
                        device, CudaError(e));
    return e == cudaErrorMemoryAllocation ? absl::ResourceExhaustedError(why)
                                          : absl::InternalError(why);
  }
  cudaIpcMemHandle_t handle;
  if (cudaError_t e = cudaIpcGetMemHandle(&handle, base); e != cudaSuccess) {
    cudaFree(base);
    return absl::UnavailableError(absl::StrFormat(
        "cudaIpcGetMemHandle on device %d: %s", device, CudaError(e)));
  }
  return std::unique_ptr<CudaSegment>(new CudaSegment(
      device, base, size_bytes,
      std::string(reinterpret_cast<const char*>(&handle), sizeof(handle))));
}

absl::Status CudaSegment::Clear(uint64_t offset, uint64_t length) const {
  if (offset > size_bytes_ || length > size_bytes_ - offset) {
    return absl::InternalError(
        absl::StrFormat("clearing [%d, +%d) outside a CUDA pool of %d bytes",
                        offset, length, size_bytes_));
  }
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
    return absl::InternalError(
        absl::StrFormat("cudaSetDevice(%d): %s", device_, CudaError(e)));
  }
  char* p = static_cast<char*>(base_) + offset;
  if (cudaError_t e = cudaMemset(p, 0, length); e != cudaSuccess) {
    return absl::InternalError(
        absl::StrFormat("cudaMemset(%d bytes) on device %d: %s", length,
                        device_, CudaError(e)));
  }
  // cudaMemset is asynchronous to the host: the range must be zero before
  // the new writer learns of it.
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    return absl::InternalError(absl::StrFormat(
        "cudaDeviceSynchronize on device %d: %s", device_, CudaError(e)));
  }
  return absl::OkStatus();
}

CudaSegment::~CudaSegment() {
  cudaSetDevice(device_);
  cudaFree(base_);
}

#else  // !SHMTENSOR_WITH_CUDA

std::string CudaSegment::DescribeDevices() {
  return "this shmtensord was built without CUDA";
}

absl::StatusOr<std::unique_ptr<CudaSegment>> CudaSegment::Create(
    int device, uint64_t size_bytes) {
  return absl::UnavailableError(
      "CUDA pools are unavailable: this shmtensord was built without CUDA "
      "(configure with the CUDA toolkit present, SHMTENSOR_WITH_CUDA=ON)");
}

absl::Status CudaSegment::Clear(uint64_t, uint64_t) const {
  return absl::UnavailableError("this shmtensord was built without CUDA");
}

CudaSegment::~CudaSegment() = default;

#endif  // SHMTENSOR_WITH_CUDA

}  // namespace shmtensor::daemon
