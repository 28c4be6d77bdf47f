#include "testing/cpp/daemon_process.h"

#include <dirent.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <utility>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shmtensor::testing {

std::string DaemonPath() {
  // Overridable for test binaries run away from their build tree
  // (testing/gpu/gpu_check.sh runs them on a GPU machine).
  const char* env = std::getenv("SHMTENSOR_DAEMON");
  return env != nullptr && *env != '\0' ? env : SHMTENSOR_DAEMON_PATH;
}
std::string FreshAddress() {
  static std::atomic<int> counter{0};
  // In a directory of its own, which the daemon makes 0700: a socket
  // directory others can write is refused. Random too: a test process
  // killed before its destructors ran leaves its directory, and the kernel
  // hands its pid out again.
  return absl::StrFormat("unix:/tmp/shmtensor-test-%d-%d-%016x/d.sock",
                         getpid(), counter++,
                         absl::Uniform<uint64_t>(absl::BitGen()));
}

absl::StatusOr<std::unique_ptr<DaemonProcess>> DaemonProcess::Start(
    std::vector<std::string> args, std::string address,
    std::vector<std::string> wrapper) {
  auto d = std::make_unique<DaemonProcess>();
  d->address_ = address.empty() ? FreshAddress() : address;
  d->socket_path_ = d->address_.substr(5);
  std::vector<std::string> argv = {DaemonPath(), "--listen", d->address_,
                                   "--log-level", "warn"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.begin(), wrapper.begin(), wrapper.end());
  d->log_path_ =
      d->socket_path_.substr(0, d->socket_path_.rfind('/')) + "-daemon.log";
  absl::StatusOr<std::unique_ptr<Subprocess>> p =
      Subprocess::Spawn(argv, d->log_path_);
  if (!p.ok()) return p.status();
  d->process_ = *std::move(p);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  // Ready when the socket accepts a connection (a file alone may be the
  // stale socket of a crashed instance).
  auto accepts = [&] {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, d->socket_path_.c_str(),
                 sizeof(addr.sun_path) - 1);
    const bool ok =
        connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    return ok;
  };
  while (!accepts()) {
    int status;
    if (waitpid(d->process_->pid(), &status, WNOHANG) == d->process_->pid()) {
      return absl::InternalError("daemon exited during start");
    }
    if (absl::Now() > deadline)
      return absl::DeadlineExceededError("daemon start");
    absl::SleepFor(absl::Milliseconds(10));
  }
  return d;
}

absl::StatusOr<std::unique_ptr<DaemonProcess>> DaemonProcess::StartShared(
    const std::string& pools_toml) {
  const std::string address = FreshAddress();
  const std::string dir = address.substr(5, address.rfind('/') - 5);
  if (mkdir(dir.c_str(), 0755) != 0 || chmod(dir.c_str(), 0755) != 0) {
    return absl::InternalError(absl::StrCat("mkdir ", dir));
  }
  const std::string config = dir + ".toml";
  std::ofstream(config) << "socket_mode = \"0666\"\n" << pools_toml;
  absl::StatusOr<std::unique_ptr<DaemonProcess>> d =
      Start({"--config", config}, address);
  unlink(config.c_str());
  if (!d.ok()) rmdir(dir.c_str());
  return d;
}

DaemonProcess::~DaemonProcess() {
  process_.reset();
  unlink(log_path_.c_str());
  // Whatever the daemon left in its socket directory (a daemon that was
  // killed leaves its sockets and lock file; a successor that took over
  // makes them again), then the directory.
  const std::string dir = socket_path_.substr(0, socket_path_.rfind('/'));
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..")) {
        unlinkat(dirfd(d), e->d_name, 0);
      }
    }
    closedir(d);
  }
  rmdir(dir.c_str());
}

std::vector<std::string> DaemonProcess::Pools() const {
  std::vector<std::string> out;
  std::set<std::pair<dev_t, ino_t>> seen;
  const std::string fds = absl::StrCat("/proc/", process_->pid(), "/fd");
  if (DIR* dir = opendir(fds.c_str())) {
    while (dirent* e = readdir(dir)) {
      const std::string path = absl::StrCat(fds, "/", e->d_name);
      char target[4096];
      const ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
      if (n <= 0) continue;
      const std::string t(target, n);
      // A memfd, or an O_TMPFILE file ("/dir/#<inode> (deleted)").
      if (!absl::StartsWith(t, "/memfd:shmtensor:") &&
          !absl::StrContains(t, "/#")) {
        continue;
      }
      struct stat st;
      if (stat(path.c_str(), &st) == 0 &&
          seen.insert({st.st_dev, st.st_ino}).second) {
        out.push_back(path);
      }
    }
    closedir(dir);
  }
  return out;
}

int DaemonProcess::Stop() {
  process_->Signal(SIGTERM);
  return process_->Wait();
}

int64_t DaemonProcess::PrivateRss() const {
  std::ifstream f(absl::StrCat("/proc/", process_->pid(), "/status"));
  int64_t rss = 0, shmem = 0;
  for (std::string line; std::getline(f, line);) {
    if (absl::StartsWith(line, "VmRSS:")) rss = std::atoll(line.c_str() + 6);
    if (absl::StartsWith(line, "RssShmem:")) {
      shmem = std::atoll(line.c_str() + 9);
    }
  }
  return (rss - shmem) * 1024;
}

double DaemonProcess::CpuUs() const {
  // Each thread's time on a CPU, in ns (schedstat's first field): finer
  // than the clock ticks /proc/<pid>/stat counts in. The daemon's threads
  // live as long as it does, so none that ran is missing from the sum.
  const std::string tasks = absl::StrCat("/proc/", process_->pid(), "/task");
  DIR* dir = opendir(tasks.c_str());
  if (dir == nullptr) return -1;
  double ns = 0;
  bool any = false;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(absl::StrCat(tasks, "/", e->d_name, "/schedstat"));
    uint64_t on_cpu = 0;
    if (f >> on_cpu) {
      ns += static_cast<double>(on_cpu);
      any = true;
    }
  }
  closedir(dir);
  return any ? ns / 1e3 : -1;
}

}  // namespace shmtensor::testing
