#include "daemon/server/connections.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace shmtensor::daemon {

bool ConnectionTable::StillOpen(int fd, const Entry& e) {
  struct stat st;
  return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == e.dev &&
         st.st_ino == e.ino;
}

absl::Status ConnectionTable::Add(int fd, Connection connection) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::InternalError(
        absl::StrFormat("fstat(%d): %s", fd, std::strerror(errno)));
  }
  absl::MutexLock lock(&mu_);
  entries_.erase(fd);  // A number gRPC closed and accept reused.
  if (max_per_uid_ > 0) {
    uint32_t same_uid = 0;
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (!StillOpen(it->first, it->second)) {
        entries_.erase(it++);
        continue;
      }
      if (it->second.connection.peer.uid == connection.peer.uid) ++same_uid;
      ++it;
    }
    if (same_uid >= max_per_uid_) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("uid %d has %d connections open, the limit "
                          "(limits.max_connections_per_uid = %d)",
                          connection.peer.uid, same_uid, max_per_uid_));
    }
  }
  connection.serial = ++last_serial_;
  entries_[fd] = Entry{std::move(connection), st.st_dev, st.st_ino};
  return absl::OkStatus();
}

std::optional<Connection> ConnectionTable::Find(absl::string_view peer) const {
  int fd;
  if (!absl::ConsumePrefix(&peer, "fd:") || !absl::SimpleAtoi(peer, &fd)) {
    return std::nullopt;
  }
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(fd);
  if (it == entries_.end() || !StillOpen(fd, it->second)) return std::nullopt;
  return it->second.connection;
}

size_t ConnectionTable::Sweep() {
  absl::MutexLock lock(&mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (!StillOpen(it->first, it->second)) {
      entries_.erase(it++);
    } else {
      ++it;
    }
  }
  return entries_.size();
}

}  // namespace shmtensor::daemon
