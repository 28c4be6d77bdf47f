#include "daemon/daemon.h"

#include <fcntl.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/host_segment.h"
#include "spdlog/spdlog.h"

namespace shmtensor::daemon {
namespace {

// FNV-1a: stable across builds and runs, unlike absl::Hash.
uint64_t StableHash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

std::string Daemon::SegmentPrefix(const std::string& address) {
  return absl::StrFormat("shmtensor-%d-%08x-", getuid(),
                         StableHash(address) & 0xffffffffu);
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(
    const DaemonConfig& config) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  std::unique_ptr<Daemon> d(new Daemon());
  d->address_ = config.listen;
  if (absl::StartsWith(config.listen, "unix:")) {
    d->socket_path_ = config.listen.substr(5);
    if (absl::StartsWith(d->socket_path_, "//")) {
      d->socket_path_ = d->socket_path_.substr(2);
    }
    d->lock_path_ = d->socket_path_ + ".lock";
    std::error_code ec;
    const auto parent = std::filesystem::path(d->socket_path_).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  } else {
    d->lock_path_ = absl::StrFormat("/tmp/shmtensord-%d-%016x.lock", getuid(),
                                    StableHash(config.listen));
  }

  // One daemon per address: an flock held for the daemon's lifetime. The
  // kernel drops it when the process dies, however it dies.
  d->lock_fd_ = open(d->lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (d->lock_fd_ < 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot open lock file %s: %s", d->lock_path_, std::strerror(errno)));
  }
  if (flock(d->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = {0};
    pread(d->lock_fd_, pid, sizeof(pid) - 1, 0);
    return absl::FailedPreconditionError(absl::StrFormat(
        "another shmtensord (pid %s) already serves %s (lock %s is held)",
        absl::StripAsciiWhitespace(pid), config.listen, d->lock_path_));
  }
  d->owns_address_ = true;
  const std::string pid = absl::StrCat(getpid(), "\n");
  ftruncate(d->lock_fd_, 0);
  pwrite(d->lock_fd_, pid.data(), pid.size(), 0);
  if (!d->socket_path_.empty()) unlink(d->socket_path_.c_str());

  const std::string prefix = SegmentPrefix(config.listen);
  if (int n = HostSegment::RemoveLeftovers(prefix); n > 0) {
    spdlog::warn(
        "removed {} shared-memory segments left by an earlier "
        "instance on {}",
        n, config.listen);
  }

  std::vector<std::unique_ptr<Pool>> pools;
  for (const PoolConfig& pc : config.pools) {
    absl::StatusOr<std::unique_ptr<HostSegment>> seg =
        HostSegment::Create(prefix, pc.size_bytes);
    if (!seg.ok()) {
      return absl::Status(
          seg.status().code(),
          absl::StrCat("pool '", pc.name, "': ", seg.status().message()));
    }
    spdlog::info("pool '{}': {} bytes of host memory reserved at /dev/shm{}",
                 pc.name, (*seg)->size_bytes(), (*seg)->handle());
    pools.push_back(std::make_unique<Pool>(pc.name, *std::move(seg)));
  }
  std::random_device rd;
  const uint64_t epoch = (uint64_t{rd()} << 32) | rd();
  d->store_ = std::make_unique<ObjectStore>(std::move(pools), epoch);
  d->service_ = std::make_unique<ObjectStoreService>(*d->store_);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(config.listen, grpc::InsecureServerCredentials(),
                           &bound_port);
  builder.RegisterService(d->service_.get());
  // Notice dead peers on TCP too (a UDS peer's death is seen at once).
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // The socket is created by BuildAndStart: give it mode 0660 from birth.
  const mode_t old_umask = umask(0117);
  d->server_ = builder.BuildAndStart();
  umask(old_umask);
  if (d->server_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on '", config.listen, "'"));
  }
  if (!d->socket_path_.empty()) chmod(d->socket_path_.c_str(), 0660);
  spdlog::info("shmtensord {} serving on {} ({} pools, epoch {:016x})",
               SHMTENSOR_VERSION, config.listen, config.pools.size(), epoch);
  return d;
}

void Daemon::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  spdlog::info("shutting down: ending {} sessions", store_->Stats().sessions());
  store_->Shutdown();
  service_->EndAllSessions();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_->Wait();
}

Daemon::~Daemon() {
  if (server_ != nullptr) Shutdown();
  server_.reset();
  service_.reset();
  const bool had_pools = store_ != nullptr;
  store_.reset();  // Unlinks every segment.
  // The lock file stays: unlinking it would let a third daemon lock a new
  // file while a second one still waits on the old one.
  if (owns_address_ && !socket_path_.empty()) unlink(socket_path_.c_str());
  if (lock_fd_ >= 0) close(lock_fd_);
  if (had_pools) spdlog::info("stopped; every segment unlinked");
}

}  // namespace shmtensor::daemon
