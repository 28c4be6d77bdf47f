// Validation of the element layout (dtype, shape, strides) of a request.
//
// Thread safety: pure functions.
#ifndef SHMTENSOR_DAEMON_STORE_LAYOUT_H_
#define SHMTENSOR_DAEMON_STORE_LAYOUT_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "shmtensor/v1/shmtensor.pb.h"

namespace shmtensor::daemon {

// Most dimensions a layout may have (NumPy 2's limit).
inline constexpr int kMaxRank = 64;

// Checks `layout` and returns the bytes it spans: 0 when a dimension is 0,
// else the offset of the last element plus its size. INVALID_ARGUMENT, naming
// the value, for an unknown dtype, a shape or strides on an untyped layout, a
// rank above kMaxRank, a negative dimension, strides of another rank, a
// negative stride or one not a multiple of the item size, or an extent that
// overflows 64 bits.
absl::StatusOr<uint64_t> LayoutExtent(const v1::Layout& layout);

// Decides how many bytes a Create reserves for the data, from its size_bytes
// and layout (see CreateRequest). INVALID_ARGUMENT when they disagree.
absl::StatusOr<uint64_t> RequestedBytes(uint64_t size_bytes,
                                        const v1::Layout& layout);

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_STORE_LAYOUT_H_
