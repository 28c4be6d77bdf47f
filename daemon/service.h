// gRPC adapter over ObjectStore: validates, calls the core, maps the Status.
//
// Unary RPCs use the synchronous API (Create and named Get may block up to
// their timeout on a pool thread). The Session stream uses the callback API so
// that an idle session costs no thread; when it ends for any reason (client
// closed it, process died, daemon shutting down) its session is ended in the
// store.
//
// Every call from a peer that is not on this host (see IsLocalPeer) fails
// PERMISSION_DENIED: shared memory is local only.
//
// Thread safety: thread-safe; gRPC calls it from many threads.
#ifndef SHMTENSOR_DAEMON_SERVICE_H_
#define SHMTENSOR_DAEMON_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/object_store.h"
#include "shmtensor/v1/shmtensor.grpc.pb.h"

namespace shmtensor::daemon {

class SessionReactor;

// PERMISSION_DENIED naming `peer`, for a data-plane call from another host.
grpc::Status RemoteRefused(const std::string& peer);

// absl::Status -> grpc::Status, with the reason as trailing metadata.
grpc::Status ToGrpcStatus(grpc::ServerContextBase* ctx,
                          const absl::Status& status);

class ObjectStoreService final
    : public v1::ObjectStore::WithCallbackMethod_Session<
          v1::ObjectStore::Service> {
 public:
  // `store` must outlive the service.
  explicit ObjectStoreService(ObjectStore& store) : store_(store) {}

  // Ends every open session stream with UNAVAILABLE. Call after
  // store.Shutdown() and before the server shuts down.
  void EndAllSessions();

  grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionEvent>* Session(
      grpc::CallbackServerContext* ctx) override;
  grpc::Status Create(grpc::ServerContext* ctx, const v1::CreateRequest* req,
                      v1::CreateResponse* resp) override;
  grpc::Status Seal(grpc::ServerContext* ctx, const v1::SealRequest* req,
                    v1::SealResponse* resp) override;
  grpc::Status Get(grpc::ServerContext* ctx, const v1::GetRequest* req,
                   v1::GetResponse* resp) override;
  grpc::Status Release(grpc::ServerContext* ctx, const v1::ReleaseRequest* req,
                       v1::ReleaseResponse* resp) override;
  grpc::Status Delete(grpc::ServerContext* ctx, const v1::DeleteRequest* req,
                      v1::DeleteResponse* resp) override;
  grpc::Status Stats(grpc::ServerContext* ctx, const v1::StatsRequest* req,
                     v1::StatsResponse* resp) override;

 private:
  friend class SessionReactor;
  void Register(SessionReactor* r);
  void Unregister(SessionReactor* r);

  ObjectStore& store_;
  absl::Mutex mu_;
  absl::flat_hash_set<SessionReactor*> reactors_ ABSL_GUARDED_BY(mu_);
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_SERVICE_H_
