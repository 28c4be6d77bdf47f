// Where an object's bytes live, and the CUDA stream type of the API.
#ifndef SHMTENSOR_COMMON_INCLUDE_SHMTENSOR_DEVICE_H_
#define SHMTENSOR_COMMON_INCLUDE_SHMTENSOR_DEVICE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace shmtensor {

// The memory an object lives in: host shared memory, or the memory of one
// CUDA device (a pool of kind "cuda").
struct Device {
  enum class Kind { kHost, kCuda };
  Kind kind = Kind::kHost;
  int index = 0;  // The CUDA device ordinal (as the daemon numbers it); 0 for
                  // the host.

  static Device Host() { return {}; }
  static Device Cuda(int index) { return {Kind::kCuda, index}; }
  bool is_cuda() const { return kind == Kind::kCuda; }
  bool operator==(const Device& o) const {
    return kind == o.kind && index == o.index;
  }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

// "cpu" or "cuda:N" (torch's spelling).
std::string DeviceName(const Device& d);
// Parses "cpu", "cuda" (device 0) and "cuda:N". INVALID_ARGUMENT naming the
// text otherwise.
absl::StatusOr<Device> ParseDevice(const std::string& text);

// A cudaStream_t, as an integer so that this header needs no CUDA headers.
// The values follow cudart and DLPack: 0 or 1 is the legacy default stream,
// 2 the per-thread default stream, anything else a stream handle.
using CudaStream = uintptr_t;
inline constexpr CudaStream kLegacyDefaultStream = 0;

}  // namespace shmtensor

#endif  // SHMTENSOR_COMMON_INCLUDE_SHMTENSOR_DEVICE_H_
