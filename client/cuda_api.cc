#include "client/cuda_api.h"

#include "absl/strings/str_format.h"

#ifdef SHMTENSOR_WITH_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#endif

namespace shmtensor::internal::cuda {

#ifdef SHMTENSOR_WITH_CUDA

namespace {

absl::Status Error(cudaError_t e, const std::string& what) {
  const std::string msg = absl::StrFormat(
      "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
  switch (e) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
      return absl::UnavailableError(msg);
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorInvalidValue:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// Makes `device` current for its lifetime, then restores the caller's.
class DeviceScope {
 public:
  explicit DeviceScope(int device) : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    error_ = previous_ == device ? cudaSuccess : cudaSetDevice(device);
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  // OK, or why the device could not be made current.
  absl::Status status() const {
    return error_ == cudaSuccess
               ? absl::OkStatus()
               : Error(error_, absl::StrFormat("cudaSetDevice(%d)", device_));
  }

 private:
  const int device_;
  int previous_ = -1;
  cudaError_t error_ = cudaSuccess;
};

cudaStream_t AsStream(CudaStream s) {
  return reinterpret_cast<cudaStream_t>(s);
}

}  // namespace

bool Built() { return true; }

absl::StatusOr<void*> OpenMemHandle(int device, const std::string& handle) {
  cudaIpcMemHandle_t h;
  if (handle.size() != sizeof(h)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CUDA IPC handle is %d bytes, expected %d", handle.size(), sizeof(h)));
  }
  std::memcpy(&h, handle.data(), sizeof(h));
  DeviceScope scope(device);
  if (absl::Status s = scope.status(); !s.ok()) return s;
  void* base = nullptr;
  if (cudaError_t e =
          cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess);
      e != cudaSuccess) {
    return Error(e,
                 absl::StrFormat("cudaIpcOpenMemHandle on device %d", device));
  }
  return base;
}

void CloseMemHandle(int device, void* base) {
  DeviceScope scope(device);
  cudaIpcCloseMemHandle(base);
}

absl::Status CopyAndWait(int device, void* dst, const void* src, uint64_t bytes,
                         CudaStream stream) {
  if (bytes == 0) return absl::OkStatus();
  DeviceScope scope(device);
  if (absl::Status s = scope.status(); !s.ok()) return s;
  if (cudaError_t e =
          cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, AsStream(stream));
      e != cudaSuccess) {
    return Error(e, absl::StrFormat("cudaMemcpyAsync of %d bytes to cuda:%d",
                                    bytes, device));
  }
  if (cudaError_t e = cudaStreamSynchronize(AsStream(stream));
      e != cudaSuccess) {
    return Error(e,
                 absl::StrFormat("cudaStreamSynchronize on cuda:%d", device));
  }
  return absl::OkStatus();
}

absl::Status WaitForStream(int device, CudaStream stream) {
  DeviceScope scope(device);
  if (absl::Status s = scope.status(); !s.ok()) return s;
  const cudaError_t e = stream == kLegacyDefaultStream
                            ? cudaDeviceSynchronize()
                            : cudaStreamSynchronize(AsStream(stream));
  if (e != cudaSuccess) {
    return Error(e, absl::StrFormat("waiting for the work on cuda:%d", device));
  }
  return absl::OkStatus();
}

absl::StatusOr<Fence> Fence::Record(int device,
                                    const std::vector<CudaStream>& streams) {
  DeviceScope scope(device);
  if (absl::Status s = scope.status(); !s.ok()) return s;
  Fence f;
  f.device_ = device;
  std::vector<CudaStream> done;
  for (CudaStream s : streams) {
    if (std::find(done.begin(), done.end(), s) != done.end()) continue;
    done.push_back(s);
    cudaEvent_t ev;
    if (cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        e != cudaSuccess) {
      return Error(e, absl::StrFormat("cudaEventCreate on cuda:%d", device));
    }
    f.events_.push_back(reinterpret_cast<uintptr_t>(ev));
    if (cudaError_t e = cudaEventRecord(ev, AsStream(s)); e != cudaSuccess) {
      return Error(e, absl::StrFormat("cudaEventRecord on cuda:%d", device));
    }
  }
  return f;
}

Fence& Fence::operator=(Fence&& o) noexcept {
  std::swap(device_, o.device_);
  std::swap(events_, o.events_);
  return *this;
}

Fence::~Fence() {
  for (uintptr_t ev : events_) {
    cudaEventDestroy(reinterpret_cast<cudaEvent_t>(ev));
  }
}

absl::Status Fence::Wait() {
  absl::Status out;
  for (uintptr_t ev : events_) {
    if (cudaError_t e = cudaEventSynchronize(reinterpret_cast<cudaEvent_t>(ev));
        e != cudaSuccess && out.ok()) {
      out =
          Error(e, absl::StrFormat("cudaEventSynchronize on cuda:%d", device_));
    }
  }
  return out;
}

#else  // !SHMTENSOR_WITH_CUDA

namespace {
absl::Status NotBuilt() {
  return absl::UnimplementedError(
      "this shmtensor client was built without CUDA (SHMTENSOR_WITH_CUDA=OFF)");
}
}  // namespace

bool Built() { return false; }
absl::StatusOr<void*> OpenMemHandle(int, const std::string&) {
  return NotBuilt();
}
void CloseMemHandle(int, void*) {}
absl::Status CopyAndWait(int, void*, const void*, uint64_t, CudaStream) {
  return NotBuilt();
}
absl::Status WaitForStream(int, CudaStream) { return NotBuilt(); }
absl::StatusOr<Fence> Fence::Record(int, const std::vector<CudaStream>&) {
  return NotBuilt();
}
Fence& Fence::operator=(Fence&& o) noexcept {
  std::swap(device_, o.device_);
  std::swap(events_, o.events_);
  return *this;
}
Fence::~Fence() = default;
absl::Status Fence::Wait() { return absl::OkStatus(); }

#endif  // SHMTENSOR_WITH_CUDA

}  // namespace shmtensor::internal::cuda
