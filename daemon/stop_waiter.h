// What ends a daemon's main thread: SIGTERM or SIGINT (SIGHUP: a reload,
// which re-executes the daemon in place, daemon.h), or, for a private
// daemon (shmtensord --owner-pid, the one a job starts for itself), the end
// of the process that owns it, however that process ends (SIGKILL
// included): its pidfd polls readable then (where the kernel has no
// pidfds, a change of getppid(), checked every second).
//
// Thread safety: Create on the main thread before any other thread exists
// (it blocks the stop signals there, and threads inherit the mask); Wait on
// that thread.
#ifndef SHMTENSOR_DAEMON_STOP_WAITER_H_
#define SHMTENSOR_DAEMON_STOP_WAITER_H_

#include <sys/types.h>

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/os/peer.h"

namespace shmtensor::daemon {

class StopWaiter {
 public:
  // Blocks SIGTERM and SIGINT in the calling thread and watches for them.
  // With `owner`, also watches that process, which must be this process's
  // parent: a private daemon is started by its owner, and a pid that is
  // not the parent may already belong to another process. FAILED_PRECONDITION
  // naming the pid when it is not the parent (or has ended already);
  // INTERNAL naming errno when the kernel refuses a signalfd or pidfd.
  static absl::StatusOr<StopWaiter> Create(std::optional<pid_t> owner);

  // Blocks until a stop signal arrives or the owner ends; returns what it
  // was, for the log ("SIGTERM", "SIGINT", "the end of owner 123").
  std::string Wait();

 private:
  StopWaiter(UniqueFd signals, UniqueFd owner, pid_t owner_pid)
      : signals_(std::move(signals)),
        owner_(std::move(owner)),
        owner_pid_(owner_pid) {}

  UniqueFd signals_;     // A signalfd of SIGTERM and SIGINT.
  UniqueFd owner_;       // The owner's pidfd; invalid without one.
  pid_t owner_pid_ = 0;  // 0: no owner.
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_STOP_WAITER_H_
