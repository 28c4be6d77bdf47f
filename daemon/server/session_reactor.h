// One client's session stream (Session in shmtensor.proto): its
// OpenSession (a new session, or a resume presenting its account), then its
// ReleaseLeases messages, handed to the release intake (release_intake.h)
// in the order they arrive. The stream is raw (its messages are parsed
// here), so one that does not parse ends it INVALID_ARGUMENT naming its
// size, where gRPC would end it as if the client had closed its side.
//
// Owned by gRPC: deletes itself in OnDone, after unregistering from its
// ObjectStoreService and telling the store the stream ended
// (ObjectStore::StreamEnded: the session outlives it while its process
// lives).
//
// Thread safety: gRPC serialises the reactor callbacks; FinishOnce may be
// called from any thread (the service ends every stream at shutdown).
#ifndef SHMTENSOR_DAEMON_SERVER_SESSION_REACTOR_H_
#define SHMTENSOR_DAEMON_SERVER_SESSION_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/server/connections.h"
#include "shmtensor/v1/shmtensor.pb.h"

namespace shmtensor::daemon {

class ObjectStoreService;

class SessionReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // Refuses (PERMISSION_DENIED) a caller that did not come through the
  // daemon's Unix socket; else reads the stream's first message.
  SessionReactor(ObjectStoreService& service, grpc::CallbackServerContext* ctx);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override {}
  void OnCancel() override;
  void OnDone() override;

  // Ends the stream with `status` unless it has ended already.
  void FinishOnce(const grpc::Status& status);

 private:
  // The first message: opens or resumes the session and answers
  // SessionOpened.
  void OnOpen(const v1::OpenSession& open);
  // Applies a ReleaseLeases and reads on. A lease the session does not hold
  // is only logged (the client cannot be told without a reply); a seq out
  // of order breaks the ordering contract, so it ends the session's stream.
  void OnRelease(const v1::ReleaseLeases& release);

  ObjectStoreService& service_;
  grpc::CallbackServerContext* const ctx_;  // gRPC's; lives until OnDone.
  const std::string peer_;
  Connection caller_;
  grpc::ByteBuffer raw_request_;
  grpc::ByteBuffer raw_event_;
  v1::SessionRequest request_;
  v1::SessionEvent event_;
  // Set once, on the reactor's read callbacks (which gRPC serialises).
  uint64_t session_id_ = 0;
  uint64_t stream_ = 0;
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_SERVER_SESSION_REACTOR_H_
