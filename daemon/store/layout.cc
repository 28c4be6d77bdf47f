#include "daemon/store/layout.h"

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/unknown_field_set.h"
#include "shmtensor/dtype.h"

namespace shmtensor::daemon {

absl::StatusOr<uint64_t> LayoutExtent(const v1::Layout& layout) {
  // What the daemon keeps of a layout (its ledger record) is bounded before
  // anything else is read of it.
  if (const size_t bytes = layout.ByteSizeLong(); bytes > kMaxLayoutBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a layout of %d bytes serialised: at most %d", bytes, kMaxLayoutBytes));
  }
  if (const google::protobuf::UnknownFieldSet& unknown =
          layout.GetReflection()->GetUnknownFields(layout);
      !unknown.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the layout carries %d fields this daemon does not know (the first "
        "is field %d): it keeps dtype, shape and strides_bytes only",
        unknown.field_count(), unknown.field(0).number()));
  }
  const int dtype_value = static_cast<int>(layout.dtype());
  if (dtype_value < 0 || dtype_value > kMaxDTypeValue) {
    return absl::InvalidArgumentError(
        absl::StrFormat("unknown dtype %d", dtype_value));
  }
  const auto dtype = static_cast<DType>(dtype_value);
  if (dtype == DType::kUnspecified) {
    if (layout.shape_size() > 0 || layout.strides_bytes_size() > 0) {
      return absl::InvalidArgumentError(
          "a shape or strides needs a dtype; got DTYPE_UNSPECIFIED");
    }
    return 0;
  }
  const int rank = layout.shape_size();
  if (rank > kMaxRank) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d exceeds the maximum of %d", rank, kMaxRank));
  }
  const bool strided = layout.strides_bytes_size() > 0;
  if (strided && layout.strides_bytes_size() != rank) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d strides given for a shape of rank %d",
                        layout.strides_bytes_size(), rank));
  }
  const int64_t item = ItemSize(dtype);
  absl::uint128 count = 1;
  for (int i = 0; i < rank; ++i) {
    const int64_t dim = layout.shape(i);
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("negative dimension %d at axis %d", dim, i));
    }
    count *= static_cast<uint64_t>(dim);
    if (count > absl::uint128(UINT64_MAX)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "shape overflows 64 bits at axis %d (dimension %d)", i, dim));
    }
    if (strided) {
      const int64_t stride = layout.strides_bytes(i);
      if (stride < 0 || stride % item != 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "stride %d bytes at axis %d must be >= 0 and a multiple of the "
            "item size %d",
            stride, i, item));
      }
    }
  }
  if (count == 0) return 0;
  absl::uint128 extent = item;
  if (!strided) {
    extent = count * static_cast<uint64_t>(item);
  } else {
    for (int i = 0; i < rank; ++i) {
      extent += absl::uint128(static_cast<uint64_t>(layout.shape(i) - 1)) *
                static_cast<uint64_t>(layout.strides_bytes(i));
    }
  }
  if (extent > absl::uint128(UINT64_MAX / 2)) {
    return absl::InvalidArgumentError("layout spans more than 2^63 bytes");
  }
  return static_cast<uint64_t>(extent);
}

absl::StatusOr<uint64_t> RequestedBytes(uint64_t size_bytes,
                                        const v1::Layout& layout) {
  absl::StatusOr<uint64_t> extent = LayoutExtent(layout);
  if (!extent.ok()) return extent.status();
  if (layout.dtype() == v1::DTYPE_UNSPECIFIED) {
    if (size_bytes == 0) {
      return absl::InvalidArgumentError(
          "size_bytes 0: an untyped object needs a size > 0 (a typed object "
          "with a zero dimension may be empty)");
    }
    return size_bytes;
  }
  if (size_bytes == 0) return *extent;
  if (size_bytes < *extent) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "layout spans %d bytes but size_bytes is %d: strides or shape out of "
        "bounds",
        *extent, size_bytes));
  }
  return size_bytes;
}

}  // namespace shmtensor::daemon
