// A child process started with fork+exec, for tests and benchmarks that
// run real processes (daemons, clients, attackers).
//
// Every child gets PR_SET_PDEATHSIG(SIGKILL): a test that crashes leaves no
// daemon or helper running.
// Thread safety: none; one owner.
#ifndef SHMTENSOR_TESTING_CPP_SUBPROCESS_H_
#define SHMTENSOR_TESTING_CPP_SUBPROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

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

}  // namespace shmtensor::testing

#endif  // SHMTENSOR_TESTING_CPP_SUBPROCESS_H_
