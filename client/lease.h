// One lease held by this process on one object, with the access this process
// has to the object's bytes. Buffers, views, SealedRefs and tensors share a
// Lease by shared_ptr; the last one to go releases it.
//
// For an object in a CUDA pool, the release waits for the GPU: the lease
// remembers the streams its exports were used on (UseOnStream; the legacy
// default stream always counts), and its last holder records events on them
// and lets the core's GpuReleaser send the release once they complete.
//
// Thread safety: thread-safe.
#ifndef SHMTENSOR_CLIENT_LEASE_H_
#define SHMTENSOR_CLIENT_LEASE_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "client/client_core.h"
#include "client/lease_address.h"
#include "shmtensor/sealed_ref.h"

namespace shmtensor::internal {

class Lease : public std::enable_shared_from_this<Lease> {
 public:
  // `data` points to the object's bytes in the mapping matching `access`.
  // For kReadWrite the range is already open for writing.
  // `device` is where the pool lives; for a CUDA pool `data` is a device
  // address and no range is opened or closed.
  Lease(std::shared_ptr<ClientCore> core, uint64_t id, v1::Placement placement,
        Access access, uint8_t* data, Device device = Device::Host())
      : core_(std::move(core)),
        id_(id),
        placement_(std::move(placement)),
        device_(device),
        access_(access),
        data_(data),
        opened_rw_range_(access == Access::kReadWrite && !device.is_cuda()),
        revocation_(core_->write_revocation()) {
    core_->LeaseMade(this);
  }
  // Closes a writable range (as revocation() says), then releases the lease
  // without waiting (one ReleaseLeases message; errors are dropped: a daemon
  // that is gone has dropped the lease already).
  ~Lease();

  // Not copyable or movable: shared by pointer.
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  uint64_t id() const { return id_; }
  const v1::Placement& placement() const { return placement_; }
  uint8_t* data() const { return data_; }
  Access access() const { return access_; }
  ClientCore& core() const { return *core_; }
  const Device& device() const { return device_; }

  // CUDA: the object is (also) used on `stream`; the release waits for the
  // work queued there. No-op for host objects.
  void UseOnStream(CudaStream stream);
  // How the writable range closes at release: the client's default
  // (ClientOptions::write_revocation) until a seal chooses. Host pools only.
  WriteRevocation revocation() const;
  // A raw pointer to the writable bytes was handed out (Buffer::data(),
  // View::mutable_data(), the Python `address`) and may outlive the lease's
  // write access: under kWhenExposed its range closes at once when that
  // access ends (ClosesAtOnce), and in every later writable use of any of
  // its bytes in this process (PoolMapping::MarkExposed). No-op for a
  // read-only lease or a CUDA pool.
  void MarkExposed();
  // Fills this process's page-table entries for the object's bytes in the
  // pool's read-only mapping in one step (PoolMapping::FillForRead), for a
  // reader about to read them all. Best effort; no-op for a CUDA pool (and
  // for a writable lease, whose range was filled when it was opened).
  void FillForRead() const;
  // A raw pointer to the writable bytes was handed past the adapter's
  // caller (lease_address.h): the range closes at once when the write
  // access ends, whatever the revocation. No-op for a read-only lease or a
  // CUDA pool.
  void MarkEscaped();
  // Counted exports alive now (LeaseExport, lease_address.h).
  int live_exports() const { return exports_.load(std::memory_order_acquire); }
  bool escaped() const { return escaped_.load(std::memory_order_acquire); }

  // Before sealing. Host: closes the writable range to read-only where
  // ClosesAtOnce says so, so that from here on a write through a pointer
  // left in it faults; else just stops handing it out (the range stays open
  // in this process's writable mapping for its next writable use). CUDA: waits
  // until the work queued on `stream` is done (all of this process's work on
  // the device for kLegacyDefaultStream), so no reader can see the object
  // before the producer's writes have landed.
  absl::Status CloseForSeal(
      CudaStream stream = kLegacyDefaultStream,
      WriteRevocation revocation = WriteRevocation::kImmediate);
  // After a shared seal: the lease now is the ref's read lease (and is
  // registered as one: lease_registry.h).
  void BecomeReadLease();
  // The lease of a named object's Create: its release before the seal
  // discards the object and frees its name for other sessions, so its
  // release goes on the stream at once (after the seal too), as a
  // shared-writable object's write lease's does (many sessions write the
  // object). Every other host lease's release (the session's own objects',
  // a reader's view or take) is posted in the session's release ring
  // (ClientCore::ReleaseLease), which wakes nobody: the daemon pulls it
  // at the session's next call, before a monitoring view, and when any
  // call lacks what it frees (room in a pool, a limit), and the writer's
  // poll writes it on the stream within 250 ms when nobody did. For its
  // maker, before the lease is shared.
  void MarkNamedCreate() { named_create_ = true; }
  // Enters a read-only host lease's bytes into the LeaseRegistry (once; the
  // destructor removes them). For its maker, once a shared_ptr owns it
  // (MakeLease); no-op for a writable or CUDA lease.
  void Register();
  // A write lease of a shared-writable object: other leases of this process
  // may write through the same range, so its release leaves the range open
  // (as WriteRevocation::kDeferred does). A pointer kept past the lease is a
  // use-after-free, as with any object. Such an object is never sealed.
  void MarkSharedWritable();
  bool shared_writable() const;
  // After an exclusive seal: the daemon consumed the lease.
  void Forget();
  // The lease is its process's share of the object `ref` names
  // (ClientCore::AddShare, under its lock): its destruction takes the
  // share out.
  void MarkShared(const ObjectRef& ref) {
    shared_ref_ = ref;
    shared_.store(true, std::memory_order_release);
  }
  bool shared() const { return shared_.load(std::memory_order_acquire); }
  const ObjectRef& shared_ref() const { return shared_ref_; }
  // Whether a get of `ref` in this process may take a share of this lease
  // instead of asking the daemon, the one rule for every holder of shares
  // (ClientCore::FindShare, the Python binding's views): the lease is its
  // client's share of exactly `ref` (MarkShared; never an exclusive ref's),
  // this process is the one that holds it (not a child it was inherited
  // by) and the daemon still holds it (not lost).
  bool SharesRef(const ObjectRef& ref) const;
  // A resume found that the daemon does not hold this lease
  // (ClientCore::HoldLease): its bytes may be reused, so nothing exports
  // them any more (CheckHeld) and it is never released. Returns whether
  // anything still used it (false once it was being released).
  bool MarkLost();
  bool lost() const { return lost_.load(std::memory_order_acquire); }
  // OK while the lease is not lost; else FAILED_PRECONDITION (reason
  // STALE_REFERENCE) naming the lease. For every path that hands out a
  // pointer to the bytes.
  absl::Status CheckHeld() const;
  // Releases the lease now and waits for the daemon to drop it (a unary
  // Release), so its effect is visible to every client when this returns.
  // The destructor then does nothing. Errors: the daemon's (e.g. UNAVAILABLE
  // when it is gone, having dropped the lease itself).
  absl::Status ReleaseNow();

 private:
  // Closes the range this lease opened for writing, if still open, as
  // revocation_ says. Called under mu_ or in the destructor.
  void CloseWritableRange();
  // The one decision of whether giving up write access under `revocation`
  // must close the range in `mapping` now: always for kImmediate; while a
  // counted export lives (LeaseExport) or once a pointer escaped, whatever
  // the revocation; and for kWhenExposed when a raw pointer was exposed, by
  // this lease or by an earlier use of any of the range in this process.
  // Host pools.
  bool ClosesAtOnce(WriteRevocation revocation, const PoolMapping& mapping);
  // CUDA: events on the streams the object was used on (or, if they cannot
  // be recorded, none after waiting for the device). Called by the last
  // holder, under mu_ or in the destructor.
  cuda::Fence RecordFence();

  std::shared_ptr<ClientCore> core_;
  const uint64_t id_;
  const v1::Placement placement_;
  const Device device_;
  mutable std::mutex mu_;
  std::vector<CudaStream> streams_;  // Guarded by mu_. CUDA only.
  Access access_;                    // Guarded by mu_ after construction.
  uint8_t* data_;
  // This lease opened its range in the writable mapping; it closes it again.
  const bool opened_rw_range_;
  bool named_create_ = false;     // MarkNamedCreate; read by the destructor.
  WriteRevocation revocation_;    // Guarded by mu_ after construction.
  bool held_ = true;              // Guarded by mu_.
  bool shared_writable_ = false;  // Guarded by mu_.
  std::atomic<bool> exposed_{false};  // MarkExposed was called.
  std::atomic<int> exports_{0};       // Live LeaseExports.
  std::atomic<bool> escaped_{false};  // MarkEscaped was called.
  friend class LeaseExport;
  std::atomic<bool> lost_{false};  // MarkLost was called.
  // Set once its release began (so a lost lease is no loss).
  std::atomic<bool> releasing_{false};
  // Where Register entered the lease (null: not registered). Set at most
  // once (constructor, or BecomeReadLease under mu_); the destructor reads
  // it.
  std::atomic<const uint8_t*> registered_{nullptr};
  // MarkShared: written once, before shared_ is set.
  ObjectRef shared_ref_;
  std::atomic<bool> shared_{false};
};

// The one-way seal of `lease_id` (an unsealed object described by `info`:
// its size and layout go with it).
v1::OneWaySeal OneWaySealOf(uint64_t lease_id, const ObjectInfo& info,
                            bool exclusive);
// Seals the unsealed object of `lease` (its writable range closed already,
// Lease::CloseForSeal) one way: sends the seal on the session stream and
// returns its ref at once, with the lease (now the ref's read lease, and
// this process's share of the object) unless `exclusive`.
absl::StatusOr<SealedRef> SealOneWay(std::shared_ptr<Lease> lease,
                                     const ObjectInfo& info, bool exclusive);

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_LEASE_H_
