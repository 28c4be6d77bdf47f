#include "daemon/server/monitor_service.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"

namespace shmtensor::daemon {

MonitorService::MonitorService(ObjectStore& store, std::string version,
                               std::vector<std::string> addresses,
                               std::vector<v1::UnavailablePool> unavailable,
                               const ConnectionTable* connections)
    : store_(store),
      connections_(connections),
      version_(std::move(version)),
      unavailable_(std::move(unavailable)),
      addresses_(std::move(addresses)) {}

void MonitorService::SetAddresses(std::vector<std::string> addresses) {
  absl::MutexLock lock(&mu_);
  addresses_ = std::move(addresses);
}

void MonitorService::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  stop_.SignalAll();
}

std::optional<PeerCredentials> MonitorService::Viewer(
    const grpc::ServerContext* ctx) const {
  if (connections_ == nullptr) return std::nullopt;
  std::optional<Connection> c = connections_->Find(ctx->peer());
  if (!c.has_value() || c->peer.uid == 0 || c->peer.uid == geteuid()) {
    return std::nullopt;
  }
  return c->peer;
}

v1::DaemonStatus MonitorService::Snapshot(const PeerCredentials* viewer) const {
  v1::DaemonStatus s = store_.Status(viewer);
  s.set_version(version_);
  s.set_pid(getpid());
  for (const v1::UnavailablePool& u : unavailable_) {
    *s.add_unavailable_pools() = u;
  }
  absl::MutexLock lock(&mu_);
  for (const std::string& a : addresses_) s.add_addresses(a);
  return s;
}

grpc::Status MonitorService::GetStatus(grpc::ServerContext* ctx,
                                       const v1::GetStatusRequest* req,
                                       v1::DaemonStatus* resp) {
  const std::optional<PeerCredentials> viewer = Viewer(ctx);
  *resp = Snapshot(viewer ? &*viewer : nullptr);
  return grpc::Status::OK;
}

grpc::Status MonitorService::ListObjects(grpc::ServerContext* ctx,
                                         const v1::ListObjectsRequest* req,
                                         v1::ListObjectsResponse* resp) {
  const std::optional<PeerCredentials> viewer = Viewer(ctx);
  *resp = store_.ListObjects(req->limit(), req->page_token(),
                             viewer ? &*viewer : nullptr);
  return grpc::Status::OK;
}

grpc::Status MonitorService::ListClients(grpc::ServerContext* ctx,
                                         const v1::ListClientsRequest* req,
                                         v1::ListClientsResponse* resp) {
  const std::optional<PeerCredentials> viewer = Viewer(ctx);
  *resp = store_.ListClients(viewer ? &*viewer : nullptr);
  return grpc::Status::OK;
}

grpc::Status MonitorService::Watch(
    grpc::ServerContext* ctx, const v1::WatchRequest* req,
    grpc::ServerWriter<v1::DaemonStatus>* writer) {
  if (req->interval_ms() < kMinWatchIntervalMs ||
      req->interval_ms() > kMaxWatchIntervalMs) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrFormat("interval_ms %d is outside [%d, %d]",
                                        req->interval_ms(), kMinWatchIntervalMs,
                                        kMaxWatchIntervalMs));
  }
  {
    absl::MutexLock lock(&mu_);
    if (watches_ >= kMaxWatches) {
      return grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrFormat("%d watches are open, the most the daemon serves "
                          "at once (each holds a thread)",
                          watches_));
    }
    ++watches_;
  }
  struct Done {
    MonitorService* m;
    ~Done() {
      absl::MutexLock lock(&m->mu_);
      --m->watches_;
    }
  } done{this};
  const std::optional<PeerCredentials> viewer = Viewer(ctx);
  const absl::Duration interval = absl::Milliseconds(req->interval_ms());
  absl::Time next = absl::Now();
  for (uint32_t sent = 0; req->count() == 0 || sent < req->count(); ++sent) {
    // Sleep until the next tick in slices, to notice a cancelled caller.
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (shutting_down_) {
          return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              "shmtensord is shutting down");
        }
        const absl::Time now = absl::Now();
        if (now >= next) break;
        stop_.WaitWithTimeout(&mu_,
                              std::min(next - now, absl::Milliseconds(100)));
      }
      if (ctx->IsCancelled()) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled");
      }
    }
    if (!writer->Write(Snapshot(viewer ? &*viewer : nullptr))) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "watcher went away");
    }
    // The next tick; after a late write, skip the missed ticks rather than
    // burst to catch up.
    next += interval;
    if (const absl::Time now = absl::Now(); next < now) next = now + interval;
  }
  return grpc::Status::OK;
}

}  // namespace shmtensor::daemon
