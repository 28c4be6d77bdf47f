// Refs as hex text, the form tests pass them in to and out of child
// processes (command lines, pipes). One home for both directions, written
// out here because the abseil of Debian 13 deprecates the string-returning
// absl::HexStringToBytes and Debian 12's lacks the one that replaces it.
#ifndef SHMTENSOR_TESTS_REF_HEX_H_
#define SHMTENSOR_TESTS_REF_HEX_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "shmtensor/object_ref.h"

namespace shmtensor::testing {

inline std::string RefToHex(const ObjectRef& ref) {
  return absl::BytesToHexString(ref.Serialize());
}

// INVALID_ARGUMENT, naming (the start of) the text, unless it is an even
// number of hex digits; else what ObjectRef::Parse says of those bytes.
inline absl::StatusOr<ObjectRef> RefFromHex(absl::string_view hex) {
  auto digit = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string bytes;
  bool ok = hex.size() % 2 == 0;
  for (size_t i = 0; ok && i < hex.size(); i += 2) {
    const int hi = digit(hex[i]), lo = digit(hex[i + 1]);
    ok = hi >= 0 && lo >= 0;
    bytes.push_back(static_cast<char>(hi * 16 + lo));
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "not a ref in hex: '", absl::CHexEscape(hex.substr(0, 64)), "'"));
  }
  return ObjectRef::Parse(bytes);
}

}  // namespace shmtensor::testing

#endif  // SHMTENSOR_TESTS_REF_HEX_H_
