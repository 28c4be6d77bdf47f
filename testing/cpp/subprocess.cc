#include "testing/cpp/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace shmtensor::testing {

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Spawn(
    const std::vector<std::string>& argv, const std::string& output_file) {
  int fds[2];
  const bool file = !output_file.empty();
  if (file) {
    fds[1] = open(output_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                  0600);
    fds[0] = open(output_file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fds[0] < 0 || fds[1] < 0) return absl::InternalError("open failed");
  } else if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError("pipe failed");
  }
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    // A test that crashes must not leave its daemons and children running.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(fds[1], STDOUT_FILENO);
    if (file) dup2(fds[1], STDERR_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  return std::unique_ptr<Subprocess>(new Subprocess(pid, fds[0], file));
}

Subprocess::~Subprocess() {
  if (!reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  close(out_);
}

absl::StatusOr<std::string> Subprocess::ReadLine(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (size_t nl = buffered_.find('\n'); nl != std::string::npos) {
      std::string line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return line;
    }
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("no line from child ", pid_, "; got '", buffered_, "'"));
    }
    char buf[4096];
    if (file_) {
      // A file: nothing new yet is not the end, unless the child is gone.
      const ssize_t n = read(out_, buf, sizeof(buf));
      if (n > 0) {
        buffered_.append(buf, n);
        continue;
      }
      siginfo_t info{};
      const bool exited =
          reaped_ ||
          (waitid(P_PID, pid_, &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
           info.si_pid == pid_);
      if (exited) {  // All it wrote is in the file: one last read.
        const ssize_t last = read(out_, buf, sizeof(buf));
        if (last > 0) {
          buffered_.append(buf, last);
          continue;
        }
        return absl::OutOfRangeError(
            absl::StrCat("child ", pid_, " exited; got '", buffered_, "'"));
      }
      absl::SleepFor(absl::Milliseconds(std::min<int64_t>(ms, 5)));
      continue;
    }
    pollfd p{out_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(ms)) <= 0) continue;
    const ssize_t n = read(out_, buf, sizeof(buf));
    if (n <= 0) {
      return absl::OutOfRangeError(absl::StrCat(
          "child ", pid_, " closed stdout; got '", buffered_, "'"));
    }
    buffered_.append(buf, n);
  }
}

std::string Subprocess::ReadAll(absl::Duration timeout) {
  std::string all;
  while (true) {
    absl::StatusOr<std::string> line = ReadLine(timeout);
    if (!line.ok()) break;
    absl::StrAppend(&all, *line, "\n");
  }
  absl::StrAppend(&all, buffered_);
  buffered_.clear();
  return all;
}

void Subprocess::Signal(int sig) { kill(pid_, sig); }

int Subprocess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  while (!reaped_) {
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      break;
    }
    if (absl::Now() > deadline) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      reaped_ = true;
      break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return status;
}

}  // namespace shmtensor::testing
