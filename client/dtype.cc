#include "shmtensor/dtype.h"

#include <string>
#include <utility>

#include "absl/strings/ascii.h"

namespace shmtensor {

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kUnspecified:
      return "bytes";
    case DType::kBool:
      return "bool";
    case DType::kUInt8:
      return "uint8";
    case DType::kInt8:
      return "int8";
    case DType::kInt16:
      return "int16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kComplex64:
      return "complex64";
    case DType::kComplex128:
      return "complex128";
    case DType::kUInt16:
      return "uint16";
    case DType::kUInt32:
      return "uint32";
    case DType::kUInt64:
      return "uint64";
  }
  return "invalid";
}

std::optional<DType> ParseDType(std::string_view name) {
  const std::string n = absl::AsciiStrToLower(std::string(name));
  for (int v = 0; v <= kMaxDTypeValue; ++v) {
    if (n == DTypeName(static_cast<DType>(v))) return static_cast<DType>(v);
  }
  static const std::pair<std::string_view, DType> kAliases[] = {
      {"bool_", DType::kBool},
      {"?", DType::kBool},
      {"b1", DType::kBool},
      {"u1", DType::kUInt8},
      {"i1", DType::kInt8},
      {"i2", DType::kInt16},
      {"short", DType::kInt16},
      {"i4", DType::kInt32},
      {"int", DType::kInt32},
      {"i8", DType::kInt64},
      {"long", DType::kInt64},
      {"f2", DType::kFloat16},
      {"half", DType::kFloat16},
      {"f4", DType::kFloat32},
      {"float", DType::kFloat32},
      {"f8", DType::kFloat64},
      {"double", DType::kFloat64},
      {"c8", DType::kComplex64},
      {"cfloat", DType::kComplex64},
      {"c16", DType::kComplex128},
      {"cdouble", DType::kComplex128},
      {"u2", DType::kUInt16},
      {"u4", DType::kUInt32},
      {"u8", DType::kUInt64},
  };
  for (const auto& [alias, dtype] : kAliases) {
    if (n == alias) return dtype;
  }
  return std::nullopt;
}

}  // namespace shmtensor
