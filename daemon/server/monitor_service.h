// gRPC adapter for the Monitor service (proto/shmtensor/v1/monitor.proto):
// read-only snapshots of the ObjectStore plus what only the daemon knows
// (version, pid, addresses).
//
// What a caller sees: everything for root, the daemon's own user and callers
// on the TCP monitoring address (an operator's choice, monitor_listen);
// for any other user on the Unix socket (who may reach it when the socket is
// shared), only the pools it may use and their objects, and its own
// sessions (ObjectStore's `viewer`).
//
// Unary calls and Watch use the synchronous API; a Watch holds one server
// thread while it streams and wakes at least every 100 ms to notice a
// cancelled caller or Shutdown(). At most kMaxWatches stream at once (more
// fail RESOURCE_EXHAUSTED), so watchers cannot take the daemon's threads.
//
// Thread safety: thread-safe.
#ifndef SHMTENSOR_DAEMON_SERVER_MONITOR_SERVICE_H_
#define SHMTENSOR_DAEMON_SERVER_MONITOR_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/server/connections.h"
#include "daemon/store/object_store.h"
#include "shmtensor/v1/monitor.grpc.pb.h"

namespace shmtensor::daemon {

// Shortest and longest Watch interval, in milliseconds.
inline constexpr uint32_t kMinWatchIntervalMs = 100;
inline constexpr uint32_t kMaxWatchIntervalMs = 3600 * 1000;
// Most Watch streams served at once.
inline constexpr int kMaxWatches = 64;

class MonitorService final : public v1::Monitor::Service {
 public:
  // `store` must outlive the service. `addresses`: every address served,
  // the socket first.
  // `unavailable` lists the configured pools the daemon serves without
  // (reported in every status).
  // `connections` (may be null: everything for everyone) tells who calls
  // on the Unix socket.
  MonitorService(ObjectStore& store, std::string version,
                 std::vector<std::string> addresses,
                 std::vector<v1::UnavailablePool> unavailable = {},
                 const ConnectionTable* connections = nullptr);

  // Replaces the addresses reported (once ports are bound: "host:0" becomes
  // the port the kernel chose).
  void SetAddresses(std::vector<std::string> addresses);

  // Ends every Watch with UNAVAILABLE, now and for later calls. Call before
  // the server shuts down (which waits for in-flight calls).
  void Shutdown();

  grpc::Status GetStatus(grpc::ServerContext* ctx,
                         const v1::GetStatusRequest* req,
                         v1::DaemonStatus* resp) override;
  grpc::Status ListObjects(grpc::ServerContext* ctx,
                           const v1::ListObjectsRequest* req,
                           v1::ListObjectsResponse* resp) override;
  grpc::Status ListClients(grpc::ServerContext* ctx,
                           const v1::ListClientsRequest* req,
                           v1::ListClientsResponse* resp) override;
  grpc::Status Watch(grpc::ServerContext* ctx, const v1::WatchRequest* req,
                     grpc::ServerWriter<v1::DaemonStatus>* writer) override;

 private:
  v1::DaemonStatus Snapshot(const PeerCredentials* viewer) const;
  // The caller's credentials when its view is restricted (see above), else
  // nullopt.
  std::optional<PeerCredentials> Viewer(const grpc::ServerContext* ctx) const;

  ObjectStore& store_;
  const ConnectionTable* const connections_;
  const std::string version_;
  const std::vector<v1::UnavailablePool> unavailable_;
  mutable absl::Mutex mu_;
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);
  absl::CondVar stop_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  int watches_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_SERVER_MONITOR_SERVICE_H_
