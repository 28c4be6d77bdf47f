// Element types of typed shmtensor objects.
//
// Values equal the wire enum shmtensor.v1.DType, so a DType converts to and
// from the proto by a cast. All multi-byte types are little-endian.
// Thread safety: pure functions, safe from any thread.
#ifndef SHMTENSOR_CLIENT_INCLUDE_SHMTENSOR_DTYPE_H_
#define SHMTENSOR_CLIENT_INCLUDE_SHMTENSOR_DTYPE_H_

#include <cstdint>
#include <optional>
#include <string_view>

namespace shmtensor {

enum class DType : int {
  kUnspecified = 0,  // Untyped bytes.
  kBool = 1,
  kUInt8 = 2,
  kInt8 = 3,
  kInt16 = 4,
  kInt32 = 5,
  kInt64 = 6,
  kFloat16 = 7,
  kBFloat16 = 8,
  kFloat32 = 9,
  kFloat64 = 10,
  kComplex64 = 11,
  kComplex128 = 12,
  kUInt16 = 13,
  kUInt32 = 14,
  kUInt64 = 15,
};

inline constexpr int kMaxDTypeValue = 15;

// Bytes per element; 1 for kUnspecified (raw bytes), 0 for a value outside
// the enum.
constexpr int64_t ItemSize(DType dtype) {
  switch (dtype) {
    case DType::kUnspecified:
    case DType::kBool:
    case DType::kUInt8:
    case DType::kInt8:
      return 1;
    case DType::kInt16:
    case DType::kUInt16:
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kInt32:
    case DType::kUInt32:
    case DType::kFloat32:
      return 4;
    case DType::kInt64:
    case DType::kUInt64:
    case DType::kFloat64:
    case DType::kComplex64:
      return 8;
    case DType::kComplex128:
      return 16;
  }
  return 0;
}

// Canonical lower-case name ("float32", "bfloat16", "bytes" for
// kUnspecified, "invalid" outside the enum).
const char* DTypeName(DType dtype);

// Parses a canonical name or a common alias ("float" = float32, "double" =
// float64, "half" = float16, "long" = int64, "int" = int32, "u1"...). Returns
// nullopt for anything else.
std::optional<DType> ParseDType(std::string_view name);

}  // namespace shmtensor

#endif  // SHMTENSOR_CLIENT_INCLUDE_SHMTENSOR_DTYPE_H_
