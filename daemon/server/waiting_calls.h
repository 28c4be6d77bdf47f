// The calls that wait (a Create for memory, a Get for a name to be sealed, a
// call for its session's releases to arrive), parked on one thread instead
// of a thread each. A parked call is retried whenever the store changed
// (ObjectStore::changes()), once more at its deadline, and finished
// CANCELLED as soon as its caller goes.
//
// Thread safety: thread-safe. Calls are retried on the one thread this
// object owns, never while its lock is held (so a retry may take the
// store's lock, and the store may Poke() under its own).
#ifndef SHMTENSOR_DAEMON_SERVER_WAITING_CALLS_H_
#define SHMTENSOR_DAEMON_SERVER_WAITING_CALLS_H_

#include <atomic>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shmtensor::daemon {

class WaitingCalls {
 public:
  // A parked call. Owned by whoever finishes it (the gRPC reactor deletes
  // itself once finished); WaitingCalls forgets it before it can be gone.
  class Call {
   public:
    virtual ~Call() = default;
    // Answers now if it can: true when it finished its RPC (it may be gone
    // when this returns). Else false, with *wake_at the time it must be
    // tried again at the latest (its deadline).
    virtual bool Retry(absl::Time* wake_at) = 0;
    // Its caller has gone: finishes the RPC. It may be gone on return.
    virtual void Cancel() = 0;
    // Set (from any thread) when the caller has gone; then Poke().
    std::atomic<bool> cancelled{false};
  };

  WaitingCalls();
  // Stops the thread. Every parked call must have finished by then (store
  // Shutdown finishes them: their retries answer UNAVAILABLE).
  ~WaitingCalls();

  WaitingCalls(const WaitingCalls&) = delete;
  WaitingCalls& operator=(const WaitingCalls&) = delete;

  // Parks `call`, to be tried again by `wake_at` at the latest.
  void Add(Call* call, absl::Time wake_at);
  // Something changed: retry every parked call soon. Cheap when none is
  // parked; safe under any lock that Retry does not take.
  void Poke();
  // Calls parked now.
  size_t size() const;

 private:
  void Loop();

  struct Parked {
    Call* call;
    absl::Time wake_at;
  };
  std::atomic<size_t> count_{0};
  mutable absl::Mutex mu_;
  std::vector<Parked> added_ ABSL_GUARDED_BY(mu_);
  uint64_t pokes_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_SERVER_WAITING_CALLS_H_
