// One lease held by this process on one object, with the access this process
// has to the object's bytes. Buffers, views, SealedRefs and tensors share a
// Lease by shared_ptr; the last one to go releases it.
//
// Thread safety: thread-safe.
#ifndef SHMTENSOR_CLIENT_LEASE_H_
#define SHMTENSOR_CLIENT_LEASE_H_

#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "client/client_core.h"

namespace shmtensor::internal {

class Lease {
 public:
  // `data` points to the object's bytes in the mapping matching `access`.
  // For kReadWrite the range is already open for writing.
  Lease(std::shared_ptr<ClientCore> core, uint64_t id, v1::Placement placement,
        Access access, uint8_t* data)
      : core_(std::move(core)),
        id_(id),
        placement_(std::move(placement)),
        access_(access),
        data_(data),
        opened_rw_range_(access == Access::kReadWrite) {}
  // Closes a writable range, then releases the lease without waiting (one
  // ReleaseLeases message; errors are dropped: a daemon that is gone has
  // dropped the lease already).
  ~Lease();

  // Not copyable or movable: shared by pointer.
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  uint64_t id() const { return id_; }
  const v1::Placement& placement() const { return placement_; }
  uint8_t* data() const { return data_; }
  Access access() const { return access_; }
  ClientCore& core() const { return *core_; }

  // Before sealing: closes the writable range to read-only. From here on a
  // write through the old pointer faults.
  absl::Status CloseForSeal();
  // After a shared seal: the lease now is the ref's read lease.
  void BecomeReadLease();
  // After an exclusive seal: the daemon consumed the lease.
  void Forget();
  // Releases the lease now and waits for the daemon to drop it (a unary
  // Release), so its effect is visible to every client when this returns.
  // The destructor then does nothing. Errors: the daemon's (e.g. UNAVAILABLE
  // when it is gone, having dropped the lease itself).
  absl::Status ReleaseNow();

 private:
  // Closes the range this lease opened for writing, if still open.
  void CloseWritableRange();

  std::shared_ptr<ClientCore> core_;
  const uint64_t id_;
  const v1::Placement placement_;
  std::mutex mu_;
  Access access_;  // Guarded by mu_ after construction.
  uint8_t* data_;
  // This lease opened its range in the writable mapping; it closes it again.
  const bool opened_rw_range_;
  bool held_ = true;  // Guarded by mu_.
};

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_LEASE_H_
