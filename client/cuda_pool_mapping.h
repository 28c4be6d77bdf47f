// A client process's mapping of one CUDA pool: the daemon's single
// cudaMalloc of the pool, opened here with cudaIpcOpenMemHandle once per
// process (however many clients and objects use it) and closed when the
// last holder lets go. An object of the pool is an offset into this mapping,
// so a Get costs no CUDA call at all (docs/pitfalls.md P13).
//
// A CUDA mapping does not survive fork(): a child's clients open their own,
// and the parent's, inherited, is never touched in the child.
//
// Opened on first use, not at connect: opening creates this process's CUDA
// context on the device, which a client that uses only host pools must not
// pay for (or fail on, on a machine without a GPU).
//
// Device memory has no page protection: a sealed object's bytes are not
// write-protected on the GPU the way a host pool's are. The contract there
// is the API's (read-only views, ReadOnlyTensor in Python), not the MMU's.
//
// Thread safety: thread-safe.
#ifndef SHMTENSOR_CLIENT_CUDA_POOL_MAPPING_H_
#define SHMTENSOR_CLIENT_CUDA_POOL_MAPPING_H_

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "shmtensor/v1/shmtensor.pb.h"

namespace shmtensor::internal {

class CudaPoolMapping {
 public:
  // The process's mapping of the pool, opened on the first call and shared
  // by every client of the process while any holds it. FAILED_PRECONDITION
  // for a pool that is not of kind CUDA; CUDA's error (UNAVAILABLE without a
  // usable device, UNIMPLEMENTED when built without CUDA) naming the pool.
  static absl::StatusOr<std::shared_ptr<CudaPoolMapping>> Get(
      const v1::PoolInfo& info);
  // How many times this process has opened a CUDA pool (for tests: one per
  // pool, never one per object).
  static uint64_t opens();
  ~CudaPoolMapping();

  CudaPoolMapping(const CudaPoolMapping&) = delete;
  CudaPoolMapping& operator=(const CudaPoolMapping&) = delete;

  const v1::PoolInfo& info() const { return info_; }
  int device() const { return info_.cuda_device(); }
  // The device address of the pool's first byte in this process.
  uint8_t* base() const { return base_; }

 private:
  CudaPoolMapping(v1::PoolInfo info, uint8_t* base)
      : info_(std::move(info)), base_(base), owner_pid_(getpid()) {}

  const v1::PoolInfo info_;
  uint8_t* const base_;
  const pid_t owner_pid_;  // The process that opened it.
};

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_CUDA_POOL_MAPPING_H_
