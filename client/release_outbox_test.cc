#include "client/release_outbox.h"

#include <cstdint>
#include <vector>

#include "common/release_protocol.h"
#include "gtest/gtest.h"

namespace shmtensor::internal {
namespace {

v1::ReleaseLeases Release(uint64_t lease_id) {
  v1::ReleaseLeases m;
  m.add_lease_ids(lease_id);
  return m;
}

v1::ReleaseLeases Seal(uint32_t slot) {
  v1::ReleaseLeases m;
  m.add_seals()->set_lease_id(1000 + slot);
  return m;
}

std::vector<uint64_t> Seqs(const std::vector<v1::SessionRequest>& batch) {
  std::vector<uint64_t> seqs;
  for (const v1::SessionRequest& r : batch) seqs.push_back(r.release().seq());
  return seqs;
}

// What a request carries after Stamp.
struct Stamped {
  uint64_t through;
  std::vector<uint64_t> carried;
};
Stamped Stamp(ReleaseOutbox& outbox) {
  v1::GetRequest req;
  outbox.Stamp(&req);
  Stamped s{req.releases_through(), {}};
  for (const v1::ReleaseLeases& m : req.releases())
    s.carried.push_back(m.seq());
  return s;
}

TEST(ReleaseOutboxTest, JoinsTheLastMessageOnlyWhileNobodyHasSeenIt) {
  ReleaseOutbox outbox;
  outbox.Enqueue(Seal(1));
  outbox.Enqueue(Release(1));
  outbox.Enqueue(Release(2));
  // One message: the seal and both releases (the daemon applies its seals
  // first, so the order they were made in holds).
  std::vector<v1::SessionRequest> batch = outbox.TakeUnwritten();
  ASSERT_EQ(Seqs(batch), std::vector<uint64_t>{1});
  EXPECT_EQ(batch[0].release().seals_size(), 1);
  EXPECT_EQ(batch[0].release().lease_ids_size(), 2);
  // The writer took it: a later release may not change what it wrote.
  outbox.Enqueue(Release(3));
  // A request counted message 2: the next one is a message of its own.
  EXPECT_EQ(Stamp(outbox).through, 2u);
  outbox.Enqueue(Release(4));
  // A resume's account counted message 3: the same.
  v1::OpenSession account;
  outbox.Account(&account);
  EXPECT_EQ(account.releases_through(), 3u);
  outbox.Enqueue(Release(5));
  outbox.Written(1);
  batch = outbox.TakeUnwritten();
  EXPECT_EQ(Seqs(batch), (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_EQ(batch[2].release().lease_ids_size(), 1);
}

TEST(ReleaseOutboxTest, AJoinedMessageHoldsAtMostMaxJoinedEntries) {
  ReleaseOutbox outbox;
  const size_t n = ReleaseOutbox::kMaxJoined + 1;
  for (size_t i = 0; i < n; ++i) outbox.Enqueue(Release(i + 1));
  std::vector<v1::SessionRequest> batch = outbox.TakeUnwritten();
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(batch[0].release().lease_ids_size(),
            static_cast<int>(ReleaseOutbox::kMaxJoined));
  EXPECT_EQ(batch[1].release().lease_ids_size(), 1);
  EXPECT_EQ(batch[0].release().lease_ids(0), 1u);
  EXPECT_EQ(batch[1].release().lease_ids(0), n);
}

TEST(ReleaseOutboxTest,
     ARequestCarriesTheOldestUnconfirmedUpToTheClientsLimit) {
  ReleaseOutbox outbox;
  const uint64_t n = kClientMaxCarriedReleases + 10;
  for (uint64_t i = 1; i <= n; ++i) {
    outbox.Enqueue(Release(i));
    Stamp(outbox);  // Each its own message.
  }
  Stamped s = Stamp(outbox);
  EXPECT_EQ(s.through, n);
  ASSERT_EQ(s.carried.size(), kClientMaxCarriedReleases);
  EXPECT_EQ(s.carried.front(), 1u);
  EXPECT_EQ(s.carried.back(), kClientMaxCarriedReleases);
  // A request's success confirms everything through its stamp: nothing is
  // carried, or written, any more.
  outbox.Confirm(n - 1);
  s = Stamp(outbox);
  EXPECT_EQ(s.carried, std::vector<uint64_t>{n});
  EXPECT_EQ(Seqs(outbox.TakeUnwritten()), std::vector<uint64_t>{n});
}

TEST(ReleaseOutboxTest,
     TheWriterTakesAtMostABatchOldestFirstAndCountsWhatIsLeft) {
  ReleaseOutbox outbox;
  const uint64_t n = ReleaseOutbox::kMaxWrittenTogether + 3;
  for (uint64_t i = 1; i <= n; ++i) {
    outbox.Enqueue(Release(i));
    Stamp(outbox);
  }
  EXPECT_EQ(outbox.Unwritten(), n);
  std::vector<v1::SessionRequest> batch = outbox.TakeUnwritten();
  ASSERT_EQ(batch.size(), ReleaseOutbox::kMaxWrittenTogether);
  EXPECT_EQ(batch.front().release().seq(), 1u);
  outbox.Written(batch.back().release().seq());
  EXPECT_EQ(outbox.Unwritten(), 3u);
  EXPECT_EQ(Seqs(outbox.TakeUnwritten()),
            (std::vector<uint64_t>{n - 2, n - 1, n}));
  outbox.Written(n);
  EXPECT_TRUE(outbox.TakeUnwritten().empty());
  EXPECT_EQ(outbox.Unwritten(), 0u);
}

TEST(ReleaseOutboxTest, AReconcilingResumeSettlesWhatItsAccountCounted) {
  ReleaseOutbox outbox;
  outbox.Enqueue(Seal(7));
  Stamp(outbox);
  outbox.Enqueue(Release(1));
  // The writer took message 1 and 2; the stream broke before it wrote.
  std::vector<v1::SessionRequest> batch = outbox.TakeUnwritten();
  ASSERT_EQ(Seqs(batch), (std::vector<uint64_t>{1, 2}));
  v1::OpenSession account;
  outbox.Account(&account);
  EXPECT_EQ(account.releases_through(), 2u);
  // The seal of an unconfirmed message is presented: the daemon applies it
  // if it had not.
  ASSERT_EQ(account.pending_seals_size(), 1);
  EXPECT_EQ(account.pending_seals(0).lease_id(), 1007u);
  outbox.Enqueue(Release(2));  // After the account: for the new stream.
  outbox.Settle(account.releases_through());
  // The writer skips what the resume settled and writes only the new one.
  EXPECT_EQ(outbox.AlreadyWritten(batch), 2u);
  EXPECT_EQ(Seqs(outbox.TakeUnwritten()), std::vector<uint64_t>{3});
  EXPECT_TRUE(Stamp(outbox).carried == std::vector<uint64_t>{3});
}

TEST(ReleaseOutboxTest,
     AResumeWithoutReconcilingSendsAgainWhatTheDaemonHadNotApplied) {
  ReleaseOutbox outbox;
  for (uint64_t i = 1; i <= 4; ++i) {
    outbox.Enqueue(Release(i));
    Stamp(outbox);
  }
  std::vector<uint64_t> wrote;
  auto write = [&](const v1::SessionRequest& r) {
    wrote.push_back(r.release().seq());
    return true;
  };
  // A new stream that breaks at its second write: the resume fails, and
  // nothing counts as written.
  int writes = 0;
  EXPECT_FALSE(outbox.Resend(
      1, [&](const v1::SessionRequest&) { return ++writes < 2; }));
  EXPECT_EQ(outbox.Unwritten(), 4u);
  // The daemon had applied 1 and 2: 3 and 4 go again, in order.
  EXPECT_TRUE(outbox.Resend(2, write));
  EXPECT_EQ(wrote, (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(outbox.Unwritten(), 0u);
  // They stay unconfirmed (carried) until a request confirms them.
  EXPECT_EQ(Stamp(outbox).carried, (std::vector<uint64_t>{1, 2, 3, 4}));
}

TEST(ReleaseOutboxTest, AnEndedSessionWritesNothingMore) {
  ReleaseOutbox outbox;
  outbox.Enqueue(Release(1));
  outbox.Abandon();
  EXPECT_EQ(outbox.Unwritten(), 0u);
  EXPECT_TRUE(outbox.TakeUnwritten().empty());
}

}  // namespace
}  // namespace shmtensor::internal
