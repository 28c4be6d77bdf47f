// Validation of the element layout (dtype, shape, strides) of a request.
//
// Thread safety: pure functions.
#ifndef SHMTENSOR_DAEMON_STORE_LAYOUT_H_
#define SHMTENSOR_DAEMON_STORE_LAYOUT_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "daemon/ledger/ledger.h"
#include "shmtensor/v1/shmtensor.pb.h"

namespace shmtensor::daemon {

// Most dimensions a layout may have (NumPy 2's limit).
inline constexpr int kMaxRank = 64;
// Most bytes a layout may take serialised: what the ledger's object record
// keeps of it (every layout of kMaxRank dimensions fits, about 1,300 bytes).
inline constexpr size_t kMaxLayoutBytes = kMaxLedgerLayoutBytes;

// Checks `layout` and returns the bytes it spans: 0 when a dimension is 0,
// else the offset of the last element plus its size. INVALID_ARGUMENT, naming
// the value, for an unknown dtype, a shape or strides on an untyped layout, a
// rank above kMaxRank, a negative dimension, strides of another rank, a
// negative stride or one not a multiple of the item size, an extent that
// overflows 64 bits, fields this daemon does not know (protobuf keeps them,
// and the daemon would store them), or more than kMaxLayoutBytes serialised.
// Every layout the daemon stores passed here: it is bounded where it
// arrives.
absl::StatusOr<uint64_t> LayoutExtent(const v1::Layout& layout);

// Decides how many bytes a Create reserves for the data, from its size_bytes
// and layout (see CreateRequest). INVALID_ARGUMENT when they disagree.
absl::StatusOr<uint64_t> RequestedBytes(uint64_t size_bytes,
                                        const v1::Layout& layout);

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_STORE_LAYOUT_H_
