#include "daemon/store/object_table.h"

#include <iterator>
#include <string>

#include "gtest/gtest.h"
#include "shmtensor/errors.h"

namespace shmtensor::daemon {
namespace {

constexpr uint64_t kEpoch = 42;

class ObjectTableTest : public ::testing::Test {
 protected:
  // Nonces 1001, 1002, ...: predictable, so tests can forge a wrong one.
  ObjectTableTest() : table_(kEpoch, [this] { return ++nonce_; }) {}

  uint32_t Add(const std::string& name = "") {
    ObjectTable::Object obj;
    obj.name = name;
    obj.serial = next_serial_++;
    return table_.Add(std::move(obj));
  }

  uint64_t nonce_ = 1000;
  uint64_t next_serial_ = 1;
  ObjectTable table_;
};

TEST_F(ObjectTableTest, AddGivesANewObjectANonceAndGenerationOne) {
  const uint32_t slot = Add();
  EXPECT_EQ(table_.live(), 1u);
  const v1::ObjectRef ref = table_.MakeRef(slot);
  EXPECT_EQ(ref.daemon_epoch(), kEpoch);
  EXPECT_EQ(ref.slot(), slot);
  EXPECT_EQ(ref.generation(), 1u);
  EXPECT_EQ(ref.nonce(), 1001u);
  EXPECT_EQ(table_.object(slot).nonce, 1001u);
  EXPECT_EQ(*table_.ResolveRef(ref), slot);
}

TEST_F(ObjectTableTest, FreeMakesEveryOldRefStale) {
  const uint32_t slot = Add();
  const v1::ObjectRef old = table_.MakeRef(slot);
  table_.Free(slot);
  EXPECT_EQ(table_.live(), 0u);
  absl::StatusOr<uint32_t> gone = table_.ResolveRef(old);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrorReasonOf(gone.status()), kReasonStaleReference);
  // Reusing the slot does not bring the old ref back.
  ASSERT_EQ(Add(), slot);
  EXPECT_EQ(table_.MakeRef(slot).generation(), 2u);
  EXPECT_EQ(table_.ResolveRef(old).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(table_.ResolveRef(old).status().message(),
            "stale reference: the object of ref(slot 0, generation 1) is gone "
            "and its memory may have been reused");
}

TEST_F(ObjectTableTest, FreedSlotsAreReusedLastFreedFirst) {
  const uint32_t a = Add();
  const uint32_t b = Add();
  const uint32_t c = Add();
  EXPECT_NE(a, b);
  EXPECT_NE(b, c);
  table_.Free(a);
  table_.Free(c);
  EXPECT_EQ(Add(), c);
  EXPECT_EQ(Add(), a);
  EXPECT_EQ(Add(), 3u);  // None free: a new slot.
}

TEST_F(ObjectTableTest, ARefOfALiveSlotIsUnknownWhileTheSlotIsFree) {
  const uint32_t slot = Add();
  v1::ObjectRef ref = table_.MakeRef(slot);
  table_.Free(slot);
  ref.set_generation(2);  // The slot's generation now, with nothing in it.
  absl::StatusOr<uint32_t> r = table_.ResolveRef(ref);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "ref(slot 0, generation 2) was never issued by this daemon");
}

TEST_F(ObjectTableTest, ForgedRefsAreNeverIssued) {
  const uint32_t slot = Add();
  const v1::ObjectRef real = table_.MakeRef(slot);
  v1::ObjectRef wrong_nonce = real;
  wrong_nonce.set_nonce(real.nonce() + 1);
  v1::ObjectRef zero_generation = real;
  zero_generation.set_generation(0);
  v1::ObjectRef future_generation = real;
  future_generation.set_generation(2);
  v1::ObjectRef no_such_slot = real;
  no_such_slot.set_slot(7);
  for (const v1::ObjectRef& ref :
       {wrong_nonce, zero_generation, future_generation, no_such_slot}) {
    EXPECT_EQ(table_.ResolveRef(ref).status().code(),
              absl::StatusCode::kInvalidArgument)
        << ref.ShortDebugString();
  }
}

TEST_F(ObjectTableTest, AllZeroRefIsNeverValid) {
  Add();
  v1::ObjectRef zero;
  zero.set_daemon_epoch(kEpoch);
  EXPECT_EQ(table_.ResolveRef(zero).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ObjectTableTest, RefOfAnotherDaemonInstanceIsStale) {
  v1::ObjectRef ref = table_.MakeRef(Add());
  ref.set_daemon_epoch(kEpoch + 1);
  absl::StatusOr<uint32_t> r = table_.ResolveRef(ref);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrorReasonOf(r.status()), kReasonStaleReference);
  EXPECT_EQ(r.status().message(),
            "stale reference: ref(slot 0, generation 1) was issued by another "
            "daemon instance (epoch 000000000000002b, this one is "
            "000000000000002a)");
}

TEST_F(ObjectTableTest, NameIsBoundUntilUnbound) {
  const uint32_t slot = Add("batch");
  EXPECT_EQ(table_.Named("batch"), slot);
  EXPECT_EQ(table_.named(), 1u);
  EXPECT_FALSE(table_.Named("other").has_value());
  table_.Unbind(slot);
  EXPECT_FALSE(table_.Named("batch").has_value());
  EXPECT_TRUE(table_.object(slot).name.empty());
  EXPECT_EQ(table_.named(), 0u);
  // Once unbound, the name may go to another object.
  const uint32_t next = Add("batch");
  EXPECT_NE(next, slot);
  EXPECT_EQ(table_.Named("batch"), next);
}

TEST_F(ObjectTableTest, ListsLiveObjectsBySerial) {
  const uint32_t a = Add();
  const uint32_t b = Add();
  const uint32_t c = Add();
  table_.Free(b);
  const auto& by_serial = table_.by_serial();
  ASSERT_EQ(by_serial.size(), 2u);
  EXPECT_EQ(by_serial.begin()->second, a);
  EXPECT_EQ(std::next(by_serial.begin())->second, c);
}

TEST_F(ObjectTableTest, SetStateCountsPendingTransfers) {
  const uint32_t slot = Add();
  table_.SetState(slot, ObjectTable::State::kPendingTransfer);
  EXPECT_EQ(table_.pending_transfers(), 1u);
  EXPECT_TRUE(table_.MakeRef(slot).exclusive());
  table_.SetState(slot, ObjectTable::State::kTaken);
  EXPECT_EQ(table_.pending_transfers(), 0u);
  EXPECT_TRUE(table_.MakeRef(slot).exclusive());
  table_.SetState(slot, ObjectTable::State::kSealed);
  EXPECT_FALSE(table_.MakeRef(slot).exclusive());
}

TEST(ObjectNamesTest, ValidateNameRefusesEmptyLongAndNulNames) {
  EXPECT_TRUE(ValidateName("ok").ok());
  EXPECT_EQ(ValidateName("").message(), "name is empty");
  EXPECT_TRUE(ValidateName(std::string(kMaxNameBytes, 'x')).ok());
  EXPECT_EQ(ValidateName(std::string(kMaxNameBytes + 1, 'x')).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateName(std::string("a\0b", 3)).message(),
            "name contains a NUL byte");
}

TEST(ObjectNamesTest, QuotedCutsLongTextTo64Bytes) {
  EXPECT_EQ(Quoted("abc"), "'abc'");
  EXPECT_EQ(Quoted(std::string(100, 'x')),
            "'" + std::string(64, 'x') + "...' (100 bytes)");
}

}  // namespace
}  // namespace shmtensor::daemon
