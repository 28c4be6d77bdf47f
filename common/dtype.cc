#include "shmtensor/dtype.h"

#include <iterator>

namespace shmtensor {
namespace {

// Indexed by value: kDTypes[v].dtype == DType(v) (dtype_test checks it).
constexpr DTypeInfo kDTypes[] = {
    {DType::kUnspecified, "bytes", 1, 'u', "u1", "B", true},
    {DType::kBool, "bool", 1, 'b', "?", "?", true},
    {DType::kUInt8, "uint8", 1, 'u', "u1", "B", true},
    {DType::kInt8, "int8", 1, 'i', "i1", "b", true},
    {DType::kInt16, "int16", 2, 'i', "<i2", "h", true},
    {DType::kInt32, "int32", 4, 'i', "<i4", "i", true},
    {DType::kInt64, "int64", 8, 'i', "<i8", "q", true},
    {DType::kFloat16, "float16", 2, 'f', "<f2", "e", true},
    {DType::kBFloat16, "bfloat16", 2, 'B', nullptr, nullptr, true},
    {DType::kFloat32, "float32", 4, 'f', "<f4", "f", true},
    {DType::kFloat64, "float64", 8, 'f', "<f8", "d", true},
    {DType::kComplex64, "complex64", 8, 'c', "<c8", "Zf", true},
    {DType::kComplex128, "complex128", 16, 'c', "<c16", "Zd", true},
    {DType::kUInt16, "uint16", 2, 'u', "<u2", "H", false},
    {DType::kUInt32, "uint32", 4, 'u', "<u4", "I", false},
    {DType::kUInt64, "uint64", 8, 'u', "<u8", "Q", false},
};
static_assert(std::size(kDTypes) == kMaxDTypeValue + 1);

}  // namespace

const DTypeInfo* FindDType(DType dtype) {
  const int v = static_cast<int>(dtype);
  return v >= 0 && v <= kMaxDTypeValue ? &kDTypes[v] : nullptr;
}
const DTypeInfo* DTypesBegin() { return std::begin(kDTypes); }
const DTypeInfo* DTypesEnd() { return std::end(kDTypes); }

}  // namespace shmtensor
