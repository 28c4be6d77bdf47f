#include "daemon/server/service.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "daemon/os/peer.h"
#include "daemon/server/session_reactor.h"
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
  std::string message(status.message());
  if (message.size() > kMaxErrorBytes) {
    message.resize(kMaxErrorBytes - 16);
    // Never end inside a UTF-8 sequence.
    while (!message.empty() && (message.back() & 0xC0) == 0x80) {
      message.pop_back();
    }
    if (!message.empty() && (message.back() & 0x80)) message.pop_back();
    message += "... (cut)";
  }
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), message);
}

grpc::Status RemoteRefused(const std::string& peer) {
  return grpc::Status(
      grpc::StatusCode::PERMISSION_DENIED,
      absl::StrCat("peer ", peer.substr(0, 128),
                   " did not connect to the daemon's Unix socket: the data "
                   "plane (shared memory) serves processes on this host "
                   "there only, where the kernel says who they are"));
}

absl::StatusOr<Connection> ObjectStoreService::ConnectionOf(
    const std::string& peer) const {
  std::optional<Connection> c = connections_.Find(peer);
  if (!c.has_value()) {
    grpc::Status refused = RemoteRefused(peer);
    return absl::PermissionDeniedError(refused.error_message());
  }
  return *std::move(c);
}

void ObjectStoreService::LogClientError(uint64_t session_id,
                                        const absl::Status& s) {
  uint64_t suppressed = 0;
  if (!client_errors_.Allow(&suppressed)) return;
  // The session id is a secret: log a prefix only, enough to tell lines of
  // one session from another's.
  spdlog::warn(
      "session {:04x}...: {}{}", session_id >> 48,
      std::string(s.message()).substr(0, kMaxErrorBytes),
      suppressed > 0
          ? absl::StrFormat(" (%d client errors not logged)", suppressed)
          : "");
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
ObjectStoreService::Session(grpc::CallbackServerContext* ctx) {
  return new SessionReactor(*this, ctx);
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
constexpr absl::Duration kMaxReleaseWait = absl::Seconds(10);

// A wait never outlasts the caller's own deadline: a Create that succeeded
// after the caller gave up would leave a write lease nobody knows of.
absl::Time BoundedDeadline(grpc::CallbackServerContext* ctx,
                           absl::Duration wait) {
  absl::Time deadline = absl::Now() + wait;
  const absl::Time theirs = absl::FromChrono(ctx->deadline());
  if (theirs != absl::InfiniteFuture()) {
    deadline = std::min(deadline, theirs - absl::Milliseconds(50));
  }
  return deadline;
}

// Copies what Create and Get have in common into their responses.
template <typename Response>
void FillHandout(Handout h, Response* resp) {
  *resp->mutable_ref() = std::move(h.ref);
  *resp->mutable_placement() = std::move(h.placement);
  *resp->mutable_layout() = std::move(h.layout);
  resp->set_lease_id(h.lease_id);
}

// A unary call parked in WaitingCalls. Owned by gRPC: deleted in OnDone,
// which comes only after Finish.
class WaitingReactor final : public grpc::ServerUnaryReactor,
                             public WaitingCalls::Call {
 public:
  WaitingReactor(ObjectStore& store, ObjectStore::WaitToken token,
                 WaitingCalls& calls, ObjectStoreService::Attempt attempt,
                 ObjectStoreService::Reply reply)
      : store_(store),
        token_(token),
        calls_(calls),
        attempt_(std::move(attempt)),
        reply_(std::move(reply)) {}

  bool Retry(absl::Time* wake_at) override {
    std::optional<grpc::Status> done = attempt_(wake_at);
    if (!done.has_value()) return false;
    Done(done->ok() ? reply_() : *done);
    return true;
  }
  void Cancel() override {
    Done(grpc::Status(grpc::StatusCode::CANCELLED,
                      "the caller cancelled the call"));
  }
  void OnCancel() override {
    cancelled.store(true, std::memory_order_release);
    calls_.Poke();
  }
  void OnDone() override { delete this; }

 private:
  void Done(const grpc::Status& status) {
    store_.EndWait(token_);
    Finish(status);
  }

  ObjectStore& store_;
  const ObjectStore::WaitToken token_;
  WaitingCalls& calls_;
  ObjectStoreService::Attempt attempt_;
  // Serializes the response; owns the call's request and response.
  ObjectStoreService::Reply reply_;
};

}  // namespace

ObjectStoreService::ObjectStoreService(ObjectStore& store,
                                       const ConnectionTable& connections)
    : store_(store), connections_(connections) {
  store_.SetChangeListener([this] { waiting_.Poke(); });
  store_.SetClientErrorSink([this](uint64_t session_id, const absl::Status& s) {
    LogClientError(session_id, s);
  });
}

ObjectStoreService::~ObjectStoreService() {
  store_.SetChangeListener({});
  store_.SetClientErrorSink({});
}

grpc::ServerUnaryReactor* ObjectStoreService::Answer(
    grpc::CallbackServerContext* ctx, const grpc::Status& status,
    const Reply& reply) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(status.ok() && reply ? reply() : status);
  return r;
}

grpc::ServerUnaryReactor* ObjectStoreService::Serve(
    grpc::CallbackServerContext* ctx, uint64_t session_id, const Reply& reply,
    Attempt attempt) {
  absl::Time wake_at = absl::InfiniteFuture();
  if (std::optional<grpc::Status> done = attempt(&wake_at)) {
    return Answer(ctx, *done, reply);
  }
  absl::StatusOr<ObjectStore::WaitToken> token = store_.BeginWait(session_id);
  if (!token.ok()) {
    return Answer(ctx, ToGrpcStatus(ctx, token.status()), nullptr);
  }
  auto* r =
      new WaitingReactor(store_, *token, waiting_, std::move(attempt), reply);
  waiting_.Add(r, wake_at);
  return r;
}

template <typename Request>
grpc::ServerUnaryReactor* ObjectStoreService::ServeAdmitted(
    grpc::CallbackServerContext* ctx, const Request* req, const Reply& reply,
    AdmittedAttempt attempt) {
  absl::StatusOr<Connection> conn = ConnectionOf(ctx->peer());
  if (!conn.ok()) return Answer(ctx, ToGrpcStatus(ctx, conn.status()), nullptr);
  daemon::Caller caller(req->session_id());
  caller.owner = conn->owner;
  caller.connection = conn->serial;
  caller.carried = &req->releases();
  caller.releases_through = req->releases_through();
  const absl::Time releases_deadline = BoundedDeadline(ctx, kMaxReleaseWait);
  auto skipped = std::make_shared<absl::Status>();
  return Serve(ctx, req->session_id(), reply,
               [this, ctx, caller, releases_deadline, skipped,
                attempt = std::move(attempt)](
                   absl::Time* wake_at) mutable -> std::optional<grpc::Status> {
                 caller.releases_last_try = absl::Now() >= releases_deadline;
                 caller.skipped = skipped.get();
                 std::optional<absl::Status> done = attempt(caller, wake_at);
                 if (!skipped->ok()) {
                   LogClientError(caller.session_id, *skipped);
                   *skipped = absl::OkStatus();
                 }
                 if (!done.has_value()) return std::nullopt;
                 if (IsAwaitingReleases(*done)) {
                   *wake_at = releases_deadline;
                   return std::nullopt;
                 }
                 return ToGrpcStatus(ctx, *done);
               });
}

grpc::ServerUnaryReactor* ObjectStoreService::HandleCreate(
    grpc::CallbackServerContext* ctx, const v1::CreateRequest* req,
    v1::CreateResponse* resp, const Reply& reply) {
  auto args = std::make_shared<CreateArgs>(CreateArgsOf(*req));
  const absl::Time deadline =
      BoundedDeadline(ctx, absl::Milliseconds(req->timeout_ms()));
  return ServeAdmitted(
      ctx, req, reply,
      [this, resp, args, deadline](
          const daemon::Caller& caller,
          absl::Time* wake_at) -> std::optional<absl::Status> {
        args->caller = caller;
        absl::StatusOr<std::optional<Handout>> h =
            store_.TryCreate(*args, absl::Now() >= deadline);
        if (!h.ok()) return h.status();
        if (!h->has_value()) {
          *wake_at = deadline;
          return std::nullopt;
        }
        if (absl::Status s = store_.ClearStale(caller.session_id, **h);
            !s.ok()) {
          return s;
        }
        FillHandout(**std::move(h), resp);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ObjectStoreService::HandleSeal(
    grpc::CallbackServerContext* ctx, const v1::SealRequest* req,
    v1::SealResponse* resp, const Reply& reply) {
  absl::StatusOr<Connection> conn = ConnectionOf(ctx->peer());
  if (!conn.ok()) return Answer(ctx, ToGrpcStatus(ctx, conn.status()), reply);
  daemon::Caller caller(req->session_id());
  caller.owner = conn->owner;
  caller.connection = conn->serial;
  absl::StatusOr<SealResult> r =
      store_.Seal(caller, req->lease_id(), req->exclusive());
  if (!r.ok()) return Answer(ctx, ToGrpcStatus(ctx, r.status()), reply);
  *resp->mutable_ref() = r->ref;
  resp->set_lease_id(r->lease_id);
  return Answer(ctx, grpc::Status::OK, reply);
}

grpc::ServerUnaryReactor* ObjectStoreService::HandleGet(
    grpc::CallbackServerContext* ctx, const v1::GetRequest* req,
    v1::GetResponse* resp, const Reply& reply) {
  if (req->target_case() != v1::GetRequest::kRef &&
      req->target_case() != v1::GetRequest::kName) {
    return Answer(ctx,
                  grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                               "GetRequest names neither a ref nor a name"),
                  reply);
  }
  const absl::Duration timeout = absl::Milliseconds(req->timeout_ms());
  const absl::Time deadline = BoundedDeadline(ctx, timeout);
  return ServeAdmitted(ctx, req, reply,
                       [this, req, resp, timeout, deadline](
                           const daemon::Caller& caller,
                           absl::Time* wake_at) -> std::optional<absl::Status> {
                         absl::StatusOr<std::optional<Handout>> h;
                         if (req->target_case() == v1::GetRequest::kRef) {
                           // A wait for a one-way seal on its way (timeout_ms >
                           // 0).
                           h = store_.TryGet(
                               caller, req->ref(), req->offer_token(),
                               req->timeout_ms() > 0, absl::Now() >= deadline);
                         } else {
                           h = store_.TryGetByName(caller, req->name(), timeout,
                                                   absl::Now() >= deadline);
                         }
                         if (!h.ok()) return h.status();
                         if (!h->has_value()) {
                           *wake_at = deadline;
                           return std::nullopt;
                         }
                         resp->set_writable((*h)->writable);
                         FillHandout(**std::move(h), resp);
                         return absl::OkStatus();
                       });
}

grpc::ServerUnaryReactor* ObjectStoreService::HandleRelease(
    grpc::CallbackServerContext* ctx, const v1::ReleaseRequest* req,
    v1::ReleaseResponse* resp, const Reply& reply) {
  // After the session's releases (and one-way seals) sent before it: the
  // seal of this very lease may be among them.
  return ServeAdmitted(
      ctx, req, reply,
      [this, req, resp](const daemon::Caller& caller,
                        absl::Time*) -> std::optional<absl::Status> {
        absl::StatusOr<bool> freed = store_.Release(caller, req->lease_id());
        if (!freed.ok()) return freed.status();
        resp->set_freed(*freed);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ObjectStoreService::HandleDelete(
    grpc::CallbackServerContext* ctx, const v1::DeleteRequest* req,
    v1::DeleteResponse* resp, const Reply& reply) {
  return ServeAdmitted(
      ctx, req, reply,
      [this, req, resp](const daemon::Caller& caller,
                        absl::Time*) -> std::optional<absl::Status> {
        absl::StatusOr<bool> freed = store_.Delete(caller, req->name());
        if (!freed.ok()) return freed.status();
        resp->set_freed(*freed);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ObjectStoreService::HandleStats(
    grpc::CallbackServerContext* ctx, const v1::StatsRequest* req,
    v1::StatsResponse* resp, const Reply& reply) {
  // Without a session: counters only, for any process on the socket.
  if (req->session_id() == 0) {
    absl::StatusOr<Connection> conn = ConnectionOf(ctx->peer());
    if (!conn.ok()) return Answer(ctx, ToGrpcStatus(ctx, conn.status()), reply);
    *resp = store_.Stats(&conn->peer);
    return Answer(ctx, grpc::Status::OK, reply);
  }
  return ServeAdmitted(
      ctx, req, reply,
      [this, resp](const daemon::Caller& caller,
                   absl::Time*) -> std::optional<absl::Status> {
        absl::StatusOr<v1::StatsResponse> stats = store_.SessionStats(caller);
        if (!stats.ok()) return stats.status();
        *resp = *std::move(stats);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ObjectStoreService::HandleEndSession(
    grpc::CallbackServerContext* ctx, const v1::EndSessionRequest* req,
    v1::EndSessionResponse* resp, const Reply& reply) {
  absl::StatusOr<Connection> conn = ConnectionOf(ctx->peer());
  if (!conn.ok()) return Answer(ctx, ToGrpcStatus(ctx, conn.status()), reply);
  if (absl::Status s = store_.Authorize(req->session_id(), conn->owner);
      !s.ok()) {
    return Answer(ctx, ToGrpcStatus(ctx, s), reply);
  }
  store_.EndSession(req->session_id());
  return Answer(ctx, grpc::Status::OK, reply);
}

grpc::ServerUnaryReactor* ObjectStoreService::HandleOffer(
    grpc::CallbackServerContext* ctx, const v1::OfferRequest* req,
    v1::OfferResponse* resp, const Reply& reply) {
  return ServeAdmitted(
      ctx, req, reply,
      [this, req, resp](const daemon::Caller& caller,
                        absl::Time*) -> std::optional<absl::Status> {
        absl::StatusOr<OfferGrant> offer =
            store_.Offer(caller, req->lease_id());
        if (!offer.ok()) return offer.status();
        *resp->mutable_ref() = offer->ref;
        resp->set_offer_token(offer->token);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ObjectStoreService::HandleCreateMany(
    grpc::CallbackServerContext* ctx, const v1::CreateManyRequest* req,
    v1::CreateManyResponse* resp, const Reply& reply) {
  if (req->sizes_size() == 0 ||
      static_cast<size_t>(req->sizes_size()) > ObjectStore::kMaxBatch) {
    return Answer(ctx,
                  grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                               absl::StrFormat("CreateMany of %d buffers: 1 to "
                                               "%d per call",
                                               req->sizes_size(),
                                               ObjectStore::kMaxBatch)),
                  reply);
  }
  const absl::Time deadline = BoundedDeadline(
      ctx, req->stock() ? absl::ZeroDuration()
                        : absl::Milliseconds(req->timeout_ms()));
  return ServeAdmitted(
      ctx, req, reply,
      [this, req, resp, deadline](
          const daemon::Caller& caller,
          absl::Time* wake_at) -> std::optional<absl::Status> {
        CreateArgs args;
        args.caller = caller;
        args.pool = req->pool();
        args.stock = req->stock();
        // Resumed where the last try stopped: only the first one waits.
        for (int i = resp->created_size(); i < req->sizes_size(); ++i) {
          args.size_bytes = req->sizes(i);
          // For the first buffer only.
          if (i == 0 && req->has_reuse_range_of()) {
            args.reuse_range_of = req->reuse_range_of();
          } else {
            args.reuse_range_of.reset();
          }
          const bool last_try = i > 0 || absl::Now() >= deadline;
          absl::StatusOr<std::optional<Handout>> h =
              store_.TryCreate(args, last_try);
          absl::Status failed = h.ok() ? absl::OkStatus() : h.status();
          if (h.ok() && !h->has_value()) {
            *wake_at = deadline;
            return std::nullopt;
          }
          if (failed.ok()) {
            failed = store_.ClearStale(caller.session_id, **h);
          }
          if (!failed.ok()) {
            if (i == 0) return failed;
            resp->set_stopped_code(static_cast<int>(failed.code()));
            resp->set_stopped_message(
                std::string(failed.message().substr(0, kMaxErrorBytes)));
            break;
          }
          FillHandout(**std::move(h), resp->add_created());
        }
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ObjectStoreService::HandleGetMany(
    grpc::CallbackServerContext* ctx, const v1::GetManyRequest* req,
    v1::GetManyResponse* resp, const Reply& reply) {
  if (static_cast<size_t>(req->refs_size()) > ObjectStore::kMaxBatch) {
    return Answer(
        ctx,
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     absl::StrFormat("GetMany of %d refs, at most %d",
                                     req->refs_size(), ObjectStore::kMaxBatch)),
        reply);
  }
  auto refs = std::make_shared<std::vector<v1::ObjectRef>>(req->refs().begin(),
                                                           req->refs().end());
  const absl::Time deadline =
      BoundedDeadline(ctx, absl::Milliseconds(req->timeout_ms()));
  return ServeAdmitted(
      ctx, req, reply,
      [this, req, resp, refs, deadline](
          const daemon::Caller& caller,
          absl::Time* wake_at) -> std::optional<absl::Status> {
        absl::StatusOr<std::optional<std::vector<absl::StatusOr<Handout>>>>
            got = store_.TryGetMany(caller, *refs, req->timeout_ms() > 0,
                                    absl::Now() >= deadline);
        if (!got.ok()) return got.status();
        if (!got->has_value()) {
          *wake_at = deadline;
          return std::nullopt;
        }
        for (absl::StatusOr<Handout>& h : **got) {
          v1::GetManyResult* r = resp->add_results();
          if (h.ok()) {
            r->mutable_view()->set_writable(h->writable);
            FillHandout(*std::move(h), r->mutable_view());
          } else {
            r->set_code(static_cast<int>(h.status().code()));
            r->set_message(
                std::string(h.status().message().substr(0, kMaxErrorBytes)));
            r->set_reason(ErrorReasonOf(h.status()));
          }
        }
        return absl::OkStatus();
      });
}

template <typename Req, typename Resp>
grpc::ServerUnaryReactor* ObjectStoreService::Raw(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
    grpc::ByteBuffer* out, Handler<Req, Resp> handle) {
  // The request and response live while the call does: the reply owns
  // them, and every attempt and parked reactor holds the reply.
  auto call = std::make_shared<std::pair<Req, Resp>>();
  grpc::ByteBuffer bytes(*in);
  const size_t size = bytes.Length();
  if (grpc::Status parsed =
          grpc::SerializationTraits<Req>::Deserialize(&bytes, &call->first);
      !parsed.ok()) {
    return Answer(
        ctx,
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     absl::StrFormat("request of %d bytes is not a valid %s "
                                     "(bad wire format, or a string field "
                                     "that is not UTF-8)",
                                     size, Req::descriptor()->full_name())),
        nullptr);
  }
  Reply reply = [call, out]() -> grpc::Status {
    bool own = false;
    return grpc::SerializationTraits<Resp>::Serialize(call->second, out, &own);
  };
  return (this->*handle)(ctx, &call->first, &call->second, reply);
}

#define SHMTENSOR_RAW_METHOD(M)                                     \
  grpc::ServerUnaryReactor* ObjectStoreService::M(                  \
      grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in, \
      grpc::ByteBuffer* out) {                                      \
    return Raw<v1::M##Request, v1::M##Response>(                    \
        ctx, in, out, &ObjectStoreService::Handle##M);              \
  }
SHMTENSOR_RAW_METHOD(Create)
SHMTENSOR_RAW_METHOD(Seal)
SHMTENSOR_RAW_METHOD(Get)
SHMTENSOR_RAW_METHOD(Release)
SHMTENSOR_RAW_METHOD(Delete)
SHMTENSOR_RAW_METHOD(Stats)
SHMTENSOR_RAW_METHOD(EndSession)
SHMTENSOR_RAW_METHOD(Offer)
SHMTENSOR_RAW_METHOD(CreateMany)
SHMTENSOR_RAW_METHOD(GetMany)
#undef SHMTENSOR_RAW_METHOD

}  // namespace shmtensor::daemon
