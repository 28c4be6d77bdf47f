// References to shmtensor objects.
#ifndef SHMTENSOR_COMMON_INCLUDE_SHMTENSOR_OBJECT_REF_H_
#define SHMTENSOR_COMMON_INCLUDE_SHMTENSOR_OBJECT_REF_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace shmtensor {

// Names one object of one daemon instance. A plain value: copy it, serialise
// it, send it to another process. It holds nothing: the object may be gone by
// the time someone uses it, and then Get fails with a stale-reference error
// (IsStaleReference), never with another object's bytes.
struct ObjectRef {
  uint64_t daemon_epoch = 0;
  uint32_t slot = 0;
  uint32_t generation = 0;
  bool exclusive = false;  // Sealed for hand-off to exactly one consumer.
  // 64 random bits the daemon drew for the object: a ref cannot be guessed
  // from slot and generation (listings show refs without it).
  uint64_t nonce = 0;

  // 26 bytes: a version byte (2), then the fields little-endian.
  std::string Serialize() const;
  // Inverse of Serialize. INVALID_ARGUMENT for any other input.
  static absl::StatusOr<ObjectRef> Parse(std::string_view bytes);

  bool operator==(const ObjectRef& o) const {
    return daemon_epoch == o.daemon_epoch && slot == o.slot &&
           generation == o.generation && exclusive == o.exclusive &&
           nonce == o.nonce;
  }
};

}  // namespace shmtensor

#endif  // SHMTENSOR_COMMON_INCLUDE_SHMTENSOR_OBJECT_REF_H_
