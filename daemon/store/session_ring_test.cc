// The daemon's end of the release ring, through the store: what a session
// posts there is applied when another session needs it, in seq order, and
// nothing a client writes there acts for another session or harms the
// daemon.
#include "daemon/store/session_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/memory/fake_segment.h"
#include "daemon/store/object_store.h"
#include "daemon/store/store_views.h"
#include "gtest/gtest.h"
#include "shmtensor/errors.h"
#include "testing/cpp/blocking_store.h"

namespace shmtensor::daemon {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kPoolPages = 16;
constexpr uid_t kUser = 1000;

class SessionRingTest : public ::testing::Test {
 protected:
  SessionRingTest() { Open({}); }
  ~SessionRingTest() override { munmap(base_, kReleaseRingBytes); }

  // A store of one 16-page pool under `limits`, sessions a (whose ring the
  // test posts in) and b.
  void Open(const StoreLimits& limits) {
    if (base_ != nullptr) munmap(base_, kReleaseRingBytes);
    writer_.reset();
    std::vector<std::unique_ptr<Pool>> pools;
    pools.push_back(std::make_unique<Pool>(
        "default", std::make_unique<FakeSegment>(kPoolPages * kPage),
        PoolAccessRules(kUser)));
    store_ = std::make_unique<ObjectStore>(std::move(pools), 42, limits);
    a_ = *store_->OpenSession("a", Peer(1));
    b_ = *store_->OpenSession("b", Peer(2));
    UniqueFd fd;
    EXPECT_TRUE(
        store_
            ->GrantDescriptors(a_.id, a_.descriptor_secret, Peer(1).owner, &fd)
            .ok());
    EXPECT_TRUE(fd.valid());
    fd_ = std::move(fd);
    base_ = mmap(nullptr, kReleaseRingBytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                 fd_.get(), 0);
    EXPECT_NE(base_, MAP_FAILED);
    writer_.emplace(*ReleaseRingWriter::Attach(base_, kReleaseRingBytes));
  }

  static PeerInfo Peer(pid_t pid) {
    return PeerInfo{{pid, kUser, kUser}, OwnerKey{kUser, pid, 1}, nullptr, ""};
  }
  Handout Create(uint64_t session, uint64_t pages = 1) {
    CreateArgs args;
    args.caller = session;
    args.size_bytes = pages * kPage;
    return *CreateBlocking(*store_, args);
  }
  static CreateArgs WholePool(uint64_t session) {
    CreateArgs args;
    args.caller = session;
    args.size_bytes = kPoolPages * kPage;
    return args;
  }
  static v1::ReleaseLeases SealMessage(uint64_t seq, uint64_t lease_id) {
    v1::ReleaseLeases m;
    m.set_seq(seq);
    m.add_seals()->set_lease_id(lease_id);
    return m;
  }
  bool Post(const v1::ReleaseLeases& m) {
    return writer_->Post(m.SerializeAsString());
  }
  v1::ClientStatus StatusOf(uint64_t client_id) {
    const v1::ListClientsResponse all = store_->ListClients();
    for (const v1::ClientStatus& c : all.clients()) {
      if (c.client_id() == client_id) return c;
    }
    ADD_FAILURE() << "no client " << client_id;
    return {};
  }

  std::unique_ptr<ObjectStore> store_;
  OpenedSession a_, b_;
  UniqueFd fd_;
  void* base_ = nullptr;
  std::optional<ReleaseRingWriter> writer_;
};

TEST_F(SessionRingTest, AGetElsewherePullsTheSealFromTheCreatorsRing) {
  const Handout h = Create(a_.id);
  ASSERT_TRUE(Post(SealMessage(1, h.lease_id)));
  // No stream message, no call of a's: b's Get finds the seal.
  absl::StatusOr<Handout> got = store_->Get(b_.id, h.ref);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->writable);
  EXPECT_EQ(writer_->applied(), 1u);
  const v1::ClientStatus a = StatusOf(a_.client_id);
  EXPECT_TRUE(a.has_release_ring());
  EXPECT_EQ(a.ring_messages(), 1u);
  // The seal's copy on the stream, arriving later, is skipped.
  EXPECT_TRUE(store_->ReleaseBatch(a_.id, 1, {}, {}).ok());
  EXPECT_EQ(StatusOf(a_.client_id).ring_messages(), 1u);
}

TEST_F(SessionRingTest, AGetThatWaitsAsksForANudgeWhichTheStreamClears) {
  const Handout h = Create(a_.id);
  absl::StatusOr<std::optional<Handout>> waiting =
      store_->TryGet(b_.id, h.ref, 0, /*wait=*/true, /*last_try=*/false);
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  EXPECT_FALSE(waiting->has_value());
  // The creator sees the request after its next post, and writes the
  // message on its stream too.
  ASSERT_TRUE(Post(SealMessage(1, h.lease_id)));
  EXPECT_TRUE(writer_->NudgeRequested());
  const uint64_t before = store_->changes();
  ASSERT_TRUE(
      store_->ReleaseBatch(a_.id, 1, {}, {SealMessage(1, h.lease_id).seals(0)})
          .ok());
  EXPECT_FALSE(writer_->NudgeRequested());
  EXPECT_GT(store_->changes(), before);  // The waiting calls try again.
  waiting = store_->TryGet(b_.id, h.ref, 0, true, false);
  ASSERT_TRUE(waiting.ok() && waiting->has_value()) << waiting.status();
}

// A get that will wait, but finds the seal in the ring, asks for no nudge:
// one left set would make each of the creator's later posts a stream write
// too, which wakes the daemon (a lifecycle's worth of CPU on a VM) for an
// object nobody waits for.
TEST_F(SessionRingTest, AGetThatFindsTheSealInTheRingAsksForNoNudge) {
  const Handout first = Create(a_.id);
  ASSERT_TRUE(Post(SealMessage(1, first.lease_id)));
  absl::StatusOr<std::optional<Handout>> got =
      store_->TryGet(b_.id, first.ref, 0, /*wait=*/true, /*last_try=*/false);
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status();
  EXPECT_FALSE(writer_->NudgeRequested());
  // The same through GetMany.
  const Handout second = Create(a_.id);
  ASSERT_TRUE(Post(SealMessage(2, second.lease_id)));
  absl::StatusOr<std::optional<std::vector<absl::StatusOr<Handout>>>> many =
      store_->TryGetMany(b_.id, {second.ref}, /*wait=*/true,
                         /*last_try=*/false);
  ASSERT_TRUE(many.ok() && many->has_value()) << many.status();
  ASSERT_TRUE((**many)[0].ok()) << (**many)[0].status();
  EXPECT_FALSE(writer_->NudgeRequested());
  // A get that still waits after the drain asks for one, as before.
  const Handout third = Create(a_.id);
  got = store_->TryGet(b_.id, third.ref, 0, true, false);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->has_value());
  EXPECT_TRUE(writer_->NudgeRequested());
}

// Releases are posted in the ring too, and nothing wakes the daemon for
// them: a call that lacks the memory they free pulls them before it fails.
TEST_F(SessionRingTest, ACreateElsewherePullsTheReleasesThatFreeItsMemory) {
  const Handout h = Create(a_.id, kPoolPages);
  v1::ReleaseLeases m = SealMessage(1, h.lease_id);
  m.add_lease_ids(h.lease_id);  // Sealed, then let go: nothing holds it.
  ASSERT_TRUE(Post(m));
  absl::StatusOr<std::optional<Handout>> made =
      store_->TryCreate(WholePool(b_.id), /*last_try=*/true);
  ASSERT_TRUE(made.ok()) << made.status();
  ASSERT_TRUE(made->has_value());
  EXPECT_EQ(writer_->applied(), 1u);
}

// A create that waits for memory asks every ring for a nudge, so that a
// release posted while it waits comes on the stream as well and wakes it.
TEST_F(SessionRingTest, ACreateThatWaitsForMemoryAsksEveryRingForANudge) {
  const Handout h = Create(a_.id, kPoolPages);
  ASSERT_TRUE(Post(SealMessage(1, h.lease_id)));
  absl::StatusOr<std::optional<Handout>> waiting =
      store_->TryCreate(WholePool(b_.id), /*last_try=*/false);
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  EXPECT_FALSE(waiting->has_value());
  EXPECT_EQ(writer_->applied(), 1u);  // Pulled, but the lease still holds.
  v1::ReleaseLeases release;
  release.set_seq(2);
  release.add_lease_ids(h.lease_id);
  ASSERT_TRUE(Post(release));
  EXPECT_TRUE(writer_->NudgeRequested());
  const uint64_t before = store_->changes();
  ASSERT_TRUE(store_->ReleaseBatch(a_.id, 2, {h.lease_id}, {}).ok());
  EXPECT_FALSE(writer_->NudgeRequested());
  EXPECT_GT(store_->changes(), before);  // The waiting create tries again.
  waiting = store_->TryCreate(WholePool(b_.id), /*last_try=*/false);
  ASSERT_TRUE(waiting.ok() && waiting->has_value()) << waiting.status();
}

// A limit counts what the daemon has applied: a release posted in another
// session's ring is pulled before a get is refused for it.
TEST_F(SessionRingTest, AGetElsewherePullsTheReleasesThatLiftALimit) {
  StoreLimits limits;
  limits.max_leases = 1;
  Open(limits);
  CreateArgs named;
  named.caller = a_.id;
  named.size_bytes = kPage;
  named.name = "kept";
  const Handout h = *CreateBlocking(*store_, named);
  ASSERT_TRUE(store_->Seal(a_.id, h.lease_id, false).ok());
  v1::ReleaseLeases release;
  release.set_seq(1);
  release.add_lease_ids(h.lease_id);
  ASSERT_TRUE(Post(release));
  absl::StatusOr<std::optional<Handout>> by_name =
      store_->TryGetByName(b_.id, "kept", absl::ZeroDuration(), true);
  ASSERT_TRUE(by_name.ok()) << by_name.status();
  ASSERT_TRUE(by_name->has_value());
  // The same through a Get of its ref, and a GetMany: each time b let go
  // (its own call, applied at once) and a took a lease again, whose
  // release it posts.
  uint64_t b_lease = (*by_name)->lease_id;
  for (uint64_t seq = 2; seq <= 3; ++seq) {
    ASSERT_TRUE(store_->Release(b_.id, b_lease).ok());
    absl::StatusOr<Handout> again = store_->Get(a_.id, h.ref);
    ASSERT_TRUE(again.ok()) << again.status();
    release.set_seq(seq);
    release.set_lease_ids(0, again->lease_id);
    ASSERT_TRUE(Post(release));
    if (seq == 2) {
      absl::StatusOr<Handout> got = store_->Get(b_.id, h.ref);
      ASSERT_TRUE(got.ok()) << got.status();
      b_lease = got->lease_id;
    } else {
      absl::StatusOr<std::optional<std::vector<absl::StatusOr<Handout>>>> many =
          store_->TryGetMany(b_.id, {h.ref}, false, true);
      ASSERT_TRUE(many.ok() && many->has_value()) << many.status();
      ASSERT_TRUE((**many)[0].ok()) << (**many)[0].status();
    }
  }
  // And past the limit for good, the refusal names it.
  EXPECT_TRUE(IsLimitExceeded(store_->Get(a_.id, h.ref).status()))
      << store_->Get(a_.id, h.ref).status();
}

TEST_F(SessionRingTest, RingMessagesApplyInSeqOrderFromTheNextOneDue) {
  const Handout h1 = Create(a_.id);
  const Handout h2 = Create(a_.id);
  // Seq 1 went on the stream only (the ring was full, say); seq 2 is in
  // the ring. Seq 2 waits for seq 1.
  ASSERT_TRUE(Post(SealMessage(2, h2.lease_id)));
  EXPECT_EQ(store_->Get(b_.id, h2.ref).status().code(),
            absl::StatusCode::kFailedPrecondition);  // Not sealed yet.
  ASSERT_TRUE(
      store_->ReleaseBatch(a_.id, 1, {}, {SealMessage(1, h1.lease_id).seals(0)})
          .ok());
  // The stream's seq 1 came: the drain after it applied seq 2.
  EXPECT_TRUE(store_->Get(b_.id, h2.ref).ok());
  EXPECT_EQ(writer_->applied(), 2u);
}

// The ring's messages come before the end of the session, as the stream's
// do: what the session sealed is ended as sealed (an untaken hand-off is
// reclaimed, design.md "Lifetimes"), not discarded as never sealed.
TEST_F(SessionRingTest, WhatASessionPostedIsAppliedBeforeItEnds) {
  const Handout handed = Create(a_.id);
  const Handout plain = Create(a_.id);
  v1::ReleaseLeases m = SealMessage(1, handed.lease_id);
  m.mutable_seals(0)->set_exclusive(true);
  m.add_seals()->set_lease_id(plain.lease_id);
  ASSERT_TRUE(Post(m));
  store_->EndSession(a_.id);
  EXPECT_EQ(writer_->applied(), 1u);
  v1::ObjectRef ref = handed.ref;
  ref.set_exclusive(true);
  EXPECT_TRUE(IsStaleReference(store_->Get(b_.id, ref).status()));
  EXPECT_TRUE(IsStaleReference(store_->Get(b_.id, plain.ref).status()));
  EXPECT_EQ(store_->Stats().objects(), 0u);
}

// A take-over hands the successor (which has no rings) the seals posted
// before it.
TEST_F(SessionRingTest, AHandoverAppliesWhatTheRingsHold) {
  const Handout h = Create(a_.id);
  ASSERT_TRUE(Post(SealMessage(1, h.lease_id)));
  store_->FreezeForHandover();
  EXPECT_EQ(writer_->applied(), 1u);
  store_->Thaw();
  EXPECT_TRUE(store_->Get(b_.id, h.ref).ok());
}

TEST_F(SessionRingTest, ARingActsOnlyForItsSession) {
  const Handout theirs = Create(b_.id);
  ASSERT_TRUE(Post(SealMessage(1, theirs.lease_id)));
  v1::ReleaseLeases release;
  release.set_seq(2);
  release.add_lease_ids(theirs.lease_id);
  ASSERT_TRUE(Post(release));
  // a's next call drains its ring: neither message touches b's object.
  ASSERT_TRUE(store_->SessionStats(a_.id).ok());
  EXPECT_EQ(writer_->applied(), 2u);
  absl::StatusOr<Handout> other = store_->Get(a_.id, theirs.ref);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(store_->Seal(b_.id, theirs.lease_id, false).ok());
}

TEST_F(SessionRingTest, AMalformedRingIsReadNoMoreAndTheStreamStillWorks) {
  const Handout h = Create(a_.id);
  ASSERT_TRUE(writer_->Post(std::string("\xff\xff\xff\xff garbage", 12)));
  ASSERT_TRUE(Post(SealMessage(1, h.lease_id)));
  EXPECT_EQ(store_->Get(b_.id, h.ref).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(
      store_->ReleaseBatch(a_.id, 1, {}, {SealMessage(1, h.lease_id).seals(0)})
          .ok());
  EXPECT_TRUE(store_->Get(b_.id, h.ref).ok());
  EXPECT_EQ(StatusOf(a_.client_id).ring_messages(), 0u);
}

TEST_F(SessionRingTest, AHeadTheClientMovedFarAheadHarmsNothing) {
  const Handout h = Create(a_.id);
  const uint64_t head = ~uint64_t{0};
  std::memcpy(static_cast<char*>(base_) + 64, &head, sizeof(head));
  EXPECT_EQ(store_->Get(b_.id, h.ref).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(store_->Seal(a_.id, h.lease_id, false).ok());
  EXPECT_TRUE(store_->Get(b_.id, h.ref).ok());
}

TEST_F(SessionRingTest, TheClientCannotResizeOrSealTheRing) {
  // Shrinking it under the daemon's mapping would fault the daemon.
  EXPECT_NE(ftruncate(fd_.get(), 0), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(ftruncate(fd_.get(), 2 * kReleaseRingBytes), 0);
  EXPECT_NE(fcntl(fd_.get(), F_ADD_SEALS, F_SEAL_FUTURE_WRITE), 0);
}

TEST_F(SessionRingTest, AResumedSessionHasNoRingAndLosesNoPost) {
  const Handout h = Create(a_.id);
  ASSERT_TRUE(Post(SealMessage(1, h.lease_id)));
  ASSERT_TRUE(store_->ResumeSession(a_.id, Peer(1).owner).ok());
  EXPECT_FALSE(StatusOf(a_.client_id).has_release_ring());
  EXPECT_TRUE(store_->Get(b_.id, h.ref).ok());
}

// A resumed session asks for a new ring (DescriptorRequest.
// release_ring_only): its posts there apply from the seq it had reached,
// and the ring says what was applied before it was made.
TEST_F(SessionRingTest, AResumedSessionGetsANewRingThatGoesOnFromItsSeq) {
  const Handout h1 = Create(a_.id);
  ASSERT_TRUE(Post(SealMessage(1, h1.lease_id)));
  ASSERT_TRUE(store_->ResumeSession(a_.id, Peer(1).owner).ok());
  UniqueFd fd;
  ASSERT_TRUE(
      store_->GrantRing(a_.id, a_.descriptor_secret, Peer(1).owner, &fd).ok());
  ASSERT_TRUE(fd.valid());
  void* base = mmap(nullptr, kReleaseRingBytes, PROT_READ | PROT_WRITE,
                    MAP_SHARED, fd.get(), 0);
  ASSERT_NE(base, MAP_FAILED);
  absl::StatusOr<ReleaseRingWriter> ring =
      ReleaseRingWriter::Attach(base, kReleaseRingBytes);
  ASSERT_TRUE(ring.ok()) << ring.status();
  EXPECT_EQ(ring->applied(), 1u);  // The old ring's seal, drained by resume.
  EXPECT_TRUE(StatusOf(a_.client_id).has_release_ring());
  const Handout h2 = Create(a_.id);
  ASSERT_TRUE(ring->Post(SealMessage(2, h2.lease_id).SerializeAsString()));
  absl::StatusOr<Handout> got = store_->Get(b_.id, h2.ref);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(ring->applied(), 2u);
  EXPECT_EQ(StatusOf(a_.client_id).ring_messages(), 2u);
  munmap(base, kReleaseRingBytes);
}

// Only the session's own process, with its secret, gets a ring, only while
// it has none and may write a host pool, and at most kMaxRingsPerSession
// in all: a client that resumes again and again cannot make the daemon
// make rings (and send their descriptors) without end.
TEST_F(SessionRingTest, ARingGoesOnlyToItsSessionWithoutOneABoundedNumber) {
  UniqueFd fd;
  EXPECT_EQ(
      store_->GrantRing(a_.id, a_.descriptor_secret, Peer(1).owner, &fd).code(),
      absl::StatusCode::kFailedPrecondition);  // It has one.
  ASSERT_TRUE(store_->ResumeSession(a_.id, Peer(1).owner).ok());
  EXPECT_EQ(store_->GrantRing(a_.id, "wrong secret", Peer(1).owner, &fd).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(
      store_->GrantRing(a_.id, a_.descriptor_secret, Peer(2).owner, &fd).code(),
      absl::StatusCode::kPermissionDenied);  // Another process.
  EXPECT_FALSE(fd.valid());
  absl::StatusOr<OpenedSession> reader =
      store_->OpenSession("r", Peer(3), /*read_only=*/true);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ(
      store_
          ->GrantRing(reader->id, reader->descriptor_secret, Peer(3).owner, &fd)
          .code(),
      absl::StatusCode::kFailedPrecondition);
  // The first ring was GrantDescriptors'; then one per resume, to the cap.
  for (uint32_t made = 1; made < kMaxRingsPerSession; ++made) {
    UniqueFd again;
    ASSERT_TRUE(
        store_->GrantRing(a_.id, a_.descriptor_secret, Peer(1).owner, &again)
            .ok())
        << made;
    ASSERT_TRUE(store_->ResumeSession(a_.id, Peer(1).owner).ok());
  }
  const absl::Status past =
      store_->GrantRing(a_.id, a_.descriptor_secret, Peer(1).owner, &fd);
  EXPECT_EQ(past.code(), absl::StatusCode::kResourceExhausted) << past;
  EXPECT_TRUE(IsLimitExceeded(past)) << past;
  EXPECT_FALSE(fd.valid());
  EXPECT_FALSE(StatusOf(a_.client_id).has_release_ring());
  // The session still works, on its stream.
  const Handout h = Create(a_.id);
  EXPECT_TRUE(
      store_->ReleaseBatch(a_.id, 1, {}, {SealMessage(1, h.lease_id).seals(0)})
          .ok());
  EXPECT_TRUE(store_->Get(b_.id, h.ref).ok());
}

TEST_F(SessionRingTest, OnlyASessionThatWritesHostMemoryGetsARing) {
  absl::StatusOr<OpenedSession> reader =
      store_->OpenSession("r", Peer(3), /*read_only=*/true);
  ASSERT_TRUE(reader.ok());
  UniqueFd fd;
  ASSERT_TRUE(store_
                  ->GrantDescriptors(reader->id, reader->descriptor_secret,
                                     Peer(3).owner, &fd)
                  .ok());
  EXPECT_FALSE(fd.valid());
}

}  // namespace
}  // namespace shmtensor::daemon
