// Daemon configuration: embedded defaults, a TOML file, command-line flags.
//
// Precedence: flags over the file over the defaults. Every key, with its
// default (deploy/shmtensord.toml is the documented sample):
//
//   listen = "unix:/tmp/shmtensord-<uid>.sock"   # or $SHMTENSOR_ADDRESS
//   monitor_listen = ""        # off; "9464" = 127.0.0.1:9464; "host:port"
//   socket_mode = "0660"       # octal, of the Unix socket
//   socket_group = ""          # group of socket and pools; "" = keep
//   log_level = "info"         # trace, debug, info, warn, error, off
//   [limits]                   # 0 = no limit
//   max_objects = 0
//   max_leases_per_client = 0
//   max_bytes_per_client = 0   # bytes or "64GiB"
//   [[pool]]                   # repeatable; default: one pool below
//   name = "default"
//   size = "1GiB"
//   kind = "host"              # "host" or "cuda"
//   directory = ""             # host: "" = a memfd; else a tmpfs directory
//                              # for an unnamed O_TMPFILE file there, e.g.
//                              # one mounted huge=always for 2 MiB pages
//   huge_pages = "auto"        # host: "auto", "require" or "off"
//   device = 0                 # cuda: the CUDA device index
//   users = []                 # who may read and write it, besides root and
//   groups = []                # the daemon's user: names or numeric ids
//   read_only_users = []       # who may only read it
//   read_only_groups = []      # (see daemon/memory/pool_access.h)
//
// Thread safety: pure functions.
#ifndef SHMTENSOR_DAEMON_CONFIG_H_
#define SHMTENSOR_DAEMON_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/memory/pool_access.h"
#include "daemon/store/limits.h"
#include "shmtensor/defaults.h"

namespace shmtensor::daemon {

// Size of the default pool when nothing else is said: 1 GiB.
inline constexpr uint64_t kDefaultPoolBytes = uint64_t{1} << 30;

struct PoolConfig {
  std::string name;
  uint64_t size_bytes = 0;
  std::string kind = "host";  // "host" or "cuda".
  // Host: empty for a memfd, else the tmpfs directory of an O_TMPFILE file.
  std::string directory;
  std::string huge_pages = "auto";  // Host: "auto", "require" or "off".
  int device = 0;                   // CUDA: device index.
  PoolAccessConfig access;          // Who may use it (pool_access.h).
};

struct DaemonConfig {
  std::string listen;  // gRPC address, "unix:/path" or "host:port".
  // Extra TCP address for monitoring from other hosts (the data plane
  // refuses callers there); empty: none.
  std::string monitor_listen;
  uint32_t socket_mode = 0660;
  std::string socket_group;  // Empty: the daemon's own group.
  std::vector<PoolConfig> pools;
  std::string log_level = "info";
  // Scheduling priority (nice, -20..19) of every daemon thread; unset keeps
  // the one the daemon was started with. Clients block on its short
  // requests, so where busy workers share its CPUs a negative value can
  // shorten them (needs CAP_SYS_NICE; systemd's Nice= does the same from
  // outside).
  std::optional<int> nice;
  StoreLimits limits;
  // The socket's directory is the daemon's own, made for it by whoever
  // started it (a job's private daemon, --owner-pid): removed at exit like
  // one the daemon made itself. Not a config file key.
  bool owns_socket_directory = false;
};

// "9464" -> "127.0.0.1:9464" (loopback unless an address is given); other
// text is returned as is.
std::string MonitorAddress(const std::string& monitor_listen);

// Defaults: DefaultAddress() and one pool "default" of kDefaultPoolBytes.
DaemonConfig DefaultConfig();

// Parses "4096", "64KiB", "512MiB", "4GiB", "1TiB" (also "K", "M", "G", "KB",
// ... as powers of 1024, case-insensitive). INVALID_ARGUMENT naming the text
// for anything else, zero, or a value that overflows 64 bits.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

// Reads a TOML file over `base`. INVALID_ARGUMENT naming the file, line and
// key for a syntax error, an unknown key or a bad value; NOT_FOUND for a
// missing file.
absl::StatusOr<DaemonConfig> LoadConfigFile(const std::string& path,
                                            DaemonConfig base);

// Checks a complete config: an address, at least one pool, unique non-empty
// pool names, at most kMaxPools, sizes > 0, known pool kinds, absolute (or
// empty) pool directories, known
// huge_pages values, a known log level, a socket mode within 0777.
absl::Status ValidateConfig(const DaemonConfig& config);

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_CONFIG_H_
