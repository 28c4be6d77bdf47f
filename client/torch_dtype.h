// The libtorch adapter's dtype mapping: shmtensor's DType to
// at::ScalarType. It lives here, not in common/dtype.cc's table, because
// common/ must not depend on torch; torch_dtype_test checks it against that
// table row for row (same item size and kind, present exactly for the rows
// whose `torch` says every supported torch has the type).
//
// Thread safety: a pure function.
#ifndef SHMTENSOR_CLIENT_TORCH_DTYPE_H_
#define SHMTENSOR_CLIENT_TORCH_DTYPE_H_

#include <c10/core/ScalarType.h>

#include <optional>

#include "shmtensor/dtype.h"

namespace shmtensor::internal {

// The torch element type of `dtype`; nullopt for kUnspecified (raw bytes),
// for a type not every supported torch has (uint16, uint32, uint64) and
// for a value outside the enum.
std::optional<at::ScalarType> ScalarTypeOf(DType dtype);

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_TORCH_DTYPE_H_
