#include "daemon/daemon.h"

#include <fcntl.h>
#include <grp.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
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

// The host pools of `config`, adopted from `passed` (a predecessor's
// descriptors) as `state` describes them. FAILED_PRECONDITION naming the
// first pool that cannot be.
absl::StatusOr<std::vector<std::unique_ptr<Pool>>> AdoptPools(
    const DaemonConfig& config, std::vector<PoolAccessRules>& access,
    absl::flat_hash_map<std::string, UniqueFd>& passed,
    const LedgerState& state) {
  if (state.pools.size() != config.pools.size()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the previous daemon had %d pools, the config has %d",
                        state.pools.size(), config.pools.size()));
  }
  std::vector<std::unique_ptr<Pool>> pools;
  for (size_t i = 0; i < config.pools.size(); ++i) {
    const PoolConfig& pc = config.pools[i];
    const LedgerPool& was = state.pools[i];
    if (pc.kind != "host" || was.kind != v1::MEMORY_KIND_HOST) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "pool '%s' is not host memory: CUDA pools do not outlive their "
          "daemon",
          pc.name));
    }
    if (was.name != pc.name || was.size_bytes != pc.size_bytes) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "pool %d was '%s' of %d bytes and the config makes it '%s' of %d "
          "bytes",
          i, was.name, was.size_bytes, pc.name, pc.size_bytes));
    }
    auto fd = passed.find(absl::StrCat(kPoolFdPrefix, pc.name));
    if (fd == passed.end()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "no descriptor of pool '%s' was handed over", pc.name));
    }
    absl::StatusOr<std::unique_ptr<HostSegment>> seg =
        HostSegment::Adopt(std::move(fd->second), pc.name, was.size_bytes,
                           was.page_size, was.huge_page_size);
    passed.erase(fd);
    if (!seg.ok()) return seg.status();
    pools.push_back(
        std::make_unique<Pool>(pc.name, *std::move(seg), access[i]));
  }
  return pools;
}

absl::StatusOr<UniqueFd> Dup(int fd) {
  UniqueFd out(fcntl(fd, F_DUPFD_CLOEXEC, 3));
  if (!out.valid()) {
    return absl::InternalError(
        absl::StrFormat("dup: %s", std::strerror(errno)));
  }
  return out;
}

}  // namespace

namespace {
// Below, with RequestTakeOver.
absl::Status FinishTakeOver(int connection);
}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(
    const DaemonConfig& config, StartOptions options) {
  absl::flat_hash_map<std::string, UniqueFd> passed;
  for (NamedFd& f : options.inherited) passed[f.name] = std::move(f.fd);
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  std::unique_ptr<Daemon> d(new Daemon());
  d->address_ = config.listen;
  for (const PoolConfig& pc : config.pools) d->pool_names_.push_back(pc.name);
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
  // predecessor removed it) tries again with the path's new file. A
  // take-over's successor takes it last, once its predecessor handed over.
  auto lock_address = [&]() -> absl::Status {
    for (int attempt = 0;; ++attempt) {
      if (d->lock_fd_ >= 0) close(d->lock_fd_);
      d->lock_fd_ = -1;
      absl::StatusOr<int> fd = OpenLockFile(d->lock_path_);
      if (!fd.ok()) return fd.status();
      d->lock_fd_ = *fd;
      // A predecessor handing over releases the lock as it exits.
      const absl::Time lock_deadline = absl::Now() + options.lock_wait;
      while (flock(d->lock_fd_, LOCK_EX | LOCK_NB) != 0 &&
             absl::Now() < lock_deadline) {
        absl::SleepFor(absl::Milliseconds(5));
      }
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
    return absl::OkStatus();
  };
  const bool taking_over = options.take_over.valid();
  if (!taking_over) {
    if (absl::Status s = lock_address(); !s.ok()) return s;
  }

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

  // A predecessor's state, when it was handed over and checks out.
  std::unique_ptr<Ledger> ledger;
  LedgerState state;
  std::vector<std::unique_ptr<Pool>> pools;
  if (auto it = passed.find(kLedgerFdName); it != passed.end()) {
    // A take-over writes into a copy of its own until its predecessor has
    // handed over (StartOptions::take_over).
    absl::StatusOr<UniqueFd> ledger_fd =
        taking_over ? Ledger::CopyForAdoption(it->second.get())
                    : absl::StatusOr<UniqueFd>(std::move(it->second));
    absl::StatusOr<std::unique_ptr<Ledger>> adopted =
        ledger_fd.ok()
            ? Ledger::Adopt(*std::move(ledger_fd), &state)
            : absl::StatusOr<std::unique_ptr<Ledger>>(ledger_fd.status());
    passed.erase(it);
    absl::StatusOr<std::vector<std::unique_ptr<Pool>>> kept =
        adopted.ok() ? AdoptPools(config, access, passed, state)
                     : adopted.status();
    if (kept.ok()) {
      ledger = *std::move(adopted);
      pools = *std::move(kept);
    } else if (taking_over) {
      return absl::FailedPreconditionError(
          absl::StrCat("not taking over (the predecessor serves on): ",
                       kept.status().message()));
    } else {
      spdlog::warn(
          "not adopting the previous daemon's objects and sessions ({}); "
          "starting fresh: its clients' sessions end",
          std::string(kept.status().message()));
    }
  }
  std::vector<v1::UnavailablePool> unavailable;
  for (size_t i = ledger != nullptr ? config.pools.size() : 0;
       i < config.pools.size(); ++i) {
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
  const bool adopting = ledger != nullptr;
  if (adopting) {
    // The access rules and limits are the config's (a take-over applies
    // them); objects, leases and sessions are the predecessor's.
    absl::StatusOr<std::unique_ptr<ObjectStore>> adopted = ObjectStore::Adopt(
        std::move(pools), config.limits, std::move(ledger), std::move(state));
    if (adopted.ok()) {
      d->store_ = *std::move(adopted);
    } else if (taking_over) {
      return absl::FailedPreconditionError(
          absl::StrCat("not taking over (the predecessor serves on): ",
                       adopted.status().message()));
    } else {
      spdlog::warn(
          "not adopting the previous daemon's objects and sessions ({}); "
          "starting fresh: its clients' sessions end",
          std::string(adopted.status().message()));
      DaemonConfig fresh = config;
      StartOptions none;
      d.reset();  // Releases the address lock for the fresh start.
      return Start(fresh, std::move(none));
    }
  } else {
    std::random_device rd;
    const uint64_t epoch = (uint64_t{rd()} << 32) | rd();
    std::vector<LedgerPool> described;
    for (const auto& pool : pools) {
      const Segment& seg = pool->segment();
      described.push_back({pool->name(), static_cast<uint32_t>(seg.kind()),
                           seg.size_bytes(), seg.page_size(),
                           seg.huge_page_size()});
    }
    absl::StatusOr<std::unique_ptr<Ledger>> fresh = Ledger::Create(
        epoch, std::move(described), LedgerCapacityFor(config.limits));
    if (!fresh.ok()) return fresh.status();
    d->store_ = std::make_unique<ObjectStore>(std::move(pools), epoch,
                                              config.limits, *std::move(fresh));
  }
  const uint64_t epoch = d->store_->epoch();
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
  // The predecessor's listening sockets, when handed over: connections made
  // while it handed over wait in their backlog, none is refused.
  auto take = [&](const char* name) {
    auto it = passed.find(name);
    if (it == passed.end()) return UniqueFd();
    UniqueFd fd = std::move(it->second);
    passed.erase(it);
    return fd;
  };
  if (taking_over && (!passed.contains(kListenFdName) ||
                      !passed.contains(kDescriptorListenFdName))) {
    // Binding afresh would replace the sockets its predecessor serves on.
    return absl::FailedPreconditionError(
        "not taking over (the predecessor serves on): its listening sockets "
        "were not handed over");
  }
  absl::StatusOr<std::unique_ptr<UnixListener>> listener = UnixListener::Bind(
      d->socket_path_, config.socket_mode, gid, take(kListenFdName));
  if (!listener.ok()) return listener.status();
  d->listener_ = *std::move(listener);
  d->descriptor_path_ = d->socket_path_ + kDescriptorSocketSuffix;
  absl::StatusOr<std::unique_ptr<DescriptorServer>> descriptors =
      DescriptorServer::Bind(d->descriptor_path_, config.socket_mode, gid,
                             *d->store_, {}, take(kDescriptorListenFdName));
  if (!descriptors.ok()) return descriptors.status();
  d->descriptors_ = *std::move(descriptors);
  // Fork holds whose connections were handed over end with their children
  // again; the others stay stranded (ObjectStore::Adopt).
  for (auto it = passed.begin(); it != passed.end();) {
    uint64_t hold_id = 0;
    if (absl::StartsWith(it->first, kHoldFdPrefix) &&
        absl::SimpleAtoi(it->first.substr(strlen(kHoldFdPrefix)), &hold_id) &&
        d->store_->ClaimForkHold(hold_id)) {
      d->descriptors_->AdoptHold(std::move(it->second), hold_id);
      passed.erase(it++);
    } else {
      ++it;
    }
  }
  d->descriptors_->SetTakeOverHandler(
      [daemon = d.get()](const v1::TakeOver& successor) {
        return daemon->HandOverTo(successor);
      });
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
  if (taking_over) {
    // Everything that can fail did not: the predecessor may go. Whatever
    // its answer, the address lock says who serves: held by a predecessor
    // that serves on (it never heard "ready"), or released as it exits.
    absl::Status handed = FinishTakeOver(options.take_over.get());
    options.take_over = UniqueFd();
    if (absl::Status s = lock_address(); !s.ok()) {
      return handed.ok() ? s : handed;
    }
    if (!handed.ok()) {
      spdlog::warn("{}; its lock is free all the same: serving",
                   std::string(handed.message()));
    }
  }
  d->listener_->Start(d->server_.get(), d->connections_.get());
  d->descriptors_->Start();
  d->reaper_ = std::thread([daemon = d.get()] { daemon->ReapLoop(); });
  std::vector<std::string> stale_names;
  for (const auto& [name, fd] : passed) stale_names.push_back(name);
  // A take-over's ledger is a new memfd (its copy): stored anew.
  d->StoreFds(adopting, stale_names, /*new_ledger=*/taking_over);
  spdlog::info("shmtensord {} serving on {} ({} pools, epoch {:016x}{})",
               SHMTENSOR_VERSION, config.listen, d->store_->pool_infos().size(),
               epoch, adopting ? ", adopted" : "");
  if (!monitor_address.empty()) {
    spdlog::info("monitoring (Monitor, health, reflection) also on {}",
                 addresses.back());
  }
  return d;
}

absl::StatusOr<std::vector<NamedFd>> Daemon::HandOverFds() const {
  std::vector<NamedFd> out;
  absl::StatusOr<UniqueFd> ledger = Dup(store_->ledger_fd());
  if (!ledger.ok()) return ledger.status();
  out.push_back({kLedgerFdName, *std::move(ledger)});
  for (size_t i = 0; i < store_->pool_infos().size(); ++i) {
    if (store_->pool_infos()[i].kind() != v1::MEMORY_KIND_HOST) continue;
    absl::StatusOr<UniqueFd> fd =
        store_->segment(static_cast<uint32_t>(i)).OpenDescriptor(true);
    if (!fd.ok()) return fd.status();
    out.push_back(
        {absl::StrCat(kPoolFdPrefix, pool_names_[i]), *std::move(fd)});
  }
  absl::StatusOr<UniqueFd> listen = Dup(listener_->listen_fd());
  if (!listen.ok()) return listen.status();
  out.push_back({kListenFdName, *std::move(listen)});
  absl::StatusOr<UniqueFd> fd_listen = Dup(descriptors_->listen_fd());
  if (!fd_listen.ok()) return fd_listen.status();
  out.push_back({kDescriptorListenFdName, *std::move(fd_listen)});
  for (NamedFd& hold : descriptors_->HoldFds()) out.push_back(std::move(hold));
  return out;
}

void Daemon::StoreFds(bool adopted, const std::vector<std::string>& stale,
                      bool new_ledger) {
  absl::StatusOr<std::vector<NamedFd>> fds = HandOverFds();
  if (!fds.ok()) {
    spdlog::warn("cannot give systemd's descriptor store the pools: {}",
                 std::string(fds.status().message()));
    return;
  }
  bool told = false;
  for (const std::string& name : stale) {
    if (ValidFdName(name)) {
      (void)Notify(absl::StrCat("FDSTOREREMOVE=1\nFDNAME=", name));
    }
  }
  for (const NamedFd& f : *fds) {
    if (!ValidFdName(f.name)) {
      spdlog::warn(
          "pool descriptor name '{}' is no systemd FDNAME; it is "
          "not stored, and a restart cannot adopt",
          f.name.substr(0, 64));
      continue;
    }
    // An adopted start's descriptors are in the store already (systemd
    // keeps what it passes; a reload's and a take-over's are the same
    // memory): storing reopens of them would only add copies. A fresh
    // start replaces whatever an earlier instance stored under the name.
    if (adopted && !(new_ledger && f.name == kLedgerFdName)) {
      told = getenv("NOTIFY_SOCKET") != nullptr;
      continue;
    }
    (void)Notify(absl::StrCat("FDSTOREREMOVE=1\nFDNAME=", f.name));
    absl::StatusOr<bool> sent =
        Notify(absl::StrCat("FDSTORE=1\nFDNAME=", f.name), {f.fd.get()});
    if (!sent.ok()) {
      spdlog::warn("systemd's descriptor store: {}",
                   std::string(sent.status().message()));
      return;
    }
    told = *sent;
  }
  if (told) {
    (void)Notify("READY=1\nSTATUS=serving");
    spdlog::info("descriptors stored with systemd ({}); a restart adopts them",
                 fds->size());
  }
}

absl::StatusOr<HandOver> Daemon::HandOverTo(const v1::TakeOver& successor) {
  const std::vector<v1::PoolInfo>& mine = store_->pool_infos();
  if (successor.pools_size() != static_cast<int>(mine.size())) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "take-over refused: this daemon serves %d pools, the successor's "
        "config has %d (pools cannot be added or removed while the daemon "
        "runs; stop it to change them)",
        mine.size(), successor.pools_size()));
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    const v1::TakeOver::Pool& theirs = successor.pools(static_cast<int>(i));
    if (theirs.name() != mine[i].name() ||
        theirs.size_bytes() != mine[i].size_bytes() ||
        theirs.kind() != mine[i].kind()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "take-over refused: pool '%s' (%d bytes) would be '%s' (%d bytes) "
          "in the successor; a pool cannot change while objects may live in "
          "it",
          mine[i].name(), mine[i].size_bytes(), theirs.name().substr(0, 64),
          theirs.size_bytes()));
    }
    if (mine[i].kind() != v1::MEMORY_KIND_HOST) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "take-over refused: pool '%s' is CUDA memory, which dies with this "
          "daemon",
          mine[i].name()));
    }
  }
  // From here on nothing changes: calls that reach the store wait, and end
  // with this process.
  listener_->Stop();
  store_->FreezeForHandover();
  absl::StatusOr<std::vector<NamedFd>> fds = HandOverFds();
  if (!fds.ok()) {
    store_->Thaw();
    listener_->Start(server_.get(), connections_.get());
    return fds.status();
  }
  HandOver h;
  h.fds = *std::move(fds);
  if (h.fds.size() > kMaxTakeOverFds) {
    // The fork holds past that stay with the successor's ledger, stranded.
    spdlog::warn(
        "take-over: {} fork holds' connections do not fit the hand-"
        "over; their objects stay until the successor stops",
        h.fds.size() - kMaxTakeOverFds);
    h.fds.resize(kMaxTakeOverFds);
  }
  h.finish = [this](bool taken_over) {
    if (!taken_over) {
      // The successor wrote nothing this daemon reads (it adopted a copy of
      // the ledger): every session, lease and object is as it was.
      spdlog::error(
          "take-over: the successor did not say it serves (it hung up, "
          "died or timed out); serving on with every session");
      store_->Thaw();
      listener_->Start(server_.get(), connections_.get());
      return;
    }
    spdlog::info(
        "taken over: the successor serves every object, lease and "
        "session now; exiting");
    spdlog::default_logger()->flush();
    _exit(0);
  };
  return h;
}

absl::Status Daemon::ReExec(const std::string& exe, char* const* argv) {
  if (access(exe.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "reload: cannot execute %s: %s", exe, std::strerror(errno)));
  }
  listener_->Stop();
  descriptors_->Stop();
  store_->FreezeForHandover();
  absl::StatusOr<std::vector<NamedFd>> fds = HandOverFds();
  absl::Status ready = fds.ok() ? PrepareListenFdsForExec(*fds) : fds.status();
  if (ready.ok()) {
    spdlog::info("reload: executing {} in place", exe);
    spdlog::default_logger()->flush();
    execv(exe.c_str(), argv);
    ready = absl::InternalError(
        absl::StrFormat("execv %s: %s", exe, std::strerror(errno)));
  }
  // The store is frozen and the descriptors rearranged: nothing to serve
  // on. Under systemd, Restart= and the descriptor store bring it back.
  spdlog::critical("reload failed: {}", ready.ToString());
  spdlog::default_logger()->flush();
  _exit(1);
}

absl::StatusOr<TakeOverGrant> RequestTakeOver(const DaemonConfig& config) {
  if (!absl::StartsWith(config.listen, "unix:")) {
    return absl::InvalidArgumentError("take-over needs a unix: address");
  }
  std::string path = config.listen.substr(5);
  if (absl::StartsWith(path, "//")) path = path.substr(2);
  path += kDescriptorSocketSuffix;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError("socket path too long");
  }
  memcpy(addr.sun_path, path.data(), path.size());
  UniqueFd sock(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock.valid() || connect(sock.get(), reinterpret_cast<sockaddr*>(&addr),
                               sizeof(addr)) != 0) {
    return absl::UnavailableError(absl::StrFormat(
        "take-over: no daemon answers at %s: %s", path, std::strerror(errno)));
  }
  v1::DescriptorRequest request;
  request.mutable_take_over()->set_says_ready(true);
  for (const PoolConfig& pc : config.pools) {
    v1::TakeOver::Pool* p = request.mutable_take_over()->add_pools();
    p->set_name(pc.name);
    p->set_size_bytes(pc.size_bytes);
    p->set_kind(pc.kind == "cuda" ? v1::MEMORY_KIND_CUDA_DEVICE
                                  : v1::MEMORY_KIND_HOST);
  }
  const std::string bytes = request.SerializeAsString();
  if (send(sock.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(bytes.size())) {
    return absl::UnavailableError(
        absl::StrFormat("take-over: send: %s", std::strerror(errno)));
  }
  // The predecessor answers once its in-flight changes are done.
  pollfd pfd{sock.get(), POLLIN, 0};
  if (poll(&pfd, 1, 30000) <= 0) {
    return absl::UnavailableError("take-over: no answer within 30 s");
  }
  // The first reply says how many more follow (DescriptorReply.
  // more_replies); each carries its descriptors and their names.
  std::vector<NamedFd> out;
  bool two_phase = false;
  uint32_t left = 1;
  for (bool first = true; left > 0; first = false) {
    --left;
    if (!first && poll(&pfd, 1, 5000) <= 0) {
      return absl::UnavailableError(
          "take-over: the rest of the descriptors did not come within 5 s");
    }
    char buf[16384];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
    iovec iov{buf, sizeof(buf)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(sock.get(), &msg, MSG_CMSG_CLOEXEC);
    if (n <= 0) {
      return absl::UnavailableError("take-over: the daemon hung up");
    }
    std::vector<UniqueFd> fds;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
         c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds.emplace_back(fd);
      }
    }
    v1::DescriptorReply reply;
    if ((msg.msg_flags & MSG_TRUNC) != 0 ||
        !reply.ParseFromArray(buf, static_cast<int>(n))) {
      return absl::InternalError("take-over: a reply does not parse");
    }
    if (reply.code() != 0 || !reply.granted()) {
      return absl::Status(static_cast<absl::StatusCode>(reply.code()),
                          reply.message());
    }
    if ((msg.msg_flags & MSG_CTRUNC) != 0 ||
        fds.size() != static_cast<size_t>(reply.fd_names_size())) {
      return absl::InternalError(
          absl::StrFormat("take-over: %d descriptors for %d names", fds.size(),
                          reply.fd_names_size()));
    }
    if (first) {
      if (reply.more_replies() > kMaxTakeOverFds / kMaxFdsPerMessage) {
        return absl::InternalError(absl::StrFormat(
            "take-over: %d more replies announced", reply.more_replies()));
      }
      left = reply.more_replies();
      two_phase = reply.awaits_ready();
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      out.push_back({reply.fd_names(static_cast<int>(i)), std::move(fds[i])});
    }
  }
  // A predecessor of an older version exits without waiting: no connection,
  // and the successor adopts in place (StartOptions::take_over).
  if (!two_phase) sock = UniqueFd();
  return TakeOverGrant{std::move(out), std::move(sock)};
}

namespace {

// Says "ready" on a take-over's connection and waits for the predecessor's
// last word (DescriptorReply.taken_over). UNAVAILABLE when it never comes.
absl::Status FinishTakeOver(int connection) {
  v1::DescriptorRequest ready;
  ready.set_take_over_ready(true);
  const std::string bytes = ready.SerializeAsString();
  if (send(connection, bytes.data(), bytes.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(bytes.size())) {
    return absl::UnavailableError(absl::StrFormat(
        "take-over: the predecessor hung up before this daemon was ready: %s",
        std::strerror(errno)));
  }
  pollfd pfd{connection, POLLIN, 0};
  if (poll(&pfd, 1, 10000) <= 0) {
    return absl::UnavailableError(
        "take-over: the predecessor did not answer 'ready' within 10 s");
  }
  char buf[512];
  const ssize_t n = recv(connection, buf, sizeof(buf), 0);
  v1::DescriptorReply reply;
  if (n <= 0 || !reply.ParseFromArray(buf, static_cast<int>(n)) ||
      !reply.taken_over()) {
    return absl::UnavailableError(
        "take-over: the predecessor did not hand over (it serves on)");
  }
  return absl::OkStatus();
}

}  // namespace

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
  // A clean stop ends every session: nothing is left for a successor. Not
  // so a take-over's successor that never served (it owns no address): what
  // systemd keeps is its predecessor's, which serves on.
  if (owns_address_) {
    for (const char* name :
         {kLedgerFdName, kListenFdName, kDescriptorListenFdName}) {
      (void)Notify(absl::StrCat("FDSTOREREMOVE=1\nFDNAME=", name));
    }
    for (const std::string& pool : pool_names_) {
      if (ValidFdName(absl::StrCat(kPoolFdPrefix, pool))) {
        (void)Notify(
            absl::StrCat("FDSTOREREMOVE=1\nFDNAME=", kPoolFdPrefix, pool));
      }
    }
    (void)Notify("STOPPING=1");
  }
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
