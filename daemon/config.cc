#include "daemon/config.h"

#include <filesystem>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "shmtensor/defaults.h"
#include "toml++/toml.h"

namespace shmtensor::daemon {

DaemonConfig DefaultConfig() {
  DaemonConfig config;
  config.listen = DefaultAddress();
  config.pools.push_back({"default", kDefaultPoolBytes});
  return config;
}

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  const std::string t(absl::StripAsciiWhitespace(text));
  size_t digits = 0;
  while (digits < t.size() && absl::ascii_isdigit(t[digits])) ++digits;
  uint64_t value = 0;
  if (digits == 0 || !absl::SimpleAtoi(t.substr(0, digits), &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("size '", text, "' must start with a whole number"));
  }
  const std::string unit = absl::AsciiStrToLower(t.substr(digits));
  int shift;
  if (unit.empty() || unit == "b") {
    shift = 0;
  } else if (unit == "k" || unit == "kb" || unit == "kib") {
    shift = 10;
  } else if (unit == "m" || unit == "mb" || unit == "mib") {
    shift = 20;
  } else if (unit == "g" || unit == "gb" || unit == "gib") {
    shift = 30;
  } else if (unit == "t" || unit == "tb" || unit == "tib") {
    shift = 40;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("size '", text, "' has unknown unit '", unit,
                     "' (use B, KiB, MiB, GiB or TiB)"));
  }
  if (value == 0) {
    return absl::InvalidArgumentError(absl::StrCat("size '", text, "' is 0"));
  }
  if (shift > 0 && value > (UINT64_MAX >> shift)) {
    return absl::InvalidArgumentError(
        absl::StrCat("size '", text, "' overflows 64 bits"));
  }
  return value << shift;
}

namespace {

bool IsHugePagesValue(const std::string& v) {
  return v == "auto" || v == "require" || v == "off";
}

absl::StatusOr<uint32_t> ParseFileMode(const std::string& text) {
  uint32_t mode = 0;
  bool ok = !text.empty() && text.size() <= 4;
  for (char c : text) {
    if (c < '0' || c > '7') ok = false;
    mode = mode * 8 + static_cast<uint32_t>(c - '0');
  }
  if (!ok || mode > 0777) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'socket_mode' is '", text, "'; want octal digits like \"0660\""));
  }
  return mode;
}

absl::Status SourceError(const std::string& path, const toml::node& node,
                         const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrFormat("%s:%d: %s", path, node.source().begin.line, what));
}

absl::StatusOr<uint64_t> SizeOf(const std::string& path, const toml::node& n) {
  if (auto i = n.value<int64_t>(); i && n.is_integer()) {
    if (*i <= 0) return SourceError(path, n, "size must be > 0");
    return static_cast<uint64_t>(*i);
  }
  if (auto s = n.value<std::string>()) {
    absl::StatusOr<uint64_t> v = ParseByteSize(*s);
    if (!v.ok()) return SourceError(path, n, std::string(v.status().message()));
    return v;
  }
  return SourceError(path, n,
                     "size must be an integer or a string like '1GiB'");
}

absl::StatusOr<std::string> StringOf(const std::string& path,
                                     const toml::node& n,
                                     const std::string& key) {
  auto v = n.value<std::string>();
  if (!v || !n.is_string()) {
    return SourceError(path, n, absl::StrCat("'", key, "' must be a string"));
  }
  return *v;
}

absl::StatusOr<uint64_t> CountOf(const std::string& path, const toml::node& n,
                                 const std::string& key) {
  auto v = n.value<int64_t>();
  if (!v || !n.is_integer() || *v < 0) {
    return SourceError(
        path, n, absl::StrCat("'", key, "' must be an integer >= 0 (0: none)"));
  }
  return static_cast<uint64_t>(*v);
}

absl::Status ParseLimits(const std::string& path, const toml::node& node,
                         StoreLimits* limits) {
  const toml::table* t = node.as_table();
  if (t == nullptr) {
    return SourceError(path, node, "'limits' must be a table ([limits])");
  }
  for (const auto& [key, n] : *t) {
    const std::string k(key.str());
    absl::StatusOr<uint64_t> v;
    // Counts and byte sizes, each with its field (one table, one home).
    struct Key {
      const char* name;
      uint64_t StoreLimits::*field;
      bool bytes;
    };
    static constexpr Key kKeys[] = {
        {"max_objects", &StoreLimits::max_objects, false},
        {"max_leases", &StoreLimits::max_leases, false},
        {"max_leases_per_client", &StoreLimits::max_leases_per_client, false},
        {"max_bytes_per_client", &StoreLimits::max_bytes_per_client, true},
        {"max_bytes_per_uid", &StoreLimits::max_bytes_per_uid, true},
        {"max_sessions_per_uid", &StoreLimits::max_sessions_per_uid, false},
        {"max_connections_per_uid", &StoreLimits::max_connections_per_uid,
         false},
        {"max_waiters_per_session", &StoreLimits::max_waiters_per_session,
         false},
        {"max_waiters_per_uid", &StoreLimits::max_waiters_per_uid, false},
        {"max_waiters", &StoreLimits::max_waiters, false},
        {"max_fork_holds_per_uid", &StoreLimits::max_fork_holds_per_uid, false},
        {"max_offers_per_session", &StoreLimits::max_offers_per_session, false},
        {"offer_grace_ms", &StoreLimits::offer_grace_ms, false},
        {"max_stock_bytes_per_client", &StoreLimits::max_stock_bytes_per_client,
         true},
        {"uid_share_percent", &StoreLimits::uid_share_percent, false},
        {"max_objects_per_uid", &StoreLimits::max_objects_per_uid, false},
        {"max_leases_per_uid", &StoreLimits::max_leases_per_uid, false},
        {"max_pins_per_uid", &StoreLimits::max_pins_per_uid, false},
        {"max_stock_bytes_per_uid", &StoreLimits::max_stock_bytes_per_uid,
         true},
    };
    const Key* known = nullptr;
    for (const Key& key : kKeys) {
      if (k == key.name) known = &key;
    }
    if (known != nullptr && !known->bytes) {
      v = CountOf(path, n, absl::StrCat("limits.", k));
      if (v.ok()) limits->*(known->field) = *v;
    } else if (known != nullptr) {
      if (n.is_integer() && n.value<int64_t>().value_or(-1) == 0) {
        v = 0;  // 0: no limit (SizeOf rejects 0).
      } else {
        v = SizeOf(path, n);
      }
      if (v.ok()) limits->*(known->field) = *v;
    } else {
      return SourceError(path, n, absl::StrCat("unknown key 'limits.", k, "'"));
    }
    if (!v.ok()) return v.status();
  }
  if (limits->uid_share_percent < 1 || limits->uid_share_percent > 100) {
    return SourceError(
        path, node,
        absl::StrFormat("limits.uid_share_percent is %d: a uid's share of each "
                        "table the daemon shares is 1 to 100 percent",
                        limits->uid_share_percent));
  }
  return absl::OkStatus();
}

}  // namespace

std::string MonitorAddress(const std::string& monitor_listen) {
  uint32_t port;
  if (absl::SimpleAtoi(monitor_listen, &port)) {
    return absl::StrCat("127.0.0.1:", port);
  }
  return monitor_listen;
}

// A pool's users or groups: an array of names (strings) and numeric ids
// (non-negative integers), at most kMaxAccessEntries of them.
absl::StatusOr<std::vector<std::string>> IdListOf(const std::string& path,
                                                  const toml::node& node,
                                                  const std::string& key) {
  constexpr size_t kMaxAccessEntries = 1024;
  const toml::array* array = node.as_array();
  if (array == nullptr) {
    return SourceError(path, node,
                       absl::StrCat("'", key,
                                    "' must be an array of names or ids, "
                                    "e.g. [\"alice\", 1001]"));
  }
  if (array->size() > kMaxAccessEntries) {
    return SourceError(path, node,
                       absl::StrFormat("'%s' has %d entries, at most %d", key,
                                       array->size(), kMaxAccessEntries));
  }
  std::vector<std::string> out;
  for (const toml::node& entry : *array) {
    if (std::optional<std::string> name = entry.value<std::string>();
        entry.is_string() && name.has_value() && !name->empty() &&
        name->size() <= 256 && name->find('\0') == std::string::npos) {
      out.push_back(*name);
    } else if (std::optional<int64_t> id = entry.value<int64_t>();
               entry.is_integer() && id.has_value() && *id >= 0 &&
               *id <= UINT32_MAX - 1) {
      out.push_back(absl::StrCat(*id));
    } else {
      return SourceError(
          path, entry,
          absl::StrCat("each entry of '", key,
                       "' must be a name (1 to 256 bytes) or a numeric id"));
    }
  }
  return out;
}

absl::StatusOr<DaemonConfig> LoadConfigFile(const std::string& path,
                                            DaemonConfig base) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(
        absl::StrCat("config file '", path, "' not found"));
  }
  toml::table table;
  // toml++ reports errors by exception: this is its one adapter.
  try {
    table = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s:%d:%d: %s", path, e.source().begin.line,
                        e.source().begin.column, e.description()));
  }
  for (const auto& [key, node] : table) {
    const std::string k(key.str());
    if (k == "listen" || k == "monitor_listen" || k == "socket_group" ||
        k == "log_level" || k == "socket_mode") {
      absl::StatusOr<std::string> v = StringOf(path, node, k);
      if (!v.ok()) return v.status();
      if (k == "listen") base.listen = *v;
      if (k == "monitor_listen") base.monitor_listen = *v;
      if (k == "socket_group") base.socket_group = *v;
      if (k == "log_level") base.log_level = *v;
      if (k == "socket_mode") {
        absl::StatusOr<uint32_t> mode = ParseFileMode(*v);
        if (!mode.ok()) {
          return SourceError(path, node, std::string(mode.status().message()));
        }
        base.socket_mode = *mode;
      }
    } else if (k == "nice") {
      const std::optional<int64_t> v = node.value<int64_t>();
      if (!node.is_integer() || !v.has_value() || *v < -20 || *v > 19) {
        return SourceError(path, node,
                           "'nice' must be an integer from -20 to 19");
      }
      base.nice = static_cast<int>(*v);
    } else if (k == "limits") {
      if (absl::Status s = ParseLimits(path, node, &base.limits); !s.ok()) {
        return s;
      }
    } else if (k == "pool") {
      const toml::array* pools = node.as_array();
      if (pools == nullptr) {
        return SourceError(path, node,
                           "'pool' must be an array of tables ([[pool]])");
      }
      base.pools.clear();
      for (const toml::node& p : *pools) {
        const toml::table* t = p.as_table();
        if (t == nullptr)
          return SourceError(path, p, "each [[pool]] must be a table");
        PoolConfig pc;
        for (const auto& [pk, pn] : *t) {
          const std::string pks(pk.str());
          if (pks == "name" || pks == "kind" || pks == "directory" ||
              pks == "huge_pages") {
            absl::StatusOr<std::string> v =
                StringOf(path, pn, absl::StrCat("pool.", pks));
            if (!v.ok()) return v.status();
            if (pks == "name") pc.name = *v;
            if (pks == "kind") pc.kind = *v;
            if (pks == "directory") pc.directory = *v;
            if (pks == "huge_pages") pc.huge_pages = *v;
            if (pks == "kind" && pc.kind != "host" && pc.kind != "cuda") {
              return SourceError(path, pn,
                                 absl::StrCat("'pool.kind' is '", pc.kind,
                                              "'; use \"host\" or \"cuda\""));
            }
            if (pks == "directory" && !absl::StartsWith(pc.directory, "/")) {
              return SourceError(
                  path, pn,
                  absl::StrCat("'pool.directory' is '", pc.directory,
                               "'; it must be an absolute path"));
            }
            if (pks == "huge_pages" && !IsHugePagesValue(pc.huge_pages)) {
              return SourceError(
                  path, pn,
                  absl::StrCat("'pool.huge_pages' is '", pc.huge_pages,
                               "'; use \"auto\", \"require\" or \"off\""));
            }
          } else if (pks == "users" || pks == "groups" ||
                     pks == "read_only_users" || pks == "read_only_groups") {
            absl::StatusOr<std::vector<std::string>> ids =
                IdListOf(path, pn, absl::StrCat("pool.", pks));
            if (!ids.ok()) return ids.status();
            if (pks == "users") pc.access.users = *std::move(ids);
            if (pks == "groups") pc.access.groups = *std::move(ids);
            if (pks == "read_only_users") {
              pc.access.read_only_users = *std::move(ids);
            }
            if (pks == "read_only_groups") {
              pc.access.read_only_groups = *std::move(ids);
            }
          } else if (pks == "device") {
            absl::StatusOr<uint64_t> device = CountOf(path, pn, "pool.device");
            if (!device.ok()) return device.status();
            if (*device > 1024) {
              return SourceError(
                  path, pn,
                  absl::StrCat("'pool.device' is ", *device,
                               "; a CUDA device index is small"));
            }
            pc.device = static_cast<int>(*device);
          } else if (pks == "size") {
            absl::StatusOr<uint64_t> size = SizeOf(path, pn);
            if (!size.ok()) return size.status();
            pc.size_bytes = *size;
          } else {
            return SourceError(path, pn,
                               absl::StrCat("unknown key 'pool.", pks, "'"));
          }
        }
        if (pc.name.empty()) {
          return SourceError(path, p, "a [[pool]] has no 'name'");
        }
        if (pc.size_bytes == 0) {
          return SourceError(
              path, p, absl::StrCat("pool '", pc.name, "' has no 'size'"));
        }
        base.pools.push_back(pc);
      }
    } else {
      return SourceError(path, node, absl::StrCat("unknown key '", k, "'"));
    }
  }
  return base;
}

absl::Status ValidateConfig(const DaemonConfig& config) {
  if (config.listen.empty()) {
    return absl::InvalidArgumentError("listen address is empty");
  }
  if (config.pools.empty()) {
    return absl::InvalidArgumentError("no pool configured");
  }
  if (config.pools.size() > kMaxPools) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d pools configured, at most %d", config.pools.size(), kMaxPools));
  }
  std::set<std::string> names;
  for (const PoolConfig& p : config.pools) {
    if (p.name.empty()) return absl::InvalidArgumentError("a pool has no name");
    if (!names.insert(p.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool name '", p.name, "' is used twice"));
    }
    if (p.size_bytes == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool '", p.name, "' has size 0"));
    }
    if (p.kind != "host" && p.kind != "cuda") {
      return absl::InvalidArgumentError(
          absl::StrCat("pool '", p.name, "' has kind '", p.kind,
                       "'; use \"host\" or \"cuda\""));
    }
    if (p.kind == "cuda" && (!p.directory.empty() || p.huge_pages != "auto")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pool '", p.name,
          "' is a CUDA pool: 'directory' and 'huge_pages' apply to host "
          "pools only"));
    }
    if (!p.directory.empty() && !absl::StartsWith(p.directory, "/")) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool '", p.name, "' has directory '", p.directory,
                       "'; it must be an absolute path"));
    }
    if (!IsHugePagesValue(p.huge_pages)) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool '", p.name, "' has huge_pages '", p.huge_pages,
                       "'; use \"auto\", \"require\" or \"off\""));
    }
  }
  if (config.nice.has_value() && (*config.nice < -20 || *config.nice > 19)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("nice %d is not within -20 to 19", *config.nice));
  }
  if (config.socket_mode > 0777) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "socket mode %o is not within 0777", config.socket_mode));
  }
  static const std::set<std::string> kLevels = {"trace", "debug", "info",
                                                "warn",  "error", "off"};
  if (!kLevels.count(config.log_level)) {
    return absl::InvalidArgumentError(
        absl::StrCat("log level '", config.log_level,
                     "' is not one of trace, debug, info, warn, error, off"));
  }
  return absl::OkStatus();
}

}  // namespace shmtensor::daemon
