// The gate a client's background thread (the stock's refill thread, the
// stream writer) passes around each of its gRPC calls, which must not be in
// flight across fork() (fork_guard.h). The thread brackets each call with
// Enter() and Leave(); ClientCore's prepare handler calls Pause(), which
// waits (bounded) for the call on its way and holds the next one back, and
// its parent handler Resume(). (The child never runs the thread.)
//
// Protocol: Enter sets in_call_ and then reads pending_; Pause sets pending_
// and then reads in_call_ (both sequentially consistent), so at least one
// of them sees the other.
//
// Thread safety: thread-safe; one thread enters at a time.
#ifndef SHMTENSOR_CLIENT_FORK_GATE_H_
#define SHMTENSOR_CLIENT_FORK_GATE_H_

#include <atomic>

namespace shmtensor::internal {

class ForkGate {
 public:
  // Waits while a fork is pending, then marks a call on its way.
  void Enter();
  // The call is done.
  void Leave();
  // For fork's prepare handler: waits for the call on its way, at most 2 s
  // (a call stuck longer goes on across the fork: gRPC's own limit,
  // fork_guard.h), and holds the next Enter back.
  void Pause();
  // For fork's parent handler: lets Enter go on.
  void Resume();

 private:
  std::atomic<bool> pending_{false};
  std::atomic<bool> in_call_{false};
};

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_FORK_GATE_H_
