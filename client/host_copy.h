// The copy of a put's bytes into host pool memory.
#ifndef SHMTENSOR_CLIENT_HOST_COPY_H_
#define SHMTENSOR_CLIENT_HOST_COPY_H_

#include <cstdint>

namespace shmtensor::internal {

// Copies below this many bytes run on the caller's thread alone.
inline constexpr uint64_t kParallelCopyBytes = uint64_t{16} << 20;
// At most this many threads (the caller's among them) share one copy, each
// with at least kParallelCopyBytes / 2 of it.
inline constexpr int kMaxCopyThreads = 4;

// Copies `size` bytes from `src` to `dst` (host memory; the two do not
// overlap). A copy of kParallelCopyBytes and up is split into page-aligned
// parts copied at once by up to kMaxCopyThreads threads, as many as this
// thread may run on CPUs (sched_getaffinity): one core's stores, not the
// memory, bound a large copy (docs/performance.md, "Large puts": 128 MiB
// in 22-24 ms on one thread, 12-13 ms on two, on the dev VM). The helper
// threads are made and joined within the call, so none outlives it (a
// fork never finds one); a part whose thread cannot be made is copied by
// the caller. Thread-safe.
void CopyHost(void* dst, const void* src, uint64_t size);

// How many threads CopyHost uses for `size` bytes when the caller may run
// on `cpus` CPUs (for tests).
int CopyThreadsFor(uint64_t size, int cpus);

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_HOST_COPY_H_
