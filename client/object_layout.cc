#include "client/object_layout.h"

namespace shmtensor::internal {

std::optional<uint64_t> ObjectBytes(const CreateOptions& o) {
  if (o.dtype == DType::kUnspecified) {
    if (!o.shape.empty() || !o.strides_bytes.empty() || o.size_bytes == 0) {
      return std::nullopt;
    }
    return o.size_bytes;
  }
  const int64_t item = ItemSize(o.dtype);
  if (item <= 0 || o.shape.size() > 64 ||
      (!o.strides_bytes.empty() && o.strides_bytes.size() != o.shape.size())) {
    return std::nullopt;
  }
  unsigned __int128 extent = static_cast<unsigned __int128>(item);
  bool empty = false;
  for (size_t i = 0; i < o.shape.size(); ++i) {
    const int64_t d = o.shape[i];
    if (d < 0) return std::nullopt;
    if (d == 0) empty = true;
    if (o.strides_bytes.empty()) {
      extent *= static_cast<uint64_t>(d);
    } else {
      const int64_t st = o.strides_bytes[i];
      if (st < 0 || st % item != 0) return std::nullopt;
      if (d > 0) {
        extent +=
            static_cast<unsigned __int128>(d - 1) * static_cast<uint64_t>(st);
      }
    }
    if (extent > (static_cast<unsigned __int128>(1) << 62)) return std::nullopt;
  }
  const uint64_t bytes = empty ? 0 : static_cast<uint64_t>(extent);
  if (o.size_bytes == 0) return bytes;
  if (o.size_bytes < bytes) return std::nullopt;
  return o.size_bytes;
}

std::vector<int64_t> ContiguousStrides(DType dtype,
                                       const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t stride = ItemSize(dtype);
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i] > 0 ? shape[i] : 1;
  }
  return strides;
}

}  // namespace shmtensor::internal
