// Daemon configuration: embedded defaults, a TOML file, command-line flags.
//
// Precedence: flags over the file over the defaults. File format:
//
//   listen = "unix:/run/shmtensor/shmtensord.sock"
//   log_level = "info"
//   [[pool]]
//   name = "default"
//   size = "1GiB"
//
// Thread safety: pure functions.
#ifndef SHMTENSOR_DAEMON_CONFIG_H_
#define SHMTENSOR_DAEMON_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shmtensor::daemon {

// Size of the default pool when nothing else is said: 1 GiB.
inline constexpr uint64_t kDefaultPoolBytes = uint64_t{1} << 30;

struct PoolConfig {
  std::string name;
  uint64_t size_bytes = 0;
};

struct DaemonConfig {
  std::string listen;  // gRPC address, "unix:/path" or "host:port".
  std::vector<PoolConfig> pools;
  std::string log_level = "info";
};

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
// pool names, sizes > 0, a known log level.
absl::Status ValidateConfig(const DaemonConfig& config);

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_CONFIG_H_
