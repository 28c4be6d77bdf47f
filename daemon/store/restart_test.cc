// A successor adopting a predecessor's ledger (ObjectStore::Adopt): what it
// keeps, what it refuses, and, with the predecessor SIGKILLed at random
// points of its work, that it never frees what a client was told it holds.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <random>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "daemon/memory/fake_segment.h"
#include "daemon/store/object_store.h"
#include "gtest/gtest.h"
#include "testing/cpp/blocking_store.h"

namespace shmtensor::daemon {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kPoolBytes = 1024 * kPage;
constexpr uid_t kUser = 1000;

std::vector<std::unique_ptr<Pool>> Pools(uint64_t bytes = kPoolBytes) {
  std::vector<std::unique_ptr<Pool>> pools;
  pools.push_back(std::make_unique<Pool>(
      "default", std::make_unique<FakeSegment>(bytes), PoolAccessRules(kUser)));
  return pools;
}

std::unique_ptr<Ledger> NewLedger(uint64_t epoch) {
  return *Ledger::Create(epoch, {{"default", 1, kPoolBytes, kPage, 0}},
                         LedgerCapacityFor(StoreLimits()));
}

// A successor of the store whose ledger is `fd`.
absl::StatusOr<std::unique_ptr<ObjectStore>> Successor(
    int fd, std::vector<std::unique_ptr<Pool>> pools = Pools()) {
  LedgerState state;
  absl::StatusOr<std::unique_ptr<Ledger>> ledger =
      Ledger::Adopt(UniqueFd(fcntl(fd, F_DUPFD_CLOEXEC, 3)), &state);
  if (!ledger.ok()) return ledger.status();
  return ObjectStore::Adopt(std::move(pools), StoreLimits(), *std::move(ledger),
                            std::move(state));
}

// A session of this very process (so a successor finds it alive).
PeerInfo ThisProcess() {
  const pid_t pid = getpid();
  return PeerInfo{{pid, kUser, kUser},
                  OwnerKey{kUser, pid, *ProcessStartTime(pid)},
                  std::make_shared<const UniqueFd>(*OpenPidfd(pid)),
                  ""};
}
// A session of a process the daemon cannot see (another pid namespace).
PeerInfo Invisible(uint64_t connection) {
  return PeerInfo{{0, kUser, kUser},
                  OwnerKey{kUser, 0, (uint64_t{1} << 63) | connection},
                  nullptr,
                  ""};
}

absl::StatusOr<Handout> Create(ObjectStore& store, uint64_t session,
                               uint64_t bytes, std::string name = "") {
  CreateArgs args;
  args.caller = session;
  args.size_bytes = bytes;
  args.name = std::move(name);
  return CreateBlocking(store, args);
}

TEST(RestartTest, ASuccessorServesEveryObjectLeaseNameAndRef) {
  std::unique_ptr<Ledger> ledger = NewLedger(77);
  const int fd = ledger->fd();
  ObjectStore old(Pools(), 77, StoreLimits(), std::move(ledger));
  const uint64_t a = old.OpenSession("a", ThisProcess())->id;
  const uint64_t b = old.OpenSession("b", ThisProcess())->id;
  // A sealed named object, a read lease of b's on it.
  Handout named = *Create(old, a, 3 * kPage, "weights");
  ASSERT_TRUE(old.Seal(a, named.lease_id, false).ok());
  Handout b_read = *old.Get(b, named.ref);
  // An exclusive hand-off waiting for its taker.
  Handout excl = *Create(old, a, kPage);
  v1::ObjectRef excl_ref = old.Seal(a, excl.lease_id, true)->ref;
  // An unsealed buffer: still a's to write.
  Handout unsealed = *Create(old, a, 2 * kPage);
  // An object gone before the restart: its ref is stale for good.
  Handout gone = *Create(old, b, kPage);
  ASSERT_TRUE(old.Seal(b, gone.lease_id, false).ok());
  ASSERT_TRUE(old.Release(b, gone.lease_id).ok());
  // An offer in flight.
  Handout offered = *Create(old, b, kPage);
  ASSERT_TRUE(old.Seal(b, offered.lease_id, false).ok());
  OfferGrant offer = *old.Offer(b, offered.lease_id);
  ASSERT_TRUE(old.Release(b, offered.lease_id).ok());
  const uint64_t used = old.Stats().pools(0).used_bytes();

  // The predecessor dies here (nothing of it runs any more).
  absl::StatusOr<std::unique_ptr<ObjectStore>> next = Successor(fd);
  ASSERT_TRUE(next.ok()) << next.status();
  ObjectStore& s = **next;
  EXPECT_EQ(s.epoch(), 77u);
  EXPECT_EQ(s.Stats().pools(0).used_bytes(), used);
  EXPECT_EQ(s.adopted().sessions, 2u);
  // Nobody but the session's own process resumes it.
  EXPECT_FALSE(s.ResumeSession(a, OwnerKey{kUser, getpid(), 1}).ok());
  EXPECT_FALSE(s.ResumeSession(a ^ 1, ThisProcess().owner).ok());
  ASSERT_TRUE(s.ResumeSession(a, ThisProcess().owner).ok());
  ASSERT_TRUE(s.ResumeSession(b, ThisProcess().owner).ok());
  EXPECT_EQ(s.adopted().sessions, 0u);

  // Refs made before resolve to the same bytes.
  absl::StatusOr<Handout> again = s.Get(b, named.ref);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->placement.offset(), named.placement.offset());
  EXPECT_TRUE(GetByNameBlocking(s, b, "weights", absl::ZeroDuration()).ok());
  absl::StatusOr<Handout> taken = s.Get(b, excl_ref);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_TRUE(taken->writable);
  EXPECT_EQ(taken->placement.offset(), excl.placement.offset());
  // The offer is taken by its token.
  absl::StatusOr<Handout> received = s.Get(a, offer.ref, offer.token);
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_FALSE(s.Get(b, gone.ref).ok());
  // Leases made before are held: released once, then unknown.
  EXPECT_TRUE(s.Release(b, b_read.lease_id).ok());
  EXPECT_FALSE(s.Release(b, b_read.lease_id).ok());
  // The unsealed buffer is still a's to seal.
  EXPECT_TRUE(s.Seal(a, unsealed.lease_id, false).ok());
  // New objects never land on live ones.
  std::set<uint64_t> live = {named.placement.offset(), excl.placement.offset(),
                             unsealed.placement.offset(),
                             offered.placement.offset()};
  for (int i = 0; i < 8; ++i) {
    Handout h = *Create(s, a, kPage);
    // Who wrote what before is not in the ledger: every range is cleared
    // before a creator of any uid gets it.
    EXPECT_FALSE(h.stale.empty());
    ASSERT_TRUE(s.ClearStale(a, h).ok());
    EXPECT_EQ(live.count(h.placement.offset()), 0u);
    live.insert(h.placement.offset());
  }
  // Everything goes when its holders do.
  ASSERT_TRUE(s.Delete(a, "weights").ok());
  s.EndSession(a);
  s.EndSession(b);
  EXPECT_EQ(s.Stats().pools(0).used_bytes(), 0u);
}

// A client whose daemon was replaced between opening its session and
// asking for its pools' descriptors asks the successor: it proves the
// session as before (its id and secret, its process), once.
TEST(RestartTest, ASessionOpenedJustBeforeTheRestartGetsItsDescriptors) {
  std::unique_ptr<Ledger> ledger = NewLedger(78);
  const int fd = ledger->fd();
  ObjectStore old(Pools(), 78, StoreLimits(), std::move(ledger));
  const OpenedSession opened = *old.OpenSession("late", ThisProcess());
  absl::StatusOr<std::unique_ptr<ObjectStore>> next = Successor(fd);
  ASSERT_TRUE(next.ok()) << next.status();
  ObjectStore& s = **next;
  const OwnerKey me = ThisProcess().owner;
  EXPECT_TRUE(absl::IsPermissionDenied(
      s.GrantDescriptors(opened.id, "wrong secret", me).status()));
  EXPECT_TRUE(absl::IsPermissionDenied(
      s.GrantDescriptors(opened.id ^ 1, opened.descriptor_secret, me)
          .status()));
  absl::StatusOr<std::vector<DescriptorGrant>> grant =
      s.GrantDescriptors(opened.id, opened.descriptor_secret, me);
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_EQ(grant->size(), 1u);
  EXPECT_TRUE(absl::IsFailedPrecondition(
      s.GrantDescriptors(opened.id, opened.descriptor_secret, me).status()));
  // The session is open under its id from then on.
  EXPECT_TRUE(s.ResumeSession(opened.id, me).ok());
}

// Adopted again and again (each successor writes on in the same ledger),
// objects held across every restart are freed once let go.
TEST(RestartTest, ObjectsHeldAcrossManyRestartsAreFreedWhenLetGo) {
  std::unique_ptr<Ledger> ledger = NewLedger(79);
  const int fd = ledger->fd();
  auto store = std::make_unique<ObjectStore>(Pools(), 79, StoreLimits(),
                                             std::move(ledger));
  const uint64_t id = store->OpenSession("c", ThisProcess())->id;
  const OwnerKey me = ThisProcess().owner;
  std::vector<uint64_t> leases;
  std::vector<std::unique_ptr<ObjectStore>> retired;
  for (int round = 0; round < 4; ++round) {
    Handout h = *Create(*store, id, kPage);
    ASSERT_TRUE(store->Seal(id, h.lease_id, false).ok());
    leases.push_back(h.lease_id);
    leases.push_back(store->Get(id, h.ref)->lease_id);
    retired.push_back(std::move(store));
    absl::StatusOr<std::unique_ptr<ObjectStore>> next = Successor(fd);
    ASSERT_TRUE(next.ok()) << next.status();
    store = *std::move(next);
    LeaseAccount account{leases, 0};
    ASSERT_TRUE(store->ResumeSession(id, me, &account).ok());
    EXPECT_EQ(store->Stats().leases(), leases.size()) << "round " << round;
    EXPECT_EQ(store->Stats().objects(), leases.size() / 2) << "round " << round;
  }
  for (uint64_t lease : leases) {
    EXPECT_TRUE(store->Release(id, lease).ok()) << lease;
  }
  EXPECT_EQ(store->Stats().leases(), 0u);
  EXPECT_EQ(store->Stats().objects(), 0u);
  EXPECT_EQ(store->Stats().pools(0).used_bytes(), 0u);
}

// A fork hold whose client was told (ForkHoldGranted, after its descriptor
// was stored) outlives the restart; one its predecessor died before telling
// pins nothing in the successor.
TEST(RestartTest, OnlyForkHoldsTheirClientWasToldOfOutliveARestart) {
  std::unique_ptr<Ledger> ledger = NewLedger(80);
  const int fd = ledger->fd();
  ObjectStore old(Pools(), 80, StoreLimits(), std::move(ledger));
  const OpenedSession opened = *old.OpenSession("forker", ThisProcess());
  const OwnerKey me = ThisProcess().owner;
  Handout h = *Create(old, opened.id, kPage);
  ASSERT_TRUE(old.Seal(opened.id, h.lease_id, false).ok());
  absl::StatusOr<ForkHoldGrant> told =
      old.HoldForFork(opened.id, opened.descriptor_secret, me);
  ASSERT_TRUE(told.ok()) << told.status();
  old.ForkHoldGranted(told->hold_id);
  Handout h2 = *Create(old, opened.id, 2 * kPage);
  ASSERT_TRUE(old.Seal(opened.id, h2.lease_id, false).ok());
  ASSERT_TRUE(old.Release(opened.id, h.lease_id).ok());
  // Pins h2's object only (the session holds nothing else now); never told.
  ASSERT_TRUE(old.HoldForFork(opened.id, opened.descriptor_secret, me).ok());

  absl::StatusOr<std::unique_ptr<ObjectStore>> next = Successor(fd);
  ASSERT_TRUE(next.ok()) << next.status();
  ObjectStore& s = **next;
  ASSERT_TRUE(s.ResumeSession(opened.id, me).ok());
  // h's object: kept by the hold its client was told of (stranded: its
  // connection was not handed over here).
  EXPECT_EQ(s.adopted().quarantined_bytes, kPage);
  ASSERT_TRUE(s.Release(opened.id, h2.lease_id).ok());
  EXPECT_EQ(s.Stats().pools(0).used_bytes(), kPage);
  EXPECT_EQ(s.Stats().objects(), 1u);
}

TEST(RestartTest, SessionsOfProcessesGoneEndAtAdoption) {
  std::unique_ptr<Ledger> ledger = NewLedger(5);
  const int fd = ledger->fd();
  ObjectStore old(Pools(), 5, StoreLimits(), std::move(ledger));
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  const uint64_t start = *ProcessStartTime(child);
  PeerInfo dead{
      {child, kUser, kUser}, OwnerKey{kUser, child, start}, nullptr, ""};
  const uint64_t id = old.OpenSession("dead", dead)->id;
  Handout h = *Create(old, id, kPage);
  ASSERT_TRUE(old.Seal(id, h.lease_id, false).ok());
  waitpid(child, nullptr, 0);
  absl::StatusOr<std::unique_ptr<ObjectStore>> next = Successor(fd);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ((*next)->Stats().sessions(), 0u);
  EXPECT_EQ((*next)->Stats().pools(0).used_bytes(), 0u);
}

TEST(RestartTest, APoolThatChangedIsRefusedNamingIt) {
  std::unique_ptr<Ledger> ledger = NewLedger(5);
  const int fd = ledger->fd();
  ObjectStore old(Pools(), 5, StoreLimits(), std::move(ledger));
  absl::StatusOr<std::unique_ptr<ObjectStore>> next =
      Successor(fd, Pools(2 * kPoolBytes));
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(next.status().message(), "'default'"))
      << next.status();
}

// What the predecessor's clients were told, reported by it after each call
// returned (so a record is in the pipe only once the client could act on
// it): H a lease is held, r a release is about to be sent, R it was applied.
struct Report {
  char kind;
  uint8_t session;
  uint64_t value;  // Lease id, or (kind S) the session's id.
};

[[noreturn]] void Work(ObjectStore& store, int out, uint32_t seed) {
  std::mt19937 rng(seed);
  uint64_t sessions[2];
  for (uint8_t i = 0; i < 2; ++i) {
    sessions[i] = store.OpenSession("worker", Invisible(i + 1))->id;
    Report r{'S', i, sessions[i]};
    (void)!write(out, &r, sizeof(r));
  }
  std::vector<std::pair<uint8_t, uint64_t>> held;
  std::vector<v1::ObjectRef> refs;
  while (true) {
    const uint8_t s = rng() % 2;
    const uint32_t op = rng() % 10;
    if (op < 4 || held.empty()) {
      absl::StatusOr<Handout> h =
          Create(store, sessions[s], (1 + rng() % 8) * kPage);
      if (!h.ok()) continue;
      Report r{'H', s, h->lease_id};
      (void)!write(out, &r, sizeof(r));
      if (store.Seal(sessions[s], h->lease_id, false).ok()) {
        refs.push_back(h->ref);
        held.emplace_back(s, h->lease_id);
      }
    } else if (op < 7 && !refs.empty()) {
      absl::StatusOr<Handout> h =
          store.Get(sessions[s], refs[rng() % refs.size()]);
      if (!h.ok()) continue;
      Report r{'H', s, h->lease_id};
      (void)!write(out, &r, sizeof(r));
      held.emplace_back(s, h->lease_id);
    } else {
      const size_t i = rng() % held.size();
      const auto [hs, lease] = held[i];
      held.erase(held.begin() + static_cast<long>(i));
      Report before{'r', hs, lease};
      (void)!write(out, &before, sizeof(before));
      if (store.Release(sessions[hs], lease).ok()) {
        Report after{'R', hs, lease};
        (void)!write(out, &after, sizeof(after));
      }
    }
  }
}

// 40 rounds of a predecessor SIGKILLed at a random point and a successor
// adopting its ledger. With `present`, each session resumes presenting what
// its client was told it holds (OpenSession.present_leases): then what the
// successor holds is exactly that, leases granted by calls whose answer
// never came included (dropped).
void KillAndAdopt(bool present) {
  std::mt19937 rng(present ? 20261203 : 20261202);
  int restarts = 0;
  for (int round = 0; round < 40; ++round) {
    std::unique_ptr<Ledger> ledger = NewLedger(900 + round);
    const int fd = ledger->fd();
    int pipe_fds[2];
    ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      close(pipe_fds[0]);
      ObjectStore store(Pools(), 900 + round, StoreLimits(), std::move(ledger));
      Work(store, pipe_fds[1], static_cast<uint32_t>(round));
    }
    close(pipe_fds[1]);
    // Killed at a random point of its work, once it has begun.
    uint64_t session[2] = {0, 0};
    Report r;
    for (int i = 0; i < 2; ++i) {
      ASSERT_EQ(read(pipe_fds[0], &r, sizeof(r)), sizeof(r));
      ASSERT_EQ(r.kind, 'S');
      session[r.session] = r.value;
    }
    usleep(1000 + rng() % 30000);
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    // What the clients were told.
    absl::flat_hash_map<uint64_t, char> last;  // Lease -> H, r or R.
    absl::flat_hash_map<uint64_t, uint8_t> owner;
    while (read(pipe_fds[0], &r, sizeof(r)) == sizeof(r)) {
      last[r.value] = r.kind;
      owner[r.value] = r.session;
    }
    close(pipe_fds[0]);
    absl::StatusOr<std::unique_ptr<ObjectStore>> next = Successor(fd);
    ASSERT_TRUE(next.ok()) << "round " << round << ": " << next.status();
    ObjectStore& s = **next;
    LeaseAccount account[2];
    for (const auto& [lease, kind] : last) {
      if (kind == 'H') account[owner[lease]].held.push_back(lease);
    }
    for (uint8_t i = 0; i < 2; ++i) {
      ASSERT_TRUE(s.ResumeSession(session[i], Invisible(100 + i).owner,
                                  present ? &account[i] : nullptr)
                      .ok())
          << "round " << round;
    }
    for (const auto& [lease, kind] : last) {
      const absl::StatusOr<bool> released =
          s.Release(session[owner[lease]], lease);
      if (kind == 'H') {
        EXPECT_TRUE(released.ok())
            << "round " << round << ": lease " << lease
            << " a client holds is gone: " << released.status();
      } else if (kind == 'R') {
        EXPECT_FALSE(released.ok())
            << "round " << round << ": lease " << lease << " came back";
      }
    }
    if (present) {
      // Nothing the clients do not hold is left, though they live on.
      EXPECT_EQ(s.Stats().pools(0).used_bytes(), 0u) << "round " << round;
    }
    s.EndSession(session[0]);
    s.EndSession(session[1]);
    EXPECT_EQ(s.Stats().pools(0).used_bytes(), 0u) << "round " << round;
    EXPECT_EQ(s.Stats().objects(), 0u) << "round " << round;
    ++restarts;
  }
  EXPECT_EQ(restarts, 40);
}

TEST(RestartTest, KilledAtAnyPointNothingHeldIsLostOrReused) {
  KillAndAdopt(/*present=*/false);
}

TEST(RestartTest, KilledAtAnyPointAResumeKeepsExactlyWhatItsClientHolds) {
  KillAndAdopt(/*present=*/true);
}

// A resume's account against what the session holds: both, kept; the
// session's only, dropped; the client's only, refused. A bad account
// changes nothing.
TEST(RestartTest, AResumeReconcilesItsAccountOfLeases) {
  ObjectStore store(Pools(), 7, StoreLimits(), NewLedger(7));
  const uint64_t id = store.OpenSession("c", ThisProcess())->id;
  std::vector<uint64_t> leases;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<Handout> h = Create(store, id, kPage);
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE(store.Seal(id, h->lease_id, false).ok());
    leases.push_back(h->lease_id);
  }
  ASSERT_TRUE(store.ReleaseBatch(id, 1, {leases[3]}).ok());
  const OwnerKey owner = ThisProcess().owner;

  LeaseAccount too_many;
  too_many.held.assign(StoreLimits().max_leases_per_client + 1, leases[0]);
  too_many.releases_through = 1;
  absl::StatusOr<OpenedSession> bad = store.ResumeSession(id, owner, &too_many);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "65537 leases"))
      << bad.status();
  LeaseAccount behind{{leases[0]}, 0};
  bad = store.ResumeSession(id, owner, &behind);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "seq 1 was applied"))
      << bad.status();
  EXPECT_EQ(store.Stats().leases(), 3u);

  // The client holds 0 and 1 and says it holds 3 (released) and 999; 2 it
  // released on a stream message seq 2 that never arrived.
  LeaseAccount account{{leases[0], leases[1], leases[3], 999, leases[0]}, 2};
  absl::StatusOr<OpenedSession> opened =
      store.ResumeSession(id, owner, &account);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_TRUE(opened->reconciled);
  EXPECT_EQ(opened->dropped, 1u);
  EXPECT_EQ(std::set<uint64_t>(opened->refused.begin(), opened->refused.end()),
            (std::set<uint64_t>{leases[3], 999}));
  EXPECT_EQ(opened->releases_applied, 2u);
  EXPECT_EQ(store.Stats().leases(), 2u);
  EXPECT_EQ(store.Stats().pools(0).used_bytes(), 2 * kPage);
  // Seq 2 is settled: its late copy is not applied again, seq 3 is next.
  EXPECT_TRUE(store.ReleaseBatch(id, 2, {leases[0]}).ok());
  EXPECT_EQ(store.Stats().leases(), 2u);
  EXPECT_TRUE(store.ReleaseBatch(id, 3, {leases[0], leases[1]}).ok());
  EXPECT_EQ(store.Stats().pools(0).used_bytes(), 0u);
}

}  // namespace
}  // namespace shmtensor::daemon
