#include "tests/test_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"
#include "shmtensor/v1/monitor.grpc.pb.h"

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

std::string DaemonPath() {
  // Overridable for test binaries run away from their build tree
  // (bench/gpu_check.sh runs them on a GPU machine).
  const char* env = std::getenv("SHMTENSOR_DAEMON");
  return env != nullptr && *env != '\0' ? env : SHMTENSOR_DAEMON_PATH;
}
std::string ChildPath() { return SHMTENSOR_CHILD_PATH; }

namespace {
// One Monitor call on a channel of its own.
template <typename Req, typename Resp>
Resp Monitor(const std::string& address,
             grpc::Status (v1::Monitor::Stub::*method)(grpc::ClientContext*,
                                                       const Req&, Resp*)) {
  auto stub = v1::Monitor::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  Resp r;
  grpc::Status st = (stub.get()->*method)(&ctx, Req(), &r);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return r;
}
}  // namespace

v1::DaemonStatus MonitorStatus(const std::string& address) {
  return Monitor(address, &v1::Monitor::Stub::GetStatus);
}
v1::ListClientsResponse MonitorClients(const std::string& address) {
  return Monitor(address, &v1::Monitor::Stub::ListClients);
}
v1::ListObjectsResponse MonitorObjects(const std::string& address) {
  return Monitor(address, &v1::Monitor::Stub::ListObjects);
}

std::string FreshAddress() {
  static std::atomic<int> counter{0};
  // In a directory of its own, which the daemon makes 0700: a socket
  // directory others can write is refused.
  return absl::StrCat("unix:/tmp/shmtensor-test-", getpid(), "-", counter++,
                      "/d.sock");
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

DaemonProcess::~DaemonProcess() {
  process_.reset();
  unlink(log_path_.c_str());
  unlink(socket_path_.c_str());
  unlink((socket_path_ + ".fd").c_str());
  unlink((socket_path_ + ".lock").c_str());
  rmdir(socket_path_.substr(0, socket_path_.rfind('/')).c_str());
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

std::vector<std::string> ShmtensorFilesInDevShm() {
  std::vector<std::string> out;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* e = readdir(dir)) {
      if (absl::StartsWith(e->d_name, "shmtensor")) out.push_back(e->d_name);
    }
    closedir(dir);
  }
  return out;
}

uint64_t ShmemBytes() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    if (absl::StartsWith(line, "Shmem:")) {
      return std::stoull(line.substr(6)) * 1024;
    }
  }
  return 0;
}

int DaemonProcess::Stop() {
  process_->Signal(SIGTERM);
  return process_->Wait();
}

void DaemonTest::SetUp() {
  absl::StatusOr<std::unique_ptr<DaemonProcess>> d =
      DaemonProcess::Start(DaemonArgs());
  ASSERT_TRUE(d.ok()) << d.status();
  daemon_ = *std::move(d);
  client_ = Connect();
}

Client DaemonTest::Connect() {
  absl::StatusOr<Client> c = Client::Connect({.address = daemon_->address()});
  if (!c.ok()) {
    ADD_FAILURE() << c.status();
    std::abort();
  }
  return *std::move(c);
}

std::unique_ptr<Subprocess> DaemonTest::Child(
    const std::vector<std::string>& command) {
  std::vector<std::string> argv = {ChildPath(), command[0], daemon_->address()};
  argv.insert(argv.end(), command.begin() + 1, command.end());
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn(argv);
  if (!p.ok()) {
    ADD_FAILURE() << p.status();
    std::abort();
  }
  return *std::move(p);
}

uint64_t DaemonTest::Used() {
  absl::StatusOr<StoreStats> s = client_->Stats();
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? s->pools[0].used_bytes : ~uint64_t{0};
}

}  // namespace shmtensor::testing
