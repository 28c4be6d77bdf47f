#include "daemon/peer.h"

#include <sys/stat.h>

#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace shmtensor::daemon {

bool IsLocalPeer(absl::string_view peer) {
  return absl::StartsWith(peer, "unix:") ||
         absl::StartsWith(peer, "unix-abstract:") ||
         absl::StartsWith(peer, "ipv4:127.") ||
         absl::StartsWith(peer, "ipv6:[::1]:") ||
         absl::StartsWith(peer, "ipv6:%5B::1%5D:") ||
         absl::StartsWith(peer, "ipv6:[::ffff:127.") ||
         absl::StartsWith(peer, "ipv6:%5B::ffff:127.");
}

PeerInfo DescribePeer(const std::string& peer, int pid) {
  PeerInfo info;
  info.peer = peer;
  if (pid <= 0) return info;
  const std::string dir = absl::StrCat("/proc/", pid);
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) return info;
  info.has_process = true;
  info.uid = st.st_uid;
  std::ifstream in(dir + "/cmdline", std::ios::binary);
  std::string raw;
  raw.resize(4096);
  in.read(raw.data(), raw.size());
  raw.resize(in.gcount());
  while (!raw.empty() && raw.back() == '\0') raw.pop_back();
  for (char& c : raw) {
    if (c == '\0') c = ' ';
  }
  info.command_line = std::move(raw);
  return info;
}

}  // namespace shmtensor::daemon
