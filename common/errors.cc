#include "shmtensor/errors.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/types/optional.h"

namespace shmtensor {

absl::Status WithReason(absl::Status status, absl::string_view reason) {
  status.SetPayload(kErrorReasonPayload, absl::Cord(reason));
  return status;
}

std::string ErrorReasonOf(const absl::Status& status) {
  absl::optional<absl::Cord> payload = status.GetPayload(kErrorReasonPayload);
  return payload ? std::string(*payload) : std::string();
}

}  // namespace shmtensor
