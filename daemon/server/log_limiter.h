// Rate limit for log lines a client can cause (its bad requests, its
// releases of leases it does not hold): a client must not be able to fill
// the operator's disk or drown the lines that matter.
//
// Thread safety: thread-safe.
#ifndef SHMTENSOR_DAEMON_SERVER_LOG_LIMITER_H_
#define SHMTENSOR_DAEMON_SERVER_LOG_LIMITER_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shmtensor::daemon {

class LogLimiter {
 public:
  // At most `lines_per_second` lines in any one-second window.
  explicit LogLimiter(int lines_per_second) : per_second_(lines_per_second) {}

  // True when one more line may be logged now; then *suppressed is how many
  // were refused since the last allowed one (for the line to say so).
  bool Allow(uint64_t* suppressed);

 private:
  const int per_second_;
  absl::Mutex mu_;
  absl::Time window_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int in_window_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t suppressed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_SERVER_LOG_LIMITER_H_
