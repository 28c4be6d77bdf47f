#include "testing/cpp/fd_store.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "testing/cpp/daemon_process.h"

namespace shmtensor::testing {

namespace {
// Most descriptors one notification carries (SCM_MAX_FD).
constexpr size_t kMaxFdsPerMessage = 253;
}  // namespace

FdStore::FdStore() {
  static int n = 0;
  path_ = absl::StrCat("/tmp/shmtensor-notify-", getpid(), "-", n++);
  log_ = absl::StrCat(path_, ".log");
  unlink(path_.c_str());
  unlink(log_.c_str());
  sock_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
  // A failure shows as a daemon that never gets ready.
  (void)bind(sock_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
}

FdStore::~FdStore() {
  Kill();
  for (auto& [name, fd] : stored_) close(fd);
  close(sock_);
  unlink(path_.c_str());
  unlink(log_.c_str());
}

absl::Status FdStore::StartSuccessor(const std::vector<std::string>& args) {
  std::vector<std::string> with = args;
  with.push_back("--take-over");
  return Spawn(with, {}, /*pass_stored=*/false);
}

absl::Status FdStore::Start(
    const std::vector<std::string>& args,
    const std::vector<std::pair<std::string, int>>& more) {
  return Spawn(args, more, /*pass_stored=*/true);
}

absl::Status FdStore::Spawn(
    const std::vector<std::string>& args,
    const std::vector<std::pair<std::string, int>>& more, bool pass_stored) {
  if (pid_ > 0) earlier_.push_back(pid_);
  pid_ = 0;
  // What the last instance stored up to now (systemd applies each
  // notification as it comes).
  Drain();
  std::vector<std::pair<std::string, int>> fds;
  if (pass_stored) fds.assign(stored_.begin(), stored_.end());
  fds.insert(fds.end(), more.begin(), more.end());
  // posix_spawn, not fork: the caller's clients may hold views, and a fork
  // would first ask the (dead) daemon for fork holds.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  // Out of the way of 3.. first, so no dup2 overwrites a source.
  std::vector<int> high;
  for (const auto& [name, fd] : fds) {
    high.push_back(fcntl(fd, F_DUPFD_CLOEXEC, 3 + fds.size() + 16));
  }
  std::vector<std::string> names;
  for (size_t i = 0; i < high.size(); ++i) {
    posix_spawn_file_actions_adddup2(&actions, high[i],
                                     3 + static_cast<int>(i));
    names.push_back(fds[i].first);
  }
  posix_spawn_file_actions_addopen(&actions, 1, log_.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  // $LISTEN_PID must be the daemon's own pid, known only once spawned: a
  // shell sets it and execs the daemon in place.
  std::vector<std::string> env = {absl::StrCat("NOTIFY_SOCKET=", path_)};
  if (!fds.empty()) {
    env.push_back(absl::StrCat("LISTEN_FDS=", fds.size()));
    env.push_back(absl::StrCat("LISTEN_FDNAMES=", absl::StrJoin(names, ":")));
  }
  std::vector<std::string> shell = {
      "/bin/sh", "-c",
      fds.empty() ? "exec \"$@\"" : "LISTEN_PID=$$ exec \"$@\"", "sh",
      DaemonPath()};
  shell.insert(shell.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : shell) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const int err =
      posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  for (int fd : high) close(fd);
  if (err != 0) {
    pid_ = 0;
    return absl::InternalError(
        absl::StrCat("posix_spawn shmtensord: ", std::strerror(err)));
  }
  return absl::OkStatus();
}

int FdStore::ApplyOne() {
  char buf[4096];
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  iovec iov{buf, sizeof(buf)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(sock_, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0) return -1;
  std::vector<int> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.push_back(fd);
    }
  }
  std::map<std::string, std::string> kv;
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(buf, n), '\n')) {
    std::pair<std::string, std::string> p = absl::StrSplit(line, '=');
    kv[p.first] = p.second;
  }
  const std::string name = kv.count("FDNAME") ? kv["FDNAME"] : "stored";
  if (kv.count("FDSTOREREMOVE")) {
    for (auto it = stored_.begin(); it != stored_.end();) {
      if (it->first == name) {
        close(it->second);
        it = stored_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (kv.count("FDSTORE")) {
    for (int fd : fds) {
      if (Stored(name, fd)) {
        close(fd);
      } else {
        stored_.emplace(name, fd);
      }
    }
  } else {
    for (int fd : fds) close(fd);
  }
  return kv.count("READY") ? 1 : 0;
}

void FdStore::Drain() {
  while (ApplyOne() >= 0) {
  }
}

bool FdStore::WaitReady(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    const int got = ApplyOne();
    if (got == 1) return true;
    if (got < 0) {
      int status;
      if (pid_ > 0 && waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = 0;
        return false;
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
  }
  return false;
}

void FdStore::Kill() {
  if (pid_ > 0) earlier_.push_back(pid_);
  pid_ = 0;
  for (pid_t pid : earlier_) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  earlier_.clear();
}

bool FdStore::Stored(const std::string& name, int fd) const {
  struct stat a;
  if (fstat(fd, &a) != 0) return false;
  auto [begin, end] = stored_.equal_range(name);
  for (auto it = begin; it != end; ++it) {
    struct stat b;
    if (fstat(it->second, &b) == 0 && a.st_dev == b.st_dev &&
        a.st_ino == b.st_ino) {
      return true;
    }
  }
  return false;
}

std::string FdStore::Log() const {
  std::ifstream f(log_);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace shmtensor::testing
