// The state one Client shares with every buffer, view and ref it made: the
// channel, the session stream and the pool mappings. Leases hold it by
// shared_ptr, so it outlives the Client handle while any view is alive.
//
// Fork: the first Connect makes the process fork-safe (fork_guard.h), so a
// child's own new clients work and it closes its copies of the parent's
// connections.
// A ClientCore inherited across fork() belongs to the parent's session: in
// the child every call fails with FAILED_PRECONDITION, and its destruction
// touches nothing the parent uses.
//
// Thread safety: thread-safe.
#ifndef SHMTENSOR_CLIENT_CLIENT_CORE_H_
#define SHMTENSOR_CLIENT_CLIENT_CORE_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/cuda_api.h"
#include "client/cuda_pool_mapping.h"
#include "client/gpu_releaser.h"
#include "client/pool_mapping.h"
#include "shmtensor/device.h"
#include "shmtensor/v1/shmtensor.grpc.pb.h"
#include "shmtensor/view.h"

namespace shmtensor::internal {

// Deadline of calls that do not wait for anything.
inline constexpr absl::Duration kRpcDeadline = absl::Seconds(30);

class ClientCore {
 public:
  // Connects, opens the session and maps every host pool read-only.
  // UNAVAILABLE naming the address when no daemon answers in time.
  static absl::StatusOr<std::shared_ptr<ClientCore>> Connect(
      const std::string& address, const std::string& client_name,
      absl::Duration connect_timeout,
      WriteRevocation write_revocation = WriteRevocation::kWhenExposed);
  // Ends the session: the daemon then drops whatever leases remain.
  ~ClientCore();

  // Keeps every client core of this process that is still alive from being
  // destroyed, ever: its session then ends when the process exits and the
  // kernel closes the socket. For a runtime's exit hook (Python's atexit),
  // run before objects are torn down in no particular order: destroying a
  // gRPC channel hands its teardown to gRPC's own threads, and if that
  // overlaps the process's static destructors (exit() after the
  // interpreter is gone) it crashes inside gRPC. Thread-safe.
  static void KeepAliveUntilExit();

  // Not copyable or movable: leases point to it.
  ClientCore(const ClientCore&) = delete;
  ClientCore& operator=(const ClientCore&) = delete;

  uint64_t session_id() const { return session_id_; }
  // True in a child process that inherited this core across fork().
  bool inherited() const;
  // FAILED_PRECONDITION naming the owner pid if inherited(), else OK.
  absl::Status CheckOwner() const;
  uint64_t epoch() const { return epoch_; }
  const std::string& address() const { return address_; }
  // The client's default for its leases (ClientOptions::write_revocation).
  WriteRevocation write_revocation() const { return write_revocation_; }

  // The description of pool `pool_id`. INTERNAL for an id the daemon never
  // sent.
  absl::StatusOr<const v1::PoolInfo*> Pool(uint32_t pool_id) const;
  // The device pool `pool_id` lives on.
  absl::StatusOr<Device> PoolDevice(uint32_t pool_id) const;
  // The mapping of host pool `pool_id`. INTERNAL for an id the daemon never
  // sent, FAILED_PRECONDITION for a CUDA pool.
  absl::StatusOr<PoolMapping*> Mapping(uint32_t pool_id) const;
  // The mapping of CUDA pool `pool_id`, opened on first use (see
  // cuda_pool_mapping.h) and kept while this core lives. Errors as
  // CudaPoolMapping::Get; FAILED_PRECONDITION for a host pool.
  absl::StatusOr<CudaPoolMapping*> CudaMapping(uint32_t pool_id);
  // The name of the first pool on `device`. NOT_FOUND naming the device and
  // listing the daemon's pools when there is none.
  absl::StatusOr<std::string> PoolOn(const Device& device) const;

  // Releases `lease_id` once `fence` has completed, without blocking (see
  // gpu_releaser.h).
  void ReleaseAfter(cuda::Fence fence, uint64_t lease_id);
  // Blocks until the releases handed to ReleaseAfter so far were sent.
  void FlushGpuReleases();

  // Calls a unary RPC of the stub with `timeout` as deadline; maps the
  // outcome to an absl::Status carrying the error reason.
  template <typename Req, typename Resp>
  absl::Status Call(grpc::Status (v1::ObjectStore::Stub::*method)(
                        grpc::ClientContext*, const Req&, Resp*),
                    const Req& req, Resp* resp,
                    absl::Duration timeout = kRpcDeadline) {
    if (absl::Status s = CheckOwner(); !s.ok()) return s;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    return FromGrpc(ctx, (stub_.get()->*method)(&ctx, req, resp));
  }

  // Drops a lease at the daemon without waiting for it: one ReleaseLeases
  // message on the session stream (see the proto). UNAVAILABLE when the
  // stream is broken, in which case the daemon ended the session and dropped
  // the lease itself.
  absl::Status ReleaseLease(uint64_t lease_id);

  // Call() for a request that can observe this client's releases (Create,
  // Get, Delete, Stats). It is stamped with `releases_through`, the seq of
  // the last ReleaseLeases sent, so the daemon applies them before serving
  // it, and carries copies of those not yet confirmed applied, so the daemon
  // need not wait for the stream to deliver them (see ReleaseLeases in the
  // proto). Once it succeeded, every release through its stamp was applied.
  template <typename Req, typename Resp>
  absl::Status CallAfterReleases(grpc::Status (v1::ObjectStore::Stub::*method)(
                                     grpc::ClientContext*, const Req&, Resp*),
                                 Req req, Resp* resp,
                                 absl::Duration timeout = kRpcDeadline) {
    // Before StampReleases: in a child process (fork) the lock it takes
    // may have been held by a parent thread that is gone.
    if (absl::Status s = CheckOwner(); !s.ok()) return s;
    StampReleases(&req);
    absl::Status s = Call(method, req, resp, timeout);
    if (s.ok()) ConfirmReleases(req.releases_through());
    return s;
  }

 private:
  ClientCore() = default;
  absl::Status FromGrpc(const grpc::ClientContext& ctx,
                        const grpc::Status& status) const;
  // See CallAfterReleases.
  template <typename Request>
  void StampReleases(Request* req) {
    std::lock_guard<std::mutex> lock(releases_mu_);
    req->set_releases_through(releases_sent_);
    for (const auto& [seq, lease_id] : unconfirmed_releases_) {
      v1::ReleaseLeases* r = req->add_releases();
      r->set_seq(seq);
      r->add_lease_ids(lease_id);
    }
  }
  // Drops the copies of releases through `through`: the daemon applied them.
  void ConfirmReleases(uint64_t through);

  pid_t owner_pid_ = 0;  // The process that connected.
  // ForkGeneration() there: inherited() compares it, without a system call.
  uint64_t fork_generation_ = 0;
  std::string address_;
  WriteRevocation write_revocation_ = WriteRevocation::kWhenExposed;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ObjectStore::Stub> stub_;
  std::unique_ptr<grpc::ClientContext> session_ctx_;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionEvent>>
      session_;
  uint64_t session_id_ = 0;
  uint64_t epoch_ = 0;
  // Serialises writes on session_ (gRPC allows one outstanding write).
  std::mutex write_mu_;
  // What requests carry of the releases (StampReleases). Its own lock, so
  // that a request never waits behind a stream write.
  std::mutex releases_mu_;
  // Seq of the last ReleaseLeases sent. Written under write_mu_ and
  // releases_mu_ (so read under either).
  uint64_t releases_sent_ = 0;
  // (seq, lease id) of the releases sent and not yet confirmed applied,
  // oldest first, at most kMaxUnconfirmedReleases (older ones are left to
  // the stream). Guarded by releases_mu_.
  static constexpr size_t kMaxUnconfirmedReleases = 64;
  std::deque<std::pair<uint64_t, uint64_t>> unconfirmed_releases_;
  std::vector<v1::PoolInfo> pools_;  // By pool id.
  // By pool id; null for CUDA pools.
  std::vector<std::shared_ptr<PoolMapping>> mappings_;
  // By pool id; opened on first use, null until then and for host pools.
  mutable std::mutex cuda_mu_;
  std::vector<std::shared_ptr<CudaPoolMapping>> cuda_mappings_;
  // Made on the first CUDA release. Declared last: destroyed first, so it
  // sends its pending releases while the session is still open.
  std::mutex releaser_mu_;
  std::unique_ptr<GpuReleaser> releaser_;
};

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_CLIENT_CORE_H_
