#include "shmtensor/view.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cuda_api.h"
#include "client/host_copy.h"
#include "client/lease.h"
#include "client/offer.h"
#include "client/ref_proto.h"

namespace shmtensor {

View::View(ObjectInfo info, std::shared_ptr<internal::Lease> lease,
           bool writable)
    : info_(std::move(info)), lease_(std::move(lease)), writable_(writable) {}

const void* View::data() const {
  return lease_ != nullptr ? lease_->data() : nullptr;
}

void* View::mutable_data() const {
  if (lease_ == nullptr || !writable_) return nullptr;
  lease_->MarkExposed();
  return lease_->data();
}

void View::Populate() const {
  if (lease_ != nullptr && !writable_) lease_->FillForRead();
}

absl::StatusOr<uint64_t> View::Offer() const {
  if (lease_ == nullptr) {
    return absl::FailedPreconditionError("Offer of a released view");
  }
  if (writable_) {
    return absl::FailedPreconditionError(
        "Offer of a writable view: only read-only views of sealed shared "
        "objects travel by reference");
  }
  absl::StatusOr<internal::LeaseOffer> offer = internal::OfferLease(*lease_);
  if (!offer.ok()) return offer.status();
  return offer->token;
}

void View::UseOnStream(CudaStream stream) const {
  if (lease_ != nullptr) lease_->UseOnStream(stream);
}

void Buffer::UseOnStream(CudaStream stream) const {
  if (lease_ != nullptr) lease_->UseOnStream(stream);
}

absl::Status View::Release() {
  if (lease_ == nullptr) {
    return absl::FailedPreconditionError("view was already released");
  }
  // The last holder releases now and waits, so the memory is back for every
  // client on return; otherwise tensors still share the lease.
  // Only the last holder releases (a share a Get takes meanwhile would
  // be left with a released lease: UnshareIfLast decides under the
  // shares' lock).
  absl::Status s = lease_->core().UnshareIfLast(lease_) ? lease_->ReleaseNow()
                                                        : absl::OkStatus();
  lease_.reset();
  return s;
}

Buffer::Buffer(ObjectInfo info, std::shared_ptr<internal::Lease> lease,
               bool named)
    : info_(std::move(info)), lease_(std::move(lease)), named_(named) {}

namespace {

absl::Status NoLongerWritable() {
  return absl::FailedPreconditionError(
      "buffer is no longer writable: it was sealed or discarded");
}

}  // namespace

void* Buffer::data() const {
  if (lease_ == nullptr) return nullptr;
  lease_->MarkExposed();
  return lease_->data();
}

absl::Status Buffer::CopyFrom(const void* src, uint64_t size, uint64_t offset) {
  if (lease_ == nullptr) return NoLongerWritable();
  if (offset > info_.size_bytes || size > info_.size_bytes - offset) {
    return absl::OutOfRangeError(absl::StrFormat(
        "CopyFrom of %d bytes at offset %d does not fit the buffer's %d bytes",
        size, offset, info_.size_bytes));
  }
  if (size == 0) return absl::OkStatus();
  if (src == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CopyFrom of %d bytes from a null pointer", size));
  }
  uint8_t* dst = lease_->data() + offset;
  if (lease_->device().is_cuda()) {
    return internal::cuda::CopyAndWait(lease_->device().index, dst, src, size,
                                       kLegacyDefaultStream);
  }
  internal::CopyHost(dst, src, size);
  return absl::OkStatus();
}

absl::Status Buffer::Fill(absl::FunctionRef<void(absl::Span<uint8_t>)> fill) {
  if (lease_ == nullptr) return NoLongerWritable();
  if (lease_->device().is_cuda()) {
    return absl::FailedPreconditionError(
        absl::StrCat("Fill writes through the host; this buffer is in ",
                     DeviceName(lease_->device()),
                     " memory: use CopyFrom, or the device address data() "
                     "gives in your kernels"));
  }
  fill(absl::Span<uint8_t>(lease_->data(), info_.size_bytes));
  return absl::OkStatus();
}

absl::StatusOr<SealedRef> Buffer::Seal(
    bool exclusive, CudaStream stream,
    std::optional<WriteRevocation> revocation) {
  if (lease_ == nullptr) return NoLongerWritable();
  if (lease_->shared_writable()) {  // Before anything changes: it stays.
    return absl::FailedPreconditionError(
        "a shared-writable object is never sealed (CreateOptions::"
        "shared_writable); release it when done");
  }
  // Close the writable range (host) or wait for the GPU's writes (CUDA)
  // before the daemon publishes the object, so no write of this process can
  // land after a reader could see it.
  // Whether the range closes at once is the lease's decision (exports
  // alive, pointers exposed: Lease::ClosesAtOnce).
  const WriteRevocation how = revocation.value_or(lease_->revocation());
  if (absl::Status s = lease_->CloseForSeal(stream, how); !s.ok()) {
    return s;
  }
  if (!named_) {
    std::shared_ptr<internal::Lease> lease = std::move(lease_);
    return internal::SealOneWay(std::move(lease), info_, exclusive);
  }
  v1::SealRequest req;
  req.set_session_id(lease_->core().session_id());
  req.set_lease_id(lease_->id());
  req.set_exclusive(exclusive);
  v1::SealResponse resp;
  absl::Status s =
      lease_->core().Call(&v1::ObjectStore::Stub::Seal, req, &resp);
  std::shared_ptr<internal::Lease> lease = std::move(lease_);
  if (!s.ok()) return s;  // The lease goes and discards the object.
  const ObjectRef ref = internal::FromProto(resp.ref());
  if (exclusive) {
    lease->Forget();
    return SealedRef(ref, nullptr);
  }
  lease->BecomeReadLease();
  ObjectInfo info = info_;
  info.ref = ref;
  lease->core().AddShare(lease, info);
  return SealedRef(ref, std::move(lease));
}

namespace internal {

v1::OneWaySeal OneWaySealOf(uint64_t lease_id, const ObjectInfo& info,
                            bool exclusive) {
  v1::OneWaySeal seal;
  seal.set_lease_id(lease_id);
  seal.set_exclusive(exclusive);
  seal.set_size_bytes(info.size_bytes);
  v1::Layout* layout = seal.mutable_layout();
  layout->set_dtype(static_cast<v1::DType>(info.dtype));
  for (int64_t d : info.shape) layout->add_shape(d);
  // Strides only where they are not C-contiguous (as the create had them).
  int64_t stride = ItemSize(info.dtype);
  bool contiguous = info.strides_bytes.size() == info.shape.size();
  for (size_t i = info.shape.size(); contiguous && i-- > 0;) {
    contiguous = info.strides_bytes[i] == stride;
    stride *= info.shape[i] > 0 ? info.shape[i] : 1;
  }
  if (!contiguous) {
    for (int64_t s : info.strides_bytes) layout->add_strides_bytes(s);
  }
  return seal;
}

absl::StatusOr<SealedRef> SealOneWay(std::shared_ptr<Lease> lease,
                                     const ObjectInfo& info, bool exclusive) {
  ClientCore& core = lease->core();
  // On failure the lease goes and discards the object.
  if (absl::Status s =
          core.SendSeals({OneWaySealOf(lease->id(), info, exclusive)});
      !s.ok()) {
    return s;
  }
  ObjectRef ref = info.ref;
  ref.exclusive = exclusive;
  if (exclusive) {
    lease->Forget();
    return SealedRef(ref, nullptr);
  }
  lease->BecomeReadLease();
  ObjectInfo shared = info;
  shared.ref = ref;
  core.AddShare(lease, shared);
  return SealedRef(ref, std::move(lease));
}

}  // namespace internal

bool Buffer::shared_writable() const {
  return lease_ != nullptr && lease_->shared_writable();
}

absl::Status Buffer::Discard() {
  if (lease_ == nullptr) {
    return absl::FailedPreconditionError(
        "buffer was already sealed or discarded");
  }
  lease_.reset();
  return absl::OkStatus();
}

}  // namespace shmtensor
