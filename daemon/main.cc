// shmtensord: parse flags and config, start the daemon, wait for a signal.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "daemon/stop_waiter.h"
#include "google/protobuf/stubs/logging.h"
#include "spdlog/spdlog.h"

int main(int argc, char** argv) {
  using shmtensor::daemon::DaemonConfig;
  // Debian builds Abseil without NDEBUG, so every absl::Mutex (gRPC's
  // included) keeps a global lock-order graph behind one spin lock, which
  // every RPC takes and the serving threads contend for (its cost:
  // docs/design.md, "Notes"). The unit tests of the store run with it on;
  // the daemon runs without.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  CLI::App app{
      "shmtensord: shared-memory pools for zero-copy arrays and tensors"};
  app.set_version_flag("--version", "shmtensord " SHMTENSOR_VERSION);
  std::string listen, pool_size, pool_dir, config_file, log_level,
      monitor_listen;
  app.add_option("--listen", listen,
                 "Unix socket: unix:/path (default: $SHMTENSOR_ADDRESS, "
                 "else $XDG_RUNTIME_DIR/shmtensord.sock, else "
                 "/tmp/shmtensor-<uid>/shmtensord.sock)");
  app.add_option(
      "--pool-size", pool_size,
      "size of the default pool, e.g. 512MiB or 4GiB (default 1GiB)");
  app.add_option("--pool-dir", pool_dir,
                 "tmpfs directory for the default pool's memory (an unnamed "
                 "O_TMPFILE file there), e.g. one mounted with huge=always "
                 "for 2 MiB pages (default: a memfd, in no directory)");
  app.add_option("--monitor-listen", monitor_listen,
                 "also serve monitoring (not the data plane) on TCP: PORT "
                 "(loopback) or HOST:PORT (default: off)");
  std::optional<int> nice;
  app.add_option("--nice", nice,
                 "scheduling priority of the daemon's threads, -20..19 "
                 "(negative values need CAP_SYS_NICE; default: unchanged)");
  app.add_option("--config", config_file, "TOML config file")
      ->check(CLI::ExistingFile);
  app.add_option("--log-level", log_level,
                 "trace, debug, info, warn, error or off");
  std::optional<pid_t> owner_pid;
  app.add_option("--owner-pid", owner_pid,
                 "serve one job as its private daemon: exit (cleaning up as "
                 "on SIGTERM) when process PID, which must be this daemon's "
                 "parent, ends, however it ends; the socket's directory, "
                 "which the job made for it, goes with it");
  bool take_over = false;
  app.add_flag("--take-over", take_over,
               "take over the daemon serving the same address: it hands this "
               "one its pools, objects, leases, sessions and sockets and "
               "exits, and its clients go on with this one (only root or the "
               "daemon's own user; the pools must be the same). With no "
               "daemon there, starts as usual");
  std::optional<int> ready_fd;
  app.add_option("--ready-fd", ready_fd,
                 "once serving, write \"ready\\n\" to this inherited "
                 "descriptor and close it (for whoever starts the daemon)");
  CLI11_PARSE(app, argc, argv);

  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ shmtensord[%P] %v");
  // protobuf logs every request that does not parse (a string that is not
  // UTF-8, say): a client could flood the log. The daemon answers those
  // with INVALID_ARGUMENT itself; protobuf's lines go to debug.
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel level,
                                     const char* file, int line,
                                     const std::string& message) {
    if (level >= google::protobuf::LOGLEVEL_FATAL) {
      spdlog::critical("protobuf {}:{}: {}", file, line, message);
    } else {
      spdlog::debug("protobuf {}:{}: {}", file, line, message.substr(0, 256));
    }
  });
  DaemonConfig config = shmtensor::daemon::DefaultConfig();
  if (!config_file.empty()) {
    absl::StatusOr<DaemonConfig> loaded =
        shmtensor::daemon::LoadConfigFile(config_file, config);
    if (!loaded.ok()) {
      spdlog::error("{}", loaded.status().ToString());
      return 2;
    }
    config = *loaded;
  }
  if (!listen.empty()) config.listen = listen;
  config.owns_socket_directory = owner_pid.has_value();
  if (!log_level.empty()) config.log_level = log_level;
  if (!monitor_listen.empty()) config.monitor_listen = monitor_listen;
  if (nice.has_value()) config.nice = nice;
  if (!pool_size.empty()) {
    absl::StatusOr<uint64_t> size = shmtensor::daemon::ParseByteSize(pool_size);
    if (!size.ok()) {
      spdlog::error("--pool-size: {}", size.status().ToString());
      return 2;
    }
    config.pools.front().size_bytes = *size;
  }
  if (!pool_dir.empty()) config.pools.front().directory = pool_dir;
  if (absl::Status s = shmtensor::daemon::ValidateConfig(config); !s.ok()) {
    spdlog::error("{}", s.ToString());
    return 2;
  }
  spdlog::set_level(spdlog::level::from_str(config.log_level));

  // Before any thread exists: Linux keeps the nice value per thread, and
  // threads inherit it from the one that creates them.
  if (config.nice.has_value() &&
      setpriority(PRIO_PROCESS, 0, *config.nice) != 0) {
    spdlog::warn(
        "cannot set nice {} ({}; a negative value needs CAP_SYS_NICE); "
        "running at nice {}",
        *config.nice, std::strerror(errno), getpriority(PRIO_PROCESS, 0));
  }

  // Every client connection is a descriptor: take all the kernel allows
  // (the soft limit is often 1024, the hard one far more).
  if (struct rlimit nofile; getrlimit(RLIMIT_NOFILE, &nofile) == 0 &&
                            nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &nofile) != 0) {
      spdlog::warn("cannot raise the descriptor limit to {}: {}",
                   nofile.rlim_max, std::strerror(errno));
    }
  }

  if (ready_fd.has_value() &&
      (*ready_fd < 0 || fcntl(*ready_fd, F_GETFD) < 0)) {
    spdlog::error("--ready-fd {}: not an open descriptor", *ready_fd);
    return 2;
  }
  // Blocks the stop signals in every thread (gRPC's included): they are
  // taken synchronously below, with the owner's end.
  absl::StatusOr<shmtensor::daemon::StopWaiter> waiter =
      shmtensor::daemon::StopWaiter::Create(owner_pid);
  if (!waiter.ok()) {
    spdlog::error("--owner-pid: {}", waiter.status().ToString());
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);

  // What a predecessor left: systemd's descriptor store after a restart, or
  // this process's own image before a reload (SIGHUP re-executes it).
  shmtensor::daemon::StartOptions options;
  absl::StatusOr<std::vector<shmtensor::daemon::NamedFd>> inherited =
      shmtensor::daemon::TakeListenFds();
  if (!inherited.ok()) {
    spdlog::warn("ignoring the descriptors passed: {}",
                 inherited.status().ToString());
  } else {
    options.inherited = *std::move(inherited);
  }
  if (take_over && options.inherited.empty()) {
    absl::StatusOr<shmtensor::daemon::TakeOverGrant> handed =
        shmtensor::daemon::RequestTakeOver(config);
    if (absl::IsUnavailable(handed.status())) {
      // Nothing to take over (a first start): start as usual.
      spdlog::info("{}; starting fresh",
                   std::string(handed.status().message()));
    } else if (!handed.ok()) {
      spdlog::error("cannot take over: {}", handed.status().ToString());
      return 1;
    } else {
      options.inherited = std::move(handed->fds);
      options.take_over = std::move(handed->connection);
      options.lock_wait = absl::Seconds(10);
    }
  }
  // The binary to run on a reload: the path it was started from, which an
  // upgrade replaces (not /proc/self/exe, the old image).
  std::string exe(4096, '\0');
  const ssize_t exe_len = readlink("/proc/self/exe", exe.data(), exe.size());
  exe.resize(exe_len > 0 ? static_cast<size_t>(exe_len) : 0);
  if (absl::EndsWith(exe, " (deleted)")) exe.resize(exe.size() - 10);

  absl::StatusOr<std::unique_ptr<shmtensor::daemon::Daemon>> daemon =
      shmtensor::daemon::Daemon::Start(config, std::move(options));
  if (!daemon.ok()) {
    spdlog::error("cannot start: {}", daemon.status().ToString());
    return 1;
  }
  if (ready_fd.has_value()) {
    (void)!write(*ready_fd, "ready\n", 6);
    close(*ready_fd);
  }
  std::string why = waiter->Wait();
  while (why == "SIGHUP") {
    // A reload: the same pid, a new image, every client's state kept.
    spdlog::info("SIGHUP: reloading {}", exe);
    absl::Status s = (*daemon)->ReExec(exe, argv);
    spdlog::error("{}; serving on", s.ToString());
    why = waiter->Wait();
  }
  spdlog::info("stopping on {}", why);
  (*daemon)->Shutdown();
  daemon->reset();
  return 0;
}
