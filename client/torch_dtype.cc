#include "client/torch_dtype.h"

namespace shmtensor::internal {

std::optional<at::ScalarType> ScalarTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kBool:
      return at::kBool;
    case DType::kUInt8:
      return at::kByte;
    case DType::kInt8:
      return at::kChar;
    case DType::kInt16:
      return at::kShort;
    case DType::kInt32:
      return at::kInt;
    case DType::kInt64:
      return at::kLong;
    case DType::kFloat16:
      return at::kHalf;
    case DType::kBFloat16:
      return at::kBFloat16;
    case DType::kFloat32:
      return at::kFloat;
    case DType::kFloat64:
      return at::kDouble;
    case DType::kComplex64:
      return at::kComplexFloat;
    case DType::kComplex128:
      return at::kComplexDouble;
    default:
      return std::nullopt;
  }
}

}  // namespace shmtensor::internal
