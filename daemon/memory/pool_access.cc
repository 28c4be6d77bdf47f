#include "daemon/memory/pool_access.h"

#include <grp.h>
#include <pwd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace shmtensor::daemon {
namespace {

// Calls getpwnam_r/getgrnam_r-like `lookup(buf, size, &found)` with a
// buffer that grows on ERANGE (a group of many members needs more than the
// usual 16 KiB), up to 16 MiB. True when found.
template <typename LookupFn>
bool LookUp(LookupFn lookup) {
  for (size_t size = 16384; size <= (size_t{16} << 20); size *= 4) {
    std::vector<char> buf(size);
    bool found = false;
    const int err = lookup(buf.data(), buf.size(), &found);
    if (err != ERANGE) return err == 0 && found;
  }
  return false;
}

// A uid from a user name or decimal id.
absl::StatusOr<uid_t> ResolveUser(const std::string& pool, const char* key,
                                  const std::string& name) {
  uint32_t id = 0;
  if (absl::SimpleAtoi(name, &id)) return static_cast<uid_t>(id);
  uid_t uid = 0;
  const bool known = LookUp([&](char* buf, size_t size, bool* found) {
    struct passwd pw;
    struct passwd* result = nullptr;
    const int err = getpwnam_r(name.c_str(), &pw, buf, size, &result);
    if (result != nullptr) uid = result->pw_uid;
    *found = result != nullptr;
    return err;
  });
  if (!known) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool '", pool, "': '", name.substr(0, 64), "' in ", key,
                     " is not a user here (nor a numeric uid)"));
  }
  return uid;
}

// A gid from a group name or decimal id.
absl::StatusOr<gid_t> ResolveGroup(const std::string& pool, const char* key,
                                   const std::string& name) {
  uint32_t id = 0;
  if (absl::SimpleAtoi(name, &id)) return static_cast<gid_t>(id);
  gid_t gid = 0;
  const bool known = LookUp([&](char* buf, size_t size, bool* found) {
    struct group gr;
    struct group* result = nullptr;
    const int err = getgrnam_r(name.c_str(), &gr, buf, size, &result);
    if (result != nullptr) gid = result->gr_gid;
    *found = result != nullptr;
    return err;
  });
  if (!known) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool '", pool, "': '", name.substr(0, 64), "' in ", key,
                     " is not a group here (nor a numeric gid)"));
  }
  return gid;
}

template <typename Id, typename ResolveFn>
absl::Status ResolveAll(const std::string& pool, const char* key,
                        const std::vector<std::string>& names,
                        ResolveFn resolve, std::vector<Id>* out) {
  for (const std::string& name : names) {
    absl::StatusOr<Id> id = resolve(pool, key, name);
    if (!id.ok()) return id.status();
    out->push_back(*id);
  }
  return absl::OkStatus();
}

template <typename Id>
bool Contains(const std::vector<Id>& ids, Id id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

absl::StatusOr<PoolAccessRules> PoolAccessRules::Resolve(
    const std::string& pool, const PoolAccessConfig& config, uid_t owner,
    int socket_gid) {
  PoolAccessRules rules(owner);
  if (absl::Status s = ResolveAll<uid_t>(pool, "users", config.users,
                                         ResolveUser, &rules.users_);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ResolveAll<gid_t>(pool, "groups", config.groups,
                                         ResolveGroup, &rules.groups_);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          ResolveAll<uid_t>(pool, "read_only_users", config.read_only_users,
                            ResolveUser, &rules.read_only_users_);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          ResolveAll<gid_t>(pool, "read_only_groups", config.read_only_groups,
                            ResolveGroup, &rules.read_only_groups_);
      !s.ok()) {
    return s;
  }
  // The socket group's members, unless the pool names writers of its own
  // or lets that group only read.
  if (socket_gid >= 0 && config.users.empty() && config.groups.empty() &&
      !Contains(rules.read_only_groups_, static_cast<gid_t>(socket_gid))) {
    rules.groups_.push_back(static_cast<gid_t>(socket_gid));
  }
  return rules;
}

v1::PoolAccess PoolAccessRules::AccessOf(const PeerCredentials& peer) const {
  auto in_groups = [&](const std::vector<gid_t>& groups) {
    if (Contains(groups, peer.gid)) return true;
    for (gid_t g : peer.groups) {
      if (Contains(groups, g)) return true;
    }
    return false;
  };
  if (peer.uid == 0 || peer.uid == owner_ || Contains(users_, peer.uid) ||
      in_groups(groups_)) {
    return v1::POOL_ACCESS_READ_WRITE;
  }
  if (Contains(read_only_users_, peer.uid) || in_groups(read_only_groups_)) {
    return v1::POOL_ACCESS_READ;
  }
  return v1::POOL_ACCESS_UNSPECIFIED;
}

const char* AccessName(v1::PoolAccess access) {
  switch (access) {
    case v1::POOL_ACCESS_READ_WRITE:
      return "rw";
    case v1::POOL_ACCESS_READ:
      return "ro";
    default:
      return "-";
  }
}

}  // namespace shmtensor::daemon
