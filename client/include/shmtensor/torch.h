// libtorch adapter: views as torch tensors, without a copy.
//
// Link shmtensor::torch (target shmtensor_torch) to use it.
#ifndef SHMTENSOR_CLIENT_INCLUDE_SHMTENSOR_TORCH_H_
#define SHMTENSOR_CLIENT_INCLUDE_SHMTENSOR_TORCH_H_

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "shmtensor/view.h"

namespace shmtensor {

// A tensor over the view's bytes (torch::from_blob) with the view's dtype,
// shape and strides, on the view's device: a CPU tensor, or a CUDA tensor for
// an object of a CUDA pool (which needs a libtorch built with CUDA, else
// FAILED_PRECONDITION saying so). For CUDA, `stream` is where the caller
// will use the tensor: the lease's release waits for the work queued there
// (and on the legacy default stream) once the last tensor is gone. The tensor
// holds the view's lease: the object stays alive, and its memory unreused,
// exactly as long as any tensor sharing that storage lives, even after the View
// itself is gone.
//
// torch 1.13 has no read-only tensors: a tensor of a read-only view points
// into a read-only mapping, and an in-place write to it faults (SIGSEGV)
// rather than change what other holders see. Use .clone() for a private,
// writable copy.
//
// INVALID_ARGUMENT for an untyped view or a dtype torch lacks (uint16, uint32,
// uint64 in 1.13); FAILED_PRECONDITION for a released view.
absl::StatusOr<at::Tensor> ToTensor(const View& view,
                                    CudaStream stream = kLegacyDefaultStream);

}  // namespace shmtensor

#endif  // SHMTENSOR_CLIENT_INCLUDE_SHMTENSOR_TORCH_H_
