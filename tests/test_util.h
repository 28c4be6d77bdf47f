// Helpers for multi-process tests: real processes, real daemon.
//
// Thread safety: none; use from the test's main thread.
#ifndef SHMTENSOR_TESTS_TEST_UTIL_H_
#define SHMTENSOR_TESTS_TEST_UTIL_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "shmtensor/client.h"
#include "shmtensor/v1/monitor.pb.h"

namespace shmtensor::testing {

// A child process started with fork+exec, its stdout on a pipe.
class Subprocess {
 public:
  // Starts argv[0] (a path) with the given arguments. With `output_file`,
  // its stdout and stderr go to that file instead of a pipe (for a process
  // that may write more than a pipe holds while nobody reads: a daemon's
  // log), and ReadLine reads the file as it grows.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Spawn(
      const std::vector<std::string>& argv,
      const std::string& output_file = "");
  // Kills (SIGKILL) and reaps the child if still running.
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  // Next line of the child's stdout without the newline; DEADLINE_EXCEEDED
  // after `timeout`, OUT_OF_RANGE at end of output.
  absl::StatusOr<std::string> ReadLine(
      absl::Duration timeout = absl::Seconds(20));
  void Signal(int sig);
  // Waits for exit (at most `timeout`, then SIGKILL) and returns the raw
  // wait status.
  int Wait(absl::Duration timeout = absl::Seconds(20));
  // All output read so far and the rest until end of file.
  std::string ReadAll(absl::Duration timeout = absl::Seconds(20));

 private:
  Subprocess(pid_t pid, int out, bool file)
      : pid_(pid), out_(out), file_(file) {}
  pid_t pid_;
  int out_;
  bool file_;  // out_ is a file the child writes, not a pipe.
  bool reaped_ = false;
  std::string buffered_;
};

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

 private:
  std::string address_;
  std::string socket_path_;
  std::string log_path_;
  std::unique_ptr<Subprocess> process_;
};

// Fixture: a fresh daemon per test and a client of it.
class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override;
  // Daemon flags; override for other pools.
  virtual std::vector<std::string> DaemonArgs() {
    return {"--pool-size", "64MiB"};
  }
  // A new client (session) of the test's daemon.
  Client Connect();
  // Runs `st_child <command[0]> <address> <command[1:]...>`.
  std::unique_ptr<Subprocess> Child(const std::vector<std::string>& command);
  // Bytes in use in the daemon's first pool.
  uint64_t Used();

  std::unique_ptr<DaemonProcess> daemon_;
  std::optional<Client> client_;
};

// What the Monitor service of the daemon at `address` says now (failures
// are test failures, answered with an empty message).
v1::DaemonStatus MonitorStatus(const std::string& address);
v1::ListClientsResponse MonitorClients(const std::string& address);
// The first page of objects (up to 10,000).
v1::ListObjectsResponse MonitorObjects(const std::string& address);

// Path of the daemon ($SHMTENSOR_DAEMON if set, else the build tree's) and
// of the test helper binary.
std::string DaemonPath();
std::string ChildPath();
// Names in /dev/shm that a shmtensord could have made ("shmtensor*"): there
// must never be any (pools are unnamed memory).
std::vector<std::string> ShmtensorFilesInDevShm();
// Shmem in /proc/meminfo, bytes.
uint64_t ShmemBytes();
// A fresh socket address "unix:/tmp/shmtensor-test-<pid>-<n>/d.sock".
std::string FreshAddress();

}  // namespace shmtensor::testing

#endif  // SHMTENSOR_TESTS_TEST_UTIL_H_
