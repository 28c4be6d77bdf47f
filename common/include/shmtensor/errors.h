// Error conventions shared by the daemon and the clients.
//
// Every fallible call returns absl::Status with a standard code (see the
// proto's header comment). Where a code alone is ambiguous the status carries
// a reason, which travels as gRPC trailing metadata and comes back as an
// absl::Status payload; use these predicates rather than parsing messages.
#ifndef SHMTENSOR_COMMON_INCLUDE_SHMTENSOR_ERRORS_H_
#define SHMTENSOR_COMMON_INCLUDE_SHMTENSOR_ERRORS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace shmtensor {

// Payload type URL of a reason; the value is an ErrorReason name such as
// "ERROR_REASON_STALE_REFERENCE".
inline constexpr char kErrorReasonPayload[] =
    "type.shmtensor.dev/shmtensor.v1.ErrorReason";
// gRPC trailing metadata key that carries the same reason on the wire.
inline constexpr char kErrorReasonMetadata[] = "shmtensor-error-reason";

inline constexpr char kReasonStaleReference[] = "ERROR_REASON_STALE_REFERENCE";
inline constexpr char kReasonSessionEnded[] = "ERROR_REASON_SESSION_ENDED";
inline constexpr char kReasonAlreadyTaken[] = "ERROR_REASON_ALREADY_TAKEN";
inline constexpr char kReasonLargerThanPool[] = "ERROR_REASON_LARGER_THAN_POOL";
inline constexpr char kReasonLimitExceeded[] = "ERROR_REASON_LIMIT_EXCEEDED";

// Values equal the wire enum shmtensor.v1.ErrorReason.
enum class ErrorReason : int {
  kUnspecified = 0,
  kStaleReference = 1,
  kSessionEnded = 2,
  kAlreadyTaken = 3,
  kLargerThanPool = 4,
  kLimitExceeded = 5,
};
inline constexpr int kMaxErrorReasonValue = 5;

// The one table of error reasons, as dtype.h's is of dtypes: errors_test
// checks it against the proto's ErrorReason enum row for row, and the
// Python package's test its exceptions against it (_core._error_reasons).
struct ErrorReasonInfo {
  ErrorReason reason;
  // The proto's name, which travels on the wire (kReason* above; the
  // payload's and the metadata's value).
  const char* name;
};
// The row of `reason`, or null for a value outside the enum.
const ErrorReasonInfo* FindErrorReason(ErrorReason reason);
// Every row, in value order (kUnspecified first).
const ErrorReasonInfo* ErrorReasonsBegin();
const ErrorReasonInfo* ErrorReasonsEnd();

// Returns `status` with `reason` attached.
absl::Status WithReason(absl::Status status, absl::string_view reason);
// The reason attached to `status`, or "" if none.
std::string ErrorReasonOf(const absl::Status& status);

// The ref names an object that is gone (or of an earlier daemon instance).
inline bool IsStaleReference(const absl::Status& s) {
  return ErrorReasonOf(s) == kReasonStaleReference;
}
// The object was sealed for exclusive transfer and already taken.
inline bool IsAlreadyTaken(const absl::Status& s) {
  return ErrorReasonOf(s) == kReasonAlreadyTaken;
}
// The requested size exceeds the whole pool: no wait or free can make room.
inline bool IsLargerThanPool(const absl::Status& s) {
  return ErrorReasonOf(s) == kReasonLargerThanPool;
}
// A limit the daemon's operator set would be passed (not a full pool).
inline bool IsLimitExceeded(const absl::Status& s) {
  return ErrorReasonOf(s) == kReasonLimitExceeded;
}
// The client's session with the daemon has ended.
inline bool IsSessionEnded(const absl::Status& s) {
  return ErrorReasonOf(s) == kReasonSessionEnded;
}

}  // namespace shmtensor

#endif  // SHMTENSOR_COMMON_INCLUDE_SHMTENSOR_ERRORS_H_
