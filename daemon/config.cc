#include "daemon/config.h"

#include <filesystem>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
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

}  // namespace

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
    if (k == "listen") {
      auto v = node.value<std::string>();
      if (!v) return SourceError(path, node, "'listen' must be a string");
      base.listen = *v;
    } else if (k == "log_level") {
      auto v = node.value<std::string>();
      if (!v) return SourceError(path, node, "'log_level' must be a string");
      base.log_level = *v;
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
          if (pks == "name") {
            auto v = pn.value<std::string>();
            if (!v)
              return SourceError(path, pn, "pool 'name' must be a string");
            pc.name = *v;
          } else if (pks == "size") {
            absl::StatusOr<uint64_t> size = SizeOf(path, pn);
            if (!size.ok()) return size.status();
            pc.size_bytes = *size;
          } else {
            return SourceError(path, pn,
                               absl::StrCat("unknown pool key '", pks, "'"));
          }
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
