#include "daemon/store/lease_table.h"

#include "gtest/gtest.h"

namespace shmtensor::daemon {
namespace {

TEST(LeaseTableTest, IdsCountUpFromOne) {
  LeaseTable leases;
  EXPECT_EQ(leases.Add(7, 0, true), 1u);
  EXPECT_EQ(leases.Add(7, 1, false), 2u);
  EXPECT_EQ(leases.size(), 2u);
}

TEST(LeaseTableTest, LookupFindsTheHoldersLease) {
  LeaseTable leases;
  const uint64_t id = leases.Add(7, 3, true);
  absl::StatusOr<LeaseTable::Lease*> lease = leases.Lookup(7, id);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ((*lease)->session, 7u);
  EXPECT_EQ((*lease)->slot, 3u);
  EXPECT_TRUE((*lease)->write);
}

TEST(LeaseTableTest, LeaseOfAnotherSessionIsPermissionDenied) {
  LeaseTable leases;
  const uint64_t id = leases.Add(7, 3, false);
  absl::StatusOr<LeaseTable::Lease*> lease = leases.Lookup(8, id);
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(lease.status().message(), "lease 1 belongs to another session");
}

TEST(LeaseTableTest, ReleasedLeaseIsFailedPrecondition) {
  LeaseTable leases;
  const uint64_t id = leases.Add(7, 3, false);
  LeaseTable::Lease removed = leases.Remove(id);
  EXPECT_EQ(removed.slot, 3u);
  EXPECT_EQ(leases.size(), 0u);
  absl::StatusOr<LeaseTable::Lease*> lease = leases.Lookup(7, id);
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(lease.status().message(), "lease 1 was already released");
}

TEST(LeaseTableTest, LeaseNeverIssuedIsNotFound) {
  LeaseTable leases;
  leases.Add(7, 3, false);
  for (uint64_t id : {uint64_t{0}, uint64_t{2}, UINT64_MAX}) {
    absl::StatusOr<LeaseTable::Lease*> lease = leases.Lookup(7, id);
    EXPECT_EQ(lease.status().code(), absl::StatusCode::kNotFound) << id;
  }
  EXPECT_EQ(leases.Lookup(7, 2).status().message(), "lease 2 was never issued");
}

TEST(LeaseTableTest, IdsAreNeverReused) {
  LeaseTable leases;
  const uint64_t first = leases.Add(7, 3, false);
  leases.Remove(first);
  EXPECT_EQ(leases.Add(7, 3, false), first + 1);
}

}  // namespace
}  // namespace shmtensor::daemon
