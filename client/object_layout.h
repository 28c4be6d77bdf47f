// An object's layout as the client computes it before (or without) asking
// the daemon: the bytes a CreateOptions spans, and a C-contiguous shape's
// strides. One home for the client and the Python binding (its batch rings
// describe slots by dtype and shape); the daemon's own checks are
// daemon/store/layout.h, which these agree with.
//
// Thread safety: pure functions.
#ifndef SHMTENSOR_CLIENT_OBJECT_LAYOUT_H_
#define SHMTENSOR_CLIENT_OBJECT_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "shmtensor/client.h"
#include "shmtensor/dtype.h"

namespace shmtensor::internal {

// The bytes an object of `options` spans, as the daemon decides them
// (RequestedBytes, daemon/store/layout.h): `size_bytes` when given (and
// large enough), else the layout's extent; nullopt for a layout the daemon
// refuses (a negative dimension or stride, more than 64 dimensions, an
// extent over 2^62, an untyped buffer without a size), where the daemon
// should word the error.
std::optional<uint64_t> ObjectBytes(const CreateOptions& options);

// The byte strides of a C-contiguous `shape` of `dtype`, as NumPy and torch
// make them (a dimension of 0 counts as 1). The caller has bounded the
// shape (every stride fits in int64: ObjectBytes of it is set and, with no
// dimension of 0, at least the product).
std::vector<int64_t> ContiguousStrides(DType dtype,
                                       const std::vector<int64_t>& shape);

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_OBJECT_LAYOUT_H_
