#include "shmtensor/dtype.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

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
// A type string's '=' means the machine's order, which is little-endian
// everywhere shmtensor runs.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__);

// torch's other names of the table's types (torch.float is float32).
struct TorchAlias {
  const char* alias;
  DType dtype;
};
constexpr TorchAlias kTorchAliases[] = {
    {"float", DType::kFloat32},    {"double", DType::kFloat64},
    {"half", DType::kFloat16},     {"long", DType::kInt64},
    {"int", DType::kInt32},        {"short", DType::kInt16},
    {"cfloat", DType::kComplex64}, {"cdouble", DType::kComplex128},
};

const DTypeInfo* ByName(absl::string_view name) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.dtype != DType::kUnspecified && name == d.name) return &d;
  }
  return nullptr;
}

// The row of NumPy's (kind, item size); null where there is none.
const DTypeInfo* ByKind(char kind, int64_t item_size) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.dtype != DType::kUnspecified && d.numpy != nullptr &&
        d.kind == kind && d.item_size == item_size) {
      return &d;
    }
  }
  return nullptr;
}

absl::Status Unsupported(absl::string_view shown_as) {
  return absl::InvalidArgumentError(
      absl::StrCat("dtype ", shown_as,
                   " has no shmtensor equivalent (supported: bool, (u)int8-64, "
                   "float16/32/64, complex64/128; bfloat16 via torch)"));
}

absl::Status UnsupportedTorch(absl::string_view text) {
  std::vector<std::string> names;
  for (const DTypeInfo& d : kDTypes) {
    if (d.dtype != DType::kUnspecified && d.torch) names.push_back(d.name);
  }
  std::sort(names.begin(), names.end());
  return absl::InvalidArgumentError(
      absl::StrCat("dtype '", text,
                   "' has no shmtensor equivalent (supported torch dtypes: ",
                   absl::StrJoin(names, ", "), ")"));
}

// A type string split: byte order (0: none), kind, item size; false when
// `text` is not byte order? + letter + digits.
bool SplitTypestr(absl::string_view text, char* order, char* kind,
                  int64_t* item_size) {
  *order = 0;
  if (!text.empty() &&
      absl::string_view("<>=|").find(text[0]) != absl::string_view::npos) {
    *order = text[0];
    text.remove_prefix(1);
  }
  if (text.size() < 2 || !absl::ascii_isalpha(text[0])) return false;
  *kind = text[0];
  text.remove_prefix(1);
  for (char c : text) {
    if (!absl::ascii_isdigit(c)) return false;
  }
  return absl::SimpleAtoi(text, item_size);
}

}  // namespace

absl::StatusOr<DType> ParseDType(absl::string_view text) {
  if (absl::string_view name = text; absl::ConsumePrefix(&name, "torch.")) {
    for (const TorchAlias& a : kTorchAliases) {
      if (name == a.alias) return a.dtype;
    }
    const DTypeInfo* d = ByName(name);
    if (d == nullptr || !d->torch) return UnsupportedTorch(text);
    return d->dtype;
  }
  if (const DTypeInfo* d = ByName(text)) return d->dtype;
  if (text == "?") return DType::kBool;
  char order, kind;
  int64_t item_size;
  if (SplitTypestr(text, &order, &kind, &item_size) &&
      absl::string_view("biufc").find(kind) != absl::string_view::npos) {
    return DTypeOfTypestr(text, text);
  }
  return absl::NotFoundError(absl::StrCat("unknown dtype '", text, "'"));
}

absl::StatusOr<DType> DTypeOfTypestr(absl::string_view typestr,
                                     absl::string_view shown_as) {
  if (typestr == "?" || typestr == "|?") return DType::kBool;
  char order, kind;
  int64_t item_size;
  if (!SplitTypestr(typestr, &order, &kind, &item_size)) {
    return Unsupported(shown_as);
  }
  const DTypeInfo* d = ByKind(kind, item_size);
  if (d == nullptr) return Unsupported(shown_as);
  if (order == '>' && item_size > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype ", typestr,
        " is big-endian; shmtensor stores little-endian values: convert "
        "with a.astype(a.dtype.newbyteorder('<'))"));
  }
  return d->dtype;
}

const DTypeInfo* FindDType(DType dtype) {
  const int v = static_cast<int>(dtype);
  return v >= 0 && v <= kMaxDTypeValue ? &kDTypes[v] : nullptr;
}
const DTypeInfo* DTypesBegin() { return std::begin(kDTypes); }
const DTypeInfo* DTypesEnd() { return std::end(kDTypes); }

}  // namespace shmtensor
