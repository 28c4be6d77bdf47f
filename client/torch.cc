#include "shmtensor/torch.h"

#include <ATen/Functions.h>

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/lease_address.h"
#include "client/torch_dtype.h"

namespace shmtensor {

absl::StatusOr<at::Tensor> ToTensor(const View& view, CudaStream stream) {
  if (!view.valid()) {
    return absl::FailedPreconditionError("view was released");
  }
  if (absl::Status s = internal::LeaseHeld(*view.lease()); !s.ok()) return s;
  std::optional<at::ScalarType> type = internal::ScalarTypeOf(view.dtype());
  if (!type) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", DTypeName(view.dtype()),
                     " has no torch equivalent in this libtorch"));
  }
  const int64_t item = ItemSize(view.dtype());
  std::vector<int64_t> strides;
  for (int64_t s : view.strides_bytes()) strides.push_back(s / item);
  const Device& device = view.info().device;
  // The deleter owns a counted export of the lease (lease_address.h): the
  // last tensor releases it (for CUDA, once the work on `stream` is done as
  // well).
  auto keep = std::make_shared<internal::LeaseExport>(view.lease());
  if (device.is_cuda()) view.UseOnStream(stream);
  // libtorch reports errors by exception: this is its one adapter.
  try {
    return at::from_blob(
        const_cast<void*>(view.data()), view.shape(), strides,
        [keep](void*) mutable { keep.reset(); },
        at::TensorOptions().dtype(*type).device(
            device.is_cuda()
                ? at::Device(at::kCUDA, static_cast<int8_t>(device.index))
                : at::Device(at::kCPU)));
  } catch (const std::exception& e) {
    // E.g. a CUDA object with a libtorch built without CUDA (Debian's).
    return absl::FailedPreconditionError(absl::StrCat(
        "torch::from_blob on ", DeviceName(device), ": ", e.what()));
  }
}

}  // namespace shmtensor
