#include "shmtensor/object_ref.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace shmtensor {
namespace {
constexpr char kVersion = 2;
constexpr size_t kSerializedSize = 26;

void StoreLE(char* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>(v >> (8 * i));
}
uint64_t LoadLE(const char* in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  }
  return v;
}
}  // namespace

std::string ObjectRef::Serialize() const {
  std::string out(kSerializedSize, '\0');
  out[0] = kVersion;
  StoreLE(&out[1], daemon_epoch, 8);
  StoreLE(&out[9], slot, 4);
  StoreLE(&out[13], generation, 4);
  out[17] = exclusive ? 1 : 0;
  StoreLE(&out[18], nonce, 8);
  return out;
}

absl::StatusOr<ObjectRef> ObjectRef::Parse(std::string_view bytes) {
  if (bytes.size() != kSerializedSize || bytes[0] != kVersion ||
      static_cast<unsigned char>(bytes[17]) > 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "not a serialised ObjectRef (%d bytes, version byte %d)", bytes.size(),
        bytes.empty() ? -1 : static_cast<int>(bytes[0])));
  }
  ObjectRef ref;
  ref.daemon_epoch = LoadLE(bytes.data() + 1, 8);
  ref.slot = static_cast<uint32_t>(LoadLE(bytes.data() + 9, 4));
  ref.generation = static_cast<uint32_t>(LoadLE(bytes.data() + 13, 4));
  ref.exclusive = bytes[17] == 1;
  ref.nonce = LoadLE(bytes.data() + 18, 8);
  return ref;
}

}  // namespace shmtensor
