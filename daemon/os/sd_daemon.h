// systemd's two descriptor protocols, spoken directly (they are a datagram
// and three environment variables; libsystemd would add a dependency for
// nothing):
//  - sd_notify(3): a datagram of "KEY=VALUE\n" lines to the Unix socket
//    $NOTIFY_SOCKET (a path, or "@name" for the abstract namespace), with
//    descriptors attached as SCM_RIGHTS for FDSTORE=1 (the file descriptor
//    store: systemd keeps them and passes them to the next instance of the
//    service, e.g. after a crash and Restart=on-failure).
//  - sd_listen_fds(3): descriptors passed from 3 on, $LISTEN_FDS of them,
//    for the process $LISTEN_PID, named by $LISTEN_FDNAMES (colon-separated).
// The daemon uses the second one too when it re-executes itself (a reload):
// the same variables, its own pid.
//
// Thread safety: Notify is thread-safe; TakeListenFds reads and clears the
// environment, so call it once, before threads start.
#ifndef SHMTENSOR_DAEMON_OS_SD_DAEMON_H_
#define SHMTENSOR_DAEMON_OS_SD_DAEMON_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/os/peer.h"

namespace shmtensor::daemon {

// Sends `state` (e.g. "READY=1", "FDSTORE=1\nFDNAME=ledger") with `fds`
// attached to $NOTIFY_SOCKET. Returns false when $NOTIFY_SOCKET is unset
// (nothing to tell), true once sent; INTERNAL naming the socket and errno
// when it cannot be sent, INVALID_ARGUMENT for more than 253 descriptors.
absl::StatusOr<bool> Notify(absl::string_view state,
                            const std::vector<int>& fds = {});

// An FDNAME is 1 to 255 printable ASCII characters, no ':' (what systemd
// accepts).
bool ValidFdName(absl::string_view name);

struct NamedFd {
  std::string name;  // "unknown" when $LISTEN_FDNAMES names none.
  UniqueFd fd;
};

// The descriptors passed to this process ($LISTEN_PID is its pid), made
// close-on-exec, and clears the three variables so that no child sees
// them. Empty when none were passed (or they were another process's);
// INVALID_ARGUMENT naming the variable for values that do not parse.
absl::StatusOr<std::vector<NamedFd>> TakeListenFds();

// Sets up the descriptor-passing variables for an exec of this process
// itself (pid unchanged): moves `fds` to 3, 4, ... (not close-on-exec),
// sets LISTEN_FDS, LISTEN_PID and LISTEN_FDNAMES. For the moment before
// execve(2) only: it rearranges this process's descriptors.
absl::Status PrepareListenFdsForExec(const std::vector<NamedFd>& fds);

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_OS_SD_DAEMON_H_
