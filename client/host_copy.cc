#include "client/host_copy.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <system_error>
#include <thread>
#include <vector>

namespace shmtensor::internal {
namespace {

constexpr uint64_t kPage = 4096;

int CallerCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

}  // namespace

int CopyThreadsFor(uint64_t size, int cpus) {
  if (size < kParallelCopyBytes || cpus < 2) return 1;
  const uint64_t by_size = size / (kParallelCopyBytes / 2);
  return static_cast<int>(std::min<uint64_t>(
      {by_size, static_cast<uint64_t>(cpus), uint64_t{kMaxCopyThreads}}));
}

void CopyHost(void* dst, const void* src, uint64_t size) {
  const int threads =
      size < kParallelCopyBytes ? 1 : CopyThreadsFor(size, CallerCpus());
  if (threads <= 1) {
    std::memcpy(dst, src, size);
    return;
  }
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  const uint64_t part = size / threads / kPage * kPage;
  std::vector<std::thread> helpers;
  helpers.reserve(threads - 1);
  for (int i = 1; i < threads; ++i) {
    const uint64_t from = part * i;
    const uint64_t len = i == threads - 1 ? size - from : part;
    try {
      helpers.emplace_back([=] { std::memcpy(d + from, s + from, len); });
    } catch (const std::system_error&) {  // No thread to be had: do it here.
      std::memcpy(d + from, s + from, len);
    }
  }
  std::memcpy(d, s, part);  // The first part is the caller's.
  for (std::thread& t : helpers) t.join();
}

}  // namespace shmtensor::internal
