#include "daemon/store/session_table.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shmtensor/errors.h"

namespace shmtensor::daemon {
namespace {

constexpr uid_t kUid = 1000;

PeerInfo Peer(pid_t pid, uid_t uid = kUid) {
  return PeerInfo{{pid, uid, uid}, OwnerKey{uid, pid, 1}, nullptr, "cmd"};
}

class SessionTableTest : public ::testing::Test {
 protected:
  explicit SessionTableTest(StoreLimits limits = {})
      : table_(limits, [this] { return next_random_++; }) {}

  uint64_t Open(pid_t pid, uid_t uid = kUid) {
    absl::StatusOr<uint64_t> id =
        table_.Open("client", Peer(pid, uid), {v1::POOL_ACCESS_READ_WRITE},
                    false, next_serial_++);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or(0);
  }

  uint64_t next_random_ = 0;  // The first draw is 0: never a session id.
  uint64_t next_serial_ = 1;
  SessionTable table_;
};

TEST_F(SessionTableTest, OpenGivesANonZeroIdAndASecret) {
  const uint64_t id = Open(10);
  EXPECT_NE(id, 0u);
  SessionTable::Session* s = table_.FindOrNull(id);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->client_name, "client");
  EXPECT_EQ(s->pid, 10);
  EXPECT_EQ(s->client_id, 1u);
  EXPECT_NE(s->stream, 0u);
  EXPECT_EQ(s->descriptor_secret.size(), kDescriptorSecretBytes);
  EXPECT_EQ(table_.size(), 1u);
}

TEST_F(SessionTableTest, EachOpenAndAttachGetsANewStream) {
  const uint64_t a = Open(10);
  const uint64_t b = Open(11);
  SessionTable::Session& sa = *table_.FindOrNull(a);
  const uint64_t first = sa.stream;
  EXPECT_NE(table_.FindOrNull(b)->stream, first);
  const uint64_t next = table_.Attach(sa);
  EXPECT_NE(next, first);
  EXPECT_EQ(sa.stream, next);
}

TEST_F(SessionTableTest, FindOfASessionNotOpenIsSessionEnded) {
  const uint64_t id = Open(10);
  table_.Close(id);
  EXPECT_EQ(table_.FindOrNull(id), nullptr);
  absl::StatusOr<SessionTable::Session*> s = table_.Find(id);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(IsSessionEnded(s.status()));
}

TEST_F(SessionTableTest, FindOwnedRefusesAnotherOwnerWithTheSameError) {
  const uint64_t id = Open(10);
  EXPECT_TRUE(table_.FindOwned(id, OwnerKey{kUid, 10, 1}).ok());
  absl::Status other = table_.FindOwned(id, OwnerKey{kUid, 11, 1}).status();
  // Its pid handed out again, to a later process of any user.
  absl::Status reused = table_.FindOwned(id, OwnerKey{kUid, 10, 2}).status();
  absl::Status other_uid =
      table_.FindOwned(id, OwnerKey{kUid + 1, 10, 1}).status();
  absl::Status ended = table_.FindOwned(id + 1, OwnerKey{kUid, 10, 1}).status();
  EXPECT_EQ(other, SessionNotOpenError(id));
  EXPECT_EQ(reused, SessionNotOpenError(id));
  EXPECT_EQ(other_uid, SessionNotOpenError(id));
  EXPECT_EQ(ended, SessionNotOpenError(id + 1));
}

TEST_F(SessionTableTest, SecretMatchesOnlyTheWholeSecret) {
  const SessionTable::Session& s = *table_.FindOrNull(Open(10));
  EXPECT_TRUE(SessionTable::SecretMatches(s, s.descriptor_secret));
  EXPECT_FALSE(SessionTable::SecretMatches(s, ""));
  EXPECT_FALSE(SessionTable::SecretMatches(
      s, s.descriptor_secret.substr(0, kDescriptorSecretBytes - 1)));
  std::string flipped = s.descriptor_secret;
  flipped.back() ^= 1;
  EXPECT_FALSE(SessionTable::SecretMatches(s, flipped));
}

TEST_F(SessionTableTest, HoldChargesAnObjectOncePerSession) {
  const uint64_t id = Open(10);
  SessionTable::Session& s = *table_.FindOrNull(id);
  table_.Hold(s, 1, 5, 4096);
  table_.Hold(s, 2, 5, 4096);  // A second lease on the same object.
  EXPECT_EQ(s.bytes_held, 4096u);
  EXPECT_EQ(table_.uid_bytes(kUid), 4096u);
  EXPECT_EQ(s.leases.size(), 2u);
  table_.Unhold(s, 1, 5, 4096);
  EXPECT_EQ(s.bytes_held, 4096u);
  table_.Unhold(s, 2, 5, 4096);
  EXPECT_EQ(s.bytes_held, 0u);
  EXPECT_EQ(table_.uid_bytes(kUid), 0u);
  EXPECT_TRUE(s.leases.empty());
}

TEST_F(SessionTableTest, CloseForgetsAUidWithNothingLeft) {
  const uint64_t id = Open(10);
  table_.Close(id);
  EXPECT_EQ(table_.size(), 0u);
  EXPECT_EQ(table_.uid_bytes(kUid), 0u);
}

TEST_F(SessionTableTest, ClientStringNamesTheClientOrTheEndedSession) {
  const uint64_t id = Open(10);
  EXPECT_EQ(table_.ClientString(id), "'client' pid 10");
  table_.Close(id);
  EXPECT_EQ(table_.ClientString(0x2a), "session 000000000000002a (ended)");
}

TEST_F(SessionTableTest, DetachedCountsSessionsWithoutAStream) {
  const uint64_t a = Open(10);
  Open(11);
  EXPECT_EQ(table_.detached(), 0u);
  table_.FindOrNull(a)->stream = 0;
  EXPECT_EQ(table_.detached(), 1u);
}

class SessionLimitsTest : public SessionTableTest {
 protected:
  static StoreLimits Limits() {
    StoreLimits l;
    l.max_sessions_per_uid = 2;
    l.max_leases_per_client = 2;
    l.max_leases = 3;
    l.max_bytes_per_client = 8192;
    l.max_bytes_per_uid = 12288;
    l.max_waiters_per_session = 1;
    l.max_waiters_per_uid = 2;
    l.max_waiters = 2;
    return l;
  }
  SessionLimitsTest() : SessionTableTest(Limits()) {}
};

TEST_F(SessionLimitsTest, OpenStopsAtTheUidsSessionLimit) {
  Open(10);
  Open(11);
  absl::StatusOr<uint64_t> third =
      table_.Open("client", Peer(12), {v1::POOL_ACCESS_READ_WRITE}, false, 99);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(third.status().message(),
            "uid 1000 has 2 sessions open, the limit "
            "(limits.max_sessions_per_uid = 2); end sessions it no longer "
            "uses");
  // Another uid is not counted against it.
  EXPECT_TRUE(table_
                  .Open("client", Peer(13, kUid + 1),
                        {v1::POOL_ACCESS_READ_WRITE}, false, 100)
                  .ok());
}

TEST_F(SessionLimitsTest, ClosingASessionGivesItsPlaceBack) {
  const uint64_t a = Open(10);
  Open(11);
  table_.Close(a);
  Open(12);
}

TEST_F(SessionLimitsTest, CheckHoldNamesThePerClientLeaseLimit) {
  SessionTable::Session& s = *table_.FindOrNull(Open(10));
  table_.Hold(s, 1, 0, 0);
  table_.Hold(s, 2, 1, 0);
  absl::Status st = table_.CheckHold(s, kNoSlot, 0, 2);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(st.message(),
            "client 'client' pid 10 holds 2 leases, the limit "
            "(limits.max_leases_per_client = 2); release views it no longer "
            "needs");
}

TEST_F(SessionLimitsTest, CheckHoldNamesTheDaemonsLeaseLimit) {
  const SessionTable::Session& s = *table_.FindOrNull(Open(10));
  EXPECT_TRUE(table_.CheckHold(s, kNoSlot, 0, 2).ok());
  EXPECT_EQ(table_.CheckHold(s, kNoSlot, 0, 3).message(),
            "3 leases are held, the limit (limits.max_leases = 3)");
}

TEST_F(SessionLimitsTest, CheckHoldCountsBytesOfNewObjectsOnly) {
  SessionTable::Session& s = *table_.FindOrNull(Open(10));
  table_.Hold(s, 1, 0, 8192);
  // One more lease on the object it holds costs nothing.
  EXPECT_TRUE(table_.CheckHold(s, 0, 8192, 1).ok());
  EXPECT_EQ(table_.CheckHold(s, kNoSlot, 4096, 1).message(),
            "client 'client' pid 10 holds 8192 bytes; 4096 more would pass "
            "the limit (limits.max_bytes_per_client = 8192)");
}

TEST_F(SessionLimitsTest, CheckHoldSumsTheUidsSessions) {
  const uint64_t ida = Open(10);
  const uint64_t idb = Open(11);
  SessionTable::Session& a = *table_.FindOrNull(ida);
  SessionTable::Session& b = *table_.FindOrNull(idb);
  table_.Hold(a, 1, 0, 8192);
  table_.Hold(b, 2, 1, 4096);
  absl::Status st = table_.CheckHold(b, kNoSlot, 4096, 2);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(st.message(),
            "uid 1000 holds 12288 bytes in all its sessions; 4096 more would "
            "pass the limit (limits.max_bytes_per_uid = 12288)");
}

TEST_F(SessionLimitsTest, ChargeCountsTowardsTheLimits) {
  SessionTable::Session& s = *table_.FindOrNull(Open(10));
  table_.Charge(s, 8192);  // An offered transfer.
  EXPECT_FALSE(table_.CheckHold(s, kNoSlot, 4096, 0).ok());
  table_.Charge(s, -8192);
  EXPECT_TRUE(table_.CheckHold(s, kNoSlot, 4096, 0).ok());
}

TEST_F(SessionLimitsTest, BeginWaitStopsAtEachWaiterLimit) {
  const uint64_t a = Open(10);
  const uint64_t b = Open(11);
  SessionTable::Session& sa = *table_.FindOrNull(a);
  SessionTable::Session& sb = *table_.FindOrNull(b);
  ASSERT_TRUE(table_.BeginWait(sa).ok());
  EXPECT_EQ(table_.BeginWait(sa).message(),
            "client 'client' pid 10 has 1 calls waiting, the limit "
            "(limits.max_waiters_per_session = 1)");
  ASSERT_TRUE(table_.BeginWait(sb).ok());
  EXPECT_EQ(table_.waiters(), 2u);
  table_.EndWait(a, kUid);
  EXPECT_EQ(sa.waiters, 0u);
  EXPECT_EQ(table_.waiters(), 1u);
  EXPECT_TRUE(table_.BeginWait(sa).ok());
}

TEST_F(SessionLimitsTest, BeginWaitNamesTheUidsWaiterLimit) {
  StoreLimits l = Limits();
  l.max_waiters_per_session = 0;
  l.max_waiters = 0;
  SessionTable table(l, [] { return 7; });
  ASSERT_TRUE(
      table.Open("c", Peer(10), {v1::POOL_ACCESS_READ_WRITE}, false, 1).ok());
  SessionTable::Session& s = *table.FindOrNull(7);
  ASSERT_TRUE(table.BeginWait(s).ok());
  ASSERT_TRUE(table.BeginWait(s).ok());
  EXPECT_EQ(table.BeginWait(s).message(),
            "uid 1000 has 2 calls waiting, the limit "
            "(limits.max_waiters_per_uid = 2)");
}

TEST_F(SessionLimitsTest, EndWaitAfterTheSessionClosed) {
  const uint64_t a = Open(10);
  ASSERT_TRUE(table_.BeginWait(*table_.FindOrNull(a)).ok());
  table_.Close(a);
  table_.EndWait(a, kUid);
  EXPECT_EQ(table_.waiters(), 0u);
}

}  // namespace
}  // namespace shmtensor::daemon
