// A client process's mappings of one host pool.
//
// Each pool is mapped at most twice per process, once each, for the life of
// the client (never per object):
//  - read-only: shm_open(O_RDONLY) + mmap(PROT_READ). Every read view points
//    here; a write through it faults.
//  - read-write, made on first need: mmap(PROT_READ|PROT_WRITE) populated,
//    then mprotect(PROT_NONE). Only the ranges of buffers this process may
//    write (its unsealed buffers, and the transfers it took) are opened to
//    PROT_READ|PROT_WRITE, with mprotect, for exactly that time. Sealing puts
//    the creator's range back to PROT_READ (PROT_NONE for an exclusive
//    hand-off), so a write through an old writable pointer faults.
// Both mappings use MAP_POPULATE, and mprotect keeps the page-table entries,
// so a steady-state object lifecycle takes no page fault.
//
// Thread safety: thread-safe.
#ifndef SHMTENSOR_CLIENT_POOL_MAPPING_H_
#define SHMTENSOR_CLIENT_POOL_MAPPING_H_

#include <cstdint>
#include <memory>
#include <mutex>

#include "absl/status/statusor.h"
#include "shmtensor/v1/shmtensor.pb.h"

namespace shmtensor::internal {

enum class Access { kNone, kRead, kReadWrite };

class PoolMapping {
 public:
  // Maps the pool read-only. UNAVAILABLE when the segment cannot be opened
  // (e.g. the daemon is gone), INTERNAL for other system errors.
  static absl::StatusOr<std::unique_ptr<PoolMapping>> Map(
      const v1::PoolInfo& info);
  ~PoolMapping();

  // Not copyable or movable: pointers into the mappings are handed out.
  PoolMapping(const PoolMapping&) = delete;
  PoolMapping& operator=(const PoolMapping&) = delete;

  const v1::PoolInfo& info() const { return info_; }
  const uint8_t* read_base() const { return ro_; }

  // Sets this process's access to [offset, offset+capacity) through the
  // writable mapping (mapped here on first use) and returns its base.
  // INVALID_ARGUMENT for a range outside the pool or not page-aligned.
  absl::StatusOr<uint8_t*> Protect(uint64_t offset, uint64_t capacity,
                                   Access access);

 private:
  PoolMapping(v1::PoolInfo info, uint8_t* ro) : info_(std::move(info)), ro_(ro) {}

  const v1::PoolInfo info_;
  uint8_t* const ro_;
  std::once_flag rw_once_;
  uint8_t* rw_ = nullptr;  // Set once under rw_once_.
  absl::Status rw_status_;  // Set once under rw_once_.
};

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_POOL_MAPPING_H_
