// Clients outlive their daemon: a take-over (shmtensord --take-over), a
// reload (SIGHUP) and a SIGKILL restart through a file descriptor store, each
// under load, with real processes. The store is a supervisor in this file
// that speaks systemd's protocols byte for byte: datagrams with SCM_RIGHTS
// on $NOTIFY_SOCKET (FDSTORE=1, FDNAME=, FDSTOREREMOVE=1, READY=1), and
// $LISTEN_FDS, $LISTEN_PID, $LISTEN_FDNAMES with descriptors from 3.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/client_core.h"
#include "client/lease.h"
#include "daemon/daemon.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "shmtensor/client.h"
#include "shmtensor/errors.h"
#include "shmtensor/v1/monitor.pb.h"
#include "shmtensor/v1/shmtensor.grpc.pb.h"
#include "testing/cpp/daemon_process.h"
#include "testing/cpp/fd_store.h"
#include "testing/cpp/subprocess.h"
#include "tests/test_util.h"

namespace shmtensor {
namespace {

using testing::DaemonPath;
using testing::DaemonProcess;
using testing::FdStore;
using testing::FreshAddress;

constexpr uint64_t kObject = 64 << 10;

// The arguments of a daemon at `address` with a 64 MiB pool.
std::vector<std::string> Args(const std::string& address,
                              std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--listen", address, "--pool-size", "64MiB"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// The chaos test's load in miniature: two clients put, get elsewhere and
// check; views kept alive are checked again each round; every ref made is
// checked once more at the end. Errors other than UNAVAILABLE (a call in
// flight at a restart) are failures.
class Load {
 public:
  explicit Load(const std::string& address) : address_(address) {}
  void Start() {
    thread_ = std::thread([this] { Run(); });
  }
  void Stop() {
    stop_ = true;
    thread_.join();
  }
  // Rounds done: the load made progress since the last look.
  uint64_t rounds() const { return rounds_.load(); }

  uint64_t mismatches = 0;
  uint64_t unavailable = 0;
  uint64_t ended = 0;  // Calls that found the session ended.
  std::vector<std::string> other_errors;
  std::vector<std::pair<ObjectRef, uint8_t>> refs;
  std::vector<std::string> names;  // Bound (and deleted, unless a restart
                                   // took the delete's answer).

 private:
  void Note(const absl::Status& s) {
    if (s.ok()) return;
    if (IsSessionEnded(s)) {
      ++ended;
    } else if (absl::IsUnavailable(s)) {
      ++unavailable;
    } else if (other_errors.size() < 10) {
      other_errors.push_back(s.ToString());
    }
  }
  void Run() {
    ClientOptions options;
    options.address = address_;
    options.resume_timeout = absl::Seconds(20);
    absl::StatusOr<Client> producer = Client::Connect(options);
    absl::StatusOr<Client> consumer = Client::Connect(options);
    if (!producer.ok() || !consumer.ok()) {
      other_errors.push_back("connect");
      return;
    }
    std::vector<std::pair<View, uint8_t>> kept;
    uint8_t byte = 0;
    while (!stop_) {
      ++byte;
      std::vector<uint8_t> data(kObject, byte);
      CreateOptions co;
      co.size_bytes = kObject;
      absl::StatusOr<SealedRef> ref = producer->Put(data.data(), co);
      Note(ref.status());
      if (ref.ok()) {
        absl::StatusOr<View> v = consumer->Get(ref->ref());
        Note(v.status());
        if (v.ok()) {
          const auto* p = static_cast<const uint8_t*>(v->data());
          if (p[0] != byte || p[kObject - 1] != byte) ++mismatches;
          if (byte % 8 == 0) kept.emplace_back(*std::move(v), byte);
        }
        if (byte % 4 == 0) refs.emplace_back(ref->ref(), byte);
      }
      if (byte % 5 == 0) {
        // An exclusive hand-off: the consumer takes the producer's object.
        absl::StatusOr<SealedRef> excl =
            producer->Put(data.data(), co, /*exclusive=*/true);
        Note(excl.status());
        if (excl.ok()) {
          absl::StatusOr<View> taken = consumer->Get(excl->ref());
          Note(taken.status());
          if (taken.ok() &&
              static_cast<const uint8_t*>(taken->data())[kObject - 1] != byte) {
            ++mismatches;
          }
        }
      }
      if (byte % 7 == 0) {
        // A name, bound, read elsewhere, deleted.
        CreateOptions named = co;
        named.name = absl::StrCat("load-", rounds_.load());
        names.push_back(named.name);
        absl::Status put = producer->Put(data.data(), named).status();
        Note(put);
        if (put.ok()) {
          absl::StatusOr<View> v = consumer->Get(named.name);
          Note(v.status());
          if (v.ok() && static_cast<const uint8_t*>(v->data())[0] != byte) {
            ++mismatches;
          }
          Note(producer->Delete(named.name));
        }
      }
      for (const auto& [view, b] : kept) {
        const auto* p = static_cast<const uint8_t*>(view.data());
        if (p[0] != b || p[kObject / 2] != b) ++mismatches;
      }
      if (kept.size() > 16) kept.erase(kept.begin());
      ++rounds_;
    }
  }

  std::string address_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> rounds_{0};
  std::thread thread_;
};

void WaitForProgress(const Load& load) {
  const uint64_t seen = load.rounds();
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (load.rounds() < seen + 20 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_GE(load.rounds(), seen + 20) << "the load stalled";
}

// Every ref made before resolves to its bytes, and nothing is left once the
// clients are gone.
void CheckAfter(const std::string& address, Load& load) {
  ClientOptions options;
  options.address = address;
  Client c = *Client::Connect(options);
  size_t resolved = 0;
  for (const auto& [ref, byte] : load.refs) {
    absl::StatusOr<View> v = c.Get(ref);
    if (!v.ok()) continue;  // Released by its producer already: fine.
    ++resolved;
    EXPECT_EQ(static_cast<const uint8_t*>(v->data())[kObject - 1], byte);
  }
  // A delete in flight at a restart may not have happened: unbind what is
  // left, so nothing holds memory once the clients are gone.
  for (const std::string& name : load.names) (void)c.Delete(name);
  EXPECT_EQ(load.mismatches, 0u);
  EXPECT_EQ(load.ended, 0u);
  EXPECT_TRUE(load.other_errors.empty())
      << absl::StrJoin(load.other_errors, "\n");
}

uint64_t UsedBytes(const std::string& address);

// Pool usage drops back to 0 once every client let go.
void ExpectEmptied(const std::string& address) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (UsedBytes(address) != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(UsedBytes(address), 0u)
      << testing::MonitorObjects(address).DebugString().substr(0, 3000)
      << testing::MonitorClients(address).DebugString().substr(0, 3000);
}

uint64_t UsedBytes(const std::string& address) {
  ClientOptions options;
  options.address = address;
  absl::StatusOr<Client> c = Client::Connect(options);
  absl::StatusOr<StoreStats> s = c.ok() ? c->Stats() : c.status();
  if (!s.ok()) {
    // Shown with the failure of whatever compares it.
    std::fprintf(stderr, "no stats from %s: %s\n", address.c_str(),
                 s.status().ToString().c_str());
    return UINT64_MAX;
  }
  return s->pools[0].used_bytes;
}

TEST(TakeOverTest, TenTakeOversUnderLoadEndNoSessionAndLoseNoByte) {
  absl::StatusOr<std::unique_ptr<DaemonProcess>> first =
      DaemonProcess::Start({"--pool-size", "64MiB"});
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = (*first)->address();
  std::vector<std::unique_ptr<DaemonProcess>> daemons;
  daemons.push_back(*std::move(first));
  Load load(address);
  load.Start();
  WaitForProgress(load);
  // A named object and a view from before, checked after every take-over.
  ClientOptions options;
  options.address = address;
  Client holder = *Client::Connect(options);
  CreateOptions named;
  named.size_bytes = kObject;
  named.name = "survivor";
  std::vector<uint8_t> bytes(kObject, 0x5a);
  ASSERT_TRUE(holder.Put(bytes.data(), named).ok());
  View view = *holder.Get("survivor");
  std::vector<absl::Duration> gaps;
  for (int i = 0; i < 10; ++i) {
    const absl::Time t0 = absl::Now();
    absl::StatusOr<std::unique_ptr<DaemonProcess>> next =
        DaemonProcess::Start({"--pool-size", "64MiB", "--take-over"}, address);
    ASSERT_TRUE(next.ok()) << next.status();
    // The predecessor hands over and exits 0.
    EXPECT_EQ(daemons.back()->process().Wait(), 0) << "take-over " << i;
    daemons.push_back(*std::move(next));
    WaitForProgress(load);
    gaps.push_back(absl::Now() - t0);
    EXPECT_EQ(static_cast<const uint8_t*>(view.data())[kObject - 1], 0x5a);
  }
  load.Stop();
  std::sort(gaps.begin(), gaps.end());
  fprintf(stderr, "take-over gap (start to 20 load rounds): p50 %s, max %s\n",
          absl::FormatDuration(gaps[gaps.size() / 2]).c_str(),
          absl::FormatDuration(gaps.back()).c_str());
  CheckAfter(address, load);
  absl::StatusOr<View> again = holder.Get("survivor");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->data(), view.data());
  ASSERT_TRUE(holder.Delete("survivor").ok());
  EXPECT_EQ(holder.daemon_epoch(), Client::Connect(options)->daemon_epoch());
  again = absl::UnknownError("dropped");
  view = View();
  ExpectEmptied(address);
}

TEST(TakeOverTest, TenSigkillRestartsThroughTheDescriptorStore) {
  const std::string address = FreshAddress();
  FdStore systemd;
  ASSERT_TRUE(systemd.Start(Args(address)).ok());
  ASSERT_TRUE(systemd.WaitReady()) << systemd.Log();
  // Ledger, pool and both listening sockets are in the store.
  EXPECT_EQ(systemd.stored().count("shmtensor.ledger"), 1u);
  EXPECT_EQ(systemd.stored().count("shmtensor.pool.default"), 1u);
  EXPECT_EQ(systemd.stored().count("shmtensor.listen"), 1u);
  EXPECT_EQ(systemd.stored().count("shmtensor.listen.fd"), 1u);
  Load load(address);
  load.Start();
  WaitForProgress(load);
  ClientOptions options;
  options.address = address;
  options.resume_timeout = absl::Seconds(20);
  Client holder = *Client::Connect(options);
  std::vector<uint8_t> bytes(kObject, 0x33);
  CreateOptions co;
  co.size_bytes = kObject;
  SealedRef kept_ref = *holder.Put(bytes.data(), co);
  View view = *holder.Get(kept_ref.ref());
  std::vector<absl::Duration> gaps;
  for (int i = 0; i < 10; ++i) {
    const absl::Time t0 = absl::Now();
    systemd.Kill();  // SIGKILL, at whatever point of its work.
    ASSERT_TRUE(systemd.Start(Args(address)).ok());
    ASSERT_TRUE(systemd.WaitReady()) << systemd.Log();
    // What was stored is what the successor adopted: nothing added.
    EXPECT_EQ(systemd.stored().size(), 4u);
    WaitForProgress(load);
    gaps.push_back(absl::Now() - t0);
    EXPECT_EQ(static_cast<const uint8_t*>(view.data())[0], 0x33);
  }
  load.Stop();
  CheckAfter(address, load);
  absl::StatusOr<View> again = holder.Get(kept_ref.ref());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->data(), view.data());
  again = absl::UnknownError("dropped");
  view = View();
  kept_ref = SealedRef();
  ExpectEmptied(address);
  std::sort(gaps.begin(), gaps.end());
  // The figures for docs/operations.md: kill to READY plus 20 rounds of load.
  fprintf(stderr, "SIGKILL restart gap (to 20 load rounds): p50 %s, max %s\n",
          absl::FormatDuration(gaps[gaps.size() / 2]).c_str(),
          absl::FormatDuration(gaps.back()).c_str());
  EXPECT_FALSE(absl::StrContains(systemd.Log(), "not adopting"))
      << systemd.Log();
}

// A resume presents the process's leases and the daemon reconciles them
// with its ledger (docs/shm_layout.md, "Resuming a session"). Raw calls of
// this process act for the client's session outside its books: a Get whose
// answer the client never saw (the daemon holds a lease the client does not
// know) and a Release the client never sent (the client holds a lease the
// daemon does not). After a SIGKILL restart the first is dropped, the second
// refused: the view over it stops exporting, and nothing of it is released
// twice. Without the reconciliation the first lease would keep its object
// for the session's life.
TEST(TakeOverTest, AResumeReconcilesTheClientsLeasesWithTheLedger) {
  const std::string address = FreshAddress();
  FdStore systemd;
  ASSERT_TRUE(systemd.Start(Args(address)).ok());
  ASSERT_TRUE(systemd.WaitReady()) << systemd.Log();
  ClientOptions options;
  options.address = address;
  options.resume_timeout = absl::Seconds(20);
  options.stock_bytes = 0;  // Only the leases below.
  Client c = *Client::Connect(options);
  std::vector<uint8_t> bytes(kObject, 0x5A);
  CreateOptions co;
  co.size_bytes = kObject;
  std::optional<SealedRef> kept = *c.Put(bytes.data(), co);
  std::optional<SealedRef> refused_ref = *c.Put(bytes.data(), co);
  // A share of refused_ref's lease, then the view's alone.
  std::optional<View> refused = *c.Get(refused_ref->ref());
  refused_ref.reset();
  CreateOptions named = co;
  named.name = "answer-lost";
  std::optional<SealedRef> orphan = *c.Put(bytes.data(), named);
  ASSERT_TRUE(c.Delete("answer-lost").ok());

  auto stub = v1::ObjectStore::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  {
    v1::GetRequest get;
    get.set_session_id(c.session_id());
    get.set_name("answer-lost");
    v1::GetResponse resp;
    grpc::ClientContext ctx;
    // Unbound already: bind it again, then get it behind the client's back.
    ASSERT_TRUE(c.Put(bytes.data(), named).ok());
    ASSERT_TRUE(stub->Get(&ctx, get, &resp).ok());
    ASSERT_TRUE(c.Delete("answer-lost").ok());
  }
  {
    v1::ReleaseRequest rel;
    rel.set_session_id(c.session_id());
    rel.set_lease_id(refused->lease()->id());
    v1::ReleaseResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Release(&ctx, rel, &resp).ok());
  }
  const uint64_t client_id = c.client_id();
  auto leases_now = [&] {
    return testing::MonitorLeasesOf(address, client_id);
  };
  // kept, orphan and the raw Get's (the second put's went with its
  // SealedRef; the raw Release took the view's).
  ASSERT_EQ(leases_now(), 3u);

  systemd.Kill();
  ASSERT_TRUE(systemd.Start(Args(address)).ok());
  ASSERT_TRUE(systemd.WaitReady()) << systemd.Log();
  ASSERT_TRUE(c.Stats().ok());  // Resumes first.
  // The raw Get's lease is dropped: the client never knew it.
  EXPECT_EQ(leases_now(), 2u);
  EXPECT_TRUE(
      absl::StrContains(systemd.Log(), "2 leases kept, 1 dropped, 1 refused"))
      << systemd.Log();
  // The released lease is refused: its view exports nothing more.
  absl::StatusOr<uint64_t> offered = refused->Offer();
  ASSERT_FALSE(offered.ok());
  EXPECT_TRUE(IsStaleReference(offered.status())) << offered.status();
  EXPECT_TRUE(absl::StrContains(offered.status().message(), "was lost"))
      << offered.status();
  // Nor is it shared: a get of its object asks the daemon, which released
  // the object with the lease.
  absl::StatusOr<View> again = c.Get(refused->ref());
  EXPECT_TRUE(IsStaleReference(again.status())) << again.status();
  // Letting go of it sends no release (the daemon logs none unknown).
  refused.reset();
  refused_ref.reset();
  kept.reset();
  orphan.reset();
  ASSERT_TRUE(c.Stats().ok());
  EXPECT_EQ(leases_now(), 0u);
  // Nothing is left held, though the client lives on.
  ExpectEmptied(address);
  EXPECT_FALSE(absl::StrContains(systemd.Log(), "holds no lease"))
      << systemd.Log();
}

// Releases and one-way seals never wait for the daemon: made while none
// answers (killed, its successor not yet started) they return at once,
// queued for the client's writer thread, and reach the successor in order
// once the writer has resumed the session: those queued before the
// resume's account through it (the seals presented, the released leases
// not), those queued after it on the new stream.
TEST(TakeOverTest, SealsAndReleasesMadeWhileNoDaemonAnswersReachItsSuccessor) {
  const std::string address = FreshAddress();
  FdStore systemd;
  ASSERT_TRUE(systemd.Start(Args(address)).ok());
  ASSERT_TRUE(systemd.WaitReady()) << systemd.Log();
  ClientOptions options;
  options.address = address;
  options.resume_timeout = absl::Seconds(20);
  options.stock_bytes = 0;  // Only the leases below.
  Client c = *Client::Connect(options);
  constexpr int kEach = 40;
  CreateOptions co;
  co.size_bytes = kObject;
  std::vector<Buffer> unsealed;
  std::vector<SealedRef> sealed;
  for (int i = 0; i < kEach; ++i) {
    unsealed.push_back(*c.Create(co));
    ASSERT_TRUE(unsealed.back()
                    .Fill([&](absl::Span<uint8_t> b) {
                      std::memset(b.data(), i, b.size());
                    })
                    .ok());
    std::vector<uint8_t> bytes(kObject, 0x80 + i);
    sealed.push_back(*c.Put(bytes.data(), co));
  }
  ASSERT_TRUE(c.Stats().ok());  // Every seal applied.
  const uint64_t client_id = c.client_id();
  auto leases_now = [&] {
    return testing::MonitorLeasesOf(address, client_id);
  };
  ASSERT_EQ(leases_now(), 2u * kEach);

  systemd.Kill();
  std::vector<SealedRef> late;
  for (Buffer& b : unsealed) {
    absl::StatusOr<SealedRef> ref = b.Seal();
    ASSERT_TRUE(ref.ok()) << ref.status();
    late.push_back(*std::move(ref));
  }
  sealed.erase(sealed.begin(), sealed.begin() + kEach / 2);
  ASSERT_TRUE(systemd.Start(Args(address)).ok());
  ASSERT_TRUE(systemd.WaitReady()) << systemd.Log();
  // The writer resumed (or this call does, failing once UNAVAILABLE).
  absl::Status stats = c.Stats().status();
  if (absl::IsUnavailable(stats)) stats = c.Stats().status();
  ASSERT_TRUE(stats.ok()) << stats;
  EXPECT_EQ(leases_now(), kEach + kEach / 2u);
  // Another process's client reads each late object sealed with its bytes,
  // and each sealed one kept.
  Client other = *Client::Connect({.address = address});
  for (int i = 0; i < kEach; ++i) {
    absl::StatusOr<View> v = other.Get(late[i].ref());
    ASSERT_TRUE(v.ok()) << i << ": " << v.status();
    EXPECT_EQ(static_cast<const uint8_t*>(v->data())[kObject - 1], i);
  }
  for (int i = 0; i < kEach / 2; ++i) {
    absl::StatusOr<View> v = other.Get(sealed[i].ref());
    ASSERT_TRUE(v.ok()) << i << ": " << v.status();
    EXPECT_EQ(static_cast<const uint8_t*>(v->data())[0], 0x80 + kEach / 2 + i);
  }
  late.clear();
  sealed.clear();
  ASSERT_TRUE(c.Stats().ok());
  EXPECT_EQ(leases_now(), 0u);
  ExpectEmptied(address);
  EXPECT_FALSE(absl::StrContains(systemd.Log(), "holds no lease"))
      << systemd.Log();
}

// A daemon restarted under a running job (SIGKILL, then started again
// through the descriptor store) has no rings: each session's client asks
// the successor for a new one when it resumes, so its puts go on sealing
// one way through a ring, not the stream, and readers get their bytes.
TEST(TakeOverTest, ASessionPostsInARingAgainAfterItsDaemonRestarts) {
  const std::string address = FreshAddress();
  FdStore systemd;
  ASSERT_TRUE(systemd.Start(Args(address)).ok());
  ASSERT_TRUE(systemd.WaitReady()) << systemd.Log();
  ClientOptions options;
  options.address = address;
  options.resume_timeout = absl::Seconds(20);
  Client producer = *Client::Connect(options);
  Client consumer = *Client::Connect(options);
  absl::StatusOr<Buffer> probe = producer.Create({.size_bytes = 4096});
  ASSERT_TRUE(probe.ok()) << probe.status();
  internal::ClientCore& core = probe->lease()->core();
  ASSERT_TRUE(core.has_release_ring());

  systemd.Kill();
  ASSERT_TRUE(systemd.Start(Args(address)).ok());
  ASSERT_TRUE(systemd.WaitReady()) << systemd.Log();
  absl::Status resumed = producer.Stats().status();
  if (absl::IsUnavailable(resumed)) resumed = producer.Stats().status();
  ASSERT_TRUE(resumed.ok()) << resumed;
  EXPECT_TRUE(core.has_release_ring());
  constexpr int kPuts = 5;
  for (int i = 0; i < kPuts; ++i) {
    const std::vector<uint8_t> bytes(kObject, 0x20 + i);
    absl::StatusOr<SealedRef> put =
        producer.Put(bytes.data(), {.size_bytes = kObject});
    ASSERT_TRUE(put.ok()) << put.status();
    absl::StatusOr<View> got = consumer.Get(put->ref());
    if (absl::IsUnavailable(got.status())) got = consumer.Get(put->ref());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(static_cast<const uint8_t*>(got->data())[kObject - 1], 0x20 + i);
  }
  ASSERT_TRUE(producer.Stats().ok());  // A call: the successor drains.
  bool listed = false;
  const v1::ListClientsResponse clients = testing::MonitorClients(address);
  for (const v1::ClientStatus& c : clients.clients()) {
    if (c.client_id() != producer.client_id()) continue;
    listed = true;
    EXPECT_TRUE(c.has_release_ring());
    EXPECT_GE(c.ring_messages(), uint64_t{kPuts});  // The successor's count.
  }
  EXPECT_TRUE(listed);
}

// A seal posted in the release ring that no daemon read before it was
// SIGKILLed, by a producer that then makes no call (it keeps its ref and
// waits for its consumer): the producer's client notices the hang-up
// itself and presents the seal to the successor, so the consumer's get of
// the ref succeeds with the bytes instead of waiting out its bound.
TEST(TakeOverTest, ASealPostedJustBeforeASigkillReachesTheSuccessorUnasked) {
  const std::string address = FreshAddress();
  FdStore systemd;
  ASSERT_TRUE(systemd.Start(Args(address)).ok());
  ASSERT_TRUE(systemd.WaitReady()) << systemd.Log();
  ClientOptions options;
  options.address = address;
  options.resume_timeout = absl::Seconds(20);
  // No stock: no refill call of the producer's drains its ring.
  options.stock_bytes = 0;
  Client producer = *Client::Connect(options);
  for (int round = 0; round < 3; ++round) {
    const std::vector<uint8_t> bytes(kObject, uint8_t(0x40 + round));
    CreateOptions co;
    co.size_bytes = kObject;
    absl::StatusOr<SealedRef> ref = producer.Put(bytes.data(), co);
    ASSERT_TRUE(ref.ok()) << ref.status();
    systemd.Kill();
    ASSERT_TRUE(systemd.Start(Args(address)).ok());
    ASSERT_TRUE(systemd.WaitReady()) << systemd.Log();
    Client consumer = *Client::Connect({.address = address});
    const absl::Time t0 = absl::Now();
    absl::StatusOr<View> v = consumer.Get(ref->ref());
    ASSERT_TRUE(v.ok()) << "round " << round << ": " << v.status();
    EXPECT_EQ(static_cast<const uint8_t*>(v->data())[kObject - 1],
              0x40 + round);
    fprintf(stderr, "round %d: the get waited %s\n", round,
            absl::FormatDuration(absl::Now() - t0).c_str());
  }
}

// A child forked while its parent held a view keeps the view's object
// through a fork hold; the hold's connection is handed on, so the object
// goes when the child exits, after the restart as before it.
void ForkedChildOutlivesRestart(const std::string& address,
                                const std::function<void()>& restart,
                                int children = 1) {
  ClientOptions options;
  options.address = address;
  options.resume_timeout = absl::Seconds(20);
  Client c = *Client::Connect(options);
  std::vector<uint8_t> bytes(kObject, 0x42);
  CreateOptions co;
  co.size_bytes = kObject;
  std::optional<View> view = *c.Get(c.Put(bytes.data(), co)->ref());
  int gate[2];
  ASSERT_EQ(pipe2(gate, O_CLOEXEC), 0);
  std::vector<pid_t> pids;
  for (int i = 0; i < children; ++i) {
    const pid_t child = fork();  // Takes a fork hold for the view.
    ASSERT_GE(child, 0);
    if (child == 0) {
      close(gate[1]);
      char b;
      (void)!read(gate[0], &b, 1);  // Until the parent closes its end.
      const bool same = static_cast<const uint8_t*>(view->data())[0] == 0x42;
      _exit(same ? 0 : 1);
    }
    pids.push_back(child);
  }
  close(gate[0]);
  view.reset();  // The parent lets go; the child's hold keeps the object.
  restart();
  ASSERT_NE(UsedBytes(address), 0u) << "the hold was lost in the restart";
  close(gate[1]);
  for (pid_t child : pids) {
    int status = 0;
    waitpid(child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  // The successor saw the children go: the object is freed, not stranded.
  ExpectEmptied(address);
}

TEST(TakeOverTest, AForkHoldEndsWithItsChildrenAfterATakeOver) {
  absl::StatusOr<std::unique_ptr<DaemonProcess>> first =
      DaemonProcess::Start({"--pool-size", "64MiB"});
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = (*first)->address();
  std::unique_ptr<DaemonProcess> next;
  ForkedChildOutlivesRestart(address, [&] {
    next =
        *DaemonProcess::Start({"--pool-size", "64MiB", "--take-over"}, address);
    EXPECT_EQ((*first)->process().Wait(), 0);
  });
}

// More fork holds than one message carries descriptors (253): a take-over
// hands them over in several, and none is stranded.
TEST(TakeOverTest, ThreeHundredForkHoldsEndWithTheirChildrenAfterATakeOver) {
  absl::StatusOr<std::unique_ptr<DaemonProcess>> first =
      DaemonProcess::Start({"--pool-size", "64MiB"});
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = (*first)->address();
  std::unique_ptr<DaemonProcess> next;
  ForkedChildOutlivesRestart(
      address,
      [&] {
        next = *DaemonProcess::Start({"--pool-size", "64MiB", "--take-over"},
                                     address);
        EXPECT_EQ((*first)->process().Wait(), 0);
      },
      300);
}

TEST(TakeOverTest, AForkHoldEndsWithItsChildrenAfterASigkillRestart) {
  const std::string address = FreshAddress();
  FdStore systemd;
  ASSERT_TRUE(systemd.Start(Args(address)).ok());
  ASSERT_TRUE(systemd.WaitReady()) << systemd.Log();
  ForkedChildOutlivesRestart(address, [&] {
    // The hold's connection went to the store when it was made.
    systemd.WaitReady(absl::Milliseconds(200));
    EXPECT_EQ(systemd.stored().size(), 5u);
    systemd.Kill();
    ASSERT_TRUE(systemd.Start(Args(address)).ok());
    ASSERT_TRUE(systemd.WaitReady()) << systemd.Log();
  });
}

TEST(TakeOverTest, ReloadReExecutesInPlaceKeepingEverything) {
  absl::StatusOr<std::unique_ptr<DaemonProcess>> d =
      DaemonProcess::Start({"--pool-size", "64MiB"});
  ASSERT_TRUE(d.ok()) << d.status();
  ClientOptions options;
  options.address = (*d)->address();
  Client c = *Client::Connect(options);
  std::vector<uint8_t> bytes(kObject, 0x77);
  CreateOptions co;
  co.size_bytes = kObject;
  SealedRef ref = *c.Put(bytes.data(), co);
  const uint64_t used = UsedBytes((*d)->address());
  // A connection the old image accepted: it ends when that image goes (the
  // signal is taken in the daemon's own time, and a call made before could
  // be answered by the old image, or a new client's connection broken by
  // the reload halfway).
  const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string path = (*d)->address().substr(5);
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
            0);
  // Accepted: gRPC's server speaks first (its HTTP/2 settings).
  pollfd accepted{probe, POLLIN, 0};
  ASSERT_EQ(poll(&accepted, 1, 20000), 1);
  (*d)->process().Signal(SIGHUP);
  pollfd gone{probe, POLLRDHUP, 0};
  ASSERT_EQ(poll(&gone, 1, 20000), 1);
  close(probe);
  // The same process serves on: the first call may find the connection
  // broken (UNAVAILABLE), none finds the session ended.
  absl::StatusOr<View> v = c.Get(ref.ref());
  if (!v.ok()) {
    EXPECT_TRUE(absl::IsUnavailable(v.status())) << v.status();
    EXPECT_FALSE(IsSessionEnded(v.status())) << v.status();
    v = c.Get(ref.ref());
  }
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(static_cast<const uint8_t*>(v->data())[0], 0x77);
  EXPECT_EQ(UsedBytes((*d)->address()), used);
  EXPECT_EQ(kill((*d)->process().pid(), 0), 0);
}

// A CreateRequest whose layout carries a field the daemon does not know,
// of `junk` bytes (protobuf keeps it in the parsed message).
v1::CreateRequest CreateWithJunkLayout(uint64_t session_id, size_t junk) {
  v1::CreateRequest req;
  req.set_session_id(session_id);
  req.mutable_layout()->set_dtype(v1::DTYPE_FLOAT32);
  req.mutable_layout()->add_shape(4);
  req.mutable_layout()
      ->GetReflection()
      ->MutableUnknownFields(req.mutable_layout())
      ->AddLengthDelimited(99, std::string(junk, 'x'));
  return req;
}

// [P23] What a client sends never spills out of its ledger record. On the
// old code a raw Create with a 1,800-byte layout was stored, and the next
// take-over refused the whole ledger ("object record 1 is out of bounds"):
// every session ended, the named object below was gone; one of a few MB
// crashed the daemon.
TEST(TakeOverTest, NoClientsLayoutSpoilsTheLedgerItsSuccessorAdopts) {
  absl::StatusOr<std::unique_ptr<DaemonProcess>> d =
      DaemonProcess::Start({"--pool-size", "64MiB"});
  ASSERT_TRUE(d.ok()) << d.status();
  const std::string address = (*d)->address();
  Client victim = *Client::Connect({.address = address});
  CreateOptions named;
  named.dtype = DType::kFloat32;
  named.shape = {4, 4};
  named.name = "victim";
  std::vector<float> values(16, 7.0f);
  ASSERT_TRUE(victim.Put(values.data(), named).ok());
  auto channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  std::unique_ptr<v1::ObjectStore::Stub> stub =
      v1::ObjectStore::NewStub(channel);
  grpc::ClientContext stream_ctx;
  auto stream = stub->Session(&stream_ctx);
  std::optional<v1::SessionOpened> opened =
      testing::OpenRawSession(stream.get(), "attacker");
  ASSERT_TRUE(opened.has_value());
  for (size_t junk : {size_t{1800}, size_t{3} << 20}) {
    grpc::ClientContext ctx;
    v1::CreateResponse resp;
    const grpc::Status st = stub->Create(
        &ctx, CreateWithJunkLayout(opened->session_id(), junk), &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << junk << ": " << st.error_message();
    EXPECT_TRUE(absl::StrContains(st.error_message(), "layout"))
        << st.error_message();
  }
  EXPECT_EQ(kill((*d)->process().pid(), 0), 0);
  absl::StatusOr<std::unique_ptr<DaemonProcess>> next =
      DaemonProcess::Start({"--pool-size", "64MiB", "--take-over"}, address);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ((*d)->process().Wait(), 0);
  // The successor adopted the ledger: the same session and object.
  absl::StatusOr<View> v = victim.Get("victim");
  if (!v.ok() && absl::IsUnavailable(v.status())) v = victim.Get("victim");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->shape(), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(static_cast<const float*>(v->data())[15], 7.0f);
  EXPECT_EQ(victim.daemon_epoch(),
            Client::Connect({.address = address})->daemon_epoch());
  stream->WritesDone();
  stream_ctx.TryCancel();
}

// A take-over hands over only once the successor says it serves (as
// Envoy's hot restart keeps the old process until the new one is ready): a
// successor that takes the descriptors and dies before that leaves the
// predecessor serving every session, view and name, and accepting new
// clients. On the old code the predecessor exited as soon as the
// descriptors were sent, and every session ended with it.
TEST(TakeOverTest,
     ASuccessorThatDiesBeforeItServesLeavesThePredecessorServing) {
  absl::StatusOr<std::unique_ptr<DaemonProcess>> d =
      DaemonProcess::Start({"--pool-size", "64MiB"});
  ASSERT_TRUE(d.ok()) << d.status();
  const std::string address = (*d)->address();
  Client holder = *Client::Connect({.address = address});
  CreateOptions named;
  named.size_bytes = kObject;
  named.name = "survivor";
  std::vector<uint8_t> bytes(kObject, 0x5a);
  ASSERT_TRUE(holder.Put(bytes.data(), named).ok());
  View view = *holder.Get("survivor");
  const uint64_t used = UsedBytes(address);
  daemon::DaemonConfig config;
  config.listen = address;
  config.pools.push_back({"default", uint64_t{64} << 20});
  for (int round = 0; round < 3; ++round) {
    // As `shmtensord --take-over` does up to its adoption; then it dies:
    // its connection and every descriptor it was handed close.
    absl::StatusOr<daemon::TakeOverGrant> grant =
        daemon::RequestTakeOver(config);
    ASSERT_TRUE(grant.ok()) << grant.status();
    EXPECT_GT(grant->fds.size(), 3u);
    grant = absl::UnknownError("died");
    // The predecessor serves on: the same session, view and name.
    absl::StatusOr<View> again = holder.Get("survivor");
    if (!again.ok() && absl::IsUnavailable(again.status())) {
      again = holder.Get("survivor");
    }
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->data(), view.data());
    EXPECT_EQ(static_cast<const uint8_t*>(view.data())[kObject - 1], 0x5a);
    // New clients are accepted, and served.
    absl::StatusOr<Client> fresh = Client::Connect({.address = address});
    ASSERT_TRUE(fresh.ok()) << fresh.status();
    EXPECT_EQ(fresh->daemon_epoch(), holder.daemon_epoch());
    ASSERT_TRUE(fresh->Get("survivor").ok());
    EXPECT_EQ(kill((*d)->process().pid(), 0), 0);
  }
  EXPECT_EQ(UsedBytes(address), used);
  // A successor that does say it serves takes over as ever.
  absl::StatusOr<std::unique_ptr<DaemonProcess>> next =
      DaemonProcess::Start({"--pool-size", "64MiB", "--take-over"}, address);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ((*d)->process().Wait(), 0);
  absl::StatusOr<View> after = holder.Get("survivor");
  if (!after.ok() && absl::IsUnavailable(after.status())) {
    after = holder.Get("survivor");
  }
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->data(), view.data());
}

// A successor of an older version asks without TakeOver.says_ready: it
// adopts in place and never says "ready", so its predecessor hands over the
// one-phase way it knows (no awaits_ready; it exits once the replies are
// sent) instead of waiting for a word that never comes.
TEST(TakeOverTest, AnOlderSuccessorGetsTheOnePhaseHandOver) {
  absl::StatusOr<std::unique_ptr<DaemonProcess>> d =
      DaemonProcess::Start({"--pool-size", "64MiB"});
  ASSERT_TRUE(d.ok()) << d.status();
  const std::string path = (*d)->socket_path() + ".fd";
  const int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  v1::DescriptorRequest request;
  v1::TakeOver::Pool* pool = request.mutable_take_over()->add_pools();
  pool->set_name("default");
  pool->set_size_bytes(uint64_t{64} << 20);
  pool->set_kind(v1::MEMORY_KIND_HOST);
  const std::string bytes = request.SerializeAsString();
  ASSERT_EQ(send(sock, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
  char buf[16384];
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 253)];
  iovec iov{buf, sizeof(buf)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  ASSERT_GT(n, 0);
  v1::DescriptorReply reply;
  ASSERT_TRUE(reply.ParseFromArray(buf, static_cast<int>(n)));
  EXPECT_TRUE(reply.granted());
  EXPECT_FALSE(reply.awaits_ready());
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
       c = CMSG_NXTHDR(&msg, c)) {
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      close(fd);
    }
  }
  // It exits without waiting (the 60 s wait for "ready" is not for it).
  const absl::Time t0 = absl::Now();
  EXPECT_EQ((*d)->process().Wait(), 0);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(30));
  close(sock);
}

TEST(TakeOverTest, RefusedFromAnotherUidAndForAnotherPoolSize) {
  absl::StatusOr<std::unique_ptr<DaemonProcess>> d = DaemonProcess::StartShared(
      "[[pool]]\nname = \"default\"\n"
      "size = \"64MiB\"\nusers = [\"nobody\"]\n");
  ASSERT_TRUE(d.ok()) << d.status();
  const std::string address = (*d)->address();
  // A pool that would change: refused, naming it; the daemon serves on.
  {
    absl::StatusOr<std::unique_ptr<testing::Subprocess>> p =
        testing::Subprocess::Spawn({DaemonPath(), "--listen", address,
                                    "--pool-size", "128MiB", "--take-over"});
    ASSERT_TRUE(p.ok());
    const std::string out = (*p)->ReadAll();
    EXPECT_NE((*p)->Wait(), 0);
    EXPECT_TRUE(absl::StrContains(out, "pool 'default'")) << out;
  }
  // Another user: refused by the kernel's word (SO_PEERCRED).
  if (geteuid() == 0) {
    absl::StatusOr<std::unique_ptr<testing::Subprocess>> p =
        testing::Subprocess::Spawn({"/usr/bin/setpriv", "--reuid=65534",
                                    "--regid=65534", "--clear-groups",
                                    DaemonPath(), "--listen", address,
                                    "--pool-size", "64MiB", "--take-over"});
    ASSERT_TRUE(p.ok());
    const std::string out = (*p)->ReadAll();
    EXPECT_NE((*p)->Wait(), 0);
    EXPECT_TRUE(absl::StrContains(out, "neither root nor")) << out;
  }
  EXPECT_EQ(kill((*d)->process().pid(), 0), 0);
  EXPECT_NE(UsedBytes(address), UINT64_MAX);
}

TEST(TakeOverTest, ABadLedgerIsRefusedAndTheDaemonStartsFresh) {
  const std::string address = FreshAddress();
  FdStore systemd;
  // Garbage where the ledger should be.
  const int bad = memfd_create("not-a-ledger", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(bad, 1 << 20), 0);
  ASSERT_EQ(pwrite(bad, "garbage", 7, 0), 7);
  ASSERT_TRUE(systemd
                  .Start(Args(address, {"--log-level", "info"}),
                         {{"shmtensor.ledger", bad}})
                  .ok());
  ASSERT_TRUE(systemd.WaitReady()) << systemd.Log();
  const std::string log = systemd.Log();
  EXPECT_TRUE(absl::StrContains(log, "not adopting")) << log;
  EXPECT_TRUE(absl::StrContains(log, "magic")) << log;
  EXPECT_NE(UsedBytes(address), UINT64_MAX);
  close(bad);
}

}  // namespace
}  // namespace shmtensor
