// The fast path (docs/shm_layout.md, "Stock and one-way seals"): puts that
// take a buffer from the client's stock and seal it one way, gets that wait
// for a seal on its way or share a lease the process holds, and the batched
// PutMany/GetMany. Each test is the way a guarantee could break under it:
// a get racing a seal, a creator that dies or never seals, a share kept
// while everything else lets go, a hoarding stock, a hostile seal.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/client_core.h"
#include "client/lease.h"
#include "client/ref_proto.h"
#include "client/stock.h"
#include "common/release_ring.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "shmtensor/client.h"
#include "shmtensor/errors.h"
#include "shmtensor/v1/shmtensor.grpc.pb.h"
#include "tests/break_connection.h"
#include "tests/ref_hex.h"
#include "tests/test_util.h"

namespace shmtensor {
namespace {

constexpr uint64_t kObject = 64 << 10;

bool AllBytes(const View& v, uint8_t value) {
  const auto* p = static_cast<const uint8_t*>(v.data());
  for (uint64_t i = 0; i < v.size_bytes(); ++i) {
    if (p[i] != value) return false;
  }
  return true;
}

// "ref <hex> [...]" from a child: the ref.
ObjectRef RefOfLine(const std::string& line) {
  std::vector<std::string> f = absl::StrSplit(line, ' ');
  EXPECT_GE(f.size(), 2u) << line;
  absl::StatusOr<ObjectRef> ref = testing::RefFromHex(f.size() > 1 ? f[1] : "");
  EXPECT_TRUE(ref.ok()) << line;
  return ref.value_or(ObjectRef{});
}

// Sets the writer's poll of the sessions opened while it lives
// (internal::SetPostedPollForTesting); the shipped poll again after.
class ScopedPostedPoll {
 public:
  explicit ScopedPostedPoll(absl::Duration poll) {
    internal::SetPostedPollForTesting(poll);
  }
  ~ScopedPostedPoll() {
    internal::SetPostedPollForTesting(internal::kPostedPoll);
  }
  ScopedPostedPoll(const ScopedPostedPoll&) = delete;
  ScopedPostedPoll& operator=(const ScopedPostedPoll&) = delete;
};

class FastPathTest : public testing::DaemonTest {
 protected:
  // A client whose writer thread polls once an hour: what it posts in its
  // release ring stays there until the daemon reads the ring.
  Client QuietClient() {
    ScopedPostedPoll hourly(absl::Hours(1));
    return Connect();
  }
  // A stub on a connection of its own (channels with the same target and
  // arguments share one otherwise), connected (so the daemon has accepted
  // it) when this returns.
  std::unique_ptr<v1::ObjectStore::Stub> ConnectedStub() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
        daemon_->address(), grpc::InsecureChannelCredentials(), args);
    EXPECT_TRUE(channel->WaitForConnected(std::chrono::system_clock::now() +
                                          std::chrono::seconds(10)));
    return v1::ObjectStore::NewStub(channel);
  }
  // Leases `c`'s session holds.
  uint64_t LeasesOf(const Client& c) {
    return testing::MonitorLeasesOf(daemon_->address(), c.client_id());
  }
};

// A creator's release of its own object is posted in its release ring,
// where nothing wakes the daemon for it: a create in another session that
// needs the memory it frees pulls it, with no wait and no call of the
// creator's.
TEST_F(FastPathTest,
       ACreatorsPostedReleaseFreesTheMemoryACreateElsewhereNeeds) {
  Client other = Connect();
  constexpr uint64_t kBig = 48 << 20;  // Of a 64 MiB pool: one at a time.
  absl::StatusOr<Buffer> big = client_->Create({.size_bytes = kBig});
  ASSERT_TRUE(big.ok()) << big.status();
  ASSERT_TRUE(big->lease()->core().has_release_ring());
  absl::StatusOr<SealedRef> sealed = big->Seal();
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  sealed->Reset();
  absl::StatusOr<Buffer> again = other.Create({.size_bytes = kBig});
  ASSERT_TRUE(again.ok()) << again.status();
}

// A reader's release is posted in its own release ring too (nobody is
// woken for it): the memory it frees is found by a create elsewhere that
// needs it, with no call of the reader's, and the daemon counts it as a
// ring message of the reader's. (The reader's writer thread polls once an
// hour here, so that it cannot write a posted release on the stream first.)
TEST_F(FastPathTest, AReadersPostedReleaseFreesTheMemoryACreateElsewhereNeeds) {
  std::optional<Client> reader;
  {
    ScopedPostedPoll hourly(absl::Hours(1));
    reader = Connect();
  }
  Client other = Connect();
  constexpr uint64_t kBig = 48 << 20;  // Of a 64 MiB pool: one at a time.
  const std::vector<uint8_t> threes(kBig, 3);
  for (int round = 0; round < 3; ++round) {
    absl::StatusOr<SealedRef> put =
        client_->Put(threes.data(), {.size_bytes = kBig});
    ASSERT_TRUE(put.ok()) << put.status();
    absl::StatusOr<View> view = reader->Get(put->ref());
    ASSERT_TRUE(view.ok()) << view.status();
    ASSERT_TRUE(view->lease()->core().has_release_ring());
    put->Reset();
    view = absl::CancelledError("released");
    absl::StatusOr<Buffer> again = other.Create({.size_bytes = kBig});
    ASSERT_TRUE(again.ok()) << again.status();
  }
  uint64_t ring_messages = 0;
  const v1::ListClientsResponse clients =
      testing::MonitorClients(daemon_->address());
  for (const v1::ClientStatus& c : clients.clients()) {
    if (c.client_id() == reader->client_id()) {
      ring_messages = c.ring_messages();
    }
  }
  // Its views' releases, and nothing else. (No create here waits, so none
  // asks a ring for a nudge, which would send the next post on the stream
  // as well.)
  EXPECT_EQ(ring_messages, 3u);
}

// A create that waits for memory a reader holds is woken when the reader
// lets go, although the release is posted, not written: the wait asked
// every ring for a nudge, so the post goes on the stream as well. The
// reader's writer thread polls once an hour here (every 250 ms as
// shipped), so only the nudge can bring the release before the create's
// deadline, whose last try would pull it from the ring: the create must
// return long before that deadline (without the nudge, at the deadline).
// The reader lets go only once the daemon counts the create as waiting.
TEST_F(FastPathTest, AReadersReleasePostedWhileACreateWaitsWakesIt) {
  std::optional<Client> reader;
  {
    ScopedPostedPoll hourly(absl::Hours(1));
    reader = Connect();
  }
  Client other = Connect();
  constexpr uint64_t kBig = 48 << 20;
  const std::vector<uint8_t> fours(kBig, 4);
  absl::StatusOr<SealedRef> put =
      client_->Put(fours.data(), {.size_bytes = kBig});
  ASSERT_TRUE(put.ok()) << put.status();
  absl::StatusOr<View> view = reader->Get(put->ref());
  ASSERT_TRUE(view.ok()) << view.status();
  put->Reset();
  std::thread reader_done([&] {
    const absl::Time until = absl::Now() + absl::Seconds(20);
    while (testing::MonitorStatus(daemon_->address()).waiters() == 0 &&
           absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_GT(testing::MonitorStatus(daemon_->address()).waiters(), 0u);
    EXPECT_TRUE(AllBytes(*view, 4));  // Nobody wrote it while it was held.
    view = absl::CancelledError("released");
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<Buffer> again =
      other.Create({.size_bytes = kBig, .timeout = absl::Seconds(60)});
  const absl::Duration waited = absl::Now() - start;
  reader_done.join();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_LT(waited, absl::Seconds(30));
}

// A get that reaches the daemon before the creator's seal (the ref went
// ahead of it) waits for the seal, and then sees the sealed bytes.
TEST_F(FastPathTest, AGetRacingTheSealWaitsForIt) {
  Client consumer = Connect();
  absl::StatusOr<Buffer> buf = client_->Create({.size_bytes = kObject});
  ASSERT_TRUE(buf.ok()) << buf.status();
  const ObjectRef ref = buf->info().ref;
  std::atomic<bool> done{false};
  absl::StatusOr<View> got = absl::UnknownError("not yet");
  std::thread getter([&] {
    got = consumer.Get(ref);
    done = true;
  });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(done.load()) << got.status();  // Waiting for the seal.
  const std::vector<uint8_t> sevens(kObject, 7);
  ASSERT_TRUE(buf->CopyFrom(sevens.data(), sevens.size()).ok());
  absl::StatusOr<SealedRef> sealed = buf->Seal();
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  EXPECT_EQ(sealed->ref(), ref);  // The ref was valid from the start.
  getter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->writable());
  EXPECT_TRUE(AllBytes(*got, 7));
}

// A put's seal goes by the session's release ring: another process's get
// finds it there (no stream write, nobody woken), and the daemon says so.
// A get that waited for it (AGetRacingTheSealWaitsForIt) was nudged.
TEST_F(FastPathTest, APutsSealReachesAnotherProcessThroughTheRing) {
  Client consumer = Connect();
  const std::vector<uint8_t> nines(kObject, 9);
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<SealedRef> put =
        client_->Put(nines.data(), {.size_bytes = kObject});
    ASSERT_TRUE(put.ok()) << put.status();
    absl::StatusOr<View> got = consumer.Get(put->ref());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(AllBytes(*got, 9));
  }
  uint64_t ring_messages = 0;
  bool has_ring = false;
  const v1::ListClientsResponse clients =
      testing::MonitorClients(daemon_->address());
  for (const v1::ClientStatus& c : clients.clients()) {
    if (c.client_id() != client_->client_id()) continue;
    has_ring = c.has_release_ring();
    ring_messages = c.ring_messages();
  }
  EXPECT_TRUE(has_ring);
  EXPECT_GE(ring_messages, 1u);
}

// The ring outlives a broken connection: the daemon drops the ring of a
// session it resumes, and the client asks it for a new one, so a put's
// seal and a release still go by a ring (no stream write, nobody woken)
// after the resume, and another process's get still finds the seal.
TEST_F(FastPathTest, AResumedSessionPostsInANewRing) {
  Client consumer = Connect();
  absl::StatusOr<Buffer> probe = client_->Create({.size_bytes = 4096});
  ASSERT_TRUE(probe.ok()) << probe.status();
  internal::ClientCore& core = probe->lease()->core();
  ASSERT_TRUE(core.has_release_ring());
  auto ring_of = [&](uint64_t client_id, bool* has_ring) {
    const v1::ListClientsResponse clients =
        testing::MonitorClients(daemon_->address());
    for (const v1::ClientStatus& c : clients.clients()) {
      if (c.client_id() != client_id) continue;
      *has_ring = c.has_release_ring();
      return c.ring_messages();
    }
    ADD_FAILURE() << "no client " << client_id;
    return uint64_t{0};
  };
  ASSERT_GT(testing::BreakDaemonConnections(daemon_->address(),
                                            testing::BreakMode::kShutdown),
            0);
  // The first call finds the connection broken and resumes (it may fail
  // UNAVAILABLE once, saying so).
  absl::Status resumed = client_->Stats().status();
  if (absl::IsUnavailable(resumed)) resumed = client_->Stats().status();
  ASSERT_TRUE(resumed.ok()) << resumed;
  EXPECT_TRUE(core.has_release_ring());
  bool has_ring = false;
  const uint64_t before = ring_of(client_->client_id(), &has_ring);
  EXPECT_TRUE(has_ring);
  constexpr int kPuts = 5;
  for (int i = 0; i < kPuts; ++i) {
    const std::vector<uint8_t> bytes(kObject, 0x40 + i);
    absl::StatusOr<SealedRef> put =
        client_->Put(bytes.data(), {.size_bytes = kObject});
    ASSERT_TRUE(put.ok()) << put.status();
    absl::StatusOr<View> got = consumer.Get(put->ref());
    if (absl::IsUnavailable(got.status())) got = consumer.Get(put->ref());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(AllBytes(*got, 0x40 + i));
  }
  ASSERT_TRUE(client_->Stats().ok());  // A call: the daemon drains.
  // Each put's seal at least, and each ref's release, from the new ring.
  EXPECT_GE(ring_of(client_->client_id(), &has_ring) - before, uint64_t{kPuts});
  EXPECT_TRUE(has_ring);
}

// Puts, gets and releases from another thread while the process's
// connections break again and again (each break a resume of both sessions,
// each resume a new ring, and past the daemon's cap none): every get reads
// the bytes its put wrote, and once every ref and view is gone the pool
// holds nothing, so no seal or release was lost in a ring the client
// swapped or gave up.
TEST_F(FastPathTest, PutsAndReleasesRacingResumesLoseNothing) {
  Client consumer = Connect();
  std::atomic<bool> stop{false};
  std::atomic<int> rounds{0}, mismatches{0}, failures{0};
  std::thread load([&] {
    for (int i = 0; !stop; ++i) {
      const std::vector<uint8_t> bytes(kObject, static_cast<uint8_t>(i));
      absl::StatusOr<SealedRef> put =
          client_->Put(bytes.data(), {.size_bytes = kObject});
      for (int tries = 0; absl::IsUnavailable(put.status()) && tries < 3;
           ++tries) {
        put = client_->Put(bytes.data(), {.size_bytes = kObject});
      }
      if (!put.ok()) {
        ++failures;
        continue;
      }
      absl::StatusOr<View> got = consumer.Get(put->ref());
      for (int tries = 0; absl::IsUnavailable(got.status()) && tries < 3;
           ++tries) {
        got = consumer.Get(put->ref());
      }
      if (!got.ok()) {
        ++failures;
        continue;
      }
      if (!AllBytes(*got, static_cast<uint8_t>(i))) ++mismatches;
      ++rounds;
    }
  });
  constexpr int kBreaks = kMaxRingsPerSession + 2;
  for (int k = 0; k < kBreaks; ++k) {
    const int seen = rounds.load();
    while (rounds.load() < seen + 20) absl::SleepFor(absl::Milliseconds(1));
    testing::BreakDaemonConnections(daemon_->address(),
                                    testing::BreakMode::kShutdown);
  }
  const int seen = rounds.load();
  while (rounds.load() < seen + 20) absl::SleepFor(absl::Milliseconds(1));
  stop = true;
  load.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(failures.load(), 0);
  ASSERT_TRUE(client_->Stats().ok());
  ASSERT_TRUE(consumer.Stats().ok());
  EXPECT_EQ(Used(), 0u);
}

// A call that reaches the daemon on a connection older than the one its
// session's stream opened or last resumed on (in flight across a resume,
// or waiting for a seal and tried again after it; the test above breaks
// connections under such calls) is refused UNAVAILABLE: a lease it granted
// would go to a connection the client has left, and be held, unknown to
// the client, until the session ends. Here the older connection is one the
// process opened before the session's; one opened after it serves.
TEST_F(FastPathTest, ACallOnAConnectionOlderThanItsSessionsIsRefused) {
  auto older = ConnectedStub();
  Client reader = Connect();
  auto newer = ConnectedStub();
  const std::vector<uint8_t> threes(kObject, 3);
  absl::StatusOr<SealedRef> put =
      client_->Put(threes.data(), {.size_bytes = kObject});
  ASSERT_TRUE(put.ok()) << put.status();
  v1::GetRequest req;
  req.set_session_id(reader.session_id());
  *req.mutable_ref() = internal::ToProto(put->ref());
  {
    v1::GetResponse resp;
    grpc::ClientContext ctx;
    const grpc::Status s = older->Get(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_TRUE(absl::StrContains(s.error_message(), "newer connection"))
        << s.error_message();
  }
  EXPECT_EQ(LeasesOf(reader), 0u);  // Nothing granted.
  v1::GetResponse resp;
  grpc::ClientContext ctx;
  const grpc::Status s = newer->Get(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(LeasesOf(reader), 1u);
  v1::ReleaseRequest release;
  release.set_session_id(reader.session_id());
  release.set_lease_id(resp.lease_id());
  v1::ReleaseResponse released;
  grpc::ClientContext release_ctx;
  ASSERT_TRUE(newer->Release(&release_ctx, release, &released).ok());
}

// The race the check closes, made certain: a Get waits at the daemon (for
// a name not bound yet) on the connection its session opened on; the
// session is resumed on a newer connection, with an account of no lease;
// then the name is bound and the waiting Get is tried again. It is
// refused, and the session holds no lease. (Served, it would grant a lease
// the resumed session's client never learns of: its answer goes to the
// connection the session left.)
TEST_F(FastPathTest, AWaitingGetTriedAgainAfterAResumeGrantsNothing) {
  auto first = ConnectedStub();
  grpc::ClientContext open_ctx;
  auto stream = first->Session(&open_ctx);
  std::optional<v1::SessionOpened> opened =
      testing::OpenRawSession(stream.get(), "raw");
  ASSERT_TRUE(opened.has_value());
  const uint64_t session = opened->session_id();
  const uint64_t client_id = opened->client_id();
  grpc::Status got;
  std::thread waiter([&] {
    v1::GetRequest req;
    req.set_session_id(session);
    req.set_name("late");
    req.set_timeout_ms(30000);
    v1::GetResponse resp;
    grpc::ClientContext ctx;
    got = first->Get(&ctx, req, &resp);
  });
  const absl::Time until = absl::Now() + absl::Seconds(20);
  while (testing::MonitorStatus(daemon_->address()).waiters() == 0 &&
         absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_GT(testing::MonitorStatus(daemon_->address()).waiters(), 0u);
  auto second = ConnectedStub();
  grpc::ClientContext resume_ctx;
  auto resumed = second->Session(&resume_ctx);
  std::optional<v1::SessionOpened> reopened = testing::OpenRawSession(
      resumed.get(), "raw", session, /*present_leases=*/true);  // Holds none.
  ASSERT_TRUE(reopened.has_value());
  EXPECT_TRUE(reopened->leases_reconciled());
  const std::vector<uint8_t> sixes(kObject, 6);
  ASSERT_TRUE(
      client_->Put(sixes.data(), {.size_bytes = kObject, .name = "late"}).ok());
  waiter.join();
  EXPECT_EQ(got.error_code(), grpc::StatusCode::UNAVAILABLE)
      << got.error_message();
  EXPECT_EQ(testing::MonitorLeasesOf(daemon_->address(), client_id), 0u);
  open_ctx.TryCancel();
  resume_ctx.TryCancel();
  stream->Finish().ok();
  resumed->Finish().ok();
}

// GetHeld answers without the daemon, and only for what this process
// holds: a share of its lease, never a transfer or another's object.
TEST_F(FastPathTest, GetHeldSharesOnlyALeaseThisProcessHolds) {
  Client consumer = Connect();
  const std::vector<uint8_t> fives(kObject, 5);
  absl::StatusOr<SealedRef> put =
      client_->Put(fives.data(), {.size_bytes = kObject});
  ASSERT_TRUE(put.ok()) << put.status();
  const uint64_t leases = LeasesOf(*client_);
  std::optional<View> held = client_->GetHeld(put->ref());
  ASSERT_TRUE(held.has_value());
  EXPECT_TRUE(AllBytes(*held, 5));
  EXPECT_EQ(LeasesOf(*client_), leases);  // A share: no new lease.
  EXPECT_FALSE(consumer.GetHeld(put->ref()).has_value());  // Not its lease.
  absl::StatusOr<SealedRef> xfer =
      client_->Put(fives.data(), {.size_bytes = kObject}, /*exclusive=*/true);
  ASSERT_TRUE(xfer.ok()) << xfer.status();
  EXPECT_FALSE(client_->GetHeld(xfer->ref()).has_value());
  // The share keeps the object when the put's ref goes.
  const uint64_t before_reset = LeasesOf(*client_);
  put->Reset();
  EXPECT_TRUE(AllBytes(*held, 5));
  EXPECT_EQ(LeasesOf(*client_), before_reset);
}

// A creator that discards the buffer, or is SIGKILLed, before it seals:
// the waiting get fails at once, as a stale ref, never waits on or sees
// the bytes.
TEST_F(FastPathTest, AGetOfABufferNeverSealedFailsWhenItsCreatorLetsGo) {
  Client consumer = Connect();
  {
    absl::StatusOr<Buffer> buf = client_->Create({.size_bytes = kObject});
    ASSERT_TRUE(buf.ok()) << buf.status();
    const ObjectRef ref = buf->info().ref;
    absl::StatusOr<View> got = absl::UnknownError("not yet");
    std::thread getter([&] { got = consumer.Get(ref); });
    absl::SleepFor(absl::Milliseconds(200));
    const absl::Time discarded = absl::Now();
    ASSERT_TRUE(buf->Discard().ok());
    getter.join();
    EXPECT_LT(absl::Now() - discarded, absl::Seconds(2));
    ASSERT_FALSE(got.ok());
    EXPECT_TRUE(IsStaleReference(got.status())) << got.status();
    EXPECT_TRUE(absl::StrContains(got.status().message(), "never sealed"))
        << got.status();
  }
  std::unique_ptr<testing::Subprocess> child = Child({"unsealed"});
  absl::StatusOr<std::string> line = child->ReadLine();
  ASSERT_TRUE(line.ok()) << line.status();
  const ObjectRef ref = RefOfLine(*line);
  absl::StatusOr<View> got = absl::UnknownError("not yet");
  std::thread getter([&] { got = consumer.Get(ref); });
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time killed = absl::Now();
  child->Signal(SIGKILL);
  child->Wait();
  getter.join();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(2));
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(IsStaleReference(got.status())) << got.status();
  EXPECT_EQ(Used(), 0u);
}

// A creator SIGKILLed while it holds stock, sealed objects and a buffer
// taken from the stock: the daemon reclaims all but what readers hold, and
// no reader sees its bytes change however the memory is reused.
TEST_F(FastPathTest, ACreatorKilledWithStockLosesItAndReadersKeepTheirBytes) {
  std::unique_ptr<testing::Subprocess> child = Child({"stock"});
  std::vector<std::pair<View, uint8_t>> views;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::string> line = child->ReadLine();
    ASSERT_TRUE(line.ok()) << line.status();
    absl::StatusOr<View> v = client_->Get(RefOfLine(*line));
    ASSERT_TRUE(v.ok()) << v.status() << " " << *line;
    views.emplace_back(*std::move(v), static_cast<uint8_t>(21 + i));
  }
  absl::StatusOr<std::string> stock = child->ReadLine();
  ASSERT_TRUE(stock.ok()) << stock.status();
  ASSERT_TRUE(absl::StartsWith(*stock, "stock ")) << *stock;
  EXPECT_NE(*stock, "stock 0");  // It held stock when killed.
  EXPECT_GT(client_->Stats()->pools[0].stock_bytes, 0u);
  child->Signal(SIGKILL);
  child->Wait();
  const absl::Time killed = absl::Now();
  StoreStats after;
  do {
    after = *client_->Stats();
    if (after.pools[0].used_bytes == 3 * kObject) break;
    absl::SleepFor(absl::Milliseconds(5));
  } while (absl::Now() - killed < absl::Seconds(1));
  EXPECT_EQ(after.pools[0].used_bytes, 3 * kObject);  // The views' only.
  EXPECT_EQ(after.pools[0].stock_bytes, 0u);
  // The freed memory goes round again, under this process's puts.
  std::vector<uint8_t> junk(kObject, 0xEE);
  for (int i = 0; i < 64; ++i) {
    ASSERT_TRUE(client_->Put(junk.data(), {.size_bytes = kObject}).ok());
  }
  for (const auto& [v, byte] : views) EXPECT_TRUE(AllBytes(v, byte));
}

// A get of an object the process holds a view of is a share of that view's
// lease: no round trip, no second lease; it keeps the bytes when every
// other holder (the first view, the creator's ref) has gone, and the
// object goes with it.
TEST_F(FastPathTest, AShareOutlivesTheOtherHoldersAndTheObjectGoesWithIt) {
  Client consumer = Connect();
  std::vector<uint8_t> fives(kObject, 5);
  absl::StatusOr<SealedRef> ref =
      client_->Put(fives.data(), {.size_bytes = kObject});
  ASSERT_TRUE(ref.ok()) << ref.status();
  std::optional<View> first = *consumer.Get(ref->ref());
  const uint64_t leases = LeasesOf(consumer);
  absl::StatusOr<View> second = consumer.Get(ref->ref());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->data(), first->data());
  EXPECT_EQ(LeasesOf(consumer), leases);  // Shared, not a new lease.
  // A ref with another nonce is no share of it: the daemon refuses it.
  ObjectRef forged = ref->ref();
  forged.nonce ^= 1;
  EXPECT_EQ(consumer.Get(forged).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(first->Release().ok());  // Not the last holder: nothing sent.
  first.reset();
  ASSERT_TRUE(ref->Release().ok());
  std::vector<uint8_t> junk(kObject, 0xEE);
  for (int i = 0; i < 32; ++i) {
    ASSERT_TRUE(client_->Put(junk.data(), {.size_bytes = kObject}).ok());
  }
  EXPECT_TRUE(AllBytes(*second, 5));
  EXPECT_EQ(Used(), kObject);
  ASSERT_TRUE(second->Release().ok());  // The last: waits for the daemon.
  EXPECT_EQ(Used(), 0u);
  // Gone: a get of its ref is refused by the daemon, never a share.
  EXPECT_TRUE(IsStaleReference(consumer.Get(ref->ref()).status()));
}

// A one-way seal the daemon must refuse (a layout past the buffer's
// capacity, as a hostile or broken client may send) discards the object:
// its waiting get fails instead of waiting on or seeing a wrong size.
TEST_F(FastPathTest, ARefusedOneWaySealDiscardsItsObject) {
  Client consumer = Connect();
  absl::StatusOr<Buffer> buf = client_->Create({.size_bytes = kObject});
  ASSERT_TRUE(buf.ok()) << buf.status();
  const ObjectRef ref = buf->info().ref;
  absl::StatusOr<View> got = absl::UnknownError("not yet");
  std::thread getter([&] { got = consumer.Get(ref); });
  absl::SleepFor(absl::Milliseconds(100));
  ObjectInfo too_big = buf->info();
  too_big.size_bytes = 64 * kObject;
  ASSERT_TRUE(buf->lease()
                  ->core()
                  .SendSeals({internal::OneWaySealOf(buf->lease()->id(),
                                                     too_big, false)})
                  .ok());
  getter.join();
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(IsStaleReference(got.status())) << got.status();
}

// What a client posts in its release ring for leases that are not its
// own is refused, and it cannot flood the daemon's log with the refusals:
// they are logged as its other errors are, a few lines a second, however
// often it posts and calls. (Each call drains the ring; before the
// refusals went through the service's rate limit, each drain wrote a line.)
TEST_F(FastPathTest, RefusedRingPostsCannotFloodTheDaemonsLog) {
  Client victim = Connect();
  absl::StatusOr<Buffer> theirs = victim.Create({.size_bytes = kObject});
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  absl::StatusOr<Buffer> mine = client_->Create({.size_bytes = kObject});
  ASSERT_TRUE(mine.ok()) << mine.status();
  internal::ClientCore& core = mine->lease()->core();
  ASSERT_TRUE(core.has_release_ring());
  constexpr int kPosts = 300;
  const absl::Time start = absl::Now();
  for (int i = 0; i < kPosts; ++i) {
    ASSERT_TRUE(core.SendSeals({internal::OneWaySealOf(theirs->lease()->id(),
                                                       theirs->info(), false)})
                    .ok());
    ASSERT_TRUE(client_->Stats().ok());  // A call: the daemon drains.
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  int lines = 0;
  while (true) {
    absl::StatusOr<std::string> line =
        daemon_->process().ReadLine(absl::Milliseconds(500));
    if (!line.ok()) break;
    if (absl::StrContains(*line, "release ring")) ++lines;
  }
  EXPECT_GE(lines, 1);  // The refusal is logged,
  // at most 20 lines a second (LogLimiter) of the run's.
  EXPECT_LE(lines, 20 * (static_cast<int>(seconds) + 2))
      << lines << " lines for " << kPosts << " refused posts in " << seconds
      << " s";
  // None of the posts acted for the victim: its buffer is still its to seal.
  absl::StatusOr<SealedRef> sealed = theirs->Seal();
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  EXPECT_TRUE(victim.Get(sealed->ref()).ok());
}

// A producer that puts as fast as it can outruns the refill thread's call.
// The take that finds its class empty then waits (for the refill's call, or
// another thread's take's) for that call's buffers
// instead of making a call of its own, so every buffer the daemon makes for
// the stock serves a put: none comes back as surplus (a create and a
// release for the daemon, for nothing). The stock stays within its cap.
TEST_F(FastPathTest, PutsBackToBackMakeNoStockBufferInVain) {
  absl::StatusOr<Client> c = Client::Connect({.address = daemon_->address()});
  ASSERT_TRUE(c.ok()) << c.status();
  constexpr uint64_t kSmall = 4 << 10;
  constexpr int kPuts = 5000;
  std::vector<uint8_t> bytes(kSmall, 7);
  // One producer thread, then two of the same size at once (a take may
  // then wait for the other's call, and for the refill thread's).
  for (int i = 0; i < kPuts / 2; ++i) {
    ASSERT_TRUE(c->Put(bytes.data(), {.size_bytes = kSmall}).ok()) << i;
  }
  std::atomic<int> failed{0};
  auto producer = [&] {
    for (int i = 0; i < kPuts / 4; ++i) {
      if (!c->Put(bytes.data(), {.size_bytes = kSmall}).ok()) ++failed;
    }
  };
  std::thread other(producer);
  producer();
  other.join();
  EXPECT_EQ(failed.load(), 0);
  absl::StatusOr<Buffer> probe = c->Create({.size_bytes = kSmall});
  ASSERT_TRUE(probe.ok()) << probe.status();
  const internal::Stock* stock = probe->lease()->core().stock();
  ASSERT_NE(stock, nullptr);
  EXPECT_EQ(stock->surplus(), 0u) << stock->made() << " made";
  EXPECT_LE(stock->made(), kPuts + 1 + internal::Stock::kMaxPerClass);
  EXPECT_LE(stock->buffers(), internal::Stock::kMaxPerClass);
}

// A put of a size the stock keeps one buffer of (a quarter of the
// client's stock budget: 2 MiB of the test pool's 8 MiB budget) writes the
// range its last object freed, which the CPU's caches still hold, when the
// reader let go first: the stock's buffer is made when the creator lets go
// of its object, not when it takes it (while it is held), and the daemon
// applies the releases posted in release rings (the reader's, which wakes
// nobody: its writer thread polls once an hour here) before it places that
// buffer. (A refill at the take, the object held, gets another range, and
// the puts take two ranges in turn.) The producer lets go either way: its
// ref's release posted, or a unary Release.
TEST_F(FastPathTest, ABigPutWritesTheRangeItsLastObjectFreed) {
  Client reader = QuietClient();
  Client producer = Connect();
  constexpr uint64_t kBig = 2 << 20;
  constexpr int kPuts = 12;
  std::vector<uint64_t> offsets;
  for (int i = 0; i < kPuts; ++i) {
    const std::vector<uint8_t> bytes(kBig, static_cast<uint8_t>(40 + i));
    absl::StatusOr<SealedRef> put =
        producer.Put(bytes.data(), {.size_bytes = kBig});
    ASSERT_TRUE(put.ok()) << put.status();
    absl::StatusOr<View> view = reader.Get(put->ref());
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_TRUE(AllBytes(*view, static_cast<uint8_t>(40 + i))) << i;
    offsets.push_back(view->lease()->placement().offset());
    view = absl::CancelledError("released");  // Posted in the reader's ring.
    if (i % 2 == 0) {
      put->Reset();
    } else {
      ASSERT_TRUE(put->Release().ok());
    }
  }
  // The first two make their buffers on a miss (a size asked for once
  // leaves no stock); each later one writes the range the one before it
  // freed.
  for (int i = 2; i < kPuts; ++i) {
    EXPECT_EQ(offsets[i], offsets[i - 1]) << "put " << i;
  }
  absl::StatusOr<Buffer> probe = producer.Create({.size_bytes = 4096});
  ASSERT_TRUE(probe.ok()) << probe.status();
  const internal::Stock* stock = probe->lease()->core().stock();
  ASSERT_NE(stock, nullptr);
  EXPECT_EQ(stock->surplus(), 0u);
  EXPECT_LE(stock->made(), static_cast<uint64_t>(kPuts) + 2);
}

// A buffer past what the stock serves (a round trip each) of a size its
// session made before lands on the range the last one freed, when the
// release that frees it is posted in a reader's ring (nobody's told: the
// reader's writer thread polls once an hour here), as a broadcast's ranks
// drop their views: the create pulls the rings before it places the
// buffer. Otherwise it takes another range, which the writer and every
// reader must map afresh.
TEST_F(FastPathTest, ABigCreatePastTheStockWritesTheRangeItsLastObjectFreed) {
  Client reader = QuietClient();
  Client producer = Connect();
  constexpr uint64_t kBig = 8 << 20;  // The stock serves up to 2 MiB here.
  constexpr int kPuts = 6;
  std::vector<uint64_t> offsets;
  for (int i = 0; i < kPuts; ++i) {
    const std::vector<uint8_t> bytes(kBig, static_cast<uint8_t>(80 + i));
    absl::StatusOr<SealedRef> put =
        producer.Put(bytes.data(), {.size_bytes = kBig});
    ASSERT_TRUE(put.ok()) << put.status();
    absl::StatusOr<View> view = reader.Get(put->ref());
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_TRUE(AllBytes(*view, static_cast<uint8_t>(80 + i))) << i;
    offsets.push_back(view->lease()->placement().offset());
    put->Reset();                             // Posted in its ring.
    view = absl::CancelledError("released");  // Posted in the reader's.
  }
  for (int i = 1; i < kPuts; ++i) {
    EXPECT_EQ(offsets[i], offsets[i - 1]) << "put " << i;
  }
}

// The same size's range is never handed back while a view of its object
// is held: the producer lets go and puts again while the reader keeps its
// view, and the view keeps its bytes through every later put.
TEST_F(FastPathTest, ABigPutNeverWritesARangeAViewStillHolds) {
  Client reader = QuietClient();
  Client producer = Connect();
  constexpr uint64_t kBig = 2 << 20;
  auto put = [&](uint8_t value) {
    const std::vector<uint8_t> bytes(kBig, value);
    return producer.Put(bytes.data(), {.size_bytes = kBig});
  };
  // The class's stock is made after its second take.
  for (uint8_t v : {60, 61}) ASSERT_TRUE(put(v).ok());
  absl::StatusOr<SealedRef> kept = put(62);
  ASSERT_TRUE(kept.ok()) << kept.status();
  absl::StatusOr<View> view = reader.Get(kept->ref());
  ASSERT_TRUE(view.ok()) << view.status();
  const uint64_t held = view->lease()->placement().offset();
  kept->Reset();  // The creator lets go; the reader's view holds it.
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<SealedRef> next = put(static_cast<uint8_t>(63 + i));
    ASSERT_TRUE(next.ok()) << next.status();
    absl::StatusOr<View> other = reader.Get(next->ref());
    ASSERT_TRUE(other.ok()) << other.status();
    EXPECT_NE(other->lease()->placement().offset(), held) << i;
    EXPECT_TRUE(AllBytes(*other, static_cast<uint8_t>(63 + i))) << i;
  }
  EXPECT_TRUE(AllBytes(*view, 62));
}

// A put handed over whole (exclusive: the daemon consumes the creator's
// lease at the seal) lets go of its lease without a release: the class of
// one buffer is refilled all the same, in the background.
TEST_F(FastPathTest, AnExclusivePutStillRefillsItsClass) {
  Client producer = Connect();
  constexpr uint64_t kBig = 2 << 20;
  const std::vector<uint8_t> bytes(kBig, 9);
  std::vector<SealedRef> handed;
  for (int i = 0; i < 2; ++i) {  // A class's stock is made after 2 takes.
    absl::StatusOr<SealedRef> put =
        producer.Put(bytes.data(), {.size_bytes = kBig}, /*exclusive=*/true);
    ASSERT_TRUE(put.ok()) << put.status();
    handed.push_back(*std::move(put));
  }
  absl::StatusOr<Buffer> probe = producer.Create({.size_bytes = 4096});
  ASSERT_TRUE(probe.ok()) << probe.status();
  const internal::Stock* stock = probe->lease()->core().stock();
  ASSERT_NE(stock, nullptr);
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (stock->bytes() < kBig && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(stock->bytes(), kBig);
  // Its objects are another's to take, whole.
  Client taker = Connect();
  for (const SealedRef& r : handed) {
    absl::StatusOr<View> v = taker.Get(r.ref());
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_TRUE(AllBytes(*v, 9));
  }
}

// CreateManyRequest.reuse_range_of is a wish, never a way in: naming an
// object another client holds, or no object at all, is no error, and never
// places the buffer where a live object lies.
TEST_F(FastPathTest, AReuseRangeWishNeverPlacesOverALiveObject) {
  Client reader = Connect();
  constexpr uint64_t kBig = 2 << 20;
  const std::vector<uint8_t> sevens(kBig, 7);
  absl::StatusOr<SealedRef> put =
      client_->Put(sevens.data(), {.size_bytes = kBig});
  ASSERT_TRUE(put.ok()) << put.status();
  absl::StatusOr<View> view = reader.Get(put->ref());
  ASSERT_TRUE(view.ok()) << view.status();
  const uint64_t held = view->lease()->placement().offset();
  put->Reset();  // Its creator lets go; the reader's view holds it.
  Client other =
      *Client::Connect({.address = daemon_->address(), .stock_bytes = 0});
  auto stub = v1::ObjectStore::NewStub(grpc::CreateChannel(
      daemon_->address(), grpc::InsecureChannelCredentials()));
  v1::ObjectRef garbage;
  garbage.set_daemon_epoch(12345);
  garbage.set_slot(3);
  garbage.set_generation(9);
  for (const v1::ObjectRef& wish : {internal::ToProto(view->ref()), garbage}) {
    v1::CreateManyRequest req;
    req.set_session_id(other.session_id());
    req.set_stock(true);
    req.add_sizes(kBig);
    *req.mutable_reuse_range_of() = wish;
    v1::CreateManyResponse resp;
    grpc::ClientContext ctx;
    const grpc::Status s = stub->CreateMany(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(resp.created_size(), 1);
    EXPECT_NE(resp.created(0).placement().offset(), held);
  }
  EXPECT_TRUE(AllBytes(*view, 7));
}

// PutMany and GetMany move many objects in a round trip each; each get
// result stands alone (a stale ref fails, its neighbours do not), and a
// PutMany that fails leaves nothing.
// A producer that keeps what it puts (a store being filled, a producer
// ahead of its consumers) writes ranges made ready before it took them: the
// refill thread opens the stock's buffers and maps their pages, so a put
// only copies, where writing a range this process never wrote takes a fault
// per 4 KiB page (docs/performance.md, "Kept puts").
TEST_F(FastPathTest, KeptPutsTakeBuffersMappedAheadOfThem) {
  Client c = Connect();
  const std::vector<uint8_t> bytes(kObject, 9);
  std::vector<SealedRef> kept;
  for (int i = 0; i < 200; ++i) {
    absl::StatusOr<SealedRef> r = c.Put(bytes.data(), {.size_bytes = kObject});
    ASSERT_TRUE(r.ok()) << r.status();
    kept.push_back(*std::move(r));
  }
  std::vector<Buffer> taken;
  absl::StatusOr<Buffer> first = c.Create({.size_bytes = kObject});
  ASSERT_TRUE(first.ok()) << first.status();
  const internal::Stock* stock = first->lease()->core().stock();
  ASSERT_NE(stock, nullptr);
  taken.push_back(*std::move(first));
  // What the refill thread brings is readied in the background: once the
  // stock holds buffers and all are ready, a take gets a ready one.
  for (int i = 0; i < 8; ++i) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (
        (stock->buffers() == 0 || stock->ready_buffers() < stock->buffers()) &&
        absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(2));
    }
    ASSERT_GT(stock->ready_buffers(), 0u) << i;
    absl::StatusOr<Buffer> b = c.Create({.size_bytes = kObject});
    ASSERT_TRUE(b.ok()) << b.status();
    auto* p = static_cast<uint8_t*>(b->data());
    // Mapped before anything wrote it, and written without a fault.
    EXPECT_TRUE(testing::PagesPresent(p, kObject)) << i;
    testing::ThreadFaults faults;
    std::memset(p, 0x5a, kObject);
    if (faults.ok()) EXPECT_EQ(faults.count(), 0u) << i;
    taken.push_back(*std::move(b));
  }
}

// A size the stock keeps one buffer of (2 MiB of the test pool's 8 MiB
// budget), put and kept: the class is refilled when a take finds its last
// take still held, in the background, so the puts after the second find a
// buffer made (and mapped) ahead, instead of each waiting for a release
// that never comes and making its buffer in a round trip of its own. Each
// kept object keeps its bytes.
TEST_F(FastPathTest, AKeptBigPutFindsItsBufferMadeAhead) {
  Client producer = Connect();
  Client reader = Connect();
  constexpr uint64_t kBig = 2 << 20;
  constexpr int kPuts = 10;
  absl::StatusOr<Buffer> probe = producer.Create({.size_bytes = 4096});
  ASSERT_TRUE(probe.ok()) << probe.status();
  const internal::Stock* stock = probe->lease()->core().stock();
  ASSERT_NE(stock, nullptr);
  const uint64_t misses_before = stock->misses();
  std::vector<SealedRef> kept;
  for (int i = 0; i < kPuts; ++i) {
    const std::vector<uint8_t> bytes(kBig, static_cast<uint8_t>(80 + i));
    absl::StatusOr<SealedRef> put =
        producer.Put(bytes.data(), {.size_bytes = kBig});
    ASSERT_TRUE(put.ok()) << put.status();
    kept.push_back(*std::move(put));
  }
  for (int i = 0; i < kPuts; ++i) {
    absl::StatusOr<View> view = reader.Get(kept[i].ref());
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_TRUE(AllBytes(*view, static_cast<uint8_t>(80 + i))) << i;
  }
  // The first two miss (a new class; then the first kept take seen, which
  // brings the next one's buffer too); before, every one did.
  EXPECT_LT(stock->misses() - misses_before, static_cast<uint64_t>(kPuts) / 2);
}

// A writable take of an object put whole in another process
// (put(exclusive=True)) opens its range with its pages mapped: the taker
// writes it without a fault per page (docs/performance.md, "Hand-off").
TEST_F(FastPathTest, AWritableTakeIsMappedWhenItOpens) {
  constexpr uint64_t kSize = 1 << 20;
  std::unique_ptr<testing::Subprocess> child =
      Child({"put-exclusive", std::to_string(kSize), "7"});
  absl::StatusOr<std::string> line = child->ReadLine();
  ASSERT_TRUE(line.ok() && absl::StartsWith(*line, "sealed ")) << *line;
  absl::StatusOr<ObjectRef> ref = testing::RefFromHex(line->substr(7));
  ASSERT_TRUE(ref.ok()) << ref.status();
  absl::StatusOr<View> view = client_->Get(*ref, /*writable=*/true);
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_TRUE(view->writable());
  auto* p = static_cast<uint8_t*>(view->mutable_data());
  EXPECT_TRUE(testing::PagesPresent(p, kSize));
  testing::ThreadFaults faults;
  EXPECT_TRUE(AllBytes(*view, 7));
  std::memset(p, 0x33, kSize);
  if (faults.ok()) EXPECT_EQ(faults.count(), 0u);
}

// View::Populate maps every page of a read view in one call: a reader about
// to read it all (a broadcast's ranks) then reads without a fault per page.
TEST_F(FastPathTest, APopulatedViewIsReadWithoutFaults) {
  constexpr uint64_t kSize = 1 << 20;
  const std::vector<uint8_t> bytes(kSize, 21);
  absl::StatusOr<SealedRef> put =
      client_->Put(bytes.data(), {.size_bytes = kSize});
  ASSERT_TRUE(put.ok()) << put.status();
  Client reader = Connect();
  absl::StatusOr<View> view = reader.Get(put->ref());
  ASSERT_TRUE(view.ok()) << view.status();
  // Nothing read it in this process yet (the put wrote through the other,
  // writable mapping).
  EXPECT_FALSE(testing::PagesPresent(view->data(), kSize));
  view->Populate();
  EXPECT_TRUE(testing::PagesPresent(view->data(), kSize));
  testing::ThreadFaults faults;
  EXPECT_TRUE(AllBytes(*view, 21));
  if (faults.ok()) EXPECT_EQ(faults.count(), 0u);
}

TEST_F(FastPathTest, ManyObjectsPerRoundTrip) {
  Client consumer = Connect();
  std::vector<std::vector<uint8_t>> data(64);
  std::vector<PutItem> items(64);
  for (size_t i = 0; i < items.size(); ++i) {
    data[i].assign(4096 * (1 + i % 5), static_cast<uint8_t>(i));
    items[i].data = data[i].data();
    items[i].options.size_bytes = data[i].size();
  }
  absl::StatusOr<std::vector<SealedRef>> refs = client_->PutMany(items);
  ASSERT_TRUE(refs.ok()) << refs.status();
  std::vector<ObjectRef> wanted;
  for (const SealedRef& r : *refs) wanted.push_back(r.ref());
  ObjectRef forged = wanted[3];
  forged.nonce ^= 1;
  wanted.push_back(forged);
  std::vector<absl::StatusOr<View>> views = consumer.GetMany(wanted);
  ASSERT_EQ(views.size(), 65u);
  for (size_t i = 0; i < 64; ++i) {
    ASSERT_TRUE(views[i].ok()) << i << " " << views[i].status();
    EXPECT_EQ(views[i]->size_bytes(), data[i].size());
    EXPECT_TRUE(AllBytes(*views[i], static_cast<uint8_t>(i))) << i;
  }
  // A nonce the daemon never drew: refused, alone.
  EXPECT_EQ(views[64].status().code(), absl::StatusCode::kInvalidArgument)
      << views[64].status();
  // A second GetMany of what it holds shares every lease: no new one.
  const uint64_t leases = LeasesOf(consumer);
  wanted.pop_back();
  std::vector<absl::StatusOr<View>> again = consumer.GetMany(wanted);
  for (const auto& v : again) ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(LeasesOf(consumer), leases);
  views.clear();
  again.clear();
  refs->clear();
  // The consumer's releases travel on its own stream: applied shortly.
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  while (Used() != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(Used(), 0u);
  // All or nothing: an item whose layout needs more than its bytes.
  items[10].options.dtype = DType::kFloat64;
  items[10].options.shape = {1 << 20};
  absl::StatusOr<std::vector<SealedRef>> bad = client_->PutMany(items);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "item 10"))
      << bad.status();
  EXPECT_EQ(Used(), 0u);
}

// A stock cannot hoard the pool: the daemon bounds it per client
// (limits.max_stock_bytes_per_client) whatever the client asks, operators
// see it, and an idle client gives it back.
class StockLimitTest : public testing::DaemonTest {
  std::vector<std::string> DaemonArgs() override {
    const std::string path = ::testing::TempDir() + "/stock_limit.toml";
    std::ofstream(path) << "[limits]\nmax_stock_bytes_per_client = "
                           "\"256KiB\"\n[[pool]]\nname = \"p\"\nsize = "
                           "\"64MiB\"\n";
    return {"--config", path};
  }
};

TEST_F(StockLimitTest, StockIsBoundedShownAndGivenBackWhenIdle) {
  absl::StatusOr<Client> greedy = Client::Connect(
      {.address = daemon_->address(), .stock_bytes = uint64_t{1} << 30});
  ASSERT_TRUE(greedy.ok()) << greedy.status();
  std::vector<uint8_t> bytes(kObject, 1);
  uint64_t most = 0;
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(greedy->Put(bytes.data(), {.size_bytes = kObject}).ok());
    most = std::max(most, greedy->Stats()->stock_bytes);
  }
  EXPECT_GT(most, 0u);
  EXPECT_LE(most, 256u << 10);
  const v1::ListClientsResponse clients =
      testing::MonitorClients(daemon_->address());
  bool shown = false;
  for (const v1::ClientStatus& c : clients.clients()) {
    if (c.client_id() != greedy->client_id()) continue;
    shown = c.stock_objects() > 0 && c.stock_bytes() <= (256u << 10);
  }
  EXPECT_TRUE(shown) << clients.DebugString();
  {
    // Asked for directly, the daemon stops at the limit and says which.
    Client plain =
        *Client::Connect({.address = daemon_->address(), .stock_bytes = 0});
    auto stub = v1::ObjectStore::NewStub(grpc::CreateChannel(
        daemon_->address(), grpc::InsecureChannelCredentials()));
    v1::CreateManyRequest req;
    req.set_session_id(plain.session_id());
    req.set_stock(true);
    for (int i = 0; i < 10; ++i) req.add_sizes(kObject);
    v1::CreateManyResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->CreateMany(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.created_size(), 4);
    EXPECT_EQ(resp.stopped_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_TRUE(absl::StrContains(resp.stopped_message(),
                                  "limits.max_stock_bytes_per_client"))
        << resp.stopped_message();
  }
  // Idle for longer than the stock's idle time: all given back.
  absl::SleepFor(absl::Seconds(3));
  EXPECT_EQ(greedy->Stats()->stock_objects, 0u);
  EXPECT_EQ(Used(), 0u);
}

}  // namespace
}  // namespace shmtensor
