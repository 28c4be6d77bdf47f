// Breaks a live process's connections to its daemon, as a fault would,
// without the process noticing until its next call: for tests that a session
// survives the loss of its connection (docs/pitfalls.md P14).
//
// Thread safety: safe to call from any thread (it only touches sockets).
#ifndef SHMTENSOR_TESTS_BREAK_CONNECTION_H_
#define SHMTENSOR_TESTS_BREAK_CONNECTION_H_

#include <string>

namespace shmtensor::testing {

enum class BreakMode {
  kShutdown,  // shutdown(SHUT_RDWR): the connection is gone both ways.
  kGarbage,   // Bytes that are no HTTP/2 frame: the daemon drops the
              // connection for a protocol error.
};

// Breaks every connection of this process to the daemon at `address`
// ("unix:/path"), found among the process's descriptors by their peer's
// path. Returns how many it broke.
int BreakDaemonConnections(const std::string& address, BreakMode mode);

}  // namespace shmtensor::testing

#endif  // SHMTENSOR_TESTS_BREAK_CONNECTION_H_
