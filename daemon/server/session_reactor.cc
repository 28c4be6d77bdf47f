#include "daemon/server/session_reactor.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "daemon/os/peer.h"
#include "daemon/server/release_intake.h"
#include "daemon/server/service.h"

namespace shmtensor::daemon {

SessionReactor::SessionReactor(ObjectStoreService& service,
                               grpc::CallbackServerContext* ctx)
    : service_(service), ctx_(ctx), peer_(ctx->peer()) {
  absl::StatusOr<Connection> caller = service_.ConnectionOf(peer_);
  if (!caller.ok()) {
    FinishOnce(RemoteRefused(peer_));
    return;
  }
  caller_ = *std::move(caller);
  StartRead(&raw_request_);
}

void SessionReactor::OnReadDone(bool ok) {
  if (!ok) {  // Client closed its side, or the connection broke.
    FinishOnce(grpc::Status::OK);
    return;
  }
  const size_t size = raw_request_.Length();
  if (!grpc::SerializationTraits<v1::SessionRequest>::Deserialize(&raw_request_,
                                                                  &request_)
           .ok()) {
    FinishOnce(grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrFormat("session message of %d bytes is not a valid "
                        "shmtensor.v1.SessionRequest",
                        size)));
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
  OnOpen(request_.open());
}

void SessionReactor::OnOpen(const v1::OpenSession& open) {
  LeaseAccount account;
  if (open.present_leases()) {
    account.held.assign(open.held_lease_ids().begin(),
                        open.held_lease_ids().end());
    account.releases_through = open.releases_through();
    account.seals.assign(open.pending_seals().begin(),
                         open.pending_seals().end());
  }
  absl::StatusOr<OpenedSession> opened =
      open.resume_session_id() != 0
          ? service_.store_.ResumeSession(
                open.resume_session_id(), caller_.owner,
                open.present_leases() ? &account : nullptr, caller_.serial)
          : service_.store_.OpenSession(
                open.client_name(),
                PeerInfo{caller_.peer, caller_.owner, caller_.pidfd,
                         CommandLineOf(caller_.peer.pid), caller_.serial},
                open.read_only());
  if (!opened.ok()) {
    FinishOnce(ToGrpcStatus(ctx_, opened.status()));
    return;
  }
  session_id_ = opened->id;
  stream_ = opened->stream;
  v1::SessionOpened* reply = event_.mutable_opened();
  reply->set_session_id(opened->id);
  reply->set_daemon_epoch(service_.store_.epoch());
  reply->set_releases_applied(opened->releases_applied);
  reply->set_client_id(opened->client_id);
  for (v1::PoolInfo& p : opened->pools) *reply->add_pools() = std::move(p);
  reply->set_descriptor_secret(opened->descriptor_secret);
  reply->set_leases_reconciled(opened->reconciled);
  for (uint64_t id : opened->refused) reply->add_refused_lease_ids(id);
  reply->set_dropped_leases(opened->dropped);
  service_.Register(this);
  bool own = false;
  if (!grpc::SerializationTraits<v1::SessionEvent>::Serialize(event_,
                                                              &raw_event_, &own)
           .ok()) {
    FinishOnce(grpc::Status(grpc::StatusCode::INTERNAL,
                            "cannot serialize SessionOpened"));
    return;
  }
  StartWrite(&raw_event_);
  StartRead(&raw_request_);  // Completes when the client goes away.
}

void SessionReactor::OnRelease(const v1::ReleaseLeases& release) {
  absl::Status unknown;
  absl::Status s =
      ApplyReleaseMessage(service_.store_, session_id_, release, &unknown);
  if (!unknown.ok()) service_.LogClientError(session_id_, unknown);
  if (absl::IsInvalidArgument(s)) {
    service_.LogClientError(session_id_, s);
    FinishOnce(ToGrpcStatus(nullptr, s));
    return;
  }
  if (!s.ok()) service_.LogClientError(session_id_, s);
  StartRead(&raw_request_);
}

void SessionReactor::OnCancel() {
  FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "session cancelled"));
}

void SessionReactor::OnDone() {
  if (session_id_ != 0) {
    service_.Unregister(this);
    service_.store_.StreamEnded(session_id_, stream_);
  }
  delete this;
}

void SessionReactor::FinishOnce(const grpc::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
  }
  Finish(status);
}

}  // namespace shmtensor::daemon
