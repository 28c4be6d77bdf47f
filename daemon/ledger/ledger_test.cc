#include "daemon/ledger/ledger.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "gtest/gtest.h"
#include "shmtensor/defaults.h"

namespace shmtensor::daemon {
namespace {

constexpr uint64_t kPoolBytes = 1 << 30;

std::unique_ptr<Ledger> NewLedger(uint64_t epoch = 42) {
  absl::StatusOr<std::unique_ptr<Ledger>> l = Ledger::Create(
      epoch, {{"default", 1, kPoolBytes, 4096, 0}}, {64, 128, 16, 32});
  EXPECT_TRUE(l.ok()) << l.status();
  return *std::move(l);
}

absl::StatusOr<std::unique_ptr<Ledger>> AdoptCopy(const Ledger& l,
                                                  LedgerState* state) {
  return Ledger::Adopt(UniqueFd(fcntl(l.fd(), F_DUPFD_CLOEXEC, 3)), state);
}

LedgerObject Obj(uint32_t slot, uint64_t offset, std::string name = "",
                 size_t layout_bytes = 8) {
  LedgerObject o;
  o.slot = slot;
  o.generation = 3;
  o.pool = 0;
  o.offset = offset;
  o.size = 4000;
  o.capacity = 4096;
  o.nonce = 0xabcdef;
  o.creator = 7;
  o.serial = 11;
  o.created_ns = 123;
  o.state = 1;
  o.named = !name.empty();
  o.name = name;
  o.layout.assign(layout_bytes, 'L');
  return o;
}

TEST(LedgerTest, ASuccessorReadsWhatWasWritten) {
  std::unique_ptr<Ledger> l = NewLedger();
  l->NoteSerial(11);
  ASSERT_TRUE(l->PutObject(Obj(0, 0, "batch")).ok());
  // Name and layout past the record's inline room go to its extension.
  ASSERT_TRUE(l->PutObject(Obj(5, 8192, std::string(255, 'n'), 1500)).ok());
  l->SetObjectState(5, 2, false);
  l->NoteLeaseId(9);
  ASSERT_TRUE(l->AddLease({9, 7, 0, false}).ok());
  LedgerSession s;
  s.client_id = 7;
  s.id_hash = HashSessionId(0x1234);
  s.uid = 1000;
  s.gid = 100;
  s.pid = 4321;
  s.instance = 99;
  s.access = {2};
  s.client_name = "loader";
  ASSERT_TRUE(l->AddSession(s).ok());
  l->SetReleasesApplied(7, 5);
  ASSERT_TRUE(
      l->AddPin({LedgerPin::kOffer, 77, 0, 3, 7, 1000, 4096, INT64_MAX}).ok());
  l->NoteForkHold(4);
  ASSERT_TRUE(
      l->AddPin({LedgerPin::kForkHold, 4, 5, 3, 7, 1000, 4096, INT64_MAX})
          .ok());

  LedgerState st;
  absl::StatusOr<std::unique_ptr<Ledger>> got = AdoptCopy(*l, &st);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(st.epoch, 42u);
  ASSERT_EQ(st.pools.size(), 1u);
  EXPECT_EQ(st.pools[0].name, "default");
  ASSERT_EQ(st.objects.size(), 2u);
  EXPECT_EQ(st.objects[0].name, "batch");
  EXPECT_TRUE(st.objects[0].named);
  EXPECT_EQ(st.objects[0].nonce, 0xabcdefu);
  EXPECT_EQ(st.objects[1].slot, 5u);
  EXPECT_EQ(st.objects[1].state, 2u);
  EXPECT_FALSE(st.objects[1].named);
  EXPECT_EQ(st.objects[1].name, std::string(255, 'n'));
  EXPECT_EQ(st.objects[1].layout, std::string(1500, 'L'));
  ASSERT_EQ(st.leases.size(), 1u);
  EXPECT_EQ(st.leases[0].id, 9u);
  ASSERT_EQ(st.sessions.size(), 1u);
  EXPECT_EQ(st.sessions[0].client_name, "loader");
  EXPECT_EQ(st.sessions[0].id_hash, HashSessionId(0x1234));
  EXPECT_NE(st.sessions[0].id_hash, HashSessionId(0x1235));
  EXPECT_EQ(st.sessions[0].releases_applied, 5u);
  EXPECT_EQ(st.sessions[0].pid, 4321);
  EXPECT_EQ(st.pins.size(), 2u);
  // Every id issued stays below what a successor issues.
  EXPECT_GT(st.next_lease_id, 9u);
  EXPECT_GT(st.next_serial, 11u);
  EXPECT_GT(st.next_fork_hold, 4u);
}

TEST(LedgerTest, FreedRecordsLeaveStaleGenerationsAndRoomBehind) {
  std::unique_ptr<Ledger> l = NewLedger();
  ASSERT_TRUE(l->PutObject(Obj(2, 0)).ok());
  l->NoteLeaseId(1);
  ASSERT_TRUE(l->AddLease({1, 7, 2, true}).ok());
  l->DropLease(1);
  l->FreeObject(2, 4);
  LedgerState st;
  absl::StatusOr<std::unique_ptr<Ledger>> got = AdoptCopy(*l, &st);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(st.objects.empty());
  EXPECT_TRUE(st.leases.empty());
  // Whether or not the generation's store landed, a successor moves past
  // it: every ref to the object freed is stale there.
  ASSERT_EQ(st.free_generations.size(), 1u);
  EXPECT_EQ(st.free_generations[0].first, 2u);
  EXPECT_EQ(st.free_generations[0].second, 5u);
  // The successor goes on writing the same ledger.
  (*got)->NoteLeaseId(st.next_lease_id);
  ASSERT_TRUE((*got)->AddLease({st.next_lease_id, 7, 2, false}).ok());
  LedgerState again;
  ASSERT_TRUE(AdoptCopy(**got, &again).ok());
  EXPECT_EQ(again.leases.size(), 1u);
}

// A take-over's successor adopts a copy: what it writes never reaches the
// ledger its predecessor (serving on, should the successor die) reads; the
// copy keeps the holes of a sparse ledger.
TEST(LedgerTest, ACopyForAdoptionIsPrivateAndSparse) {
  absl::StatusOr<std::unique_ptr<Ledger>> big = Ledger::Create(
      42, {{"default", 1, kPoolBytes, 4096, 0}}, {1 << 20, 1 << 20, 16, 32});
  ASSERT_TRUE(big.ok()) << big.status();
  ASSERT_TRUE((*big)->PutObject(Obj(7, 8192, "kept")).ok());
  absl::StatusOr<UniqueFd> copy = Ledger::CopyForAdoption((*big)->fd());
  ASSERT_TRUE(copy.ok()) << copy.status();
  struct stat st;
  ASSERT_EQ(fstat(copy->get(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), (*big)->bytes());
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, (*big)->bytes() / 16);
  LedgerState state;
  absl::StatusOr<std::unique_ptr<Ledger>> adopted =
      Ledger::Adopt(*std::move(copy), &state);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  ASSERT_EQ(state.objects.size(), 1u);
  EXPECT_EQ(state.objects[0].name, "kept");
  (*adopted)->FreeObject(7, 9);
  LedgerState original;
  ASSERT_TRUE(AdoptCopy(**big, &original).ok());
  ASSERT_EQ(original.objects.size(), 1u);  // The original is untouched.
  // Refused as Adopt refuses: not a regular file.
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  EXPECT_EQ(Ledger::CopyForAdoption(p[0]).status().code(),
            absl::StatusCode::kFailedPrecondition);
  close(p[0]);
  close(p[1]);
}

TEST(LedgerTest, FullTablesSayNoRoom) {
  std::unique_ptr<Ledger> l = NewLedger();
  EXPECT_TRUE(l->has_lease_room(128));
  EXPECT_FALSE(l->has_lease_room(129));
  for (uint64_t i = 1; i <= 16; ++i) {
    ASSERT_TRUE(l->has_session_room());
    LedgerSession s;
    s.client_id = i;
    ASSERT_TRUE(l->AddSession(s).ok());
  }
  EXPECT_FALSE(l->has_session_room());
}

// A copy of `l`'s bytes in a new memfd of `size` bytes, with `patch`
// applied to the copy's mapping.
UniqueFd CopyWith(const Ledger& l, uint64_t size,
                  const std::function<void(char*)>& patch) {
  UniqueFd fd(memfd_create("bad-ledger", MFD_CLOEXEC));
  EXPECT_EQ(ftruncate(fd.get(), static_cast<off_t>(size)), 0);
  off_t off = 0;
  const uint64_t n = std::min<uint64_t>(size, l.bytes());
  EXPECT_EQ(sendfile(fd.get(), l.fd(), &off, n), static_cast<ssize_t>(n));
  void* p =
      mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  patch(static_cast<char*>(p));
  munmap(p, size);
  return fd;
}

void ExpectRefused(UniqueFd fd, const std::string& why) {
  LedgerState st;
  absl::StatusOr<std::unique_ptr<Ledger>> got =
      Ledger::Adopt(std::move(fd), &st);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(got.status().message().find(why), std::string::npos)
      << got.status();
}

TEST(LedgerTest, ABadLedgerIsRefusedNeverBelieved) {
  std::unique_ptr<Ledger> l = NewLedger();
  ASSERT_TRUE(l->PutObject(Obj(0, 0)).ok());
  const uint64_t size = l->bytes();
  // Intact, the copy is accepted (the patches below are what is refused).
  {
    LedgerState st;
    EXPECT_TRUE(Ledger::Adopt(CopyWith(*l, size, [](char*) {}), &st).ok());
  }
  ExpectRefused(CopyWith(*l, size, [](char* p) { std::memset(p, 0, 8); }),
                "magic");
  ExpectRefused(CopyWith(*l, size, [](char* p) { p[8] = 9; }), "version");
  ExpectRefused(CopyWith(*l, size, [](char* p) { p[12] ^= 1; }), "Boost");
  ExpectRefused(CopyWith(*l, size, [](char* p) { p[4096 + 300] ^= 0x5a; }),
                "checksum");
  ExpectRefused(CopyWith(*l, size + 4096, [](char*) {}), "bytes");
  ExpectRefused(CopyWith(*l, 8192, [](char*) {}), "bytes");
  // Not a file at all.
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  close(p[1]);
  ExpectRefused(UniqueFd(p[0]), "regular");
  // Another uid's.
  if (geteuid() == 0) {
    UniqueFd other = CopyWith(*l, size, [](char*) {});
    ASSERT_EQ(fchown(other.get(), 12345, 12345), 0);
    ExpectRefused(std::move(other), "uid 12345");
  }
}

// [P23] A record is never written past: what does not fit is refused where
// it would be written, and the ledger is as it was (on the old code a
// 4,000-byte layout ran into the next slot's record).
TEST(LedgerTest, AWriteThatDoesNotFitItsRecordWritesNothing) {
  std::unique_ptr<Ledger> l = NewLedger();
  ASSERT_TRUE(l->PutObject(Obj(1, 8192, "victim")).ok());
  for (size_t layout :
       {kMaxLedgerLayoutBytes + 1, size_t{4000}, size_t{4} << 20}) {
    absl::Status s = l->PutObject(Obj(0, 0, "", layout));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(std::to_string(kMaxLedgerLayoutBytes)),
              std::string::npos)
        << s;
  }
  EXPECT_EQ(l->PutObject(Obj(0, 0, std::string(256, 'n'))).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(l->PutObject(Obj(64, 0)).code(), absl::StatusCode::kOutOfRange);
  // The widest name with the widest layout fits.
  ASSERT_TRUE(l->PutObject(Obj(2, 16384, std::string(kMaxLedgerNameBytes, 'w'),
                               kMaxLedgerLayoutBytes))
                  .ok());
  EXPECT_EQ(l->SetObjectLayout(1, 10, std::string(4000, 'L')).code(),
            absl::StatusCode::kInvalidArgument);
  LedgerSession session;
  session.client_id = 9;
  session.client_name = std::string(256, 'c');
  EXPECT_EQ(l->AddSession(session).code(), absl::StatusCode::kInvalidArgument);
  session.client_name = "ok";
  session.access.assign(kMaxPools + 1, 1);
  EXPECT_EQ(l->AddSession(session).code(), absl::StatusCode::kInvalidArgument);
  // Full tables: the next record is refused, none written past the table.
  for (uint64_t id = 1; id <= 32; ++id) {
    ASSERT_TRUE(
        l->AddPin({LedgerPin::kOffer, id, 1, 3, 7, 1000, 4096, INT64_MAX})
            .ok());
  }
  EXPECT_FALSE(l->has_pin_room());
  EXPECT_EQ(
      l->AddPin({LedgerPin::kOffer, 99, 1, 3, 7, 1000, 4096, INT64_MAX}).code(),
      absl::StatusCode::kResourceExhausted);

  LedgerState st;
  absl::StatusOr<std::unique_ptr<Ledger>> got = AdoptCopy(*l, &st);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(st.refused_records, 0u);
  ASSERT_EQ(st.objects.size(), 2u);
  EXPECT_EQ(st.objects[0].slot, 1u);
  EXPECT_EQ(st.objects[0].name, "victim");
  EXPECT_EQ(st.objects[0].layout, std::string(8, 'L'));
  EXPECT_EQ(st.objects[1].layout, std::string(kMaxLedgerLayoutBytes, 'L'));
  EXPECT_TRUE(st.sessions.empty());
  EXPECT_EQ(st.pins.size(), 32u);
}

// A successor that meets a record it cannot trust refuses that record, and
// says which; every other record is read.
TEST(LedgerTest, ARecordOutOfBoundsIsRefusedAloneAndTheRestRead) {
  std::unique_ptr<Ledger> l = NewLedger();
  LedgerObject bad = Obj(0, 0);
  bad.offset = kPoolBytes - 4096 + 1;  // Past the pool's end.
  ASSERT_TRUE(l->PutObject(bad).ok());
  ASSERT_TRUE(l->PutObject(Obj(1, 8192, "kept")).ok());
  // A lease id that was never reserved (not written by a daemon), on a
  // live object, and a good one.
  l->NoteLeaseId(9);
  ASSERT_TRUE(l->AddLease({9, 7, 1, false}).ok());
  ASSERT_TRUE(l->AddLease({uint64_t{1} << 40, 7, 1, false}).ok());
  LedgerSession session;
  session.client_id = 7;
  session.client_name = "loader";
  ASSERT_TRUE(l->AddSession(session).ok());

  LedgerState st;
  absl::StatusOr<std::unique_ptr<Ledger>> got = AdoptCopy(*l, &st);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(st.refused_records, 2u);
  ASSERT_EQ(st.refusals.size(), 2u);
  EXPECT_EQ(st.refusals[0].table, LedgerRefusal::kObject);
  EXPECT_NE(st.refusals[0].why.find("object record 0"), std::string::npos);
  EXPECT_EQ(st.refusals[1].table, LedgerRefusal::kLease);
  EXPECT_NE(st.refusals[1].why.find("lease record 1"), std::string::npos);
  ASSERT_EQ(st.retired_slots.size(), 1u);
  EXPECT_EQ(st.retired_slots[0].slot, 0u);
  EXPECT_FALSE(st.retired_slots[0].range_known);
  // The refused lease's object stays for the successor's life.
  EXPECT_EQ(st.quarantined_slots, std::vector<uint32_t>{1});
  ASSERT_EQ(st.objects.size(), 1u);
  EXPECT_EQ(st.objects[0].name, "kept");
  ASSERT_EQ(st.leases.size(), 1u);
  EXPECT_EQ(st.leases[0].id, 9u);
  ASSERT_EQ(st.sessions.size(), 1u);
  // The refused lease's record is never reused by the successor.
  EXPECT_EQ((*got)->lease_records(), 2u);
  // The refused records were withdrawn: the successor's own successor
  // refuses nothing, and finds the refused object's slot free with a later
  // generation (a ref to what it held is stale there).
  LedgerState next;
  absl::StatusOr<std::unique_ptr<Ledger>> again = AdoptCopy(**got, &next);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(next.refused_records, 0u);
  EXPECT_EQ(next.leases.size(), 1u);
  EXPECT_EQ(next.objects.size(), 1u);
  ASSERT_EQ(next.free_generations.size(), 1u);
  EXPECT_EQ(next.free_generations[0].first, 0u);
  EXPECT_GT(next.free_generations[0].second, 3u);
}

}  // namespace
}  // namespace shmtensor::daemon
