// Element types of typed shmtensor objects.
//
// Values equal the wire enum shmtensor.v1.DType, so a DType converts to and
// from the proto by a cast. All multi-byte types are little-endian.
// Thread safety: pure functions, safe from any thread.
#ifndef SHMTENSOR_COMMON_INCLUDE_SHMTENSOR_DTYPE_H_
#define SHMTENSOR_COMMON_INCLUDE_SHMTENSOR_DTYPE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

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

// Everything shmtensor knows about one element type: the one table of
// dtypes in C++ (dtype_test checks it against the proto's DType enum, row
// for row). Every other spelling (NumPy, the buffer protocol, DLPack, the
// Python package's codes) is derived from it.
struct DTypeInfo {
  DType dtype;
  // Canonical lower-case name, as NumPy and torch spell it ("float32");
  // "bytes" for kUnspecified.
  const char* name;
  int64_t item_size;  // Bytes per element; 1 for kUnspecified.
  // 'b' bool, 'u' unsigned integer, 'i' signed integer, 'f' IEEE 754
  // binary float, 'B' bfloat16, 'c' complex (two floats).
  char kind;
  // NumPy's little-endian dtype string ("<f4"); null where NumPy has none
  // (bfloat16).
  const char* numpy;
  // PEP 3118 (struct module) format code without byte order ("f", "Zf");
  // null where there is none (bfloat16).
  const char* buffer;
  // Whether every supported torch (1.13 and later) has the type: uint16,
  // uint32 and uint64 are NumPy only.
  bool torch;
};

// The row of `dtype`, or null for a value outside the enum.
const DTypeInfo* FindDType(DType dtype);
// Every row, in value order (kUnspecified first).
const DTypeInfo* DTypesBegin();
const DTypeInfo* DTypesEnd();

// Bytes per element; 1 for kUnspecified (raw bytes), 0 for a value outside
// the enum.
inline int64_t ItemSize(DType dtype) {
  const DTypeInfo* info = FindDType(dtype);
  return info == nullptr ? 0 : info->item_size;
}

// Canonical name ("float32", "bytes" for kUnspecified, "invalid" outside
// the enum).
inline const char* DTypeName(DType dtype) {
  const DTypeInfo* info = FindDType(dtype);
  return info == nullptr ? "invalid" : info->name;
}

// The dtype of `text` spelt as the table spells dtypes, for every binding:
//  - a name of the table ("float32", "bfloat16"; not "bytes");
//  - a NumPy type string of a table kind ('b', 'i', 'u', 'f', 'c') with
//    the item size in bytes, after an optional byte order ('<', '=', '|',
//    '>'): "<f4", "f4", "|u1", "b1"; or "?" (bool);
//  - "torch." and a name torch has of the table's ("torch.float32"), or one
//    of torch's aliases of them ("torch.float", "torch.double",
//    "torch.half", "torch.long", "torch.int", "torch.short",
//    "torch.cfloat", "torch.cdouble").
// Each means what NumPy (or torch) says it means. INVALID_ARGUMENT naming
// the text for a big-endian type string (saying how to convert), and for a
// type string or torch name of a type shmtensor does not store (naming the
// ones it does). NOT_FOUND for any other text: a binding may read it by
// its own ecosystem's rules (Python: NumPy's, where "float" is float64) and
// pass NumPy's type string for it to DTypeOfTypestr.
absl::StatusOr<DType> ParseDType(absl::string_view text);

// The dtype of NumPy type string `typestr` (numpy.dtype.str: "<f4", "|b1",
// "|V8", "<U1", "|O"), named `shown_as` (e.g. str(numpy.dtype)) in the
// error for a type shmtensor does not store; INVALID_ARGUMENT for that, and
// for a big-endian type of more than one byte.
absl::StatusOr<DType> DTypeOfTypestr(absl::string_view typestr,
                                     absl::string_view shown_as);

}  // namespace shmtensor

#endif  // SHMTENSOR_COMMON_INCLUDE_SHMTENSOR_DTYPE_H_
