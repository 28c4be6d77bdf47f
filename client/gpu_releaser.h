// Releases the leases of CUDA objects once the GPU is done with them.
//
// A view of a CUDA object may still be read by kernels queued on the
// consumer's streams when its last reference dies on the host. Releasing the
// lease then would let the daemon hand the memory to a new producer while
// those kernels run (docs/pitfalls.md P12). So the last reference records a
// fence (events on the streams that used the object) and hands it here; a
// thread waits for each fence and only then sends the release. The releasing
// thread never blocks on the GPU.
//
// Ownership: owned by the ClientCore whose leases it releases; its
// destructor waits for every pending fence and sends those releases, so
// nothing is dropped by the daemon (at the session's end) while the GPU may
// still use it.
//
// Thread safety: thread-safe.
#ifndef SHMTENSOR_CLIENT_GPU_RELEASER_H_
#define SHMTENSOR_CLIENT_GPU_RELEASER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "client/cuda_api.h"

namespace shmtensor::internal {

class GpuReleaser {
 public:
  // `release` sends the release of one lease (ClientCore::ReleaseLease).
  explicit GpuReleaser(std::function<void(uint64_t)> release)
      : release_(std::move(release)) {}
  // Drains: waits for every pending fence, sends those releases, joins.
  ~GpuReleaser();
  GpuReleaser(const GpuReleaser&) = delete;
  GpuReleaser& operator=(const GpuReleaser&) = delete;

  // Releases `lease_id` once `fence` has completed. Fences are waited for in
  // the order they came. Starts the thread on first use.
  void ReleaseAfter(cuda::Fence fence, uint64_t lease_id);
  // Blocks until every release handed in so far was sent.
  void Flush();

 private:
  void Run();

  const std::function<void(uint64_t)> release_;
  absl::Mutex mu_;
  std::deque<std::pair<cuda::Fence, uint64_t>> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t queued_ ABSL_GUARDED_BY(mu_) = 0;  // Handed in, ever.
  uint64_t sent_ ABSL_GUARDED_BY(mu_) = 0;    // Released, ever.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // Started under mu_ on first use.
};

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_GPU_RELEASER_H_
