#include "client/cuda_pool_mapping.h"

#include <unistd.h>

#include <atomic>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "client/cuda_api.h"

namespace shmtensor::internal {
namespace {
std::atomic<uint64_t> g_opens{0};
}  // namespace

absl::StatusOr<std::shared_ptr<CudaPoolMapping>> CudaPoolMapping::Get(
    const v1::PoolInfo& info) {
  if (info.kind() != v1::MEMORY_KIND_CUDA_DEVICE) {
    return absl::FailedPreconditionError(
        absl::StrFormat("pool '%s' is not a CUDA pool", info.name()));
  }
  // Keyed by the IPC handle, which is unique per allocation (so per daemon
  // instance and pool), and by process: a CUDA mapping does not survive
  // fork(), so a child opens its own.
  static absl::Mutex mu(absl::kConstInit);
  static auto* mappings =
      new absl::flat_hash_map<std::string, std::weak_ptr<CudaPoolMapping>>();
  const std::string key = absl::StrCat(getpid(), "/", info.cuda_ipc_handle());
  absl::MutexLock lock(&mu);
  std::weak_ptr<CudaPoolMapping>& slot = (*mappings)[key];
  if (std::shared_ptr<CudaPoolMapping> live = slot.lock()) return live;
  absl::StatusOr<void*> base =
      cuda::OpenMemHandle(info.cuda_device(), info.cuda_ipc_handle());
  if (!base.ok()) {
    mappings->erase(key);
    return absl::Status(
        base.status().code(),
        absl::StrFormat("cannot map CUDA pool '%s' (cuda:%d, %d bytes): %s",
                        info.name(), info.cuda_device(), info.size_bytes(),
                        base.status().message()));
  }
  g_opens.fetch_add(1, std::memory_order_relaxed);
  std::shared_ptr<CudaPoolMapping> mapping(
      new CudaPoolMapping(info, static_cast<uint8_t*>(*base)));
  slot = mapping;
  return mapping;
}

uint64_t CudaPoolMapping::opens() {
  return g_opens.load(std::memory_order_relaxed);
}

CudaPoolMapping::~CudaPoolMapping() {
  // In a forked child the mapping is the parent's: no CUDA call there.
  if (getpid() != owner_pid_) return;
  cuda::CloseMemHandle(info_.cuda_device(), base_);
}

}  // namespace shmtensor::internal
