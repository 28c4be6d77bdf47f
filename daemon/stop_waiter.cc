#include "daemon/stop_waiter.h"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shmtensor::daemon {

absl::StatusOr<StopWaiter> StopWaiter::Create(std::optional<pid_t> owner) {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  UniqueFd signals(signalfd(-1, &stop, SFD_CLOEXEC));
  if (!signals.valid()) {
    return absl::InternalError(
        absl::StrCat("signalfd: ", std::strerror(errno)));
  }
  if (!owner.has_value()) return StopWaiter(std::move(signals), UniqueFd(), 0);
  if (*owner <= 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("owner pid %d: not a process id", *owner));
  }
  // Without pidfds (Linux before 5.3; a seccomp profile that refuses
  // them), Wait polls getppid() instead: the owner is the parent, and a
  // parent's end reparents its children.
  absl::StatusOr<UniqueFd> opened = OpenPidfd(*owner);
  const bool no_pidfds = absl::IsUnimplemented(opened.status());
  if (!opened.ok() && !no_pidfds && !absl::IsNotFound(opened.status())) {
    return opened.status();
  }
  UniqueFd pidfd = opened.ok() ? *std::move(opened) : UniqueFd();
  // Checked after the pidfd is open: if the parent is `owner` now, the
  // pidfd follows that process (the pid cannot be recycled while it is
  // this process's parent), not a later one with its number.
  if ((!pidfd.valid() && !no_pidfds) || getppid() != *owner) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "owner pid %d is not this daemon's parent (pid %d): a private daemon "
        "must be started by its owner, which may also have ended already",
        *owner, getppid()));
  }
  return StopWaiter(std::move(signals), std::move(pidfd), *owner);
}

std::string StopWaiter::Wait() {
  pollfd fds[2] = {{signals_.get(), POLLIN, 0}, {owner_.get(), POLLIN, 0}};
  const nfds_t n = owner_.valid() ? 2 : 1;
  // An owner without a pidfd: its end is seen within a second.
  const int timeout_ms = owner_pid_ != 0 && !owner_.valid() ? 1000 : -1;
  while (true) {
    if (poll(fds, n, timeout_ms) < 0) {
      if (errno == EINTR) continue;
      return absl::StrCat("poll failing (", std::strerror(errno), ")");
    }
    if ((n == 2 && fds[1].revents != 0) ||
        (timeout_ms > 0 && getppid() != owner_pid_)) {
      return absl::StrCat("the end of owner ", owner_pid_);
    }
    if (fds[0].revents != 0) {
      signalfd_siginfo info;
      if (read(signals_.get(), &info, sizeof(info)) == sizeof(info)) {
        return info.ssi_signo == SIGTERM  ? "SIGTERM"
               : info.ssi_signo == SIGHUP ? "SIGHUP"
                                          : "SIGINT";
      }
    }
  }
}

}  // namespace shmtensor::daemon
