#include "tests/break_connection.h"

#include <dirent.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace shmtensor::testing {

int BreakDaemonConnections(const std::string& address, BreakMode mode) {
  std::string path = address.substr(address.rfind("unix:", 0) == 0 ? 5 : 0);
  if (path.rfind("//", 0) == 0) path = path.substr(2);
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  int broken = 0;
  while (dirent* e = readdir(dir)) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2 || fd == dirfd(dir)) continue;
    sockaddr_un peer{};
    socklen_t len = sizeof(peer);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0 ||
        peer.sun_family != AF_UNIX || path != peer.sun_path) {
      continue;
    }
    if (mode == BreakMode::kShutdown) {
      shutdown(fd, SHUT_RDWR);
    } else {
      // A frame header with an unknown type on stream 0 and a length past
      // any limit: a connection error for the daemon's HTTP/2 parser.
      const unsigned char junk[] = {0xff, 0xff, 0xff, 0x7f, 0xff,
                                    0xff, 0xff, 0xff, 0xff, 0xde,
                                    0xad, 0xbe, 0xef, 0x00, 0x00};
      (void)!send(fd, junk, sizeof(junk), MSG_NOSIGNAL);
    }
    ++broken;
  }
  closedir(dir);
  return broken;
}

}  // namespace shmtensor::testing
