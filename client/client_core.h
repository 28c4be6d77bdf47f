// The state one Client shares with every buffer, view and ref it made: the
// channel, the session stream and the pool mappings. Leases hold it by
// shared_ptr, so it outlives the Client handle while any view is alive.
//
// Connection loss: the channel runs over a socket this client connected
// itself (daemon_socket.h), so it never reconnects behind the client's back
// (to a daemon that restarted, say). When a call or a release finds the
// connection broken, the core connects again and resumes its session
// (OpenSession.resume_session_id; the daemon kept every lease, since this
// process lives and may map its views), presenting the leases it holds for
// the daemon to reconcile with its own (docs/shm_layout.md, "Resuming a
// session"; HoldLease). The daemon may be another instance of the same
// daemon by then (a take-over, a reload, a restart through systemd's
// descriptor store: same epoch, same pools, docs/operations.md): the core
// tries again with back-off for the resume timeout while the address has
// a socket, and takes the new descriptor secret it is given. The call
// that found it broken fails UNAVAILABLE (it may or may not have taken
// effect); later calls work. When the session
// cannot be resumed (the daemon restarted, or is gone) the core is ended:
// every call fails with reason SESSION_ENDED (UNAVAILABLE while no daemon
// answers, FAILED_PRECONDITION when another instance does), and views keep
// the bytes they had (this process's mapping holds them).
//
// Fork: the first Connect makes the process fork-safe (fork_guard.h), so a
// child's own new clients work and it closes its copies of the parent's
// connections. [P18] A process that forks while a core of it holds leases
// takes a fork hold for each such core first (pool_descriptors.h,
// TakeForkHold): the daemon keeps every object those leases name until the
// children exit or exec, so the views a child inherited keep their bytes
// whatever the parent does after the fork. A fork with no lease held asks
// the daemon nothing. (CUDA leases are held too; but a forked child cannot
// use the parent's CUDA context anyway.)
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
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/call_canceller.h"
#include "client/cuda_api.h"
#include "client/cuda_pool_mapping.h"
#include "client/gpu_releaser.h"
#include "client/pool_mapping.h"
#include "client/release_outbox.h"
#include "client/ring_mapping.h"
#include "client/stream_writer.h"
#include "shmtensor/device.h"
#include "shmtensor/v1/shmtensor.grpc.pb.h"
#include "shmtensor/view.h"

namespace shmtensor::internal {

class Lease;
class Stock;

// Deadline of calls that do not wait for anything.
inline constexpr absl::Duration kRpcDeadline = absl::Seconds(30);
// How long a stock class may go untaken before its buffers go back
// (stock.h).
inline constexpr absl::Duration kStockIdle = absl::Seconds(2);
// How long a message posted in the release ring may go unread before the
// writer thread looks at it: it writes those the daemon has not applied on
// the stream, where a broken connection shows (stream_writer.h).
inline constexpr absl::Duration kPostedPoll = absl::Milliseconds(250);
// How long a resumed session waits for its new release ring
// (ClientCore::RenewRingLocked), with the writer held: the daemon answers
// at once; a daemon that does not in time leaves the session on its stream
// until its next resume.
inline constexpr absl::Duration kRingRequestTimeout = absl::Seconds(2);
// For tests that must tell what the poll does from what a nudge does: the
// poll of the sessions this process opens from here on (kPostedPoll until
// set; kept within 1 ms to a day). Thread-safe; a session keeps the value
// it opened with.
void SetPostedPollForTesting(absl::Duration poll);

class ClientCore {
 public:
  // Connects, opens the session (read-only when `read_only`), receives the
  // descriptors of the host pools the session may use (pool_descriptors.h)
  // and maps each read-only. UNAVAILABLE naming the address when no daemon
  // answers in time. PERMISSION_DENIED when another user serves the socket
  // (see daemon_socket.h; `daemon_uid` is one more uid to accept), or when
  // the daemon lets this user use no pool.
  static absl::StatusOr<std::shared_ptr<ClientCore>> Connect(
      const std::string& address, const std::string& client_name,
      absl::Duration connect_timeout,
      WriteRevocation write_revocation = WriteRevocation::kWhenExposed,
      std::optional<uid_t> daemon_uid = std::nullopt, bool read_only = false,
      std::optional<absl::Duration> resume_timeout = std::nullopt,
      uint64_t stock_bytes = 0);
  // Ends the session (EndSession): the daemon drops whatever leases remain.
  ~ClientCore();

  // Keeps every client core of this process that is still alive from being
  // destroyed, ever: its session then ends when the process exits and the
  // kernel closes the socket. For a runtime's exit hook (Python's atexit),
  // run before objects are torn down in no particular order: destroying a
  // gRPC channel hands its teardown to gRPC's own threads, and if that
  // overlaps the process's static destructors (exit() after the
  // interpreter is gone) it crashes inside gRPC. Thread-safe.
  static void KeepAliveUntilExit();
  // Flushes every core of this process (FlushStream), 2 s in all at most.
  static void FlushAll();

  // Not copyable or movable: leases point to it.
  ClientCore(const ClientCore&) = delete;
  ClientCore& operator=(const ClientCore&) = delete;

  uint64_t session_id() const { return session_id_; }
  // Public id operators see for this session (shmtensorctl clients).
  uint64_t client_id() const { return client_id_; }
  // True in a child process that inherited this core across fork().
  bool inherited() const;
  // In a child forked while this client held views and the daemon refused
  // to pin them (a fork hold): every view the child inherited of it is
  // revoked (its range inaccessible, Lease::CheckHeld fails).
  bool views_revoked() const {
    return views_revoked_.load(std::memory_order_acquire);
  }
  // The leases this process holds, as it presents them when it resumes the
  // session (OpenSession.present_leases; docs/shm_layout.md, "Resuming a
  // session"). A lease id a call returned is entered by HoldLease before
  // anything uses it, with the generation of the connection that carried
  // the call (Call's `generation`): UNAVAILABLE, and not entered, when a
  // resume began since (the daemon dropped the lease, or will: the resume
  // did not present it). It leaves by ReleaseLease (which sends its
  // release), ForgetLease (the daemon dropped it at a unary Release,
  // `released`, or consumed it: an exclusive seal), or a resume that finds
  // the daemon does not hold it (the Lease is then marked lost:
  // Lease::MarkLost). Each way out tells the stock (Stock::Released).
  absl::Status HoldLease(uint64_t lease_id, uint64_t generation);
  void ForgetLease(uint64_t lease_id, bool released);
  // Counted by each Lease for its life (what a fork hold is for); LeaseMade
  // also binds the Lease to its held id (marking it lost if a resume
  // refused the id meanwhile).
  void LeaseMade(Lease* lease);
  // A lease's Lease is destroyed while its release waits (a CUDA fence):
  // nothing reads it through held_ any more.
  void LeaseUnmade(uint64_t lease_id);
  void LeaseGone() { live_leases_.fetch_sub(1, std::memory_order_relaxed); }
  // FAILED_PRECONDITION naming the owner pid if inherited(), else OK.
  absl::Status CheckOwner() const;
  uint64_t epoch() const { return epoch_; }
  const std::string& address() const { return address_; }
  // The client's default for its leases (ClientOptions::write_revocation).
  WriteRevocation write_revocation() const { return write_revocation_; }

  // The description of pool `pool_id`. INTERNAL for an id the daemon never
  // sent (a pool this session may not use).
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
  // The pool this session may use named `name`, or null.
  const v1::PoolInfo* PoolNamed(const std::string& name) const;
  // The name of the pool the daemon chose for what this session creates on
  // `device` (PoolInfo.default_for_device). NOT_FOUND naming the device and
  // listing the session's pools when there is none.
  absl::StatusOr<std::string> PoolOn(const Device& device) const;

  // Releases `lease_id` once `fence` has completed, without blocking (see
  // gpu_releaser.h).
  void ReleaseAfter(cuda::Fence fence, uint64_t lease_id);
  // Blocks until the releases handed to ReleaseAfter so far were sent.
  void FlushGpuReleases();

  // Calls a unary RPC of the stub with `timeout` as deadline; maps the
  // outcome to an absl::Status carrying the error reason.
  // A call that finds the connection broken fails UNAVAILABLE and resumes
  // the session for the next one (see the class comment).
  // `generation`, when given, receives the generation of the connection
  // that carried the call (for HoldLease).
  template <typename Req, typename Resp>
  absl::Status Call(grpc::Status (v1::ObjectStore::Stub::*method)(
                        grpc::ClientContext*, const Req&, Resp*),
                    const Req& req, Resp* resp,
                    absl::Duration timeout = kRpcDeadline,
                    uint64_t* generation = nullptr) {
    if (absl::Status s = CheckOwner(); !s.ok()) return s;
    std::shared_ptr<Connection> conn = CurrentConnection();
    if (conn == nullptr) return Ended();
    // A connection that broke while no call was on it (the daemon was
    // replaced meanwhile) is resumed before the call, which then goes to
    // the daemon serving now: only a call in flight at the break fails.
    if (Broken(*conn)) {
      if (absl::Status s = ResumeBroken(conn); !s.ok()) return s;
      conn = CurrentConnection();
      if (conn == nullptr) return Ended();
    }
    if (generation != nullptr) *generation = conn->generation;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    CallCanceller* canceller = ThreadCanceller();
    if (canceller != nullptr && !canceller->Attach(&ctx)) {
      return absl::CancelledError("the call was cancelled");
    }
    grpc::Status st = (conn->stub.get()->*method)(&ctx, req, resp);
    if (canceller != nullptr) canceller->Detach();
    if (st.error_code() == grpc::StatusCode::UNAVAILABLE) {
      return Resume(conn, st);
    }
    return FromGrpc(ctx, st);
  }

  // How a release travels: kPost, posted in the release ring when the
  // session has one (every host lease but a named object's create's,
  // Lease::MarkNamedCreate, and a shared-writable object's write leases);
  // kStream, written on the stream at once.
  enum class Route { kPost, kStream };
  // Drops a lease at the daemon without waiting for it: one ReleaseLeases
  // message (see the proto), published at once (`route`: posted in the
  // release ring, which wakes nobody, PublishLocked; or queued for the
  // session's writer thread, stream_writer.h): from here on every request
  // carries it or finds it ahead of it (CallAfterReleases), the daemon
  // pulls a posted one before it refuses or waits for want of what it
  // frees, and a resume accounts for it. A broken stream is resumed and the
  // release sent on the new one; FAILED_PRECONDITION when the session has
  // ended (the daemon then dropped the lease itself).
  absl::Status ReleaseLease(uint64_t lease_id, Route route = Route::kStream);
  // Seals without waiting for the daemon: one ReleaseLeases message
  // carrying `seals` (in order), queued as ReleaseLease's, ordered with the
  // releases (docs/shm_layout.md, "Stock and one-way seals"), and posted in
  // the session's release ring when it fits there, as releases are: the
  // daemon pulls it when it needs it, and the writer thread is woken only
  // when the ring is full or a call waits ("The release ring"). Until a
  // call confirms it applied, requests carry its copy and a resume
  // presents its seals (OpenSession.pending_seals), so a seal is never
  // lost to a broken connection. Errors as ReleaseLease.
  absl::Status SendSeals(std::vector<v1::OneWaySeal> seals);
  // Whether SendSeals posts in a release ring now.
  bool has_release_ring() const {
    return ring_on_.load(std::memory_order_relaxed);
  }
  // Waits (until `deadline`) for the writer thread to have written every
  // message queued so far: before a process ends by a path that runs no
  // destructor (an exit hook; the session's own end flushes). False on the
  // deadline.
  bool FlushStream(absl::Time deadline);

  // Lease shares: a Get of an object this process holds a read lease on
  // (a view, a SealedRef) shares that lease instead of asking the daemon.
  // FindShare returns the live read lease of exactly `ref` (nonce
  // included) with its object's info when Lease::SharesRef allows, else
  // null. AddShare enters a read lease of a sealed shared host object; the
  // Lease leaves on its destruction (DropShare). Thread-safe.
  std::shared_ptr<Lease> FindShare(const ObjectRef& ref, ObjectInfo* info);
  void AddShare(const std::shared_ptr<Lease>& lease, const ObjectInfo& info);
  void DropShare(const ObjectRef& ref, const Lease* lease);
  // Whether `lease` is held by its caller alone (use_count 1); if so, it is
  // no longer shared, so no Get can take it from here on. Under the
  // shares' lock, as FindShare.
  bool UnshareIfLast(const std::shared_ptr<Lease>& lease);

  // The session's stock (stock.h); null when ClientOptions::stock_bytes
  // is 0 or the session may write no host pool.
  Stock* stock() const { return stock_.get(); }
  // Whether lease `lease_id` is still held (a resume may have refused it).
  bool Holds(uint64_t lease_id);

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
                                 absl::Duration timeout = kRpcDeadline,
                                 uint64_t* generation = nullptr) {
    // Before Stamp: in a child process (fork) the lock it takes
    // may have been held by a parent thread that is gone.
    if (absl::Status s = CheckOwner(); !s.ok()) return s;
    outbox_.Stamp(&req);
    absl::Status s = Call(method, req, resp, timeout, generation);
    if (s.ok()) outbox_.Confirm(req.releases_through());
    return s;
  }

 private:
  // One connection to the daemon and the session stream on it. Replaced
  // whole when the session resumes; calls hold the one they use.
  struct Connection {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::ObjectStore::Stub> stub;
    std::unique_ptr<grpc::ClientContext> session_ctx;
    std::unique_ptr<
        grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionEvent>>
        session;
    // A second descriptor of the connection's socket (close-on-exec; a
    // forked child's is replaced like gRPC's, fork_guard.h): polled for a
    // hang-up, how a client learns that its daemon went while it made no
    // call. No thread waits in gRPC for it: a fork while a thread is inside
    // a gRPC call is unsafe (fork_guard.h).
    int probe = -1;
    // held_generation_ when it was made: a lease a call on it returned is
    // the session's only if no resume began since (HoldLease).
    uint64_t generation = 0;
    // Ends the stream and lets go of the channel.
    ~Connection();
  };

  ClientCore() = default;
  // One attempt of Connect, until `deadline`.
  static absl::StatusOr<std::shared_ptr<ClientCore>> ConnectOnce(
      const std::string& address, const std::string& client_name,
      absl::Time deadline, WriteRevocation write_revocation,
      std::optional<uid_t> daemon_uid, bool read_only,
      std::optional<absl::Duration> resume_timeout, uint64_t stock_bytes);
  // Connects a socket (daemon_socket.h), makes the channel and stub over it
  // and opens the session stream: a new session (resume_id 0) or a resumed
  // one. Fills session_id_ etc. for a new session; returns the daemon's
  // SessionOpened.
  // A resume presents `account` (OpenSession.present_leases), when given.
  absl::StatusOr<std::shared_ptr<Connection>> OpenConnection(
      uint64_t resume_id, absl::Duration timeout, v1::SessionOpened* opened,
      const v1::OpenSession* account = nullptr);
  // The connection in use; null once the session has ended.
  std::shared_ptr<Connection> CurrentConnection() const;
  // Whether `conn`'s socket was hung up by the daemon (one poll(2) with no
  // wait).
  static bool Broken(const Connection& conn);
  // Resumes the session for a call not yet sent (write_mu_ is taken).
  absl::Status ResumeBroken(const std::shared_ptr<Connection>& broken);
  // Replaces `broken` (if it is still the current connection) by a new one
  // with the session resumed, and returns UNAVAILABLE saying so (or
  // FAILED_PRECONDITION when the session could not be resumed, after which
  // the core is ended). `cause` is what the broken call got.
  absl::Status Resume(const std::shared_ptr<Connection>& broken,
                      const grpc::Status& cause);
  // Resume with write_mu_ held: presents the leases held; when the daemon
  // reconciles them (`*reconciled`, when given, says so), drops those it
  // refused, else sends again, on the new stream, every release the daemon
  // had not applied. OK when resumed.
  absl::Status ResumeLocked(const std::shared_ptr<Connection>& broken,
                            bool* reconciled = nullptr);
  // The leases a reconciling resume refused: marked lost and no longer held.
  void DropRefused(const v1::SessionOpened& opened);
  // After a resume (write_mu_ held): a new release ring from the daemon,
  // mapped and installed, when the session writes host pools and this
  // daemon did not refuse it one before. Without one (a refusal, its cap
  // kMaxRingsPerSession, an older daemon) its messages go on the stream,
  // as before. The request is a descriptor-socket exchange, bounded by
  // kRingRequestTimeout (the daemon answers at once).
  void RenewRingLocked();
  // Makes `ring` the one posted in and sets ring_on_ (write_mu_ held, or
  // in Open); the one before is unmapped.
  void InstallRing(std::unique_ptr<RingMapping> ring);
  // The `applied` of the ring (0 without one).
  uint64_t RingApplied() const;
  // Publishes `message` (the next ReleaseLeases: releases, seals): posted
  // in the release ring while the session has one and it fits there (the
  // daemon pulls it when it serves this session or needs what it frees:
  // docs/shm_layout.md, "The release ring"), else queued for the writer
  // thread as EnqueueLocked. True when the caller must kick the writer
  // (AfterEnqueue, with no lock held): it was not posted, or the daemon
  // asked for a nudge. held_mu_ may be held (lock order). Errors as
  // EnqueueLocked.
  absl::StatusOr<bool> PublishLocked(v1::ReleaseLeases message);
  // Publishes `message` in outbox_ for the writer thread to write; held_mu_
  // may be held by the caller (lock order). FAILED_PRECONDITION (or
  // UNAVAILABLE) when the session has ended.
  absl::Status EnqueueLocked(v1::ReleaseLeases message);
  // Kicks the writer for what EnqueueLocked queued, and holds the caller
  // back while more than kMaxUnwritten messages wait for it (the caller
  // holds no lock of this core).
  void AfterEnqueue();
  // On the writer thread: writes the oldest messages queued and not yet
  // written (nor settled by a resume, nor confirmed applied), up to
  // ReleaseOutbox::kMaxWrittenTogether in one send, resuming the session if the
  // stream broke (the resume writes again, or settles, every message queued so
  // far). False when none is left.
  bool WriteOne();
  // On the writer thread, every kPostedPoll while it sleeps: confirms what
  // the ring says was applied; true when posted messages are left to write
  // (the writer then drains); else, with messages written and not known
  // applied, resumes the session if its connection broke.
  bool PollUnconfirmed();
  // The error of every call once the session ended (reason SESSION_ENDED):
  // UNAVAILABLE when the daemon is gone, FAILED_PRECONDITION otherwise.
  absl::Status Ended() const;
  absl::Status FromGrpc(const grpc::ClientContext& ctx,
                        const grpc::Status& status) const;
  // fork() handlers (registered once, by the first Connect): see the class
  // comment. Prepare takes the holds, Parent closes its ends of them.
  static void PrepareFork();
  static void AfterForkInParent();
  static void AfterForkInChild();

  pid_t owner_pid_ = 0;  // The process that connected.
  // SessionOpened.descriptor_secret: proves the session on the descriptor
  // socket (descriptors at connect, fork holds).
  std::string descriptor_secret_;
  bool has_host_pools_ = false;
  std::atomic<int64_t> live_leases_{0};
  // See views_revoked(); set in a forked child's handler only.
  std::atomic<bool> views_revoked_{false};
  // In the prepare handler of a fork whose hold was refused: names the
  // range of every host view this client holds to PoolMapping::RevokeInChild.
  // Returns how many.
  size_t RevokeViewsInChild();
  // ForkGeneration() there: inherited() compares it, without a system call.
  uint64_t fork_generation_ = 0;
  std::string address_;
  std::string socket_path_;
  std::string client_name_;
  std::optional<uid_t> daemon_uid_;
  bool read_only_ = false;
  absl::Duration resume_timeout_ = absl::Seconds(10);
  WriteRevocation write_revocation_ = WriteRevocation::kWhenExposed;
  // The connection in use (null once ended). Swapped under conn_mu_ by
  // ResumeLocked, which holds write_mu_ too.
  mutable std::mutex conn_mu_;
  std::shared_ptr<Connection> conn_;
  // Why and how the session ended (UNAVAILABLE when no daemon answered the
  // resume, FAILED_PRECONDITION when one refused it). Guarded by conn_mu_;
  // set when conn_ goes null.
  std::string ended_why_;
  absl::StatusCode ended_code_ = absl::StatusCode::kFailedPrecondition;
  uint64_t session_id_ = 0;
  uint64_t client_id_ = 0;
  uint64_t epoch_ = 0;
  // Serialises writes on the session stream (gRPC allows one outstanding
  // write: the writer thread's, and a resume's) and resumes.
  std::mutex write_mu_;
  // The session's ReleaseLeases messages, from queued to confirmed
  // applied (release_outbox.h). Its lock is taken after write_mu_ and
  // held_mu_.
  ReleaseOutbox outbox_;
  // How many queued messages may wait for the writer before the thread
  // that queues waits too (bounds the queue when the daemon reads slowly).
  static constexpr uint64_t kMaxUnwritten = 1024;
  // The leases held (HoldLease), each with its Lease once made (null
  // before), and the generation: bumped by each resume as it takes its
  // account of them. Lock order: write_mu_, then held_mu_, then
  // outbox_'s.
  std::mutex held_mu_;
  // A lease held, and where its view is (for RevokeViewsInChild, which must
  // not read a Lease that may be gone).
  struct HeldLease {
    Lease* lease = nullptr;  // Null until made, and once destroyed.
    bool releasing = false;  // Destroyed; its release waits (a CUDA fence).
    bool host = false;       // Its view is in a host pool's mapping.
    uint32_t pool_id = 0;
    uint64_t offset = 0;
    uint64_t capacity = 0;
  };
  absl::flat_hash_map<uint64_t, HeldLease> held_;
  uint64_t held_generation_ = 0;
  // By pool id; a pool the session may not use is a default PoolInfo
  // (access POOL_ACCESS_UNSPECIFIED).
  std::vector<v1::PoolInfo> pools_;
  // By pool id; null for CUDA pools.
  std::vector<std::shared_ptr<PoolMapping>> mappings_;
  // By pool id; opened on first use, null until then and for host pools.
  mutable std::mutex cuda_mu_;
  std::vector<std::shared_ptr<CudaPoolMapping>> cuda_mappings_;
  // Lease shares (FindShare), by slot and generation.
  struct Share {
    std::weak_ptr<Lease> lease;
    const Lease* raw = nullptr;
    ObjectInfo info;
  };
  std::mutex shares_mu_;
  absl::flat_hash_map<uint64_t, Share> shares_;
  // The session's release ring (ring_mapping.h), null without one; only
  // read or replaced under ring_mu_, a leaf lock (nothing is taken under
  // it). Releases and seals are posted there while ring_on_, under
  // outbox_'s lock. A resume clears ring_on_ (the daemon drops a resumed
  // session's ring), then asks for a new ring and installs it
  // (InstallRing: the old one unmapped) before setting ring_on_ again.
  // Never unmapped in a forked child (whatever the child maps later may lie
  // where it was).
  mutable std::mutex ring_mu_;
  std::unique_ptr<RingMapping> ring_;
  std::atomic<bool> ring_on_{false};
  // Whether the session may write a host pool (it gets a release ring).
  bool writes_host_ = false;
  // The descriptor secret of the daemon that last refused this session a
  // ring (or whose ring this client could not map): not asked again until
  // a successor gives the session a new secret. Under write_mu_.
  std::string ring_refused_by_;
  // Writes the session stream's messages (WriteOne); stopped, after it
  // wrote them all, before the session ends.
  std::unique_ptr<StreamWriter> writer_;
  // Stopped first thing in the destructor (its thread makes calls).
  std::unique_ptr<Stock> stock_;
  // Made on the first CUDA release. Declared last: destroyed first, so it
  // sends its pending releases while the session is still open.
  std::mutex releaser_mu_;
  std::unique_ptr<GpuReleaser> releaser_;
};

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_CLIENT_CORE_H_
