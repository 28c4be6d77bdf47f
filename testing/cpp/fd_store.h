// systemd's part in a restart through its file descriptor store, for tests
// and benchmarks: a supervisor that speaks systemd's protocols byte for
// byte. It receives the daemon's notifications on its own $NOTIFY_SOCKET
// (datagrams, descriptors attached with SCM_RIGHTS: FDSTORE=1, FDNAME=,
// FDSTOREREMOVE=1, READY=1), keeps what is stored, and starts the daemon's
// next instance with it as $LISTEN_FDS, $LISTEN_PID and $LISTEN_FDNAMES
// (descriptors from 3), as systemd starts a unit's next instance.
//
// Thread safety: none; one owner.
#ifndef SHMTENSOR_TESTING_CPP_FD_STORE_H_
#define SHMTENSOR_TESTING_CPP_FD_STORE_H_

#include <sys/types.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace shmtensor::testing {

class FdStore {
 public:
  // Binds the notify socket (a fresh path under /tmp).
  FdStore();
  // SIGKILLs the daemon if it runs; closes what is stored.
  ~FdStore();
  FdStore(const FdStore&) = delete;
  FdStore& operator=(const FdStore&) = delete;

  // Starts the daemon (DaemonPath()) with `args`, the stored descriptors and
  // `more` (name, descriptor: passed too, not stored), its output appended
  // to Log(). INTERNAL when it cannot be spawned.
  absl::Status Start(const std::vector<std::string>& args,
                     const std::vector<std::pair<std::string, int>>& more = {});
  // Starts a successor (`args` with --take-over) beside the running daemon,
  // as ExecReload= would: with $NOTIFY_SOCKET, without the stored
  // descriptors (it takes them from its predecessor). The predecessor is
  // reaped once it exits.
  absl::Status StartSuccessor(const std::vector<std::string>& args);
  // Applies notifications until READY=1. False at the deadline or when the
  // daemon exited.
  bool WaitReady(absl::Duration timeout = absl::Seconds(20));
  // SIGKILLs the daemon (and any predecessor still there) and reaps them.
  void Kill();

  pid_t pid() const { return pid_; }
  // What every instance wrote.
  std::string Log() const;
  // Name -> descriptor, as stored now. A descriptor of a file already
  // stored under its name is not stored twice (as systemd does).
  const std::multimap<std::string, int>& stored() const { return stored_; }

 private:
  // Start and StartSuccessor: the stored descriptors are passed when
  // `pass_stored`.
  absl::Status Spawn(const std::vector<std::string>& args,
                     const std::vector<std::pair<std::string, int>>& more,
                     bool pass_stored);
  // Applies one notification waiting on the socket: 1 when it said
  // READY=1, 0 otherwise, -1 when none was waiting.
  int ApplyOne();
  // Applies every notification waiting.
  void Drain();
  // Whether a descriptor of the file `fd` refers to is stored as `name`.
  bool Stored(const std::string& name, int fd) const;

  std::string path_;
  std::string log_;
  int sock_ = -1;
  pid_t pid_ = 0;
  std::vector<pid_t> earlier_;  // Predecessors, reaped by Kill.
  std::multimap<std::string, int> stored_;
};

}  // namespace shmtensor::testing

#endif  // SHMTENSOR_TESTING_CPP_FD_STORE_H_
