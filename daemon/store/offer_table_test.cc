#include "daemon/store/offer_table.h"

#include "gtest/gtest.h"

namespace shmtensor::daemon {
namespace {

OfferTable::Offer OfferOf(uint64_t session, uint32_t slot, uint32_t gen = 1) {
  OfferTable::Offer o;
  o.slot = slot;
  o.generation = gen;
  o.session_id = session;
  o.uid = 1000;
  o.bytes = 4096;
  return o;
}

TEST(OfferTableTest, TakeNeedsTheTokenOfThatObject) {
  OfferTable offers;
  offers.Add(11, OfferOf(7, 3, 2));
  EXPECT_FALSE(offers.Take(12, 3, 2).has_value());  // Unknown token.
  EXPECT_FALSE(offers.Take(11, 4, 2).has_value());  // Another slot.
  EXPECT_FALSE(offers.Take(11, 3, 1).has_value());  // Another generation.
  EXPECT_EQ(offers.size(), 1u);
  std::optional<OfferTable::Offer> taken = offers.Take(11, 3, 2);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->session_id, 7u);
  EXPECT_FALSE(offers.Take(11, 3, 2).has_value());  // Taken once.
  EXPECT_EQ(offers.size(), 0u);
  EXPECT_EQ(offers.CountOf(7), 0u);
}

TEST(OfferTableTest, OffersOfAnOpenSessionNeverExpire) {
  OfferTable offers;
  offers.Add(11, OfferOf(7, 3));
  offers.Add(12, OfferOf(8, 4));
  EXPECT_EQ(offers.CountOf(7), 1u);
  EXPECT_TRUE(offers.Expire(absl::InfiniteFuture() - absl::Hours(1)).empty());
  EXPECT_EQ(offers.size(), 2u);
}

TEST(OfferTableTest, OffersExpireGraceAfterTheirSessionEnded) {
  OfferTable offers;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  offers.Add(11, OfferOf(7, 3));
  offers.Add(12, OfferOf(7, 4));
  offers.Add(13, OfferOf(8, 5));
  offers.SessionEnded(7, t0, absl::Seconds(10));
  EXPECT_EQ(offers.CountOf(7), 0u);  // No longer counted against it.
  EXPECT_TRUE(offers.Expire(t0 + absl::Seconds(9)).empty());
  // Taken within the grace: gone from the expiry order too.
  ASSERT_TRUE(offers.Take(12, 4, 1).has_value());
  std::vector<OfferTable::Offer> expired =
      offers.Expire(t0 + absl::Seconds(10));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].slot, 3u);
  EXPECT_FALSE(offers.Take(11, 3, 1).has_value());
  EXPECT_EQ(offers.size(), 1u);  // Session 8's stays.
  EXPECT_EQ(offers.CountOf(8), 1u);
}

TEST(OfferTableTest, ZeroGraceExpiresAtOnce) {
  OfferTable offers;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  offers.Add(11, OfferOf(7, 3));
  offers.SessionEnded(7, t0, absl::ZeroDuration());
  EXPECT_EQ(offers.Expire(t0).size(), 1u);
  EXPECT_EQ(offers.size(), 0u);
}

}  // namespace
}  // namespace shmtensor::daemon
