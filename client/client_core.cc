#include "client/client_core.h"

#include <fcntl.h>
#include <grpcpp/create_channel_posix.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/daemon_socket.h"
#include "client/fork_guard.h"
#include "client/lease.h"
#include "client/lease_registry.h"
#include "client/lease_share.h"
#include "client/pool_descriptors.h"
#include "client/stock.h"
#include "shmtensor/defaults.h"
#include "shmtensor/errors.h"

namespace shmtensor::internal {

namespace {

// Every core made in this process (weakly), for KeepAliveUntilExit. Never
// destroyed (static destruction order would race with late users).
std::mutex& RegistryMu() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::vector<std::weak_ptr<ClientCore>>& Registry() {
  static auto* cores = new std::vector<std::weak_ptr<ClientCore>>;
  return *cores;
}

// The fork holds PrepareFork took, for AfterForkInParent to close (the
// child keeps its copies: they are how the daemon sees it go). Touched only
// under RegistryMu(), which the fork handlers hold across fork().
constexpr int kMaxForkHolds = 64;
int fork_hold_fds[kMaxForkHolds];
int fork_hold_count = 0;
// The cores PrepareFork looked at, kept alive until after the fork (a core
// whose last reference went in the prepare handler would be destroyed
// there, making calls).
std::vector<std::shared_ptr<ClientCore>>* forking_cores = nullptr;
// The cores whose fork hold the daemon refused in this fork: the child
// revokes their views (ClientCore::views_revoked). Made in PrepareFork,
// read in AfterForkInChild, dropped by both.
std::vector<ClientCore*>* refused_cores = nullptr;

void Register(const std::shared_ptr<ClientCore>& core) {
  std::lock_guard<std::mutex> lock(RegistryMu());
  std::vector<std::weak_ptr<ClientCore>>& cores = Registry();
  // Drop the entries of cores already gone, so the list stays short.
  cores.erase(std::remove_if(cores.begin(), cores.end(),
                             [](const auto& w) { return w.expired(); }),
              cores.end());
  cores.push_back(core);
}

// SetPostedPollForTesting's value, in nanoseconds.
std::atomic<int64_t> posted_poll_ns{absl::ToInt64Nanoseconds(kPostedPoll)};

}  // namespace

void SetPostedPollForTesting(absl::Duration poll) {
  // At most a day: the writer waits on a steady clock, whose deadline an
  // infinite (or near-infinite) wait would overflow.
  poll = std::clamp(poll, absl::Milliseconds(1), absl::Hours(24));
  posted_poll_ns.store(absl::ToInt64Nanoseconds(poll),
                       std::memory_order_relaxed);
}

void ClientCore::PrepareFork() {
  RegistryMu().lock();
  fork_hold_count = 0;
  forking_cores = new std::vector<std::shared_ptr<ClientCore>>();
  for (const std::weak_ptr<ClientCore>& w : Registry()) {
    std::shared_ptr<ClientCore> core = w.lock();
    if (core == nullptr) continue;
    forking_cores->push_back(core);
    if (!core->inherited() && core->stock_ != nullptr) {
      core->stock_->PauseForFork();
    }
    if (!core->inherited()) core->writer_->PauseForFork();
    if (core->inherited() || !core->has_host_pools_ ||
        core->live_leases_.load(std::memory_order_relaxed) <= 0) {
      continue;
    }
    absl::StatusOr<int> hold =
        fork_hold_count == kMaxForkHolds
            ? absl::ResourceExhaustedError(absl::StrCat(
                  "this process forks with ", kMaxForkHolds,
                  " clients that hold views; a fork holds the views of at "
                  "most that many"))
            : TakeForkHold(core->socket_path_, core->session_id_,
                           core->descriptor_secret_,
                           absl::Now() + absl::Seconds(5), core->daemon_uid_);
    if (hold.ok()) {
      fork_hold_fds[fork_hold_count++] = *hold;
      continue;
    }
    // [P5] Refused (or no daemon answered: a successor could reuse the
    // memory all the same): the fork goes on, as a handler cannot stop it,
    // and fails closed. Every view of this client the child inherits is
    // made inaccessible there, and its new exports raise.
    size_t revoked = core->RevokeViewsInChild();
    if (refused_cores == nullptr) refused_cores = new std::vector<ClientCore*>;
    refused_cores->push_back(core.get());
    std::fprintf(stderr,
                 "shmtensor: pid %d forks while client %llu holds views, and "
                 "the daemon could not pin them for the child (%s): the %zu "
                 "views the child inherited are made inaccessible there (a "
                 "read faults, a new array or tensor of them raises "
                 "StaleReferenceError); the parent's are unchanged\n",
                 static_cast<int>(getpid()),
                 static_cast<unsigned long long>(core->client_id_),
                 hold.status().ToString().c_str(), revoked);
  }
  // Last: no other thread may hold it across the fork (a child's first
  // lease would wait for it for ever), and the holds above took time.
  LeaseRegistry::LockForFork();
}

size_t ClientCore::RevokeViewsInChild() {
  size_t n = 0;
  std::lock_guard<std::mutex> lock(held_mu_);
  for (const auto& [id, h] : held_) {
    // Not made yet (no view of it exists), or destroyed: no view to revoke.
    if (h.lease == nullptr || !h.host) continue;
    absl::StatusOr<PoolMapping*> m = Mapping(h.pool_id);
    if (!m.ok()) continue;
    (*m)->RevokeInChild(h.offset, h.capacity);
    ++n;
  }
  return n;
}

void ClientCore::AfterForkInParent() {
  delete refused_cores;
  refused_cores = nullptr;
  LeaseRegistry::UnlockAfterFork();
  for (int i = 0; i < fork_hold_count; ++i) close(fork_hold_fds[i]);
  fork_hold_count = 0;
  std::vector<std::shared_ptr<ClientCore>>* cores = forking_cores;
  forking_cores = nullptr;
  for (const std::shared_ptr<ClientCore>& core : *cores) {
    if (!core->inherited() && core->stock_ != nullptr) {
      core->stock_->ResumeAfterFork();
    }
    if (!core->inherited()) core->writer_->ResumeAfterFork();
  }
  RegistryMu().unlock();
  delete cores;  // May destroy a core another thread let go meanwhile.
}

void ClientCore::AfterForkInChild() {
  // The holds' connections stay open here, close-on-exec: the daemon ends
  // each hold when the last process holding it (this child, and children
  // it forks in turn) exits or execs.
  fork_hold_count = 0;
  if (refused_cores != nullptr) {
    for (ClientCore* core : *refused_cores) {
      core->views_revoked_.store(true, std::memory_order_release);
    }
    delete refused_cores;
    refused_cores = nullptr;
  }
  LeaseRegistry::UnlockAfterFork();
  // The parent's cores: left alive here (their destruction in the child
  // is harmless, but need not happen inside a fork handler).
  forking_cores = nullptr;
  RegistryMu().unlock();
}

void ClientCore::KeepAliveUntilExit() {
  std::lock_guard<std::mutex> lock(RegistryMu());
  static auto* kept = new std::vector<std::shared_ptr<ClientCore>>;
  for (const std::weak_ptr<ClientCore>& w : Registry()) {
    if (std::shared_ptr<ClientCore> core = w.lock()) {
      // Releases waiting for the GPU go out now, while the session is open
      // (after exit the daemon would drop those leases at once).
      if (!core->inherited()) core->FlushGpuReleases();
      // No call of its refill thread may overlap the exit.
      if (!core->inherited() && core->stock_ != nullptr) core->stock_->Stop();
      // What its writer thread has not written yet goes out (bounded).
      if (!core->inherited()) {
        core->FlushStream(absl::Now() + absl::Seconds(2));
      }
      kept->push_back(core);
    }
  }
}

void ClientCore::FlushAll() {
  std::vector<std::shared_ptr<ClientCore>> cores;
  {
    std::lock_guard<std::mutex> lock(RegistryMu());
    for (const std::weak_ptr<ClientCore>& w : Registry()) {
      std::shared_ptr<ClientCore> core = w.lock();
      if (core != nullptr && !core->inherited()) cores.push_back(core);
    }
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  for (const std::shared_ptr<ClientCore>& core : cores) {
    core->FlushStream(deadline);
  }
}

ClientCore::Connection::~Connection() {
  if (probe >= 0) close(probe);
  if (session != nullptr) {
    session->WritesDone();
    session_ctx->TryCancel();
    session->Finish();
  }
}

absl::StatusOr<std::shared_ptr<ClientCore::Connection>>
ClientCore::OpenConnection(uint64_t resume_id, absl::Duration timeout,
                           v1::SessionOpened* opened,
                           const v1::OpenSession* account) {
  // A resume connects briefly, so its caller can look whether the address
  // still has a socket between tries.
  const absl::Duration connect_for =
      resume_id != 0 ? std::min(timeout, absl::Milliseconds(250)) : timeout;
  absl::StatusOr<int> fd = ConnectDaemonSocket(
      socket_path_, absl::Now() + connect_for, daemon_uid_, SOCK_STREAM);
  if (!fd.ok()) return fd.status();
  grpc::ChannelArguments args;
  // No keepalive: the daemon is on this host, its death closes the socket at
  // once, and a late ping answer must never cost the session.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, INT_MAX);
  auto conn = std::make_shared<Connection>();
  {
    std::lock_guard<std::mutex> lock(held_mu_);
    conn->generation = held_generation_;
  }
  conn->probe = fcntl(*fd, F_DUPFD_CLOEXEC, 3);
  // The channel owns the socket from here on (closed with the channel).
  conn->channel =
      grpc::CreateCustomInsecureChannelFromFd("shmtensord", *fd, args);
  conn->stub = v1::ObjectStore::NewStub(conn->channel);
  conn->session_ctx = std::make_unique<grpc::ClientContext>();
  conn->session = conn->stub->Session(conn->session_ctx.get());
  v1::SessionRequest open;
  if (account != nullptr) *open.mutable_open() = *account;
  open.mutable_open()->set_client_name(client_name_);
  open.mutable_open()->set_resume_session_id(resume_id);
  open.mutable_open()->set_read_only(read_only_);
  v1::SessionEvent event;
  // A socket whose daemon never answers (its listening socket kept by
  // systemd while no daemon runs, a frozen predecessor): the open ends with
  // `timeout` too.
  std::mutex watch_mu;
  std::condition_variable watch_cv;
  bool answered = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(watch_mu);
    if (!watch_cv.wait_for(lock, absl::ToChronoMilliseconds(timeout),
                           [&] { return answered; })) {
      conn->session_ctx->TryCancel();
    }
  });
  const bool opened_ok = conn->session->Write(open) &&
                         conn->session->Read(&event) && event.has_opened();
  {
    std::lock_guard<std::mutex> lock(watch_mu);
    answered = true;
  }
  watch_cv.notify_one();
  watchdog.join();
  if (!opened_ok) {
    grpc::Status st = conn->session->Finish();
    conn->session.reset();
    const absl::StatusCode code =
        st.error_code() == grpc::StatusCode::OK
            ? absl::StatusCode::kUnavailable
            : static_cast<absl::StatusCode>(st.error_code());
    absl::Status refused(
        code, absl::StrCat("shmtensord at ", address_, " refused the session",
                           resume_id != 0 ? " resume" : "", ": ",
                           st.error_message()));
    const auto& trailers = conn->session_ctx->GetServerTrailingMetadata();
    if (auto it = trailers.find(std::string(kErrorReasonMetadata));
        it != trailers.end()) {
      refused = WithReason(
          refused, absl::string_view(it->second.data(), it->second.size()));
    }
    return refused;
  }
  *opened = event.opened();
  return conn;
}

absl::StatusOr<std::shared_ptr<ClientCore>> ClientCore::Connect(
    const std::string& address, const std::string& client_name,
    absl::Duration connect_timeout, WriteRevocation write_revocation,
    std::optional<uid_t> daemon_uid, bool read_only,
    std::optional<absl::Duration> resume_timeout, uint64_t stock_bytes) {
  const absl::Time deadline = absl::Now() + connect_timeout;
  while (true) {
    absl::StatusOr<std::shared_ptr<ClientCore>> core =
        ConnectOnce(address, client_name, deadline, write_revocation,
                    daemon_uid, read_only, resume_timeout, stock_bytes);
    // A daemon that went after the session opened, before this process
    // had its pools (it was being replaced): again, on its successor (the
    // failed attempt's core ended its session, resumed there).
    if (core.ok() || !absl::IsUnavailable(core.status()) ||
        absl::Now() + absl::Milliseconds(20) >= deadline) {
      return core;
    }
    struct stat st;
    absl::StatusOr<std::string> path = SocketPathOf(address);
    if (!path.ok() || lstat(path->c_str(), &st) != 0) return core;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::StatusOr<std::shared_ptr<ClientCore>> ClientCore::ConnectOnce(
    const std::string& address, const std::string& client_name,
    absl::Time deadline, WriteRevocation write_revocation,
    std::optional<uid_t> daemon_uid, bool read_only,
    std::optional<absl::Duration> resume_timeout, uint64_t stock_bytes) {
  absl::StatusOr<std::string> path = SocketPathOf(address);
  if (!path.ok()) return path.status();
  static std::once_flag fork_handlers;
  // Registered before EnableForkSupport's, so its prepare runs after
  // gRPC's (prepare handlers run in reverse order): the hold's snapshot is
  // taken once gRPC has stopped completing calls, so a lease a call gets
  // is in it. It needs no gRPC: the descriptor socket is a plain one.
  std::call_once(fork_handlers, [] {
    pthread_atfork(PrepareFork, AfterForkInParent, AfterForkInChild);
  });
  EnableForkSupport();
  RegisterDaemonAddress(address);
  std::shared_ptr<ClientCore> core(new ClientCore());
  core->owner_pid_ = getpid();
  core->fork_generation_ = ForkGeneration();
  core->address_ = address;
  core->socket_path_ = *std::move(path);
  core->client_name_ = client_name;
  core->daemon_uid_ = daemon_uid;
  core->read_only_ = read_only;
  core->write_revocation_ = write_revocation;
  if (resume_timeout.has_value()) {
    core->resume_timeout_ = *resume_timeout;
  } else if (const char* env = getenv("SHMTENSOR_RESUME_TIMEOUT");
             env != nullptr && *env != '\0') {
    double seconds = 0;
    if (!absl::SimpleAtod(env, &seconds) || seconds < 0 || seconds > 86400) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SHMTENSOR_RESUME_TIMEOUT '", absl::string_view(env).substr(0, 32),
          "' is not a number of seconds from 0 to 86400"));
    }
    core->resume_timeout_ = absl::Seconds(seconds);
  }
  v1::SessionOpened opened;
  absl::StatusOr<std::shared_ptr<Connection>> conn =
      core->OpenConnection(0, deadline - absl::Now(), &opened);
  // A connection the daemon dropped before the session opened (it was
  // being replaced: its successor serves the same socket) is tried again,
  // with back-off, within connect_timeout.
  for (absl::Duration backoff = absl::Milliseconds(5);
       !conn.ok() && absl::IsUnavailable(conn.status()) &&
       absl::Now() + backoff < deadline;
       backoff = std::min(backoff * 2, absl::Milliseconds(200))) {
    struct stat st;
    if (lstat(core->socket_path_.c_str(), &st) != 0) break;  // No daemon.
    absl::SleepFor(backoff);
    conn = core->OpenConnection(0, deadline - absl::Now(), &opened);
  }
  if (!conn.ok()) return conn.status();
  core->conn_ = *std::move(conn);
  core->session_id_ = opened.session_id();
  core->descriptor_secret_ = opened.descriptor_secret();
  core->client_id_ = opened.client_id();
  core->epoch_ = opened.daemon_epoch();
  uint32_t pools = 0;
  bool any_host = false;
  for (const v1::PoolInfo& info : opened.pools()) {
    if (info.pool_id() >= kMaxPools) {
      return absl::InternalError(absl::StrFormat(
          "shmtensord at %s sent pool id %d", address, info.pool_id()));
    }
    pools = std::max(pools, info.pool_id() + 1);
    any_host = any_host || info.kind() == v1::MEMORY_KIND_HOST;
  }
  core->has_host_pools_ = any_host;
  core->pools_.resize(pools);
  core->mappings_.resize(pools);  // CUDA pools: mapped on first use.
  core->cuda_mappings_.resize(pools);
  for (const v1::PoolInfo& info : opened.pools()) {
    core->pools_[info.pool_id()] = info;
  }
  if (any_host) {
    // The session is open: give the hand-over time of its own, whatever
    // opening it took of connect_timeout.
    absl::StatusOr<SessionDescriptors> fds = FetchPoolDescriptors(
        core->socket_path_, core->session_id_, opened.descriptor_secret(),
        std::max(deadline, absl::Now() + absl::Seconds(5)), daemon_uid);
    if (!fds.ok()) return fds.status();
    // Every descriptor is owned by a mapping (or closed) from here on.
    if (fds->release_ring >= 0) {
      // A ring this client cannot use (another layout) leaves the seals on
      // the stream.
      absl::StatusOr<std::unique_ptr<RingMapping>> ring =
          RingMapping::Map(fds->release_ring);
      if (ring.ok()) core->InstallRing(*std::move(ring));
    }
    absl::Status failed;
    for (const PoolDescriptor& d : fds->pools) {
      if (d.pool_id >= pools ||
          core->pools_[d.pool_id].kind() != v1::MEMORY_KIND_HOST ||
          core->mappings_[d.pool_id] != nullptr) {
        close(d.fd);
        continue;
      }
      absl::StatusOr<std::shared_ptr<PoolMapping>> m =
          PoolMapping::Get(core->pools_[d.pool_id], d.fd);
      if (!m.ok()) {
        failed.Update(m.status());
        continue;
      }
      core->mappings_[d.pool_id] = *std::move(m);
    }
    if (!failed.ok()) return failed;
    for (uint32_t id = 0; id < pools; ++id) {
      if (core->pools_[id].kind() == v1::MEMORY_KIND_HOST &&
          core->pools_[id].access() != v1::POOL_ACCESS_UNSPECIFIED &&
          core->mappings_[id] == nullptr) {
        return absl::InternalError(
            absl::StrFormat("shmtensord at %s sent no descriptor of pool '%s'",
                            address, core->pools_[id].name()));
      }
    }
  }
  bool writes_host = false;
  for (const v1::PoolInfo& info : core->pools_) {
    writes_host = writes_host || (info.kind() == v1::MEMORY_KIND_HOST &&
                                  info.access() == v1::POOL_ACCESS_READ_WRITE);
  }
  core->writes_host_ = writes_host;
  // Posts in the release ring kick no thread, and a daemon may die before
  // it reads what was written: the writer looks every kPostedPoll
  // (stream_writer.h).
  core->writer_ = std::make_unique<StreamWriter>(
      [c = core.get()] { return c->WriteOne(); },
      [c = core.get()] { return c->PollUnconfirmed(); },
      absl::Nanoseconds(posted_poll_ns.load(std::memory_order_relaxed)));
  if (stock_bytes > 0 && writes_host) {
    core->stock_ = std::make_unique<Stock>(*core, stock_bytes, kStockIdle);
  }
  Register(core);
  return core;
}

ClientCore::~ClientCore() {
  if (inherited()) {
    // The parent's gRPC objects: never touch them in the child.
    new std::shared_ptr<Connection>(std::move(conn_));
    releaser_.release();  // Its thread is the parent's.
    stock_.release();     // So is this one's,
    writer_.release();    // and this one's.
    ring_.release();      // Not in this process (MADV_DONTFORK).
    return;
  }
  // Its thread makes calls: stopped before anything it uses goes. Its
  // buffers go with the session.
  if (stock_ != nullptr) stock_->Stop();
  // Pending GPU releases go out while the session is open (else the
  // daemon would drop those leases at once, with the GPU maybe still on
  // them).
  releaser_.reset();
  // Every release and seal queued goes out before the session ends (an
  // object sealed one way and not yet written would go with it).
  if (writer_ != nullptr) writer_->Stop();
  if (CurrentConnection() == nullptr) return;
  // Ends the session at once; without it the daemon would keep the leases
  // until this process exits (a broken stream is no proof of a clean end).
  // A broken connection is resumed once to say so.
  v1::EndSessionRequest req;
  req.set_session_id(session_id_);
  v1::EndSessionResponse resp;
  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::Status s =
        Call(&v1::ObjectStore::Stub::EndSession, req, &resp, absl::Seconds(5));
    if (!absl::IsUnavailable(s)) break;
  }
  std::shared_ptr<Connection> last;
  {
    std::lock_guard<std::mutex> lock(conn_mu_);
    last = std::move(conn_);
  }
}

bool ClientCore::Broken(const Connection& conn) {
  if (conn.probe < 0) return false;
  pollfd p{conn.probe, POLLRDHUP, 0};
  return poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

absl::Status ClientCore::ResumeBroken(
    const std::shared_ptr<Connection>& broken) {
  std::lock_guard<std::mutex> lock(write_mu_);
  return ResumeLocked(broken);
}

std::shared_ptr<ClientCore::Connection> ClientCore::CurrentConnection() const {
  std::lock_guard<std::mutex> lock(conn_mu_);
  return conn_;
}

absl::Status ClientCore::Ended() const {
  std::lock_guard<std::mutex> lock(conn_mu_);
  return WithReason(
      absl::Status(ended_code_,
                   absl::StrCat("the session with shmtensord at ", address_,
                                " has ended (", ended_why_,
                                "); connect a new client (views of this one "
                                "keep their bytes)")),
      kReasonSessionEnded);
}

absl::Status ClientCore::Resume(const std::shared_ptr<Connection>& broken,
                                const grpc::Status& cause) {
  absl::Status resumed;
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    resumed = ResumeLocked(broken);
  }
  if (!resumed.ok()) return resumed;
  return absl::UnavailableError(absl::StrCat(
      "shmtensord at ", address_, " unavailable: ", cause.error_message(),
      " (the connection broke; the session was resumed on a new one, so "
      "this call may or may not have taken effect)"));
}

absl::Status ClientCore::ResumeLocked(const std::shared_ptr<Connection>& broken,
                                      bool* reconciled) {
  if (reconciled != nullptr) *reconciled = false;
  // Another thread resumed it already, or its failed resume ended it.
  if (std::shared_ptr<Connection> now = CurrentConnection(); now != broken) {
    return now != nullptr ? absl::OkStatus() : Ended();
  }
  // The account of the leases held, taken before the new connection: from
  // here on a lease a call on the old one returns is not the session's
  // (HoldLease), and every release sent so far is in releases_through
  // (write_mu_ is held, so none is being sent).
  // Both under held_mu_ (and the outbox's lock): a release leaves held_ and is
  // queued under both (ReleaseLease), so the account either names its
  // lease or counts its message in releases_through, never neither.
  // The daemon drops the ring of a session it resumes (a successor never
  // had it): seals go on the stream from here on. Cleared before the
  // account takes the outbox's lock (see SendSeals).
  ring_on_.store(false, std::memory_order_release);
  v1::OpenSession account;
  account.set_present_leases(true);
  {
    std::lock_guard<std::mutex> lock(held_mu_);
    ++held_generation_;
    account.mutable_held_lease_ids()->Reserve(held_.size());
    for (const auto& [id, h] : held_) account.add_held_lease_ids(id);
    outbox_.Account(&account);
  }
  v1::SessionOpened opened;
  // The daemon may be being replaced: try again with back-off until the
  // resume timeout, or until the address has had no socket for a while (a
  // daemon that stopped cleanly removed it).
  const absl::Time deadline = absl::Now() + resume_timeout_;
  absl::Duration backoff = absl::Milliseconds(5);
  absl::Time missing_since = absl::InfiniteFuture();
  absl::StatusOr<std::shared_ptr<Connection>> conn =
      absl::UnavailableError("not tried");
  while (true) {
    const absl::Duration left =
        std::max(deadline - absl::Now(), absl::Milliseconds(250));
    conn = OpenConnection(session_id_, std::min(left, absl::Seconds(30)),
                          &opened, &account);
    if (conn.ok() || !absl::IsUnavailable(conn.status())) break;
    const absl::Time now = absl::Now();
    if (now >= deadline) break;
    struct stat st;
    if (lstat(socket_path_.c_str(), &st) != 0) {
      if (missing_since == absl::InfiniteFuture()) missing_since = now;
      if (now - missing_since > absl::Milliseconds(300)) break;
    } else {
      missing_since = absl::InfiniteFuture();
    }
    absl::SleepFor(std::min(backoff, deadline - now));
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
  }
  absl::Status failed;
  if (!conn.ok()) {
    failed = conn.status();
  } else if (opened.daemon_epoch() != epoch_) {
    failed = absl::FailedPreconditionError(
        "the daemon restarted (another instance answers)");
  }
  if (failed.ok() && opened.leases_reconciled()) {
    // Every message through the account's releases_through is settled
    // (its seals were presented, its released leases not); those queued
    // since go on the new stream. The leases the daemon does not hold are
    // dropped here (never released: their bytes may be reused).
    outbox_.Settle(account.releases_through());
    DropRefused(opened);
  } else if (failed.ok()) {
    // A daemon that does not reconcile: send again what it had not
    // applied, in order, before any other message (write_mu_ is held, so
    // the writer thread waits).
    const bool resent = outbox_.Resend(opened.releases_applied(),
                                       [&](const v1::SessionRequest& req) {
                                         return (*conn)->session->Write(req);
                                       });
    if (!resent) {
      failed = absl::UnavailableError("the new connection broke at once");
    }
  }
  std::shared_ptr<Connection> old;
  std::unique_lock<std::mutex> lock(conn_mu_);
  old = std::move(conn_);
  if (!failed.ok()) {
    ended_why_ = absl::StrCat(
        "its connection broke and it could not be "
        "resumed: ",
        failed.message());
    ended_code_ = absl::IsUnavailable(failed)
                      ? absl::StatusCode::kUnavailable
                      : absl::StatusCode::kFailedPrecondition;
    return WithReason(
        absl::Status(ended_code_,
                     absl::StrCat("the session with shmtensord "
                                  "at ",
                                  address_, " has ended (", ended_why_, ")")),
        kReasonSessionEnded);
  }
  conn_ = *std::move(conn);
  if (reconciled != nullptr) *reconciled = opened.leases_reconciled();
  if (!opened.descriptor_secret().empty() &&
      opened.descriptor_secret() != descriptor_secret_) {
    // A successor daemon gave the session a new one (fork holds need it).
    // PrepareFork reads it under the registry's lock.
    std::lock_guard<std::mutex> registry(RegistryMu());
    descriptor_secret_ = opened.descriptor_secret();
  }
  lock.unlock();  // The ring's request is no business of conn_mu_'s.
  RenewRingLocked();
  return absl::OkStatus();
}

void ClientCore::RenewRingLocked() {
  if (!writes_host_ || ring_refused_by_ == descriptor_secret_) return;
  absl::StatusOr<int> fd =
      FetchReleaseRing(socket_path_, session_id_, descriptor_secret_,
                       absl::Now() + kRingRequestTimeout, daemon_uid_);
  absl::StatusOr<std::unique_ptr<RingMapping>> ring =
      fd.ok() ? RingMapping::Map(*fd) : fd.status();
  if (!ring.ok()) {
    // Not asked again of this daemon: its answer would be the same (its
    // cap, an older daemon, a layout this client cannot map). A timeout is
    // no answer: the next resume asks again.
    if (!absl::IsUnavailable(ring.status())) {
      ring_refused_by_ = descriptor_secret_;
    }
    return;
  }
  InstallRing(*std::move(ring));
}

void ClientCore::InstallRing(std::unique_ptr<RingMapping> ring) {
  std::unique_ptr<RingMapping> old;
  {
    std::lock_guard<std::mutex> lock(ring_mu_);
    old = std::exchange(ring_, std::move(ring));
  }
  ring_on_.store(true, std::memory_order_release);
}

uint64_t ClientCore::RingApplied() const {
  std::lock_guard<std::mutex> lock(ring_mu_);
  return ring_ != nullptr ? ring_->writer().applied() : 0;
}

bool ClientCore::inherited() const {
  return ForkGeneration() != fork_generation_;
}

absl::Status ClientCore::CheckOwner() const {
  if (!inherited()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "this client was connected in process ", owner_pid_,
      " and inherited across fork(); connect a new client in process ",
      getpid()));
}

absl::StatusOr<const v1::PoolInfo*> ClientCore::Pool(uint32_t pool_id) const {
  if (pool_id >= pools_.size() ||
      pools_[pool_id].access() == v1::POOL_ACCESS_UNSPECIFIED) {
    return absl::InternalError(
        absl::StrCat("daemon named pool ", pool_id,
                     ", which it did not list for this session"));
  }
  return &pools_[pool_id];
}

absl::StatusOr<Device> ClientCore::PoolDevice(uint32_t pool_id) const {
  absl::StatusOr<const v1::PoolInfo*> info = Pool(pool_id);
  if (!info.ok()) return info.status();
  if ((*info)->kind() == v1::MEMORY_KIND_CUDA_DEVICE) {
    return Device::Cuda((*info)->cuda_device());
  }
  return Device::Host();
}

absl::StatusOr<PoolMapping*> ClientCore::Mapping(uint32_t pool_id) const {
  absl::StatusOr<const v1::PoolInfo*> info = Pool(pool_id);
  if (!info.ok()) return info.status();
  if (mappings_[pool_id] == nullptr) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "pool '%s' holds CUDA device memory (cuda:%d), not host memory",
        (*info)->name(), (*info)->cuda_device()));
  }
  return mappings_[pool_id].get();
}

absl::StatusOr<CudaPoolMapping*> ClientCore::CudaMapping(uint32_t pool_id) {
  absl::StatusOr<const v1::PoolInfo*> info = Pool(pool_id);
  if (!info.ok()) return info.status();
  std::lock_guard<std::mutex> lock(cuda_mu_);
  std::shared_ptr<CudaPoolMapping>& m = cuda_mappings_[pool_id];
  if (m == nullptr) {
    absl::StatusOr<std::shared_ptr<CudaPoolMapping>> opened =
        CudaPoolMapping::Get(**info);
    if (!opened.ok()) return opened.status();
    m = *std::move(opened);
  }
  return m.get();
}

const v1::PoolInfo* ClientCore::PoolNamed(const std::string& name) const {
  for (const v1::PoolInfo& info : pools_) {
    if (info.access() != v1::POOL_ACCESS_UNSPECIFIED && info.name() == name) {
      return &info;
    }
  }
  return nullptr;
}

absl::StatusOr<std::string> ClientCore::PoolOn(const Device& device) const {
  // Per Create: the search is a scan of a few pools; the list of them is
  // built only for the error. The daemon chose the pool of each device
  // (PoolInfo.default_for_device); the client never chooses.
  for (uint32_t id = 0; id < pools_.size(); ++id) {
    if (pools_[id].default_for_device() &&
        PoolDevice(id).value_or(Device::Host()) == device) {
      return pools_[id].name();
    }
  }
  std::vector<std::string> have;
  for (uint32_t id = 0; id < pools_.size(); ++id) {
    if (pools_[id].access() == v1::POOL_ACCESS_UNSPECIFIED) continue;
    have.push_back(
        absl::StrCat(pools_[id].name(), " (",
                     DeviceName(PoolDevice(id).value_or(Device::Host())), ")"));
  }
  return absl::NotFoundError(absl::StrCat(
      "shmtensord at ", address_, " has no pool on ", DeviceName(device),
      "; its pools: ", absl::StrJoin(have, ", "),
      device.is_cuda() ? " (a CUDA pool the daemon could not create is listed "
                         "by `shmtensorctl status`)"
                       : ""));
}

void ClientCore::ReleaseAfter(cuda::Fence fence, uint64_t lease_id) {
  GpuReleaser* r;
  {
    std::lock_guard<std::mutex> lock(releaser_mu_);
    if (releaser_ == nullptr) {
      releaser_ = std::make_unique<GpuReleaser>(
          [this](uint64_t id) { ReleaseLease(id).IgnoreError(); });
    }
    r = releaser_.get();
  }
  r->ReleaseAfter(std::move(fence), lease_id);
}

void ClientCore::FlushGpuReleases() {
  GpuReleaser* r;
  {
    std::lock_guard<std::mutex> lock(releaser_mu_);
    r = releaser_.get();
  }
  if (r != nullptr) r->Flush();
}

absl::Status ClientCore::HoldLease(uint64_t lease_id, uint64_t generation) {
  {
    std::lock_guard<std::mutex> lock(held_mu_);
    if (generation == held_generation_) {
      held_.emplace(lease_id, HeldLease());
      return absl::OkStatus();
    }
  }
  // A resume began after the call was sent and did not present the lease:
  // the daemon dropped it, or (a stream replaced while its daemon served
  // on) may still grant it; release it to be sure.
  v1::ReleaseLeases release;
  release.add_lease_ids(lease_id);
  if (EnqueueLocked(std::move(release)).ok()) AfterEnqueue();
  return absl::UnavailableError(absl::StrCat(
      "the connection to shmtensord at ", address_, " broke while lease ",
      lease_id,
      " was on its way; the session was resumed without it (call again)"));
}

void ClientCore::ForgetLease(uint64_t lease_id, bool released) {
  {
    std::lock_guard<std::mutex> lock(held_mu_);
    held_.erase(lease_id);
  }
  if (stock_ != nullptr) stock_->Released(lease_id, released);
}

void ClientCore::LeaseMade(Lease* lease) {
  live_leases_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(held_mu_);
  auto it = held_.find(lease->id());
  if (it == held_.end()) {
    lease->MarkLost();  // Refused by a resume since HoldLease.
  } else {
    const v1::Placement& p = lease->placement();
    it->second = {lease,       false,      !lease->device().is_cuda(),
                  p.pool_id(), p.offset(), p.capacity_bytes()};
  }
}

void ClientCore::LeaseUnmade(uint64_t lease_id) {
  std::lock_guard<std::mutex> lock(held_mu_);
  auto it = held_.find(lease_id);
  if (it == held_.end()) return;
  it->second.lease = nullptr;
  it->second.releasing = true;
}

void ClientCore::DropRefused(const v1::SessionOpened& opened) {
  if (opened.refused_lease_ids().empty()) return;
  int in_use = 0;
  {
    std::lock_guard<std::mutex> lock(held_mu_);
    for (uint64_t id : opened.refused_lease_ids()) {
      auto it = held_.find(id);
      if (it == held_.end()) continue;
      // One being released (its unary Release applied, its answer lost in
      // the break) is no loss.
      const HeldLease& h = it->second;
      if (!h.releasing && (h.lease == nullptr || h.lease->MarkLost())) {
        ++in_use;
      }
      held_.erase(it);
    }
  }
  if (stock_ != nullptr) {
    for (uint64_t id : opened.refused_lease_ids()) {
      stock_->Released(id, /*named=*/false);
    }
  }
  if (in_use == 0) return;
  // Not expected: the daemon records each lease before it answers. Say so
  // once per resume, since views of these leases may now change.
  std::fprintf(stderr,
               "shmtensor: pid %d: shmtensord at %s resumed client %llu "
               "without %d of the leases it holds; views of them may see "
               "their bytes reused, and export no more\n",
               static_cast<int>(getpid()), address_.c_str(),
               static_cast<unsigned long long>(client_id_), in_use);
}

absl::Status ClientCore::ReleaseLease(uint64_t lease_id, Route route) {
  if (absl::Status s = CheckOwner(); !s.ok()) return s;
  bool kicked = true;  // The stream's writer has work.
  {
    // Leaves held_ and is queued at once for a resume's account (see
    // ResumeLocked).
    std::lock_guard<std::mutex> held(held_mu_);
    // Lost (a resume found the daemon does not hold it): nothing to send.
    if (held_.erase(lease_id) == 0) return absl::OkStatus();
    v1::ReleaseLeases release;
    release.add_lease_ids(lease_id);
    if (route == Route::kStream) {
      if (absl::Status s = EnqueueLocked(std::move(release)); !s.ok()) {
        return s;
      }
    } else {
      absl::StatusOr<bool> kick = PublishLocked(std::move(release));
      if (!kick.ok()) return kick.status();
      kicked = *kick;
    }
  }
  // Queued: the stock's refill that this may start carries it (not under
  // held_mu_, which the stock takes under its own lock).
  if (stock_ != nullptr) stock_->Released(lease_id, /*named=*/true);
  if (kicked) AfterEnqueue();
  return absl::OkStatus();
}

absl::Status ClientCore::SendSeals(std::vector<v1::OneWaySeal> seals) {
  if (absl::Status s = CheckOwner(); !s.ok()) return s;
  v1::ReleaseLeases message;
  message.mutable_seals()->Reserve(static_cast<int>(seals.size()));
  for (v1::OneWaySeal& seal : seals) *message.add_seals() = std::move(seal);
  absl::StatusOr<bool> kick = PublishLocked(std::move(message));
  if (!kick.ok()) return kick.status();
  if (*kick) AfterEnqueue();
  return absl::OkStatus();
}

absl::StatusOr<bool> ClientCore::PublishLocked(v1::ReleaseLeases message) {
  if (!ring_on_.load(std::memory_order_acquire)) {
    if (absl::Status s = EnqueueLocked(std::move(message)); !s.ok()) return s;
    return true;
  }
  if (CurrentConnection() == nullptr) return Ended();
  // The ring's `applied` is true whichever ring it is (a resume's new ring
  // starts at the session's applied seq).
  bool nudge = false;
  const bool posted = outbox_.EnqueuePosted(
      std::move(message), RingApplied(),
      [this, &nudge](const v1::ReleaseLeases& m) {
        // Read under the outbox's lock, which a resume's account takes
        // after clearing it: a post either is in the account or sees it
        // cleared (and a new ring is installed only after the account).
        if (!ring_on_.load(std::memory_order_acquire)) return false;
        const size_t n = m.ByteSizeLong();
        if (n > kReleaseRingMaxRecord) return false;
        char record[kReleaseRingMaxRecord];
        m.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(record));
        std::lock_guard<std::mutex> lock(ring_mu_);
        if (ring_ == nullptr ||
            !ring_->writer().Post(absl::string_view(record, n))) {
          return false;
        }
        nudge = ring_->writer().NudgeRequested();
        return true;
      });
  // Not posted: the stream takes it. Posted: the writer too, only while a
  // call waits for one of this session's messages (a seal, or memory some
  // release may free).
  return !posted || nudge;
}

bool ClientCore::FlushStream(absl::Time deadline) {
  return writer_->Flush(deadline);
}

absl::Status ClientCore::EnqueueLocked(v1::ReleaseLeases message) {
  if (CurrentConnection() == nullptr) return Ended();
  outbox_.Enqueue(std::move(message));
  return absl::OkStatus();
}

void ClientCore::AfterEnqueue() {
  writer_->Kick();
  // The writer drains what it was kicked for, or gives up with the session
  // (WriteOne): the wait ends either way.
  if (outbox_.Unwritten() > kMaxUnwritten)
    writer_->Flush(absl::InfiniteFuture());
}

bool ClientCore::WriteOne() {
  // What the daemon applied from the ring (or the stream) need not be
  // written. After a resume the ring's figure is stale but still true.
  if (ring_on_.load(std::memory_order_acquire)) {
    outbox_.Confirm(RingApplied());
  }
  // The messages queued and not yet written, oldest first, up to a batch:
  // written together, gRPC holding all but the last (buffer_hint) so that
  // they go in one send and wake the daemon once.
  const std::vector<v1::SessionRequest> batch = outbox_.TakeUnwritten();
  if (batch.empty()) return false;
  std::lock_guard<std::mutex> lock(write_mu_);
  std::shared_ptr<Connection> conn = CurrentConnection();
  // Ended: nothing goes any more (the daemon dropped every lease).
  if (conn == nullptr) {
    outbox_.Abandon();
    return false;
  }
  // Those a resume since wrote again on the new stream, or settled.
  const size_t first = outbox_.AlreadyWritten(batch);
  if (first == batch.size()) return true;
  // A hung-up connection may still take the write (into its buffers, for
  // nobody): ask the socket first, so that a process that makes no call
  // after its daemon was replaced (its gets are shares) still resumes, and
  // its releases reach the daemon that holds its leases.
  bool broken = Broken(*conn);
  for (size_t i = first; !broken && i < batch.size(); ++i) {
    grpc::WriteOptions options;
    if (i + 1 < batch.size()) options.set_buffer_hint();
    broken = !conn->session->Write(batch[i], options);
  }
  if (broken) {
    // The resume writes these messages again, or settles them, with every
    // other one queued; a failed one ends the session (next turn).
    ResumeLocked(conn).IgnoreError();
    return true;
  }
  outbox_.Written(batch.back().release().seq());
  return true;
}

bool ClientCore::PollUnconfirmed() {
  if (ring_on_.load(std::memory_order_acquire)) {
    outbox_.Confirm(RingApplied());
  }
  if (!outbox_.HasUnconfirmed()) return false;
  // Posted and not read yet: WriteOne writes them on the stream.
  if (outbox_.Unwritten() > 0) return true;
  // Written, and not known applied: a daemon that went before it read them
  // is found here, and the resume presents them (or sends them again).
  std::shared_ptr<Connection> conn = CurrentConnection();
  if (conn != nullptr && Broken(*conn)) ResumeBroken(conn).IgnoreError();
  return false;
}

bool ClientCore::Holds(uint64_t lease_id) {
  std::lock_guard<std::mutex> lock(held_mu_);
  return held_.contains(lease_id);
}

std::shared_ptr<Lease> ClientCore::FindShare(const ObjectRef& ref,
                                             ObjectInfo* info) {
  std::lock_guard<std::mutex> lock(shares_mu_);
  auto it = shares_.find(ShareKey(ref));
  if (it == shares_.end()) return nullptr;
  std::shared_ptr<Lease> lease = it->second.lease.lock();
  if (lease == nullptr || !lease->SharesRef(ref)) return nullptr;
  *info = it->second.info;
  return lease;
}

void ClientCore::AddShare(const std::shared_ptr<Lease>& lease,
                          const ObjectInfo& info) {
  if (lease->device().is_cuda() || lease->access() != Access::kRead) return;
  std::lock_guard<std::mutex> lock(shares_mu_);
  Share& s = shares_[ShareKey(info.ref)];
  // One share per object: a second lease of it (two gets racing) stays
  // unshared.
  if (!s.lease.expired()) return;
  s.lease = lease;
  s.raw = lease.get();
  s.info = info;
  lease->MarkShared(info.ref);
}

bool ClientCore::UnshareIfLast(const std::shared_ptr<Lease>& lease) {
  std::lock_guard<std::mutex> lock(shares_mu_);
  if (lease.use_count() != 1) return false;
  if (lease->shared()) {
    auto it = shares_.find(ShareKey(lease->shared_ref()));
    if (it != shares_.end() && it->second.raw == lease.get()) shares_.erase(it);
  }
  return true;
}

void ClientCore::DropShare(const ObjectRef& ref, const Lease* lease) {
  std::lock_guard<std::mutex> lock(shares_mu_);
  auto it = shares_.find(ShareKey(ref));
  if (it != shares_.end() && it->second.raw == lease) shares_.erase(it);
}

absl::Status ClientCore::FromGrpc(const grpc::ClientContext& ctx,
                                  const grpc::Status& status) const {
  if (status.ok()) return absl::OkStatus();
  std::string message = status.error_message();
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    message =
        absl::StrCat("shmtensord at ", address_, " unavailable: ", message);
  }
  absl::Status out(static_cast<absl::StatusCode>(status.error_code()), message);
  const auto& trailers = ctx.GetServerTrailingMetadata();
  auto it = trailers.find(std::string(kErrorReasonMetadata));
  if (it != trailers.end()) {
    out = WithReason(out,
                     absl::string_view(it->second.data(), it->second.size()));
  }
  return out;
}

}  // namespace shmtensor::internal
