#include "daemon/daemon.h"

#include <fcntl.h>
#include <grp.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "daemon/memory/cuda_segment.h"
#include "daemon/memory/host_segment.h"
#include "daemon/server/unix_listener.h"
#include "shmtensor/defaults.h"
#include "spdlog/spdlog.h"

namespace shmtensor::daemon {
namespace {

absl::Status PrepareSocketDirectory(const std::string& socket_path,
                                    bool* created) {
  std::string dir = std::filesystem::path(socket_path).parent_path().string();
  if (dir.empty()) dir = ".";
  *created = mkdir(dir.c_str(), 0700) == 0;
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("socket directory %s: %s", dir, std::strerror(errno)));
  }
  // Only its owner may be able to put a socket (or a lock file) there:
  // otherwise another user could take the address first, or swap the
  // daemon's socket for one of their own.
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "socket directory %s is not a directory (a symlink?)", dir));
  }
  if (st.st_uid != geteuid() && st.st_uid != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "socket directory %s belongs to uid %d, not to this daemon's uid %d "
        "or root: another user could replace the socket",
        dir, st.st_uid, geteuid()));
  }
  if ((st.st_mode & 022) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "socket directory %s has mode %04o: others can write it, so they "
        "could take the address first; use a directory only its owner can "
        "write (the default, $XDG_RUNTIME_DIR or /tmp/shmtensor-<uid>, is)",
        dir, st.st_mode & 07777));
  }
  return absl::OkStatus();
}

// Opens the lock file without following a link, and only if it is a plain
// file of this user with one name (a hard link to someone else's file, made
// before the directory was checked, is refused).
absl::StatusOr<int> OpenLockFile(const std::string& path) {
  const int fd =
      open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot open lock file %s: %s", path, std::strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
      st.st_nlink != 1) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrFormat(
        "lock file %s is not a plain file of uid %d with one link; remove it",
        path, geteuid()));
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(
    const DaemonConfig& config) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  std::unique_ptr<Daemon> d(new Daemon());
  d->address_ = config.listen;
  if (!absl::StartsWith(config.listen, "unix:")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen address '", config.listen.substr(0, 128),
        "' is not unix:/path: the data plane is served on a Unix socket "
        "only (clients' identity comes from the kernel there); use "
        "monitor_listen for TCP monitoring"));
  }
  d->socket_path_ = config.listen.substr(5);
  if (absl::StartsWith(d->socket_path_, "//")) {
    d->socket_path_ = d->socket_path_.substr(2);
  }
  d->lock_path_ = d->socket_path_ + ".lock";
  if (absl::Status s =
          PrepareSocketDirectory(d->socket_path_, &d->created_directory_);
      !s.ok()) {
    return s;
  }
  d->created_directory_ |= config.owns_socket_directory;

  // One daemon per address: an flock on the lock file, held for the
  // daemon's lifetime (the kernel drops it when the process dies, however it
  // dies). A daemon that stops cleanly unlinks the file while it still holds
  // the lock, so the owner is whoever locks the file that is at the path:
  // one that locked a file unlinked meanwhile (opened just before a
  // predecessor removed it) tries again with the path's new file.
  for (int attempt = 0;; ++attempt) {
    if (d->lock_fd_ >= 0) close(d->lock_fd_);
    d->lock_fd_ = -1;
    absl::StatusOr<int> fd = OpenLockFile(d->lock_path_);
    if (!fd.ok()) return fd.status();
    d->lock_fd_ = *fd;
    if (flock(d->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      char pid[32] = {0};
      pread(d->lock_fd_, pid, sizeof(pid) - 1, 0);
      return absl::FailedPreconditionError(absl::StrFormat(
          "another shmtensord (pid %s) already serves %s (lock %s is held)",
          absl::StripAsciiWhitespace(pid), config.listen, d->lock_path_));
    }
    struct stat locked, at_path;
    if (fstat(d->lock_fd_, &locked) == 0 &&
        lstat(d->lock_path_.c_str(), &at_path) == 0 &&
        locked.st_dev == at_path.st_dev && locked.st_ino == at_path.st_ino) {
      break;
    }
    if (attempt == 100) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "lock file %s keeps being replaced; is another shmtensord "
          "starting and stopping on %s?",
          d->lock_path_, config.listen));
    }
  }
  d->owns_address_ = true;
  const std::string pid = absl::StrCat(getpid(), "\n");
  ftruncate(d->lock_fd_, 0);
  pwrite(d->lock_fd_, pid.data(), pid.size(), 0);

  int gid = -1;
  if (!config.socket_group.empty()) {
    struct group* g = getgrnam(config.socket_group.c_str());
    if (g == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "socket_group '", config.socket_group, "' is not a group here"));
    }
    gid = static_cast<int>(g->gr_gid);
  }

  // What can be refused without reserving memory, before any pool is: the
  // descriptor socket's path, every pool's users and groups.
  if (const std::string fd_path = d->socket_path_ + kDescriptorSocketSuffix;
      fd_path.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "socket path '%s' is %d bytes: the descriptor socket beside it "
        "('<path>%s') must fit in %d",
        d->socket_path_.substr(0, 128), d->socket_path_.size(),
        kDescriptorSocketSuffix, sizeof(sockaddr_un::sun_path) - 1));
  }
  std::vector<PoolAccessRules> access;
  for (const PoolConfig& pc : config.pools) {
    absl::StatusOr<PoolAccessRules> rules =
        PoolAccessRules::Resolve(pc.name, pc.access, geteuid(), gid);
    if (!rules.ok()) return rules.status();
    access.push_back(*std::move(rules));
  }

  std::vector<std::unique_ptr<Pool>> pools;
  std::vector<v1::UnavailablePool> unavailable;
  for (size_t i = 0; i < config.pools.size(); ++i) {
    const PoolConfig& pc = config.pools[i];
    PoolAccessRules& rules = access[i];
    if (pc.kind == "cuda") {
      absl::StatusOr<std::unique_ptr<CudaSegment>> seg =
          CudaSegment::Create(pc.device, pc.size_bytes);
      if (absl::IsUnavailable(seg.status())) {
        // No GPU here (or no CUDA in this build): serve the other pools.
        spdlog::warn("pool '{}': {}; serving without it", pc.name,
                     std::string(seg.status().message()));
        v1::UnavailablePool& u = unavailable.emplace_back();
        u.set_name(pc.name);
        u.set_kind(v1::MEMORY_KIND_CUDA_DEVICE);
        u.set_reason(std::string(seg.status().message()));
        continue;
      }
      if (!seg.ok()) {
        return absl::Status(
            seg.status().code(),
            absl::StrCat("pool '", pc.name, "': ", seg.status().message()));
      }
      spdlog::info("pool '{}': {} bytes of CUDA memory on device {}", pc.name,
                   (*seg)->size_bytes(), pc.device);
      pools.push_back(
          std::make_unique<Pool>(pc.name, *std::move(seg), std::move(rules)));
      continue;
    }
    HostSegmentOptions options;
    options.directory = pc.directory;
    options.label = pc.name;
    options.size_bytes = pc.size_bytes;
    options.huge_pages = pc.huge_pages == "require" ? HugePages::kRequire
                         : pc.huge_pages == "off"   ? HugePages::kOff
                                                    : HugePages::kAuto;
    absl::StatusOr<std::unique_ptr<HostSegment>> seg =
        HostSegment::Create(options);
    if (!seg.ok()) {
      return absl::Status(
          seg.status().code(),
          absl::StrCat("pool '", pc.name, "': ", seg.status().message()));
    }
    const uint64_t huge = (*seg)->huge_page_size();
    spdlog::info(
        "pool '{}': {} bytes of host memory reserved ({}), {}", pc.name,
        (*seg)->size_bytes(), (*seg)->where(),
        huge > 0 ? absl::StrFormat("%d KiB huge pages", huge >> 10)
        : pc.huge_pages == "off"
            ? std::string("huge pages off")
            : absl::StrFormat("%d-byte pages (the tmpfs gives no huge pages; "
                              "see huge_pages in deploy/shmtensord.toml)",
                              (*seg)->page_size()));
    pools.push_back(
        std::make_unique<Pool>(pc.name, *std::move(seg), std::move(rules)));
  }
  if (pools.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no pool could be created: ", unavailable.front().reason()));
  }
  std::random_device rd;
  const uint64_t epoch = (uint64_t{rd()} << 32) | rd();
  d->store_ =
      std::make_unique<ObjectStore>(std::move(pools), epoch, config.limits);
  d->connections_ =
      std::make_unique<ConnectionTable>(config.limits.max_connections_per_uid);
  d->service_ =
      std::make_unique<ObjectStoreService>(*d->store_, *d->connections_);
  std::vector<std::string> addresses = {config.listen};
  const std::string monitor_address = MonitorAddress(config.monitor_listen);
  if (!monitor_address.empty()) addresses.push_back(monitor_address);
  d->monitor_ = std::make_unique<MonitorService>(
      *d->store_, SHMTENSOR_VERSION, addresses, std::move(unavailable),
      d->connections_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  absl::StatusOr<std::unique_ptr<UnixListener>> listener =
      UnixListener::Bind(d->socket_path_, config.socket_mode, gid);
  if (!listener.ok()) return listener.status();
  d->listener_ = *std::move(listener);
  d->descriptor_path_ = d->socket_path_ + kDescriptorSocketSuffix;
  absl::StatusOr<std::unique_ptr<DescriptorServer>> descriptors =
      DescriptorServer::Bind(d->descriptor_path_, config.socket_mode, gid,
                             *d->store_);
  if (!descriptors.ok()) return descriptors.status();
  d->descriptors_ = *std::move(descriptors);
  grpc::ServerBuilder builder;
  int monitor_port = 0;
  if (!monitor_address.empty()) {
    builder.AddListeningPort(monitor_address, grpc::InsecureServerCredentials(),
                             &monitor_port);
  }
  builder.RegisterService(d->service_.get());
  builder.RegisterService(d->monitor_.get());
  // No keepalive pings to judge liveness: every session peer is on this host
  // (Unix socket or loopback), where a dead process's socket closes at once.
  // A ping that a live client answers late (stalled in a fork() of a large
  // process, or starved on a busy machine) must never end its session and
  // drop its leases. Likewise never hang up on a client that pings often.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, INT_MAX);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 0);
  d->server_ = builder.BuildAndStart();
  if (d->server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on '", absl::StrJoin(addresses, "' and '"), "'"));
  }
  if (!monitor_address.empty()) {
    if (monitor_port == 0) {
      return absl::UnavailableError(absl::StrCat(
          "cannot listen on monitor address '", monitor_address, "'"));
    }
    // Report the port bound, which differs when the config asked for 0.
    addresses.back() =
        absl::StrCat(monitor_address.substr(0, monitor_address.rfind(':')), ":",
                     monitor_port);
    d->monitor_->SetAddresses(addresses);
  }
  d->listener_->Start(d->server_.get(), d->connections_.get());
  d->descriptors_->Start();
  d->reaper_ = std::thread([daemon = d.get()] { daemon->ReapLoop(); });
  spdlog::info("shmtensord {} serving on {} ({} pools, epoch {:016x})",
               SHMTENSOR_VERSION, config.listen, d->store_->pool_infos().size(),
               epoch);
  if (!monitor_address.empty()) {
    spdlog::info("monitoring (Monitor, health, reflection) also on {}",
                 addresses.back());
  }
  return d;
}

void Daemon::ReapLoop() {
  absl::MutexLock lock(&reaper_mu_);
  while (!stopping_) {
    reaper_mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                                absl::Milliseconds(200));
    if (stopping_) break;
    reaper_mu_.Unlock();
    store_->ReapExitedProcesses();
    store_->ExpireOffers();
    connections_->Sweep();
    reaper_mu_.Lock();
  }
}

void Daemon::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  spdlog::info("shutting down: ending {} sessions", store_->Stats().sessions());
  // Health first, so probes and load balancers see NOT_SERVING while the
  // rest winds down (health Watch streams get the change before they end).
  server_->GetHealthCheckService()->Shutdown();
  listener_->Stop();
  descriptors_->Stop();
  spdlog::info(
      "descriptor socket: {} sessions given their pools, {} "
      "connections refused or closed without",
      descriptors_->granted(), descriptors_->refused());
  {
    absl::MutexLock lock(&reaper_mu_);
    stopping_ = true;
  }
  if (reaper_.joinable()) reaper_.join();
  store_->Shutdown();
  monitor_->Shutdown();
  service_->EndAllSessions();
  // The grace period for unary calls in flight, which the store now answers
  // at once (waits end UNAVAILABLE). gRPC also waits this long for clients to
  // close their connections after its GOAWAY, and an idle synchronous client
  // (nothing polling its socket) never does, so this is also what stopping
  // costs while such clients are connected: keep it short.
  server_->Shutdown(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(300));
  server_->Wait();
}

Daemon::~Daemon() {
  if (server_ != nullptr) Shutdown();
  server_.reset();
  descriptors_.reset();  // Before the store it asks.
  service_.reset();
  monitor_.reset();
  const bool had_pools = store_ != nullptr;
  store_.reset();  // Closes every pool descriptor.
  if (owns_address_) {
    if (!socket_path_.empty()) unlink(socket_path_.c_str());
    if (!descriptor_path_.empty()) unlink(descriptor_path_.c_str());
    // Last, while still locked: see Start.
    unlink(lock_path_.c_str());
  }
  if (lock_fd_ >= 0) close(lock_fd_);
  if (created_directory_) {
    rmdir(std::filesystem::path(socket_path_).parent_path().c_str());
  }
  if (had_pools) spdlog::info("stopped");
}

}  // namespace shmtensor::daemon
