#include "daemon/server/log_limiter.h"

#include "absl/time/clock.h"

namespace shmtensor::daemon {

bool LogLimiter::Allow(uint64_t* suppressed) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - window_ >= absl::Seconds(1)) {
    window_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= per_second_) {
    ++suppressed_;
    return false;
  }
  ++in_window_;
  *suppressed = suppressed_;
  suppressed_ = 0;
  return true;
}

}  // namespace shmtensor::daemon
