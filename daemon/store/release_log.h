// The order of one session's ReleaseLeases messages. A client numbers them
// 1, 2, ... and may send each twice (on its stream, and copied into a unary
// request that must not overtake it), so each is applied once, in order.
//
// Thread safety: not thread-safe; the owner (ObjectStore) serializes access.
#ifndef SHMTENSOR_DAEMON_STORE_RELEASE_LOG_H_
#define SHMTENSOR_DAEMON_STORE_RELEASE_LOG_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shmtensor::daemon {

class ReleaseLog {
 public:
  // Whether message `seq` is to be applied now: true when it is the next one
  // due (it is then recorded as applied), false when it was applied already
  // (the other copy came first: nothing to do). INVALID_ARGUMENT naming both
  // seqs when `seq` is past the next one due.
  absl::StatusOr<bool> Apply(uint64_t seq);

  // A successor's log of a session whose predecessor applied through
  // `applied` (the ledger's record of it).
  void Restore(uint64_t applied) { applied_ = applied; }
  // The last seq applied (0: none yet).
  uint64_t applied() const { return applied_; }
  // Whether every message through `seq` was applied (always, for seq 0).
  bool Reached(uint64_t seq) const { return applied_ >= seq; }
  // DEADLINE_EXCEEDED naming `seq` and the last seq applied, for a wait for
  // `seq` that ran out of time.
  absl::Status NotReachedError(uint64_t seq) const;

 private:
  uint64_t applied_ = 0;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_STORE_RELEASE_LOG_H_
