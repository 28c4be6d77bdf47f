// The client's one adapter over the CUDA runtime (cudart, linked statically
// when built with SHMTENSOR_WITH_CUDA). Everything the client does on a GPU
// goes through here, and every failure comes back as an absl::Status naming
// the call, the device and CUDA's error. Built without CUDA, every call fails
// UNIMPLEMENTED saying so.
//
// Calls that need a device make it current for their own duration and
// restore the caller's current device before returning, so a client never
// changes the device a framework (torch) had selected on the thread.
//
// Thread safety: thread-safe (as cudart).
#ifndef SHMTENSOR_CLIENT_CUDA_API_H_
#define SHMTENSOR_CLIENT_CUDA_API_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shmtensor/device.h"

namespace shmtensor::internal::cuda {

// True when this client was built with CUDA support.
bool Built();

// Maps the memory that another process exported with cudaIpcGetMemHandle
// (`handle`: the 64 bytes of a cudaIpcMemHandle_t) on `device`; returns its
// base address in this process. cudaIpcOpenMemHandle is expensive (it maps
// the whole allocation): callers open each pool once per process.
absl::StatusOr<void*> OpenMemHandle(int device, const std::string& handle);
// Unmaps what OpenMemHandle returned.
void CloseMemHandle(int device, void* base);

// Copies `bytes` from `src` to `dst`, either of which may be host or device
// memory (unified addressing), queued on `stream` of `device` after the work
// already queued there, and waits until the copy is done.
absl::Status CopyAndWait(int device, void* dst, const void* src, uint64_t bytes,
                         CudaStream stream);

// Waits until the work queued on `stream` of `device` is done; for
// kLegacyDefaultStream, until all work of this process on `device` is done
// (cudaDeviceSynchronize), which is what a producer that names no stream
// needs before its object is published.
absl::Status WaitForStream(int device, CudaStream stream);

// Events recorded now on each of `streams` of `device`: they complete when
// the work queued on those streams so far is done.
class Fence {
 public:
  // Records one event per stream (duplicates skipped).
  static absl::StatusOr<Fence> Record(int device,
                                      const std::vector<CudaStream>& streams);
  Fence() = default;
  Fence(Fence&& o) noexcept
      : device_(o.device_), events_(std::move(o.events_)) {
    o.events_.clear();
  }
  Fence& operator=(Fence&& o) noexcept;
  ~Fence();
  // Blocks until every event has completed. Errors: CUDA's (e.g. a context
  // that was torn down), in which case the work is gone too.
  absl::Status Wait();

 private:
  int device_ = 0;
  std::vector<uintptr_t> events_;  // cudaEvent_t values.
};

}  // namespace shmtensor::internal::cuda

#endif  // SHMTENSOR_CLIENT_CUDA_API_H_
