// Cancelling the calls a thread makes from another thread: how a binding
// keeps a long wait (for pool memory, for a name) one call to the daemon
// and still answers Ctrl-C (python/src/py_client.cc, WaitInterruptibly).
//
// A thread under a ScopedCanceller makes every ClientCore::Call through its
// canceller: Cancel(), from any thread, cancels the call in flight (the
// daemon finishes a parked call CANCELLED) and fails the later ones at once.
//
// Thread safety: thread-safe.
#ifndef SHMTENSOR_CLIENT_CALL_CANCELLER_H_
#define SHMTENSOR_CLIENT_CALL_CANCELLER_H_

#include <grpcpp/grpcpp.h>

#include <mutex>

namespace shmtensor::internal {

class CallCanceller {
 public:
  void Cancel();
  // For ClientCore::Call: the call's context, until Detach. False, attaching
  // nothing, once cancelled.
  bool Attach(grpc::ClientContext* ctx);
  void Detach();

 private:
  std::mutex mu_;
  grpc::ClientContext* ctx_ = nullptr;  // Guarded by mu_.
  bool cancelled_ = false;              // Guarded by mu_.
};

// The canceller of this thread's calls; null outside a ScopedCanceller.
CallCanceller* ThreadCanceller();

// Makes `canceller` this thread's for its scope.
class ScopedCanceller {
 public:
  explicit ScopedCanceller(CallCanceller* canceller);
  ~ScopedCanceller();
  ScopedCanceller(const ScopedCanceller&) = delete;
  ScopedCanceller& operator=(const ScopedCanceller&) = delete;

 private:
  CallCanceller* previous_;
};

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_CALL_CANCELLER_H_
