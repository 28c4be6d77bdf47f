// gRPC adapter over ObjectStore: validates, calls the core, maps the Status.
//
// Every RPC uses gRPC's callback API: no call holds a thread. A call that
// must wait (Create for memory, a named Get, any call for its session's
// releases) is parked in WaitingCalls, one thread for all of them, counted
// against the waiter limits, and finished CANCELLED as soon as its caller
// goes. An idle session stream costs no thread either; when it ends without
// EndSession, the store keeps the session while its process lives
// (ObjectStore::StreamEnded).
//
// Identity comes from the connection, never from the request: the data plane
// serves only connections the daemon accepted on its Unix socket itself
// (connections.h), each tied to its peer process by the kernel. Every other
// caller (TCP, even loopback) gets PERMISSION_DENIED. A request naming a
// session acts for it only when it arrives from the process that opened it.
// Waiting calls poll their cancellation, so a caller that gives up frees
// what its call held at once. Error messages are cut to kMaxErrorBytes.
//
// Thread safety: thread-safe; gRPC calls it from many threads.
#ifndef SHMTENSOR_DAEMON_SERVER_SERVICE_H_
#define SHMTENSOR_DAEMON_SERVER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/server/connections.h"
#include "daemon/server/log_limiter.h"
#include "daemon/server/waiting_calls.h"
#include "daemon/store/object_store.h"
#include "shmtensor/v1/shmtensor.grpc.pb.h"

namespace shmtensor::daemon {

class SessionReactor;

// Longest error message the daemon sends (bytes): it travels in a header,
// and a client's metadata limit is 8 KiB by default.
inline constexpr size_t kMaxErrorBytes = 1024;

// PERMISSION_DENIED naming `peer`, for a data-plane call that did not come
// through the daemon's Unix socket.
grpc::Status RemoteRefused(const std::string& peer);

// absl::Status -> grpc::Status, with the reason as trailing metadata and the
// message cut to kMaxErrorBytes.
grpc::Status ToGrpcStatus(grpc::ServerContextBase* ctx,
                          const absl::Status& status);

// Every method is raw (its bytes parsed here): a request that does not
// parse gets INVALID_ARGUMENT naming its type and size, where gRPC's
// callback handler would answer UNIMPLEMENTED with no message (and end a
// session stream as if the client had closed it).
using ObjectStoreServiceBase = v1::ObjectStore::WithRawCallbackMethod_Session<
    v1::ObjectStore::WithRawCallbackMethod_Create<
        v1::ObjectStore::WithRawCallbackMethod_Seal<
            v1::ObjectStore::WithRawCallbackMethod_Get<
                v1::ObjectStore::WithRawCallbackMethod_Release<
                    v1::ObjectStore::WithRawCallbackMethod_Delete<
                        v1::ObjectStore::WithRawCallbackMethod_Stats<
                            v1::ObjectStore::WithRawCallbackMethod_EndSession<
                                v1::ObjectStore::WithRawCallbackMethod_Offer<
                                    v1::ObjectStore::
                                        WithRawCallbackMethod_CreateMany<
                                            v1::ObjectStore::
                                                WithRawCallbackMethod_GetMany<
                                                    v1::ObjectStore::
                                                        Service>>>>>>>>>>>;

class ObjectStoreService final : public ObjectStoreServiceBase {
 public:
  // `store` and `connections` must outlive the service.
  ObjectStoreService(ObjectStore& store, const ConnectionTable& connections);
  ~ObjectStoreService() override;

  // Ends every open session stream with UNAVAILABLE. Call after
  // store.Shutdown() (which also answers every parked call) and before the
  // server shuts down.
  void EndAllSessions();

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Session(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* Create(grpc::CallbackServerContext* ctx,
                                   const grpc::ByteBuffer* in,
                                   grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* Seal(grpc::CallbackServerContext* ctx,
                                 const grpc::ByteBuffer* in,
                                 grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx,
                                const grpc::ByteBuffer* in,
                                grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx,
                                    const grpc::ByteBuffer* in,
                                    grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx,
                                   const grpc::ByteBuffer* in,
                                   grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx,
                                  const grpc::ByteBuffer* in,
                                  grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* EndSession(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* in,
                                       grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* Offer(grpc::CallbackServerContext* ctx,
                                  const grpc::ByteBuffer* in,
                                  grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* CreateMany(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* in,
                                       grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* GetMany(grpc::CallbackServerContext* ctx,
                                    const grpc::ByteBuffer* in,
                                    grpc::ByteBuffer* out) override;

  // Serializes the call's response into the reply's bytes (and owns the
  // call's request and response).
  using Reply = std::function<grpc::Status()>;
  // One try at answering a call: its status, or nullopt for "not yet" with
  // *wake_at the latest time to try again (the call's deadline).
  using Attempt = std::function<std::optional<grpc::Status>(absl::Time*)>;

 private:
  friend class SessionReactor;
  void Register(SessionReactor* r);
  void Unregister(SessionReactor* r);
  // The connection the call came on; PERMISSION_DENIED for any other peer.
  absl::StatusOr<Connection> ConnectionOf(const std::string& peer) const;
  // One try of a data-plane call as `caller` (caller.h: the store admits it
  // under the lock the call takes): its status, the response filled when
  // OK; or nullopt for "not yet" with *wake_at the latest time to try again
  // (the call's deadline).
  using AdmittedAttempt = std::function<std::optional<absl::Status>(
      const Caller& caller, absl::Time* wake_at)>;
  // How every data-plane call of a session is answered: Serve of `attempt`
  // as the request's session from the connection it came on, carrying the
  // request's releases and following its releases_through. A try the store
  // answers IsAwaitingReleases waits for the session's stream, at most
  // 10 s (kMaxReleaseWait); later tries then fail DEADLINE_EXCEEDED.
  // Leases and seals of carried releases the session does not hold are
  // logged (rate-limited).
  template <typename Request>
  grpc::ServerUnaryReactor* ServeAdmitted(grpc::CallbackServerContext* ctx,
                                          const Request* req,
                                          const Reply& reply,
                                          AdmittedAttempt attempt);
  // Answers with `attempt` now, or parks the call (counted against the
  // waiter limits) until it can; `reply` serializes the response on OK.
  grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* ctx,
                                  uint64_t session_id, const Reply& reply,
                                  Attempt attempt);
  // Finishes with `status`, or on OK with what `reply` (if any) gives.
  static grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx,
                                          const grpc::Status& status,
                                          const Reply& reply);
  // A typed handler, and the raw entry point that parses for it.
  template <typename Req, typename Resp>
  using Handler = grpc::ServerUnaryReactor* (
      ObjectStoreService::*)(grpc::CallbackServerContext*, const Req*, Resp*,
                             const Reply&);
  template <typename Req, typename Resp>
  grpc::ServerUnaryReactor* Raw(grpc::CallbackServerContext* ctx,
                                const grpc::ByteBuffer* in,
                                grpc::ByteBuffer* out,
                                Handler<Req, Resp> handle);
  grpc::ServerUnaryReactor* HandleCreate(grpc::CallbackServerContext* ctx,
                                         const v1::CreateRequest* req,
                                         v1::CreateResponse* resp,
                                         const Reply& reply);
  grpc::ServerUnaryReactor* HandleSeal(grpc::CallbackServerContext* ctx,
                                       const v1::SealRequest* req,
                                       v1::SealResponse* resp,
                                       const Reply& reply);
  grpc::ServerUnaryReactor* HandleGet(grpc::CallbackServerContext* ctx,
                                      const v1::GetRequest* req,
                                      v1::GetResponse* resp,
                                      const Reply& reply);
  grpc::ServerUnaryReactor* HandleRelease(grpc::CallbackServerContext* ctx,
                                          const v1::ReleaseRequest* req,
                                          v1::ReleaseResponse* resp,
                                          const Reply& reply);
  grpc::ServerUnaryReactor* HandleDelete(grpc::CallbackServerContext* ctx,
                                         const v1::DeleteRequest* req,
                                         v1::DeleteResponse* resp,
                                         const Reply& reply);
  grpc::ServerUnaryReactor* HandleStats(grpc::CallbackServerContext* ctx,
                                        const v1::StatsRequest* req,
                                        v1::StatsResponse* resp,
                                        const Reply& reply);
  grpc::ServerUnaryReactor* HandleEndSession(grpc::CallbackServerContext* ctx,
                                             const v1::EndSessionRequest* req,
                                             v1::EndSessionResponse* resp,
                                             const Reply& reply);
  grpc::ServerUnaryReactor* HandleOffer(grpc::CallbackServerContext* ctx,
                                        const v1::OfferRequest* req,
                                        v1::OfferResponse* resp,
                                        const Reply& reply);
  grpc::ServerUnaryReactor* HandleCreateMany(grpc::CallbackServerContext* ctx,
                                             const v1::CreateManyRequest* req,
                                             v1::CreateManyResponse* resp,
                                             const Reply& reply);
  grpc::ServerUnaryReactor* HandleGetMany(grpc::CallbackServerContext* ctx,
                                          const v1::GetManyRequest* req,
                                          v1::GetManyResponse* resp,
                                          const Reply& reply);
  // Logs a client's error (a request, stream message or release ring post
  // refused), at most a few lines a second. Thread-safe; the store calls it
  // under its lock (ObjectStore::SetClientErrorSink).
  void LogClientError(uint64_t session_id, const absl::Status& s);

  ObjectStore& store_;
  const ConnectionTable& connections_;
  LogLimiter client_errors_{20};
  WaitingCalls waiting_;
  absl::Mutex mu_;
  absl::flat_hash_set<SessionReactor*> reactors_ ABSL_GUARDED_BY(mu_);
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_SERVER_SERVICE_H_
