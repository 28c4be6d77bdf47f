#include "shmtensor/errors.h"

#include <iterator>
#include <string>

#include "absl/strings/cord.h"
#include "absl/types/optional.h"

namespace shmtensor {
namespace {

// Indexed by value: kErrorReasons[v].reason == ErrorReason(v).
constexpr ErrorReasonInfo kErrorReasons[] = {
    {ErrorReason::kUnspecified, "ERROR_REASON_UNSPECIFIED"},
    {ErrorReason::kStaleReference, kReasonStaleReference},
    {ErrorReason::kSessionEnded, kReasonSessionEnded},
    {ErrorReason::kAlreadyTaken, kReasonAlreadyTaken},
    {ErrorReason::kLargerThanPool, kReasonLargerThanPool},
    {ErrorReason::kLimitExceeded, kReasonLimitExceeded},
};
static_assert(std::size(kErrorReasons) == kMaxErrorReasonValue + 1);

}  // namespace

const ErrorReasonInfo* FindErrorReason(ErrorReason reason) {
  const int v = static_cast<int>(reason);
  return v >= 0 && v <= kMaxErrorReasonValue ? &kErrorReasons[v] : nullptr;
}
const ErrorReasonInfo* ErrorReasonsBegin() { return std::begin(kErrorReasons); }
const ErrorReasonInfo* ErrorReasonsEnd() { return std::end(kErrorReasons); }

absl::Status WithReason(absl::Status status, absl::string_view reason) {
  status.SetPayload(kErrorReasonPayload, absl::Cord(reason));
  return status;
}

std::string ErrorReasonOf(const absl::Status& status) {
  absl::optional<absl::Cord> payload = status.GetPayload(kErrorReasonPayload);
  return payload ? std::string(*payload) : std::string();
}

}  // namespace shmtensor
