// Buffers (writable, unsealed) and views (of sealed objects).
#ifndef SHMTENSOR_CLIENT_INCLUDE_SHMTENSOR_VIEW_H_
#define SHMTENSOR_CLIENT_INCLUDE_SHMTENSOR_VIEW_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "shmtensor/device.h"
#include "shmtensor/dtype.h"
#include "shmtensor/object_ref.h"
#include "shmtensor/sealed_ref.h"

namespace shmtensor {

// Element layout of an object. Strides are in bytes and always filled (C
// order when the creator gave none). Every object shmtensor hands out starts
// at a page-aligned address; it is C-contiguous unless created with strides.
struct ObjectInfo {
  ObjectRef ref;
  DType dtype = DType::kUnspecified;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides_bytes;
  uint64_t size_bytes = 0;
  // Where the bytes are: data() is a host address, or a device address on
  // that CUDA device.
  Device device;
};

// How a writable buffer, or the writable view of a taken transfer, gives up
// this process's write access to host-pool memory when it is sealed or
// released.
//
// Whatever the choice, an export an adapter made from the lease (an array
// or tensor, which the lease counts) that is alive when the write access
// ends closes the range at once. The choice is about raw pointers.
enum class WriteRevocation {
  // The default: kImmediate where a raw pointer into the range may be left,
  // kDeferred where none can be. A pointer may be left when this buffer's
  // data() (or this writable view's mutable_data()) was called, or when any
  // byte of the range was ever handed out by data() or mutable_data() in
  // this process before (an old pointer may still point there). A buffer
  // filled only through CopyFrom or Fill leaves none, so recycled memory
  // changes no page table: the lifecycle costs its round trips and nothing
  // more.
  kWhenExposed,
  // At once, with mprotect: a write through any pointer kept from it (say,
  // data() saved before Seal) faults instead of changing what others see.
  // Costs two page-table changes per writable use (open and close); what
  // that is per lifecycle: docs/performance.md (lifecycle_bench section 5).
  kImmediate,
  // The caller vouches that no raw pointer into the bytes outlives the seal
  // or release. With no export alive, the range then stays
  // writable in this process's writable mapping, into which no view or
  // tensor points once its lease is gone, and the next writable use of that
  // memory here needs no page-table change. Readers are unaffected: every
  // read view reads through the read-only mapping.
  kDeferred,
};

// A read-only view of a sealed object (writable for the taker of an
// exclusive transfer, and for every view of a shared-writable object). Copies
// share one lease; the lease is released when the last copy, and the last
// tensor made from one (ToTensor), is gone. Reading through a view never
// changes: the object is immutable and its memory cannot be reused while the
// lease is held.
//
// A read-only view's bytes (host pools) lie in a read-only mapping: a write
// through a const_cast pointer faults (SIGSEGV) instead of changing what
// others see. Device memory (CUDA pools) has no such protection: there,
// read-only is the API's contract (see client.h).
// Thread safety: const methods are safe from any thread.
class View {
 public:
  View() = default;
  View(ObjectInfo info, std::shared_ptr<internal::Lease> lease, bool writable);

  bool valid() const { return lease_ != nullptr; }
  const ObjectInfo& info() const { return info_; }
  const ObjectRef& ref() const { return info_.ref; }
  DType dtype() const { return info_.dtype; }
  const std::vector<int64_t>& shape() const { return info_.shape; }
  const std::vector<int64_t>& strides_bytes() const {
    return info_.strides_bytes;
  }
  uint64_t size_bytes() const { return info_.size_bytes; }
  bool writable() const { return writable_; }

  // The bytes; nullptr once released.
  const void* data() const;
  // The bytes for writing; nullptr unless writable(). A pointer that may
  // outlive the view: with WriteRevocation::kWhenExposed the view's release
  // closes the range at once (a write through it then faults).
  void* mutable_data() const;

  // Maps every page of the bytes into this process now, in one system call
  // (Linux 5.14's MADV_POPULATE_READ), for a reader about to read them
  // all: the first read of a page this process never mapped otherwise
  // takes a page fault (on a VM, several µs each; docs/performance.md,
  // "Broadcast"). Only the first call for given bytes does anything, and
  // the pages are the pool's (nothing is allocated or copied). Best
  // effort: without the kernel's support the pages fault in as they are
  // read. No-op for a writable view (its range was mapped when it was
  // opened), a CUDA object or a released view.
  void Populate() const;

  // Drops this copy's share of the lease. When it is the last share (no
  // copy or tensor holds it), waits for the daemon to drop the lease, so the
  // memory is back in the pool for every client on return. (Destroying the
  // view instead posts the release without waiting: this client sees it at
  // once; the daemon applies it at this session's next call, when a call
  // of any session lacks the memory, before a monitoring view, or within
  // about 250 ms.) FAILED_PRECONDITION if this copy was released already.
  absl::Status Release();

  // The sending half of sending the object by reference to another process
  // (Client::Take receives): pins the object at the daemon for the
  // receiver and returns the pin's token, to send with ref(). The pin lasts
  // until a Take presents the token, or until the daemon's
  // limits.offer_grace_ms after this client's session ended, and counts
  // against this process's uid meanwhile. FAILED_PRECONDITION for a
  // writable view (an exclusive take, a shared-writable object) or one of a
  // CUDA pool, and for a released view; RESOURCE_EXHAUSTED (LIMIT_EXCEEDED)
  // when this session has limits.max_offers_per_session untaken.
  absl::StatusOr<uint64_t> Offer() const;

  // CUDA objects: declares that the bytes are (also) used on `stream`, so
  // the lease's release waits for the work queued there too (see client.h).
  // No-op for host objects or a released view.
  void UseOnStream(CudaStream stream) const;

  // For adapters (ToTensor): the shared lease, to keep alive with the data.
  const std::shared_ptr<internal::Lease>& lease() const { return lease_; }

 private:
  ObjectInfo info_;
  std::shared_ptr<internal::Lease> lease_;
  bool writable_ = false;
};

// A writable, unsealed object, owned by its creator alone. Nobody else can
// see it until Seal. Move-only. Destroying it unsealed discards the object.
// Thread safety: not thread-safe; one owner.
class Buffer {
 public:
  Buffer() = default;
  // `named`: the object has a name (CreateOptions::name), which its seal
  // makes visible before Seal returns (a unary Seal); an unnamed one is
  // sealed one way (see Seal).
  Buffer(ObjectInfo info, std::shared_ptr<internal::Lease> lease,
         bool named = false);
  Buffer(Buffer&&) = default;
  Buffer& operator=(Buffer&&) = default;
  // Not copyable: there is one writer.
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // Made with CreateOptions::shared_writable: never sealed.
  bool shared_writable() const;
  bool valid() const { return lease_ != nullptr; }
  const ObjectInfo& info() const { return info_; }
  // The bytes to fill; nullptr once sealed or discarded. A raw pointer that
  // may outlive the buffer: Seal then closes the range at once (see
  // WriteRevocation::kWhenExposed), so a write through it faults. Prefer
  // CopyFrom or Fill, which leave no pointer behind and cost no page-table
  // change.
  void* data() const;
  uint64_t size_bytes() const { return info_.size_bytes; }

  // Copies `size` bytes from `src` to byte `offset` of the buffer (a host
  // copy; for a CUDA pool, host or device memory to the device, complete on
  // return). No pointer into the buffer is handed out. FAILED_PRECONDITION
  // if not valid; OUT_OF_RANGE if [offset, offset + size) is not inside the
  // buffer; INVALID_ARGUMENT for a null `src` with a nonzero size.
  absl::Status CopyFrom(const void* src, uint64_t size, uint64_t offset = 0);
  // Calls `fill` with the buffer's bytes to write them in place (decode
  // into them, say). The span is lent for the call only: unlike data(), a
  // pointer kept from it is not revoked at Seal, so keeping one is a
  // use-after-free. Host pools only (FAILED_PRECONDITION for a CUDA pool,
  // whose bytes the host cannot write: use CopyFrom, or the device address
  // data() gives in your kernels); also FAILED_PRECONDITION if not valid.
  absl::Status Fill(absl::FunctionRef<void(absl::Span<uint8_t>)> fill);

  // Makes the object immutable and returns its ref; the Buffer becomes
  // invalid. From here on a write
  // through an export made from the lease that is still alive faults (host
  // pools; see the class comment of View for CUDA pools), and so does one
  // through the old data() pointer, unless `revocation` (default: the
  // client's ClientOptions::write_revocation) is kDeferred, by which the
  // caller vouches that no such pointer is left. With the default
  // kWhenExposed, a buffer whose data() was never called and with no export
  // left is sealed without a page-table change.
  // Shared seal: the SealedRef holds a lease that keeps the object alive.
  // Exclusive seal (hand-off to exactly one consumer): the SealedRef holds
  // nothing, this process loses write access (the taker alone may write),
  // and the object lives until one consumer's Get takes it (or this client's
  // session ends).
  // CUDA: first waits for the producer's GPU work (see client.h): on
  // `stream`, or for all of this process's work on the device by default.
  // FAILED_PRECONDITION if already sealed or discarded.
  // An unnamed object is sealed one way, without waiting for the daemon
  // (docs/shm_layout.md, "Stock and one-way seals"): the ref is valid at
  // once, and a Get of it that reaches the daemon before the seal waits for
  // it. A named one waits for the daemon, so its name is visible to every
  // process when Seal returns.
  absl::StatusOr<SealedRef> Seal(
      bool exclusive = false, CudaStream stream = kLegacyDefaultStream,
      std::optional<WriteRevocation> revocation = std::nullopt);

  // Gives up this copy's share of the unsealed object (copies of a Buffer
  // share it): the object is discarded, its memory back in the pool, when
  // the last share goes, copies and exports made from lease() included.
  // FAILED_PRECONDITION if this copy was sealed or discarded already.
  absl::Status Discard();

  // As View::UseOnStream.
  void UseOnStream(CudaStream stream) const;
  // For adapters (Python arrays, DLPack): the lease, to keep alive with the
  // data. Exports made from it keep the object alive; after Seal they see
  // the bytes read-only.
  const std::shared_ptr<internal::Lease>& lease() const { return lease_; }

 private:
  ObjectInfo info_;
  std::shared_ptr<internal::Lease> lease_;
  bool named_ = false;
};

}  // namespace shmtensor

#endif  // SHMTENSOR_CLIENT_INCLUDE_SHMTENSOR_VIEW_H_
