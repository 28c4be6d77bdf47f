// The one C++ launcher of shmtensord, for the multi-process tests and the
// C++ benchmarks alike: a real daemon on a fresh socket.
//
// Which daemon: $SHMTENSOR_DAEMON if set, else the build tree's (the path
// CMake compiled in).
// Thread safety: none; one owner.
#ifndef SHMTENSOR_TESTING_CPP_DAEMON_PROCESS_H_
#define SHMTENSOR_TESTING_CPP_DAEMON_PROCESS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "testing/cpp/subprocess.h"

namespace shmtensor::testing {

// A shmtensord on a fresh socket, started from the build tree.
class DaemonProcess {
 public:
  // Starts the daemon with `args` (default: a 64 MiB pool) and waits until it
  // serves. The socket lives at `address`, by default a fresh path under
  // /tmp.
  // `wrapper` comes before the daemon's path (e.g. {"/usr/bin/prlimit",
  // "--nofile=64", "--"}).
  static absl::StatusOr<std::unique_ptr<DaemonProcess>> Start(
      std::vector<std::string> args = {"--pool-size", "64MiB"},
      std::string address = "", std::vector<std::string> wrapper = {});
  // A daemon other users may reach, for the multi-user tests: its socket
  // 0666 in a fresh 0755 directory (the daemon refuses a socket directory
  // others can write), serving the pools `pools_toml` describes ([[pool]]
  // tables with their `users` and the like).
  static absl::StatusOr<std::unique_ptr<DaemonProcess>> StartShared(
      const std::string& pools_toml);
  // SIGKILLs the daemon if still running and removes its leftovers (its
  // log file too).
  ~DaemonProcess();

  const std::string& address() const { return address_; }
  const std::string& socket_path() const { return socket_path_; }
  // The daemon's stdout and stderr go to a file (never a pipe it could
  // fill): process().ReadLine() reads its log as it grows.
  Subprocess& process() { return *process_; }
  // The daemon's pools' memory: for each distinct one (memfd or O_TMPFILE
  // file), a /proc/<pid>/fd/<n> path of a descriptor the daemon holds of
  // it, which stat() and open() follow to the memory itself.
  std::vector<std::string> Pools() const;
  // Sends SIGTERM and returns the wait status.
  int Stop();
  // Resident memory of the daemon outside shared memory (VmRSS less
  // RssShmem), in bytes.
  int64_t PrivateRss() const;
  // CPU time the daemon used so far, all its threads (user and system), in
  // microseconds; -1 when /proc does not say (no schedstat).
  double CpuUs() const;

 private:
  std::string address_;
  std::string socket_path_;
  std::string log_path_;
  std::unique_ptr<Subprocess> process_;
};

// Path of the daemon DaemonProcess starts.
std::string DaemonPath();
// A fresh socket address "unix:/tmp/shmtensor-test-<pid>-<n>-<random>/d.sock",
// in a directory of its own (the daemon makes it 0700).
std::string FreshAddress();

}  // namespace shmtensor::testing

#endif  // SHMTENSOR_TESTING_CPP_DAEMON_PROCESS_H_
