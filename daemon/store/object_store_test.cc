#include "daemon/store/object_store.h"

#include <thread>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "common/release_protocol.h"
#include "daemon/memory/fake_segment.h"
#include "daemon/store/store_views.h"
#include "gtest/gtest.h"
#include "shmtensor/errors.h"
#include "testing/cpp/blocking_store.h"

namespace shmtensor::daemon {
namespace {

constexpr uint64_t kPage = 4096;
// The user the tests' sessions run as: the pools' owner (pool_access.h).
constexpr uid_t kUser = 1000;

// Opens a session for a made-up process `pid` (no pidfd: the store takes a
// session whose stream ends as gone).
uint64_t Open(ObjectStore& store, const std::string& name, pid_t pid,
              uid_t uid = kUser) {
  return store
      .OpenSession(
          name, PeerInfo{{pid, uid, uid}, OwnerKey{uid, pid, 1}, nullptr, ""})
      ->id;
}

class ObjectStoreTest : public ::testing::Test {
 protected:
  ObjectStoreTest() {
    std::vector<std::unique_ptr<Pool>> pools;
    pools.push_back(std::make_unique<Pool>(
        "default", std::make_unique<FakeSegment>(16 * kPage),
        PoolAccessRules(kUser)));
    store_ = std::make_unique<ObjectStore>(std::move(pools), 42);
    a_ = Open(*store_, "a", 1);
    b_ = Open(*store_, "b", 2);
  }

  absl::StatusOr<Handout> Create(
      uint64_t session, uint64_t bytes, std::string name = "",
      absl::Duration timeout = absl::ZeroDuration()) {
    CreateArgs args;
    args.caller = session;
    args.size_bytes = bytes;
    args.name = std::move(name);
    args.timeout = timeout;
    return CreateBlocking(*store_, args);
  }
  uint64_t Used() { return store_->Stats().pools(0).used_bytes(); }

  std::unique_ptr<ObjectStore> store_;
  uint64_t a_, b_;
};

TEST_F(ObjectStoreTest, LifecycleFreesMemoryWhenLastLeaseGoes) {
  Handout h = *Create(a_, 3 * kPage);
  EXPECT_TRUE(h.writable);
  EXPECT_EQ(h.placement.capacity_bytes(), 3 * kPage);
  SealResult sealed = *store_->Seal(a_, h.lease_id, false);
  Handout view = *store_->Get(b_, sealed.ref);
  EXPECT_FALSE(view.writable);
  EXPECT_EQ(view.placement.offset(), h.placement.offset());
  EXPECT_FALSE(*store_->Release(a_, sealed.lease_id));  // b still holds it.
  EXPECT_EQ(Used(), 3 * kPage);
  EXPECT_TRUE(*store_->Release(b_, view.lease_id));
  EXPECT_EQ(Used(), 0u);
}

// A refused one-way seal says what became of the object: discarded when
// the lease was its unsealed object's write lease, untouched otherwise.
TEST_F(ObjectStoreTest, ARefusedOneWaySealSaysWhatHappened) {
  Handout h = *Create(a_, kPage);
  v1::OneWaySeal too_big;
  too_big.set_lease_id(h.lease_id);
  too_big.set_size_bytes(2 * kPage);  // Past its capacity.
  absl::Status s = store_->ReleaseBatch(a_, 1, {}, {too_big});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("its unsealed object is discarded"),
            std::string::npos)
      << s;
  EXPECT_EQ(Used(), 0u);
  // A sealed object's read lease: refused, and nothing changes.
  Handout kept = *Create(a_, kPage);
  SealResult sealed = *store_->Seal(a_, kept.lease_id, false);
  v1::OneWaySeal again;
  again.set_lease_id(sealed.lease_id);
  s = store_->ReleaseBatch(a_, 2, {}, {again});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("nothing changed"), std::string::npos) << s;
  EXPECT_EQ(s.message().find("discarded"), std::string::npos) << s;
  EXPECT_TRUE(store_->Get(b_, sealed.ref).ok());
}

TEST_F(ObjectStoreTest, UnsealedObjectIsInvisible) {
  Handout h = *Create(a_, kPage, "x");
  absl::StatusOr<Handout> g = store_->Get(b_, h.ref);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition);
  g = GetByNameBlocking(*store_, b_, "x", absl::ZeroDuration());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ObjectStoreTest, NamedGetWaitsForSeal) {
  Handout h = *Create(a_, kPage, "batch");
  std::thread sealer([&] {
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(store_->Seal(a_, h.lease_id, false).ok());
  });
  absl::StatusOr<Handout> g =
      GetByNameBlocking(*store_, b_, "batch", absl::Seconds(10));
  sealer.join();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->ref.slot(), h.ref.slot());
}

TEST_F(ObjectStoreTest, NamedGetTimesOut) {
  const absl::Time start = absl::Now();
  absl::StatusOr<Handout> g =
      GetByNameBlocking(*store_, b_, "never", absl::Milliseconds(100));
  EXPECT_EQ(g.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_NE(g.status().message().find("never"), std::string::npos);
}

TEST_F(ObjectStoreTest, DeleteInUseIsDeferredAndNameIsFreeAgain) {
  Handout h = *Create(a_, kPage, "n");
  SealResult s = *store_->Seal(a_, h.lease_id, false);
  ASSERT_TRUE(store_->Release(a_, s.lease_id).ok());
  EXPECT_EQ(Used(), kPage);  // The name keeps it.
  Handout view = *GetByNameBlocking(*store_, b_, "n", absl::ZeroDuration());
  EXPECT_FALSE(*store_->Delete(a_, "n"));  // Deferred: b holds a view.
  EXPECT_EQ(Used(), kPage);
  EXPECT_EQ(
      GetByNameBlocking(*store_, b_, "n", absl::ZeroDuration()).status().code(),
      absl::StatusCode::kNotFound);
  EXPECT_TRUE(Create(a_, kPage, "n").ok());  // Name reusable at once.
  EXPECT_TRUE(*store_->Release(b_, view.lease_id));
}

TEST_F(ObjectStoreTest, NameIsNeverRebound) {
  ASSERT_TRUE(Create(a_, kPage, "dup").ok());
  absl::StatusOr<Handout> again = Create(b_, kPage, "dup");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(again.status().message().find("dup"), std::string::npos);
}

TEST_F(ObjectStoreTest, StaleRefAfterFreeAndSlotReuse) {
  Handout h = *Create(a_, kPage);
  SealResult s = *store_->Seal(a_, h.lease_id, false);
  ASSERT_TRUE(*store_->Release(a_, s.lease_id));
  Handout reuse = *Create(a_, kPage);  // Same slot, same memory.
  EXPECT_EQ(reuse.ref.slot(), s.ref.slot());
  EXPECT_EQ(reuse.placement.offset(), h.placement.offset());
  ASSERT_TRUE(store_->Seal(a_, reuse.lease_id, false).ok());
  absl::StatusOr<Handout> g = store_->Get(b_, s.ref);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(IsStaleReference(g.status())) << g.status();
}

TEST_F(ObjectStoreTest, ForgedAndForeignRefs) {
  Handout h = *Create(a_, kPage);
  ASSERT_TRUE(store_->Seal(a_, h.lease_id, false).ok());
  v1::ObjectRef forged = h.ref;
  forged.set_generation(h.ref.generation() + 5);
  EXPECT_EQ(store_->Get(b_, forged).status().code(),
            absl::StatusCode::kInvalidArgument);
  forged = h.ref;
  forged.set_slot(1000);
  EXPECT_EQ(store_->Get(b_, forged).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::ObjectRef foreign = h.ref;
  foreign.set_daemon_epoch(7);
  EXPECT_TRUE(IsStaleReference(store_->Get(b_, foreign).status()));
  EXPECT_EQ(store_->Get(b_, v1::ObjectRef()).status().code(),
            absl::StatusCode::kNotFound);  // Epoch 0: not this daemon.
}

TEST_F(ObjectStoreTest, ExclusiveTransferHasExactlyOneTaker) {
  Handout h = *Create(a_, kPage);
  SealResult s = *store_->Seal(a_, h.lease_id, true);
  EXPECT_EQ(s.lease_id, 0u);
  EXPECT_TRUE(s.ref.exclusive());
  EXPECT_EQ(store_->Stats().pending_transfers(), 1u);
  // The creator's lease is gone.
  EXPECT_EQ(store_->Release(a_, h.lease_id).status().code(),
            absl::StatusCode::kFailedPrecondition);
  Handout taken = *store_->Get(b_, s.ref);
  EXPECT_TRUE(taken.writable);
  absl::StatusOr<Handout> second = store_->Get(a_, s.ref);
  EXPECT_TRUE(IsAlreadyTaken(second.status())) << second.status();
  EXPECT_TRUE(*store_->Release(b_, taken.lease_id));
  EXPECT_EQ(Used(), 0u);
}

TEST_F(ObjectStoreTest, SharedWritableObjectIsWritableByEveryHolder) {
  CreateArgs args;
  args.caller = a_;
  args.size_bytes = 2 * kPage;
  args.shared_writable = true;
  Handout h = *CreateBlocking(*store_, args);
  EXPECT_TRUE(h.writable);
  EXPECT_FALSE(h.ref.exclusive());
  // Every Get, from any session, is writable and holds a lease of its own.
  Handout b1 = *store_->Get(b_, h.ref);
  Handout b2 = *store_->Get(b_, h.ref);
  EXPECT_TRUE(b1.writable && b2.writable);
  EXPECT_EQ(b1.placement.offset(), h.placement.offset());
  EXPECT_NE(b1.lease_id, b2.lease_id);
  // Never sealed; the failed seal leaves the creator's lease as it was.
  absl::StatusOr<SealResult> sealed = store_->Seal(a_, h.lease_id, false);
  EXPECT_EQ(sealed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(sealed.status().message(), "shared-writable"))
      << sealed.status();
  EXPECT_EQ(store_->Seal(a_, h.lease_id, true).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->ListObjects(0).objects(0).state(),
            v1::OBJECT_STATE_SHARED_WRITABLE);
  // It lives while any session holds it, the creator's ending included.
  EXPECT_FALSE(*store_->Release(b_, b1.lease_id));
  store_->EndSession(a_);
  EXPECT_EQ(Used(), 2 * kPage);
  EXPECT_TRUE(*store_->Release(b_, b2.lease_id));
  EXPECT_EQ(Used(), 0u);
  EXPECT_TRUE(IsStaleReference(store_->Get(b_, h.ref).status()));
  // No name: a name would publish what nobody sealed.
  args.caller = b_;
  args.name = "ring";
  absl::StatusOr<Handout> named = CreateBlocking(*store_, args);
  EXPECT_EQ(named.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(named.status().message(), "'ring'"));
}

// The DataLoader pattern: two producers hand batches of one size to one
// consumer. A producer's next batch lands on a range it wrote before (its
// pages are mapped in its process already) whenever one is free, even where
// best fit would have given it another producer's; never by splitting a free
// range in two.
TEST_F(ObjectStoreTest, CreateReusesTheRangesTheClientWroteBefore) {
  const uint64_t consumer = Open(*store_, "c", 3);
  auto hand_off = [&](uint64_t producer) {
    Handout h = *Create(producer, 2 * kPage);
    SealResult s = *store_->Seal(producer, h.lease_id, true);
    Handout taken = *store_->Get(consumer, s.ref);
    EXPECT_TRUE(taken.writable);
    return std::make_pair(h.placement.offset(), taken.lease_id);
  };
  const auto [a1, a1_lease] = hand_off(a_);  // Pages [0, 2).
  const auto [b1, b1_lease] = hand_off(b_);  // [2, 4)
  const auto [a2, a2_lease] = hand_off(a_);  // [4, 6)
  const auto [b2, b2_lease] = hand_off(b_);  // [6, 8); [8, 16) free.
  ASSERT_EQ(b1, a1 + 2 * kPage);
  ASSERT_EQ(a2, b1 + 2 * kPage);
  EXPECT_TRUE(*store_->Release(consumer, a1_lease));
  EXPECT_TRUE(*store_->Release(consumer, b1_lease));  // [0, 4) free.
  // Best fit alone would give b [0, 2), a's; b gets its own [2, 4) back.
  const auto [b3, b3_lease] = hand_off(b_);
  EXPECT_EQ(b3, b1);
  const auto [a3, a3_lease] = hand_off(a_);
  EXPECT_EQ(a3, a1);
  // A size the client never wrote goes where best fit puts it.
  Handout other = *Create(a_, 3 * kPage);
  EXPECT_EQ(other.placement.offset(), 8 * kPage);
  ASSERT_TRUE(store_->Release(a_, other.lease_id).ok());
  // Everything is free again, one range [0, 16): taking b's [2, 4) or
  // [6, 8) would split it in two, so b gets best fit's [0, 2).
  for (uint64_t lease : {a2_lease, b2_lease, a3_lease, b3_lease}) {
    ASSERT_TRUE(store_->Release(consumer, lease).ok());
  }
  Handout b4 = *Create(b_, 2 * kPage);
  EXPECT_EQ(b4.placement.offset(), 0u);
  EXPECT_EQ(store_->Stats().pools(0).largest_free_bytes(), 14 * kPage);
  // The consumer was given every range writable, so its own Create of that
  // size lands on the most recent of them that is free: [2, 4).
  Handout c1 = *Create(consumer, 2 * kPage);
  EXPECT_EQ(c1.placement.offset(), b3);
}

TEST_F(ObjectStoreTest, NamedObjectCannotBeExclusive) {
  Handout h = *Create(a_, kPage, "named");
  EXPECT_EQ(store_->Seal(a_, h.lease_id, true).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(ObjectStoreTest, EndSessionReclaimsEverything) {
  Handout unsealed = *Create(a_, kPage, "half");
  Handout transfer = *Create(a_, kPage);
  ASSERT_TRUE(store_->Seal(a_, transfer.lease_id, true).ok());
  Handout shared = *Create(b_, kPage);
  SealResult s = *store_->Seal(b_, shared.lease_id, false);
  ASSERT_TRUE(store_->Get(a_, s.ref).ok());
  EXPECT_EQ(Used(), 3 * kPage);
  store_->EndSession(a_);
  EXPECT_EQ(Used(), kPage);  // Only b's own object remains.
  v1::StatsResponse st = store_->Stats();
  EXPECT_EQ(st.pending_transfers(), 0u);
  EXPECT_EQ(st.named_objects(), 0u);  // The half-written name is gone.
  EXPECT_EQ(st.leases(), 1u);
  EXPECT_TRUE(IsSessionEnded(Create(a_, kPage).status()));
}

TEST_F(ObjectStoreTest, FullPoolWaitsThenSucceedsWhenMemoryReturns) {
  Handout big = *Create(a_, 16 * kPage);
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(store_->Release(a_, big.lease_id).ok());
  });
  absl::StatusOr<Handout> h = Create(b_, kPage, "", absl::Seconds(10));
  releaser.join();
  EXPECT_TRUE(h.ok()) << h.status();
}

TEST_F(ObjectStoreTest, FullPoolFailsAfterTimeoutNamingPoolAndHolders) {
  ASSERT_TRUE(Create(a_, 15 * kPage).ok());
  absl::StatusOr<Handout> h = Create(b_, 2 * kPage, "", absl::Milliseconds(50));
  ASSERT_EQ(h.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string msg(h.status().message());
  EXPECT_NE(msg.find("'default'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("8192 bytes"), std::string::npos) << msg;  // Asked.
  EXPECT_NE(msg.find("4096 of 65536 bytes free"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'a' pid 1 holds 61440 bytes"), std::string::npos) << msg;
}

TEST_F(ObjectStoreTest, FullPoolNamesTheThreeLargestHoldersLargestFirst) {
  const uint64_t c = Open(*store_, "c", 3);
  const uint64_t d = Open(*store_, "d", 4);
  ASSERT_TRUE(Create(a_, kPage).ok());
  ASSERT_TRUE(Create(b_, 2 * kPage).ok());
  // An offered transfer counts for its creator until it is taken.
  Handout offered = *Create(c, 3 * kPage);
  ASSERT_TRUE(store_->Seal(c, offered.lease_id, /*exclusive=*/true).ok());
  ASSERT_TRUE(Create(d, 4 * kPage).ok());
  absl::StatusOr<Handout> h = Create(a_, 8 * kPage);
  ASSERT_EQ(h.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string msg(h.status().message());
  EXPECT_TRUE(absl::StrContains(
      msg,
      "most held by: 'd' pid 4 holds 16384 bytes, 'c' pid 3 holds 12288 "
      "bytes, 'b' pid 2 holds 8192 bytes"))
      << msg;
  EXPECT_FALSE(absl::StrContains(msg, "'a'")) << msg;
}

TEST_F(ObjectStoreTest, LeaseMisuseGetsPreciseErrors) {
  Handout h = *Create(a_, kPage);
  SealResult s = *store_->Seal(a_, h.lease_id, false);
  EXPECT_EQ(store_->Release(b_, s.lease_id).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(store_->Seal(a_, s.lease_id, false).status().code(),
            absl::StatusCode::kFailedPrecondition);  // Sealed twice.
  ASSERT_TRUE(store_->Release(a_, s.lease_id).ok());
  EXPECT_EQ(store_->Release(a_, s.lease_id).status().code(),
            absl::StatusCode::kFailedPrecondition);  // Double release.
  EXPECT_EQ(store_->Release(a_, 999999).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ObjectStoreTest, BadCreateArguments) {
  EXPECT_EQ(Create(a_, 0).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<Handout> huge = Create(a_, 1ull << 40);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(huge.status().message().find("1099511627776"), std::string::npos);
  EXPECT_EQ(Create(a_, kPage, std::string(256, 'n')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Create(a_, kPage, std::string("a\0b", 3)).status().code(),
            absl::StatusCode::kInvalidArgument);
  CreateArgs args;
  args.caller = a_;
  args.size_bytes = kPage;
  args.pool = "nope";
  EXPECT_EQ(CreateBlocking(*store_, args).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Used(), 0u);  // Nothing leaked by the failures.
}

TEST_F(ObjectStoreTest, EmptyTypedObjectTakesNoMemory) {
  CreateArgs args;
  args.caller = a_;
  args.layout.set_dtype(v1::DTYPE_FLOAT32);
  args.layout.add_shape(0);
  args.layout.add_shape(3);
  Handout h = *CreateBlocking(*store_, args);
  EXPECT_EQ(h.placement.size_bytes(), 0u);
  EXPECT_EQ(Used(), 0u);
  SealResult s = *store_->Seal(a_, h.lease_id, false);
  Handout v = *store_->Get(b_, s.ref);
  EXPECT_EQ(v.layout.shape_size(), 2);
}

TEST_F(ObjectStoreTest, EndingASessionEndsItsWaits) {
  ASSERT_TRUE(Create(a_, 16 * kPage).ok());
  std::thread ender([&] {
    absl::SleepFor(absl::Milliseconds(100));
    store_->EndSession(b_);
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<Handout> h = Create(b_, kPage, "", absl::Seconds(30));
  ender.join();
  EXPECT_TRUE(IsSessionEnded(h.status())) << h.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST_F(ObjectStoreTest, ShutdownWakesWaiters) {
  ASSERT_TRUE(Create(a_, 16 * kPage).ok());
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(100));
    store_->Shutdown();
  });
  absl::StatusOr<Handout> h = Create(b_, kPage, "", absl::Seconds(30));
  stopper.join();
  EXPECT_EQ(h.status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(ObjectStoreTest, StreamReleasesApplyInOrderAndSkipUnknownLeases) {
  Handout h1 = *Create(a_, kPage);
  Handout h2 = *Create(a_, kPage);
  Handout other = *Create(b_, kPage);
  // Seq 1 drops h1; another session's lease and an unknown id are skipped
  // and named, and nothing of theirs is touched.
  absl::Status s =
      store_->ReleaseBatch(a_, 1, {h1.lease_id, other.lease_id, 999});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("999"), std::string::npos) << s;
  EXPECT_EQ(Used(), 2 * kPage);
  EXPECT_TRUE(store_->Seal(b_, other.lease_id, false).ok());
  // A seq that skips one breaks the ordering contract.
  s = store_->ReleaseBatch(a_, 3, {h2.lease_id});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("seq 3 out of order: expected 2"),
            std::string::npos)
      << s;
  // A seq applied already is the second copy of that message (the stream's,
  // after a request carried one, or the other way round): skipped whole, so
  // it drops nothing, whatever ids it names.
  EXPECT_TRUE(store_->ReleaseBatch(a_, 1, {h2.lease_id}).ok());
  EXPECT_EQ(Used(), 2 * kPage);
  EXPECT_TRUE(store_->ReleaseBatch(a_, 2, {h2.lease_id}).ok());
  EXPECT_EQ(Used(), kPage);
  EXPECT_TRUE(store_->ReleaseBatch(a_, 2, {h2.lease_id}).ok());
  EXPECT_EQ(Used(), kPage);
}

// Releases that were in flight when SIGTERM came still apply: none is
// refused, or logged as a lease the session does not hold.
// The caller of a data-plane call as the service makes it: session `id` of
// process `pid` (kUser), from the connection of process `from`.
Caller From(uint64_t id, pid_t from) {
  Caller c(id);
  c.owner = OwnerKey{kUser, from, 1};
  return c;
}

v1::ReleaseLeases Message(uint64_t seq, std::vector<uint64_t> ids) {
  v1::ReleaseLeases m;
  m.set_seq(seq);
  for (uint64_t id : ids) m.add_lease_ids(id);
  return m;
}

// [P15] Every data-plane call admits its caller under its own lock: from
// another process, the session is not open, with the message a session
// that is not open gets, and nothing changes.
TEST_F(ObjectStoreTest, EveryCallActsOnlyForTheSessionsOwnProcess) {
  Handout h = *Create(a_, kPage, "n");
  SealResult sealed = *store_->Seal(From(a_, 1), h.lease_id, false);
  Handout w = *Create(a_, kPage);
  const Caller stranger = From(a_, 2);  // Session a_ is process 1's.
  std::vector<absl::Status> refused;
  CreateArgs args;
  args.caller = stranger;
  args.size_bytes = kPage;
  refused.push_back(store_->TryCreate(args, true).status());
  refused.push_back(store_->Seal(stranger, w.lease_id, false).status());
  refused.push_back(store_->Get(stranger, sealed.ref).status());
  refused.push_back(
      store_->TryGetByName(stranger, "n", absl::ZeroDuration(), true).status());
  refused.push_back(
      store_->TryGetMany(stranger, {sealed.ref}, false, true).status());
  refused.push_back(store_->Release(stranger, sealed.lease_id).status());
  refused.push_back(store_->Offer(stranger, sealed.lease_id).status());
  refused.push_back(store_->Delete(stranger, "n").status());
  refused.push_back(store_->SessionStats(stranger).status());
  const absl::Status not_open = store_->SessionStats(From(12345, 1)).status();
  for (size_t i = 0; i < refused.size(); ++i) {
    EXPECT_TRUE(IsSessionEnded(refused[i])) << i << ": " << refused[i];
    EXPECT_EQ(refused[i].message(),
              absl::StrReplaceAll(
                  not_open.message(),
                  {{"0000000000003039", absl::StrFormat("%016x", a_)}}))
        << i;
  }
  // [P15] A process that carries releases for another's session applies
  // none of them: the lease stays (the counts below).
  google::protobuf::RepeatedPtrField<v1::ReleaseLeases> carried;
  *carried.Add() = Message(1, {sealed.lease_id});
  Caller lying = stranger;
  lying.carried = &carried;
  EXPECT_TRUE(IsSessionEnded(store_->SessionStats(lying).status()));
  const v1::StatsResponse st = store_->Stats();
  EXPECT_EQ(st.objects(), 2u);
  EXPECT_EQ(st.leases(), 2u);
  EXPECT_EQ(st.named_objects(), 1u);
  EXPECT_TRUE(store_->Seal(From(a_, 1), w.lease_id, false).ok());
}

// The releases a request carries are applied under the call's own lock,
// before the call: one call drops them and serves what they made room for.
TEST_F(ObjectStoreTest, ACallAppliesTheReleasesItCarriesFirst) {
  Handout h1 = *Create(a_, 8 * kPage);
  Handout h2 = *Create(a_, 8 * kPage);
  google::protobuf::RepeatedPtrField<v1::ReleaseLeases> carried;
  *carried.Add() = Message(1, {h1.lease_id});
  *carried.Add() = Message(2, {h2.lease_id, 999});  // 999: not held.
  absl::Status skipped;
  CreateArgs args;
  args.caller = From(a_, 1);
  args.caller.carried = &carried;
  args.caller.releases_through = 2;
  args.caller.skipped = &skipped;
  args.size_bytes = 16 * kPage;  // Fits only once both are released.
  absl::StatusOr<std::optional<Handout>> h = store_->TryCreate(args, true);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE(h->has_value());
  EXPECT_EQ(skipped.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(skipped.message(), "999")) << skipped;
  // The same copies again (a retry, or the stream's) change nothing.
  skipped = absl::OkStatus();
  EXPECT_TRUE(store_->SessionStats(args.caller).ok());
  EXPECT_TRUE(skipped.ok()) << skipped;
  EXPECT_TRUE(store_->ReleaseBatch(a_, 2, {h2.lease_id}).ok());
  EXPECT_EQ(store_->Stats().leases(), 1u);
}

// A call that follows releases not yet arrived is not served: it says so
// (for the service to wait for the stream), and on its last try fails
// naming both seqs. A copy past a gap is left to the stream.
TEST_F(ObjectStoreTest, ACallWaitsForTheReleasesItFollows) {
  Handout h1 = *Create(a_, kPage);
  Handout h2 = *Create(a_, kPage);
  google::protobuf::RepeatedPtrField<v1::ReleaseLeases> carried;
  *carried.Add() = Message(2, {h2.lease_id});  // Seq 1 has not arrived.
  Caller c = From(a_, 1);
  c.carried = &carried;
  c.releases_through = 2;
  absl::StatusOr<bool> r = store_->Release(c, h1.lease_id);
  EXPECT_TRUE(IsAwaitingReleases(r.status())) << r.status();
  EXPECT_EQ(store_->Stats().leases(), 2u);  // Nothing was applied.
  c.releases_last_try = true;
  r = store_->Release(c, h1.lease_id);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "2 not reached"))
      << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "through 0"))
      << r.status();
  // Seq 1 arrives on the stream: the call goes through, seq 2 from its copy.
  ASSERT_TRUE(store_->ReleaseBatch(a_, 1, {}).ok());
  c.releases_last_try = false;
  EXPECT_TRUE(*store_->Release(c, h1.lease_id));
  EXPECT_EQ(store_->Stats().leases(), 0u);
}

TEST_F(ObjectStoreTest, ACallCarryingTooManyReleasesIsRefusedNamingThem) {
  google::protobuf::RepeatedPtrField<v1::ReleaseLeases> carried;
  for (uint64_t i = 1; i <= kDaemonMaxCarriedReleases + 1; ++i) {
    *carried.Add() = Message(i, {});
  }
  Caller c = From(a_, 1);
  c.carried = &carried;
  absl::Status s = store_->SessionStats(c).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(
      s.message(),
      absl::StrFormat("carries %d ReleaseLeases copies, at most %d",
                      kDaemonMaxCarriedReleases + 1,
                      kDaemonMaxCarriedReleases)))
      << s;
  EXPECT_TRUE(store_->ReleaseBatch(a_, 1, {}).ok());  // None was applied.
}

TEST_F(ObjectStoreTest, ReleasesStillApplyWhileShuttingDown) {
  Handout h1 = *Create(a_, kPage);
  Handout h2 = *Create(a_, kPage);
  store_->Shutdown();
  EXPECT_EQ(Create(a_, kPage).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(store_->ReleaseBatch(a_, 1, {h1.lease_id}).ok());
  absl::StatusOr<bool> freed = store_->Release(a_, h2.lease_id);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_TRUE(*freed);
  EXPECT_EQ(Used(), 0u);
}

TEST_F(ObjectStoreTest, AwaitReleasesWaitsForTheSeqThenTimesOut) {
  EXPECT_TRUE(AwaitReleasesBlocking(*store_, a_, 0, absl::ZeroDuration()).ok());
  Handout h = *Create(a_, kPage);
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(store_->ReleaseBatch(a_, 1, {h.lease_id}).ok());
  });
  EXPECT_TRUE(AwaitReleasesBlocking(*store_, a_, 1, absl::Seconds(30)).ok());
  releaser.join();
  EXPECT_EQ(Used(), 0u);  // The release is applied before the wait returns.
  absl::Status s =
      AwaitReleasesBlocking(*store_, a_, 2, absl::Milliseconds(50));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("through 1 only"), std::string::npos) << s;
  std::thread ender([&] {
    absl::SleepFor(absl::Milliseconds(100));
    store_->EndSession(a_);
  });
  EXPECT_TRUE(
      IsSessionEnded(AwaitReleasesBlocking(*store_, a_, 2, absl::Seconds(30))));
  ender.join();
}

TEST_F(ObjectStoreTest, ListingsFollowHoldingsThroughTransfersAndSessionEnd) {
  Handout named = *Create(a_, kPage, "n");
  ASSERT_TRUE(store_->Seal(a_, named.lease_id, false).ok());
  Handout xfer = *Create(a_, 2 * kPage);
  SealResult offered = *store_->Seal(a_, xfer.lease_id, true);
  // By pid: a_'s is 1, b_'s 2.
  auto holder = [&](uint64_t session) {
    const v1::ListClientsResponse all = store_->ListClients();
    for (const v1::ClientStatus& c : all.clients()) {
      if (c.pid() == (session == a_ ? 1 : 2)) return c;
    }
    return v1::ClientStatus();
  };
  EXPECT_EQ(holder(a_).bytes_held(), 3 * kPage);  // Its ref and its transfer.
  EXPECT_EQ(holder(a_).pending_transfers(), 1u);
  Handout taken = *store_->Get(b_, offered.ref);
  EXPECT_EQ(holder(a_).bytes_held(), kPage);  // The transfer moved to b.
  EXPECT_EQ(holder(b_).bytes_held(), 2 * kPage);
  v1::ListObjectsResponse objects = store_->ListObjects(0);
  ASSERT_EQ(objects.objects_size(), 2);
  EXPECT_EQ(objects.objects(0).name(), "n");
  EXPECT_EQ(objects.objects(0).state(), v1::OBJECT_STATE_SEALED);
  EXPECT_EQ(objects.objects(1).state(), v1::OBJECT_STATE_TAKEN);
  EXPECT_EQ(objects.objects(1).creator(), "'a' pid 1");
  store_->EndSession(a_);
  EXPECT_EQ(store_->ListObjects(0).objects(0).creator(),
            absl::StrFormat("session %016x (ended)", a_));
  v1::DaemonStatus status = store_->Status();
  EXPECT_EQ(status.pools(0).used_bytes(), 3 * kPage);  // Name and b's take.
  EXPECT_EQ(status.pools(0).high_water_bytes(), 3 * kPage);
  EXPECT_EQ(status.pools(0).leases(), 1u);
  ASSERT_TRUE(store_->Release(b_, taken.lease_id).ok());
  EXPECT_EQ(holder(b_).bytes_held(), 0u);
  EXPECT_EQ(store_->Status().pools(0).high_water_bytes(), 3 * kPage);
}

TEST(ObjectStoreLimitsTest, LimitsNameTheClientAndTheLimit) {
  std::vector<std::unique_ptr<Pool>> pools;
  pools.push_back(std::make_unique<Pool>(
      "default", std::make_unique<FakeSegment>(64 * kPage),
      PoolAccessRules(kUser)));
  ObjectStore store(std::move(pools), 1,
                    {.max_objects = 3,
                     .max_leases_per_client = 2,
                     .max_bytes_per_client = 4 * kPage,
                     .uid_share_percent = 100});
  const uint64_t a = Open(store, "a", 7);
  const uint64_t b = Open(store, "b", 8);
  CreateArgs args{.caller = a, .size_bytes = 5 * kPage};
  absl::StatusOr<Handout> h = CreateBlocking(store, args);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(h.status().message().find("'a' pid 7 holds 0 bytes; 20480 more "
                                      "would pass the limit "
                                      "(limits.max_bytes_per_client = 16384)"),
            std::string::npos)
      << h.status();
  args.size_bytes = 2 * kPage;
  Handout h1 = *CreateBlocking(store, args);
  SealResult s1 = *store.Seal(a, h1.lease_id, false);
  // A second lease on an object it already holds costs no bytes.
  ASSERT_TRUE(store.Get(a, s1.ref).ok());
  h = store.Get(a, s1.ref);
  EXPECT_NE(h.status().message().find("holds 2 leases, the limit "
                                      "(limits.max_leases_per_client = 2)"),
            std::string::npos)
      << h.status();
  args.caller = b;
  args.size_bytes = kPage;
  ASSERT_TRUE(CreateBlocking(store, args).ok());
  ASSERT_TRUE(CreateBlocking(store, args).ok());
  h = CreateBlocking(store, args);
  EXPECT_NE(h.status().message().find("(limits.max_objects = 3)"),
            std::string::npos)
      << h.status();
  EXPECT_EQ(store.Status().limits().max_objects(), 3u);
}

TEST(ObjectStoreHugePagesTest, LargeObjectsTakeWholeAlignedHugePages) {
  constexpr uint64_t kHuge = 512 * kPage;  // 2 MiB.
  std::vector<std::unique_ptr<Pool>> pools;
  pools.push_back(std::make_unique<Pool>(
      "huge", std::make_unique<FakeSegment>(8 * kHuge, kHuge),
      PoolAccessRules(kUser)));
  ObjectStore store(std::move(pools), 7);
  EXPECT_EQ(store.pool_infos()[0].huge_page_size(), kHuge);
  const uint64_t s = Open(store, "s", 1);
  auto create = [&](uint64_t bytes) {
    CreateArgs args;
    args.caller = s;
    args.size_bytes = bytes;
    return *CreateBlocking(store, args);
  };
  // Small objects keep the page granule and pack down from the top...
  const Handout small = create(100);
  EXPECT_EQ(small.placement.offset(), 8 * kHuge - kPage);
  EXPECT_EQ(small.placement.capacity_bytes(), kPage);
  // ...large ones, from half a huge page up, take whole huge pages on huge
  // boundaries from the bottom, so the two never share a huge page here.
  const Handout half = create(kHuge / 2);
  EXPECT_EQ(half.placement.offset(), 0u);
  EXPECT_EQ(half.placement.capacity_bytes(), kHuge);
  const Handout odd = create(3 * kHuge + 1);
  EXPECT_EQ(odd.placement.offset(), kHuge);
  EXPECT_EQ(odd.placement.capacity_bytes(), 4 * kHuge);
  EXPECT_EQ(odd.placement.size_bytes(), 3 * kHuge + 1);
  EXPECT_EQ(create(kHuge / 2 - kPage).placement.offset(),
            8 * kHuge - kPage - (kHuge / 2 - kPage));
  // Freed and made again, a lifecycle gets the same range back.
  const uint64_t small_at = small.placement.offset();
  ASSERT_TRUE(store.Release(s, small.lease_id).ok());
  EXPECT_EQ(create(100).placement.offset(), small_at);
}

// [P24] One uid never takes what another needs: each table the daemon
// shares between uids has a per-uid share. On the old code uid 2000 took
// every object record with zero-byte objects and every pin with offers.
TEST(ObjectStoreSharesTest, OneUidTakesAtMostItsShareOfEachTable) {
  PoolAccessConfig both;
  both.users = {"2000"};
  std::vector<std::unique_ptr<Pool>> pools;
  pools.push_back(std::make_unique<Pool>(
      "shared", std::make_unique<FakeSegment>(64 * kPage),
      *PoolAccessRules::Resolve("shared", both, kUser, -1)));
  ObjectStore store(std::move(pools), 42,
                    {.max_objects = 8, .max_pins_per_uid = 2});
  EXPECT_EQ(store.limits().max_objects_per_uid, 4u);  // Half, by default.
  const uint64_t attacker = Open(store, "attacker", 7, 2000);
  const uint64_t victim = Open(store, "victim", 8, kUser);
  // Zero-byte objects (a typed layout with an empty dimension) hold no pool
  // memory, but each costs its uid a record.
  CreateArgs empty{.caller = attacker};
  empty.layout.set_dtype(v1::DTYPE_FLOAT32);
  empty.layout.add_shape(0);
  std::vector<SealResult> sealed;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<Handout> h = CreateBlocking(store, empty);
    ASSERT_TRUE(h.ok()) << h.status();
    sealed.push_back(*store.Seal(attacker, h->lease_id, false));
  }
  absl::StatusOr<Handout> more = CreateBlocking(store, empty);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(more.status().message().find(
                "uid 2000 has 4 live objects; 1 more would pass its share "
                "(limits.max_objects_per_uid = 4)"),
            std::string::npos)
      << more.status();
  // The other uid's puts go on.
  CreateArgs put{.caller = victim, .size_bytes = kPage};
  absl::StatusOr<Handout> v = CreateBlocking(store, put);
  ASSERT_TRUE(v.ok()) << v.status();
  const SealResult vs = *store.Seal(victim, v->lease_id, false);
  // Offers (and fork-held objects) are pins: two for uid 2000.
  ASSERT_TRUE(store.Offer(attacker, sealed[0].lease_id).ok());
  ASSERT_TRUE(store.Offer(attacker, sealed[1].lease_id).ok());
  absl::StatusOr<OfferGrant> offer = store.Offer(attacker, sealed[2].lease_id);
  EXPECT_EQ(offer.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(offer.status().message().find("(limits.max_pins_per_uid = 2)"),
            std::string::npos)
      << offer.status();
  EXPECT_TRUE(store.Offer(victim, vs.lease_id).ok());
  // Freed objects give their records back to their uid.
  ASSERT_TRUE(store.Release(attacker, sealed[3].lease_id).ok());
  EXPECT_TRUE(CreateBlocking(store, empty).ok());
}

// Per-pool access: a session sees, creates in, reads from and hands out
// descriptors of only the pools its peer's credentials allow.
class ObjectStoreAccessTest : public ::testing::Test {
 protected:
  ObjectStoreAccessTest() {
    PoolAccessConfig shared;
    shared.users = {"2000"};
    shared.read_only_users = {"3000"};
    shared.read_only_groups = {"77"};
    std::vector<std::unique_ptr<Pool>> pools;
    pools.push_back(std::make_unique<Pool>(
        "private", std::make_unique<FakeSegment>(16 * kPage),
        PoolAccessRules(kUser)));
    pools.push_back(std::make_unique<Pool>(
        "shared", std::make_unique<FakeSegment>(16 * kPage),
        *PoolAccessRules::Resolve("shared", shared, kUser, -1)));
    store_ = std::make_unique<ObjectStore>(std::move(pools), 42);
  }
  absl::StatusOr<OpenedSession> OpenAs(uid_t uid,
                                       std::vector<gid_t> groups = {},
                                       bool read_only = false) {
    const pid_t pid = ++last_pid_;
    return store_->OpenSession("t",
                               PeerInfo{{pid, uid, uid, std::move(groups)},
                                        OwnerKey{uid, pid, 1},
                                        nullptr,
                                        ""},
                               read_only);
  }
  absl::StatusOr<Handout> CreateIn(uint64_t session, const std::string& pool) {
    CreateArgs args;
    args.caller = session;
    args.size_bytes = kPage;
    args.pool = pool;
    return CreateBlocking(*store_, args);
  }
  std::unique_ptr<ObjectStore> store_;
  pid_t last_pid_ = 100;  // The pid of the last session OpenAs opened.
};

TEST_F(ObjectStoreAccessTest, SessionsSeeAndUseOnlyTheirPools) {
  OpenedSession owner = *OpenAs(kUser);
  ASSERT_EQ(owner.pools.size(), 2u);
  EXPECT_EQ(owner.pools[1].access(), v1::POOL_ACCESS_READ_WRITE);
  OpenedSession writer = *OpenAs(2000);
  ASSERT_EQ(writer.pools.size(), 1u);
  EXPECT_EQ(writer.pools[0].name(), "shared");
  EXPECT_EQ(writer.pools[0].pool_id(), 1u);
  EXPECT_EQ(writer.pools[0].access(), v1::POOL_ACCESS_READ_WRITE);
  EXPECT_EQ(writer.descriptor_secret.size(), kDescriptorSecretBytes);
  // The default pool is the first it may write; "private" is unknown to it.
  CreateArgs args;
  args.caller = writer.id;
  args.size_bytes = kPage;
  EXPECT_EQ(CreateBlocking(*store_, args)->placement.pool_id(), 1u);
  EXPECT_EQ(CreateIn(writer.id, "private").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->SessionStats(writer.id)->pools_size(), 1);
  // Another user's object in a pool it may not read: refused, naming it.
  Handout mine = *CreateIn(owner.id, "private");
  SealResult sealed = *store_->Seal(owner.id, mine.lease_id, false);
  absl::StatusOr<Handout> got = store_->Get(writer.id, sealed.ref);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(got.status().message(),
                                "uid 2000 may not use pool 'private'"))
      << got.status();
}

// The daemon alone decides which pool holds what a session creates on a
// device without naming a pool, and tells each session per device
// (PoolInfo.default_for_device): the first pool there it may write, else
// the first it may read; a Create that names no pool lands in the host one.
TEST(ObjectStoreDefaultPoolTest, TheDaemonMarksOnePoolPerDeviceForEachSession) {
  PoolAccessConfig readers;
  readers.users = {std::to_string(kUser)};
  readers.read_only_users = {"3000"};
  PoolAccessConfig writers = readers;
  writers.users.push_back("3000");
  std::vector<std::unique_ptr<Pool>> pools;
  pools.push_back(std::make_unique<Pool>(
      "read", std::make_unique<FakeSegment>(16 * kPage),
      *PoolAccessRules::Resolve("read", readers, kUser, -1)));
  pools.push_back(std::make_unique<Pool>(
      "gpu1", FakeSegment::Cuda(16 * kPage, 1),
      *PoolAccessRules::Resolve("gpu1", writers, kUser, -1)));
  pools.push_back(std::make_unique<Pool>(
      "write", std::make_unique<FakeSegment>(16 * kPage),
      *PoolAccessRules::Resolve("write", writers, kUser, -1)));
  pools.push_back(std::make_unique<Pool>(
      "gpu1b", FakeSegment::Cuda(16 * kPage, 1),
      *PoolAccessRules::Resolve("gpu1b", writers, kUser, -1)));
  pools.push_back(std::make_unique<Pool>(
      "gpu0", FakeSegment::Cuda(16 * kPage, 0),
      *PoolAccessRules::Resolve("gpu0", readers, kUser, -1)));
  ObjectStore store(std::move(pools), 42);
  auto defaults_of = [&](uid_t uid, bool read_only) {
    static pid_t pid = 500;
    ++pid;
    OpenedSession s = *store.OpenSession(
        "t", PeerInfo{{pid, uid, uid, {}}, OwnerKey{uid, pid, 1}, nullptr, ""},
        read_only);
    std::vector<std::string> marked;
    for (const v1::PoolInfo& p : s.pools) {
      if (p.default_for_device()) marked.push_back(p.name());
    }
    return std::make_pair(s.id, marked);
  };
  // The owner may write every pool: the first of each device.
  auto [owner, owner_marked] = defaults_of(kUser, false);
  EXPECT_EQ(owner_marked, (std::vector<std::string>{"read", "gpu1", "gpu0"}));
  // Uid 3000 may only read "read" and "gpu0": the host pool it may write
  // comes first, and on cuda:0 the one it may read.
  auto [reader, reader_marked] = defaults_of(3000, false);
  EXPECT_EQ(reader_marked, (std::vector<std::string>{"gpu1", "write", "gpu0"}));
  // Read-only, it writes nothing: the first pool of each device.
  auto [ro, ro_marked] = defaults_of(3000, true);
  EXPECT_EQ(ro_marked, (std::vector<std::string>{"read", "gpu1", "gpu0"}));
  // A Create naming no pool goes where the host mark says.
  CreateArgs args;
  args.size_bytes = kPage;
  args.caller = owner;
  EXPECT_EQ(CreateBlocking(store, args)->placement.pool_id(), 0u);
  args.caller = reader;
  EXPECT_EQ(CreateBlocking(store, args)->placement.pool_id(), 2u);
  args.caller = ro;
  absl::StatusOr<Handout> refused = CreateBlocking(store, args);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "pool 'read'"))
      << refused.status();
}

TEST_F(ObjectStoreAccessTest, AUidOnNoListIsRefusedNamingIt) {
  absl::StatusOr<OpenedSession> s = OpenAs(4000);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(s.status().message(), "uid 4000"))
      << s.status();
  EXPECT_EQ(store_->Stats().sessions(), 0u);
}

TEST_F(ObjectStoreAccessTest, ReadersReadAndNeverWrite) {
  OpenedSession owner = *OpenAs(kUser);
  Handout h = *CreateIn(owner.id, "shared");
  SealResult sealed = *store_->Seal(owner.id, h.lease_id, false);
  CreateArgs named;
  named.caller = owner.id;
  named.size_bytes = kPage;
  named.pool = "shared";
  named.name = "weights";
  Handout n = *CreateBlocking(*store_, named);
  ASSERT_TRUE(store_->Seal(owner.id, n.lease_id, false).ok());
  Handout x = *CreateIn(owner.id, "shared");
  SealResult xfer = *store_->Seal(owner.id, x.lease_id, true);
  CreateArgs sw;
  sw.caller = owner.id;
  sw.size_bytes = kPage;
  sw.pool = "shared";
  sw.shared_writable = true;
  Handout ring = *CreateBlocking(*store_, sw);
  // A read-only user (by uid, by supplementary group) and a read-only
  // session of a writer.
  for (absl::StatusOr<OpenedSession> reader :
       {OpenAs(3000), OpenAs(5000, {77}), OpenAs(2000, {}, true)}) {
    ASSERT_TRUE(reader.ok()) << reader.status();
    ASSERT_EQ(reader->pools.size(), 1u);
    EXPECT_EQ(reader->pools[0].access(), v1::POOL_ACCESS_READ);
    absl::StatusOr<Handout> c = CreateIn(reader->id, "shared");
    EXPECT_EQ(c.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_TRUE(absl::StrContains(c.status().message(), "may only read"))
        << c.status();
    EXPECT_FALSE(store_->Get(reader->id, sealed.ref)->writable);
    EXPECT_TRUE(
        GetByNameBlocking(*store_, reader->id, "weights", absl::ZeroDuration())
            .ok());
    EXPECT_EQ(store_->Delete(reader->id, "weights").status().code(),
              absl::StatusCode::kPermissionDenied);
    EXPECT_EQ(store_->Get(reader->id, ring.ref).status().code(),
              absl::StatusCode::kPermissionDenied);
  }
  // A reader's take of an exclusive hand-off is a read-only take.
  OpenedSession reader = *OpenAs(3000);
  absl::StatusOr<Handout> taken = store_->Get(reader.id, xfer.ref);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_FALSE(taken->writable);
  v1::ListClientsResponse clients = store_->ListClients();
  bool listed = false;
  for (const v1::ClientStatus& c : clients.clients()) {
    if (c.uid() != 2000 || !c.read_only()) continue;
    listed = true;
    ASSERT_EQ(c.pools_size(), 1);
    EXPECT_EQ(c.pools(0).pool(), "shared");
    EXPECT_EQ(c.pools(0).access(), v1::POOL_ACCESS_READ);
  }
  EXPECT_TRUE(listed);
}

TEST_F(ObjectStoreAccessTest,
       DescriptorsGoOnlyToTheSessionsProcessWithItsSecret) {
  OpenedSession s = *OpenAs(2000);
  // The session's process: uid, pid and start time (the tests' is 1).
  const OwnerKey self{2000, last_pid_, 1};
  absl::StatusOr<std::vector<DescriptorGrant>> ok =
      store_->GrantDescriptors(s.id, s.descriptor_secret, self);
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->size(), 1u);
  EXPECT_EQ((*ok)[0].pool_id, 1u);
  EXPECT_EQ((*ok)[0].access, v1::POOL_ACCESS_READ_WRITE);
  std::string wrong = s.descriptor_secret;
  wrong[0] ^= 0x80;
  const OwnerKey other_pid{2000, 999, 1};
  const OwnerKey other_uid{2001, last_pid_, 1};
  // The session's pid, handed out again to a later process.
  const OwnerKey pid_reused{2000, last_pid_, 2};
  // A process the daemon cannot see: no pid to tell it by.
  const OwnerKey unseen{2000, 0, uint64_t{1} << 63};
  for (const auto& [id, secret, peer] :
       std::vector<std::tuple<uint64_t, std::string, OwnerKey>>{
           {s.id, wrong, self},
           {s.id, s.descriptor_secret.substr(1), self},
           {s.id, s.descriptor_secret + "x", self},
           {s.id + 1, s.descriptor_secret, self},
           {s.id, s.descriptor_secret, other_pid},
           {s.id, s.descriptor_secret, other_uid},
           {s.id, s.descriptor_secret, pid_reused},
           {s.id, s.descriptor_secret, unseen}}) {
    absl::StatusOr<std::vector<DescriptorGrant>> g =
        store_->GrantDescriptors(id, secret, peer);
    EXPECT_EQ(g.status().code(), absl::StatusCode::kPermissionDenied);
  }
  store_->EndSession(s.id);
  EXPECT_FALSE(store_->GrantDescriptors(s.id, s.descriptor_secret, self).ok());
}

}  // namespace
}  // namespace shmtensor::daemon

namespace shmtensor::daemon {
namespace {

// [P21] A range one uid was given writable reaches another uid only with
// the stale parts named for clearing; within one uid it is reused as is.
TEST_F(ObjectStoreTest, RangesAnotherUidWroteAreHandedOutForClearing) {
  const uint64_t root = Open(*store_, "root", 3, 0);
  Handout first = *Create(a_, 3 * kPage);
  EXPECT_TRUE(first.stale.empty());  // The pool starts zeroed.
  ASSERT_TRUE(*store_->Release(a_, first.lease_id));
  Handout again = *Create(b_, 3 * kPage);  // Another process, same uid.
  EXPECT_EQ(again.placement.offset(), first.placement.offset());
  EXPECT_TRUE(again.stale.empty());
  ASSERT_TRUE(*store_->Release(b_, again.lease_id));
  EXPECT_EQ(store_->Status().pools(0).cleared_bytes(), 0u);

  Handout other = *Create(root, 4 * kPage);
  ASSERT_EQ(other.placement.offset(), first.placement.offset());
  ASSERT_EQ(other.stale.size(), 1u);
  EXPECT_EQ(other.stale[0].offset, first.placement.offset());
  EXPECT_EQ(other.stale[0].length, 3 * kPage);  // Not the clean 4th page.
  EXPECT_EQ(store_->Status().pools(0).cleared_bytes(), 3 * kPage);
  EXPECT_TRUE(store_->ClearStale(root, other).ok());
}

// An exclusive hand-off taken by another uid leaves its range written by
// both: it is cleared for whichever of them creates there next.
TEST_F(ObjectStoreTest, ARangeTakenByAnotherUidIsClearedForBoth) {
  const uint64_t root = Open(*store_, "root", 3, 0);
  Handout h = *Create(a_, 2 * kPage);
  SealResult sealed = *store_->Seal(a_, h.lease_id, true);
  Handout taken = *store_->Get(root, sealed.ref);
  EXPECT_TRUE(taken.writable);
  ASSERT_TRUE(*store_->Release(root, taken.lease_id));
  Handout mine = *Create(a_, 2 * kPage);
  ASSERT_EQ(mine.placement.offset(), h.placement.offset());
  EXPECT_EQ(mine.stale.size(), 1u);
}

// -- Offers [P19] ------------------------------------------------------------

// A store whose limits the test sets, with sessions a and b (uid kUser).
struct OfferStore {
  explicit OfferStore(StoreLimits limits) {
    std::vector<std::unique_ptr<Pool>> pools;
    pools.push_back(std::make_unique<Pool>(
        "default", std::make_unique<FakeSegment>(16 * kPage),
        PoolAccessRules(kUser)));
    store = std::make_unique<ObjectStore>(std::move(pools), 42, limits);
    a = Open(*store, "a", 1);
    b = Open(*store, "b", 2);
  }
  absl::StatusOr<Handout> Create(uint64_t session, uint64_t bytes,
                                 bool shared_writable = false) {
    CreateArgs args;
    args.caller = session;
    args.size_bytes = bytes;
    args.shared_writable = shared_writable;
    return CreateBlocking(*store, args);
  }
  // A sealed object of a's, and a's read lease on it.
  SealResult Sealed(uint64_t bytes = kPage) {
    return *store->Seal(a, Create(a, bytes)->lease_id, false);
  }
  uint64_t Used() { return store->Stats().pools(0).used_bytes(); }

  std::unique_ptr<ObjectStore> store;
  uint64_t a, b;
};

TEST(ObjectStoreOfferTest, AnOfferOutlivesItsSendersSessionUntilTaken) {
  OfferStore s({});
  SealResult sealed = s.Sealed(2 * kPage);
  OfferGrant offer = *s.store->Offer(s.a, sealed.lease_id);
  EXPECT_NE(offer.token, 0u);
  EXPECT_EQ(offer.ref.slot(), sealed.ref.slot());
  EXPECT_EQ(offer.ref.nonce(), sealed.ref.nonce());
  // The sender lets go of everything and ends: the offer keeps the object.
  ASSERT_TRUE(s.store->Release(s.a, sealed.lease_id).ok());
  s.store->EndSession(s.a);
  EXPECT_EQ(s.Used(), 2 * kPage);
  EXPECT_EQ(s.store->Stats().offers(), 1u);
  Handout taken = *s.store->Get(s.b, offer.ref, offer.token);
  EXPECT_FALSE(taken.writable);
  EXPECT_EQ(s.store->Stats().offers(), 0u);  // The lease holds it now.
  EXPECT_EQ(s.Used(), 2 * kPage);
  EXPECT_TRUE(*s.store->Release(s.b, taken.lease_id));
  EXPECT_EQ(s.Used(), 0u);
  // Taken once: the token pins nothing now, and the ref is stale, saying
  // why.
  absl::StatusOr<Handout> again = s.store->Get(s.b, offer.ref, offer.token);
  EXPECT_TRUE(IsStaleReference(again.status())) << again.status();
  EXPECT_TRUE(absl::StrContains(again.status().message(), "offer was taken"))
      << again.status();
}

TEST(ObjectStoreOfferTest, AnUntakenOfferEndsGraceAfterItsSessionEnded) {
  StoreLimits limits;
  limits.offer_grace_ms = 60000;
  OfferStore s(limits);
  SealResult sealed = s.Sealed();
  OfferGrant offer = *s.store->Offer(s.a, sealed.lease_id);
  // While the session is open, time does not end it.
  EXPECT_EQ(s.store->ExpireOffers(absl::Now() + absl::Hours(24)), 0);
  s.store->EndSession(s.a);
  EXPECT_EQ(s.store->ExpireOffers(absl::Now() + absl::Seconds(30)), 0);
  EXPECT_EQ(s.Used(), kPage);
  EXPECT_EQ(s.store->ExpireOffers(absl::Now() + absl::Seconds(61)), 1);
  EXPECT_EQ(s.Used(), 0u);
  EXPECT_EQ(s.store->Stats().offers(), 0u);
  EXPECT_TRUE(
      IsStaleReference(s.store->Get(s.b, offer.ref, offer.token).status()));
}

TEST(ObjectStoreOfferTest, WithNoGraceOffersEndWithTheirSession) {
  StoreLimits limits;
  limits.offer_grace_ms = 0;
  OfferStore s(limits);
  SealResult sealed = s.Sealed();
  ASSERT_TRUE(s.store->Offer(s.a, sealed.lease_id).ok());
  s.store->EndSession(s.a);
  EXPECT_EQ(s.Used(), 0u);
}

TEST(ObjectStoreOfferTest, ATokenOfAnotherObjectTakesNothing) {
  OfferStore s({});
  SealResult one = s.Sealed();
  SealResult two = s.Sealed();
  OfferGrant offer_one = *s.store->Offer(s.a, one.lease_id);
  // Two's ref with one's token: a lease on two; one's pin stays.
  ASSERT_TRUE(s.store->Get(s.b, two.ref, offer_one.token).ok());
  EXPECT_EQ(s.store->Stats().offers(), 1u);
  ASSERT_TRUE(s.store->Release(s.a, one.lease_id).ok());
  s.store->EndSession(s.a);
  EXPECT_TRUE(s.store->Get(s.b, offer_one.ref, offer_one.token).ok());
  EXPECT_EQ(s.store->Stats().offers(), 0u);
}

TEST(ObjectStoreOfferTest, OnlyReadLeasesOfSealedSharedObjectsAreOffered) {
  OfferStore s({});
  Handout unsealed = *s.Create(s.a, kPage);
  absl::StatusOr<OfferGrant> o = s.store->Offer(s.a, unsealed.lease_id);
  EXPECT_EQ(o.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(o.status().message(), "not a read lease"))
      << o.status();
  Handout shared = *s.Create(s.a, kPage, true);
  EXPECT_EQ(s.store->Offer(s.a, shared.lease_id).status().code(),
            absl::StatusCode::kFailedPrecondition);
  SealResult ex = *s.store->Seal(s.a, s.Create(s.a, kPage)->lease_id, true);
  Handout taken = *s.store->Get(s.b, ex.ref);
  EXPECT_EQ(s.store->Offer(s.b, taken.lease_id).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Another session's lease, or none: the lease lookup's errors.
  SealResult sealed = s.Sealed();
  EXPECT_EQ(s.store->Offer(s.b, sealed.lease_id).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.store->Offer(s.b, 999999).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(s.store->Stats().offers(), 0u);
}

TEST(ObjectStoreOfferTest, OffersPerSessionAreBounded) {
  StoreLimits limits;
  limits.max_offers_per_session = 3;
  OfferStore s(limits);
  SealResult sealed = s.Sealed();
  std::vector<OfferGrant> offers;
  for (int i = 0; i < 3; ++i) {
    offers.push_back(*s.store->Offer(s.a, sealed.lease_id));
  }
  absl::StatusOr<OfferGrant> fourth = s.store->Offer(s.a, sealed.lease_id);
  EXPECT_EQ(fourth.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(fourth.status().message(),
                                "limits.max_offers_per_session = 3"))
      << fourth.status();
  // A take makes room.
  ASSERT_TRUE(s.store->Get(s.b, offers[0].ref, offers[0].token).ok());
  EXPECT_TRUE(s.store->Offer(s.a, sealed.lease_id).ok());
}

TEST(ObjectStoreOfferTest, ATakeMovesTheOffersChargeToTheNewLease) {
  StoreLimits limits;
  limits.max_bytes_per_uid = 4 * kPage;
  limits.max_leases_per_client = 1;
  OfferStore s(limits);
  SealResult sealed = s.Sealed(3 * kPage);
  OfferGrant offer = *s.store->Offer(s.a, sealed.lease_id);
  ASSERT_TRUE(s.store->Release(s.a, sealed.lease_id).ok());
  // uid kUser holds 3 pages, the offer's. The taker (same uid) is charged
  // them instead, not on top.
  absl::StatusOr<Handout> taken = s.store->Get(s.b, offer.ref, offer.token);
  ASSERT_TRUE(taken.ok()) << taken.status();
  // A refused take (b is at its one lease) leaves the offer in place.
  OfferGrant again = *s.store->Offer(s.b, taken->lease_id);
  EXPECT_EQ(s.store->Get(s.b, again.ref, again.token).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.store->Stats().offers(), 1u);
  ASSERT_TRUE(s.store->Release(s.b, taken->lease_id).ok());
  EXPECT_EQ(s.Used(), 3 * kPage);  // The offer keeps it.
  absl::StatusOr<Handout> later = s.store->Get(s.b, again.ref, again.token);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(s.store->Stats().offers(), 0u);
  EXPECT_TRUE(*s.store->Release(s.b, later->lease_id));
  EXPECT_EQ(s.Used(), 0u);
}

TEST(ObjectStoreOfferTest, WhatAnOfferPinsCountsAgainstTheSendersUid) {
  StoreLimits limits;
  limits.max_bytes_per_uid = 4 * kPage;
  OfferStore s(limits);
  SealResult sealed = s.Sealed(3 * kPage);
  ASSERT_TRUE(s.store->Offer(s.a, sealed.lease_id).ok());
  ASSERT_TRUE(s.store->Release(s.a, sealed.lease_id).ok());
  s.store->EndSession(s.a);
  // 3 pages pinned for uid kUser: b (same uid) cannot hold 2 more.
  absl::StatusOr<Handout> h = s.Create(s.b, 2 * kPage);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kResourceExhausted)
      << h.status();
}

}  // namespace
}  // namespace shmtensor::daemon
