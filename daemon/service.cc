#include "daemon/service.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "daemon/peer.h"
#include "shmtensor/errors.h"
#include "spdlog/spdlog.h"

namespace shmtensor::daemon {

grpc::Status ToGrpcStatus(grpc::ServerContextBase* ctx,
                          const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const std::string reason = ErrorReasonOf(status);
  if (!reason.empty() && ctx != nullptr) {
    ctx->AddTrailingMetadata(std::string(kErrorReasonMetadata), reason);
  }
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

grpc::Status RemoteRefused(const std::string& peer) {
  return grpc::Status(
      grpc::StatusCode::PERMISSION_DENIED,
      absl::StrCat("peer ", peer,
                   " is not on this host: the data plane (shared memory) "
                   "serves local clients only; use the Unix socket"));
}

namespace {

// Applies one ReleaseLeases of `session_id` (from its stream, or a copy a
// unary request carried). Leases the session does not hold are skipped and
// only logged (no reply can tell the client); returns OK then.
// INVALID_ARGUMENT: the seq is past the next one due. Other errors: the
// session's (not open).
absl::Status ApplyReleaseMessage(ObjectStore& store, uint64_t session_id,
                                 const v1::ReleaseLeases& release) {
  const std::vector<uint64_t> ids(release.lease_ids().begin(),
                                  release.lease_ids().end());
  absl::Status s = store.ReleaseBatch(session_id, release.seq(), ids);
  if (absl::IsNotFound(s)) {
    spdlog::warn("session {:016x}: {}", session_id, s.ToString());
    return absl::OkStatus();
  }
  return s;
}

}  // namespace

// One session stream. Owned by gRPC: deletes itself in OnDone.
class SessionReactor final
    : public grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionEvent> {
 public:
  SessionReactor(ObjectStoreService& service, std::string peer)
      : service_(service), peer_(std::move(peer)) {
    if (!IsLocalPeer(peer_)) {
      FinishOnce(RemoteRefused(peer_));
      return;
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // Client closed its side, or the connection broke.
      FinishOnce(grpc::Status::OK);
      return;
    }
    if (session_id_ != 0 && request_.has_release()) {
      OnRelease(request_.release());
      return;
    }
    if (session_id_ != 0 || !request_.has_open()) {
      FinishOnce(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              session_id_ != 0
                                  ? "session stream takes one OpenSession only"
                                  : "first session message must be open"));
      return;
    }
    absl::StatusOr<uint64_t> id = service_.store_.OpenSession(
        request_.open().client_name(), request_.open().pid(),
        DescribePeer(peer_, request_.open().pid()));
    if (!id.ok()) {
      FinishOnce(ToGrpcStatus(nullptr, id.status()));
      return;
    }
    session_id_ = *id;
    v1::SessionOpened* opened = event_.mutable_opened();
    opened->set_session_id(*id);
    opened->set_daemon_epoch(service_.store_.epoch());
    for (const v1::PoolInfo& p : service_.store_.pool_infos()) {
      *opened->add_pools() = p;
    }
    service_.Register(this);
    StartWrite(&event_);
    StartRead(&request_);  // Completes when the client goes away.
  }

  // Applies a ReleaseLeases and reads on. A lease the session does not hold
  // is only logged (the client cannot be told without a reply); a seq out of
  // order breaks the ordering contract, so it ends the session.
  void OnRelease(const v1::ReleaseLeases& release) {
    absl::Status s = ApplyReleaseMessage(service_.store_, session_id_, release);
    if (absl::IsInvalidArgument(s)) {
      spdlog::warn("session {:016x}: {}; ending it", session_id_, s.ToString());
      FinishOnce(ToGrpcStatus(nullptr, s));
      return;
    }
    if (!s.ok()) spdlog::warn("session {:016x}: {}", session_id_, s.ToString());
    StartRead(&request_);
  }

  void OnWriteDone(bool ok) override {}
  void OnCancel() override {
    FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "session cancelled"));
  }
  void OnDone() override {
    if (session_id_ != 0) {
      service_.Unregister(this);
      service_.store_.EndSession(session_id_);
    }
    delete this;
  }

  // Ends the stream with `status` unless it has ended already.
  void FinishOnce(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(status);
  }

 private:
  ObjectStoreService& service_;
  const std::string peer_;
  v1::SessionRequest request_;
  v1::SessionEvent event_;
  uint64_t session_id_ = 0;  // Set once, on the reactor's read callback.
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionEvent>*
ObjectStoreService::Session(grpc::CallbackServerContext* ctx) {
  return new SessionReactor(*this, ctx->peer());
}

void ObjectStoreService::Register(SessionReactor* r) {
  bool end_now;
  {
    absl::MutexLock lock(&mu_);
    reactors_.insert(r);
    end_now = ending_;
  }
  if (end_now) {
    r->FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               "shmtensord is shutting down"));
  }
}

void ObjectStoreService::Unregister(SessionReactor* r) {
  absl::MutexLock lock(&mu_);
  reactors_.erase(r);
}

void ObjectStoreService::EndAllSessions() {
  absl::MutexLock lock(&mu_);
  ending_ = true;
  // FinishOnce does not call back into the service, so holding mu_ keeps
  // every reactor alive (OnDone must Unregister first).
  for (SessionReactor* r : reactors_) {
    r->FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               "shmtensord is shutting down"));
  }
}

namespace {

// Longest wait for a session's releases to arrive on its stream; they were
// sent before the call, so this bounds a broken client only.
constexpr uint32_t kMaxReleaseWaitMs = 10000;

// A wait never outlasts the caller's own deadline: a Create that succeeded
// after the caller gave up would leave a write lease nobody knows of.
absl::Duration BoundedWait(grpc::ServerContext* ctx, uint32_t timeout_ms) {
  absl::Duration wait = absl::Milliseconds(timeout_ms);
  const absl::Time deadline = absl::FromChrono(ctx->deadline());
  if (deadline != absl::InfiniteFuture()) {
    wait = std::min(wait, deadline - absl::Now() - absl::Milliseconds(50));
  }
  return std::max(wait, absl::ZeroDuration());
}

// Most copies of stream releases one request may carry (the client sends at
// most 64).
constexpr int kMaxCarriedReleases = 1024;

// Applies the session's own releases through `releases_through` before a
// call that could observe them (see ReleaseLeases in the proto): first the
// copies the request carries, in order, up to a gap; then waits for the
// stream to deliver any others.
template <typename Request>
absl::Status ApplyReleases(ObjectStore& store, grpc::ServerContext* ctx,
                           const Request& req) {
  if (req.releases_size() > kMaxCarriedReleases) {
    return absl::InvalidArgumentError(
        absl::StrFormat("request carries %d ReleaseLeases copies, at most %d",
                        req.releases_size(), kMaxCarriedReleases));
  }
  for (const v1::ReleaseLeases& r : req.releases()) {
    absl::Status s = ApplyReleaseMessage(store, req.session_id(), r);
    if (absl::IsInvalidArgument(s)) break;  // A gap: the stream has the rest.
    if (!s.ok()) return s;
  }
  if (req.releases_through() == 0) return absl::OkStatus();
  return store.AwaitReleases(req.session_id(), req.releases_through(),
                             BoundedWait(ctx, kMaxReleaseWaitMs));
}

// Copies what Create and Get have in common into their responses.
template <typename Response>
void FillHandout(Handout h, Response* resp) {
  *resp->mutable_ref() = std::move(h.ref);
  *resp->mutable_placement() = std::move(h.placement);
  *resp->mutable_layout() = std::move(h.layout);
  resp->set_lease_id(h.lease_id);
}

}  // namespace

grpc::Status ObjectStoreService::Create(grpc::ServerContext* ctx,
                                        const v1::CreateRequest* req,
                                        v1::CreateResponse* resp) {
  if (!IsLocalPeer(ctx->peer())) return RemoteRefused(ctx->peer());
  if (absl::Status s = ApplyReleases(store_, ctx, *req); !s.ok()) {
    return ToGrpcStatus(ctx, s);
  }
  CreateArgs args;
  args.session_id = req->session_id();
  args.pool = req->pool();
  args.size_bytes = req->size_bytes();
  args.layout = req->layout();
  args.name = req->name();
  args.timeout = BoundedWait(ctx, req->timeout_ms());
  args.shared_writable = req->shared_writable();
  absl::StatusOr<Handout> h = store_.Create(args);
  if (!h.ok()) return ToGrpcStatus(ctx, h.status());
  FillHandout(*std::move(h), resp);
  return grpc::Status::OK;
}

grpc::Status ObjectStoreService::Seal(grpc::ServerContext* ctx,
                                      const v1::SealRequest* req,
                                      v1::SealResponse* resp) {
  if (!IsLocalPeer(ctx->peer())) return RemoteRefused(ctx->peer());
  absl::StatusOr<SealResult> r =
      store_.Seal(req->session_id(), req->lease_id(), req->exclusive());
  if (!r.ok()) return ToGrpcStatus(ctx, r.status());
  *resp->mutable_ref() = r->ref;
  resp->set_lease_id(r->lease_id);
  return grpc::Status::OK;
}

grpc::Status ObjectStoreService::Get(grpc::ServerContext* ctx,
                                     const v1::GetRequest* req,
                                     v1::GetResponse* resp) {
  if (!IsLocalPeer(ctx->peer())) return RemoteRefused(ctx->peer());
  if (absl::Status s = ApplyReleases(store_, ctx, *req); !s.ok()) {
    return ToGrpcStatus(ctx, s);
  }
  absl::StatusOr<Handout> h;
  switch (req->target_case()) {
    case v1::GetRequest::kRef:
      h = store_.Get(req->session_id(), req->ref());
      break;
    case v1::GetRequest::kName:
      h = store_.GetByName(req->session_id(), req->name(),
                           BoundedWait(ctx, req->timeout_ms()));
      break;
    default:
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "GetRequest names neither a ref nor a name");
  }
  if (!h.ok()) return ToGrpcStatus(ctx, h.status());
  resp->set_writable(h->writable);
  FillHandout(*std::move(h), resp);
  return grpc::Status::OK;
}

grpc::Status ObjectStoreService::Release(grpc::ServerContext* ctx,
                                         const v1::ReleaseRequest* req,
                                         v1::ReleaseResponse* resp) {
  if (!IsLocalPeer(ctx->peer())) return RemoteRefused(ctx->peer());
  absl::StatusOr<bool> freed =
      store_.Release(req->session_id(), req->lease_id());
  if (!freed.ok()) return ToGrpcStatus(ctx, freed.status());
  resp->set_freed(*freed);
  return grpc::Status::OK;
}

grpc::Status ObjectStoreService::Delete(grpc::ServerContext* ctx,
                                        const v1::DeleteRequest* req,
                                        v1::DeleteResponse* resp) {
  if (!IsLocalPeer(ctx->peer())) return RemoteRefused(ctx->peer());
  if (absl::Status s = ApplyReleases(store_, ctx, *req); !s.ok()) {
    return ToGrpcStatus(ctx, s);
  }
  absl::StatusOr<bool> freed = store_.Delete(req->session_id(), req->name());
  if (!freed.ok()) return ToGrpcStatus(ctx, freed.status());
  resp->set_freed(*freed);
  return grpc::Status::OK;
}

grpc::Status ObjectStoreService::Stats(grpc::ServerContext* ctx,
                                       const v1::StatsRequest* req,
                                       v1::StatsResponse* resp) {
  if (!IsLocalPeer(ctx->peer())) return RemoteRefused(ctx->peer());
  if (absl::Status s = ApplyReleases(store_, ctx, *req); !s.ok()) {
    return ToGrpcStatus(ctx, s);
  }
  *resp = store_.Stats();
  return grpc::Status::OK;
}

}  // namespace shmtensor::daemon
