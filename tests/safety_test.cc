// The guarantees that make sharing safe, proven with real processes:
// sealed memory cannot be written [P1][P10], dead clients are reclaimed
// within a second [P9], a full pool makes producers wait, never overwrite
// [P2].
#include <signal.h>
#include <sys/wait.h>

#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "client/lease.h"
#include "client/lease_address.h"
#include "gtest/gtest.h"
#include "shmtensor/client.h"
#include "shmtensor/errors.h"
#include "tests/ref_hex.h"
#include "tests/test_util.h"

namespace shmtensor {
namespace {

using testing::Subprocess;

bool KilledBySegv(int status) {
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
}

class SafetyTest : public testing::DaemonTest {
 protected:
  SealedRef Put(uint64_t bytes, uint8_t byte, const std::string& name = "") {
    absl::StatusOr<Buffer> buf =
        client_->Create({.size_bytes = bytes, .name = name});
    EXPECT_TRUE(buf.ok()) << buf.status();
    std::memset(buf->data(), byte, bytes);
    return *buf->Seal();
  }
  // Runs an st_child `command` that seals an object named `name` filled
  // with 7s, says "sealed <ref>", then writes into it: the child must die of
  // SIGSEGV, and the object, which outlives it through its name, must be
  // unchanged.
  void ExpectWriteIntoSealedFaults(const std::vector<std::string>& command,
                                   const std::string& name) {
    std::unique_ptr<Subprocess> child = Child(command);
    absl::StatusOr<std::string> line = child->ReadLine();
    ASSERT_TRUE(line.ok() && absl::StartsWith(*line, "sealed "))
        << line.status();
    EXPECT_TRUE(KilledBySegv(child->Wait()));
    absl::StatusOr<View> v = client_->Get(name);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_TRUE(AllBytes(*v, 7));
  }
  static bool AllBytes(const View& v, uint8_t byte) {
    const auto* p = static_cast<const uint8_t*>(v.data());
    for (uint64_t i = 0; i < v.size_bytes(); ++i) {
      if (p[i] != byte) return false;
    }
    return true;
  }
};

TEST_F(SafetyTest, ReaderWriteThroughViewFaultsAndChangesNothing) {  // [P1]
  SealedRef ref = Put(1 << 20, 7);
  std::unique_ptr<Subprocess> child =
      Child({"write-view", testing::RefToHex(ref.ref())});
  EXPECT_EQ(*child->ReadLine(), "got read-only");
  const int status = child->Wait();
  EXPECT_TRUE(KilledBySegv(status)) << child->ReadAll();
  EXPECT_TRUE(AllBytes(*client_->Get(ref.ref()), 7));
}

TEST_F(SafetyTest, ReaderWriteThroughTorchTensorFaults) {  // [P1]
  absl::StatusOr<Buffer> buf =
      client_->Create({.dtype = DType::kFloat32, .shape = {1024}});
  std::memset(buf->data(), 0, 4096);
  SealedRef ref = *buf->Seal();
  std::unique_ptr<Subprocess> child =
      Child({"write-tensor", testing::RefToHex(ref.ref())});
  EXPECT_EQ(*child->ReadLine(), "got read-only");
  EXPECT_TRUE(KilledBySegv(child->Wait()));
  EXPECT_TRUE(AllBytes(*client_->Get(ref.ref()), 0));
}

TEST_F(SafetyTest, CreatorWriteAfterSealFaults) {  // [P10]
  ExpectWriteIntoSealedFaults({"write-after-seal", "sealed-obj"}, "sealed-obj");
}

// The default revocation (kWhenExposed) leaves a range open only where no
// raw pointer points in; one kept from an earlier buffer in the same memory
// does, so the next buffer there closes at seal although it was filled with
// CopyFrom.
TEST_F(SafetyTest, OldPointerIntoReusedMemoryFaultsAfterSeal) {  // [P10]
  ExpectWriteIntoSealedFaults({"stale-pointer-write", "reused-obj"},
                              "reused-obj");
}

// What the default revocation buys and what it keeps: buffers filled with
// CopyFrom or Fill leave no pointer, so recycled memory takes no mprotect
// in a lifecycle or an exclusive hand-off; a live export, data() or a
// writable view's mutable_data() close their range at once, and memory
// that data() ever pointed into closes at every seal from then on.
TEST_F(SafetyTest, BuffersFilledWithoutAPointerChangeNoPageTable) {
  // Without stock, so that every lifecycle gets the same range back
  // (StockRecyclesItsRangesWithoutMprotect covers the stock).
  absl::StatusOr<Client> nostock =
      Client::Connect({.address = daemon_->address(), .stock_bytes = 0});
  ASSERT_TRUE(nostock.ok()) << nostock.status();
  Client* const client = &*nostock;
  constexpr uint64_t kBytes = 64 << 10;
  const std::vector<uint8_t> src(kBytes, 3);
  internal::PoolMapping* mapping = nullptr;
  std::optional<uint64_t> offset;
  enum class Fill { kCopyFrom, kFill, kData, kLiveExport };
  // One lifecycle (exclusive: a hand-off taken by this client, written
  // through mutable_data() if `write_taken`); returns the pool mapping's
  // mprotect count after it.
  auto lifecycle = [&](Fill how, bool exclusive = false,
                       bool write_taken = false) -> uint64_t {
    absl::StatusOr<Buffer> buf = client->Create({.size_bytes = kBytes});
    EXPECT_TRUE(buf.ok()) << buf.status();
    const internal::Lease& lease = *buf->lease();
    mapping = *lease.core().Mapping(lease.placement().pool_id());
    // Every lifecycle reuses the same memory, or the counts mean nothing.
    if (!offset) offset = lease.placement().offset();
    EXPECT_EQ(lease.placement().offset(), *offset);
    std::unique_ptr<internal::LeaseExport> export_share;
    switch (how) {
      case Fill::kLiveExport:
        // What an adapter's array or tensor holds.
        export_share = std::make_unique<internal::LeaseExport>(buf->lease());
        [[fallthrough]];
      case Fill::kCopyFrom:
        EXPECT_TRUE(buf->CopyFrom(src.data(), kBytes).ok());
        break;
      case Fill::kFill:
        EXPECT_TRUE(buf->Fill([](absl::Span<uint8_t> bytes) {
                         std::memset(bytes.data(), 3, bytes.size());
                       })
                        .ok());
        break;
      case Fill::kData:
        std::memset(buf->data(), 3, kBytes);
        break;
    }
    absl::StatusOr<SealedRef> ref = buf->Seal(exclusive);
    EXPECT_TRUE(ref.ok()) << ref.status();
    absl::StatusOr<View> v = client->Get(ref->ref());
    EXPECT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->writable(), exclusive);
    EXPECT_TRUE(AllBytes(*v, 3));
    if (write_taken) static_cast<uint8_t*>(v->mutable_data())[0] = 3;
    // Waiting releases: the memory is free before the next Create.
    export_share.reset();
    EXPECT_TRUE(v->Release().ok());
    if (!exclusive) {
      EXPECT_TRUE(ref->Release().ok());
    }
    return mapping->protect_calls();
  };
  const uint64_t warm = lifecycle(Fill::kCopyFrom);  // Opens the range once.
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(lifecycle(Fill::kCopyFrom), warm);
    EXPECT_EQ(lifecycle(Fill::kFill), warm);
    EXPECT_EQ(lifecycle(Fill::kCopyFrom, /*exclusive=*/true), warm);
  }
  // An export alive at the seal closes the range (1); the next buffer opens
  // it again (1).
  EXPECT_EQ(lifecycle(Fill::kLiveExport), warm + 1);
  EXPECT_EQ(lifecycle(Fill::kCopyFrom), warm + 2);
  EXPECT_EQ(lifecycle(Fill::kCopyFrom), warm + 2);
  // A taken view written through mutable_data() closes at release (1), and
  // marks the memory: from then on every writable use opens and closes it.
  EXPECT_EQ(lifecycle(Fill::kCopyFrom, true, /*write_taken=*/true), warm + 3);
  EXPECT_EQ(lifecycle(Fill::kCopyFrom), warm + 5);
  EXPECT_EQ(lifecycle(Fill::kFill), warm + 7);
  EXPECT_EQ(lifecycle(Fill::kData), warm + 9);
}

TEST_F(SafetyTest, CreatorLosesAccessAfterExclusiveSeal) {
  std::unique_ptr<Subprocess> child =
      Child({"write-after-seal", "unused", "exclusive"});
  absl::StatusOr<std::string> line = child->ReadLine();
  ASSERT_TRUE(line.ok() && absl::StartsWith(*line, "sealed ")) << line.status();
  EXPECT_TRUE(KilledBySegv(child->Wait()));
}

// WriteRevocation::kDeferred leaves a sealed object's range writable in its
// creator's writable mapping; every view, the creator's own included, still
// reads through the read-only mapping, so a write through it faults.
TEST_F(SafetyTest, DeferredRevocationKeepsEveryViewReadOnly) {  // [P1]
  ExpectWriteIntoSealedFaults({"deferred-write-view", "deferred-obj"},
                              "deferred-obj");
}

// What kDeferred buys: once a recycled range is open in this process, a
// lifecycle (create, fill, seal, get, release) and an exclusive hand-off
// take no mprotect at all; with kImmediate each writable use takes two.
TEST_F(SafetyTest, DeferredRevocationRecyclesRangesWithoutMprotect) {
  absl::StatusOr<Client> deferred =
      Client::Connect({.address = daemon_->address(),
                       .write_revocation = WriteRevocation::kDeferred,
                       .stock_bytes = 0});
  ASSERT_TRUE(deferred.ok()) << deferred.status();
  absl::StatusOr<Client> eager_client =
      Client::Connect({.address = daemon_->address(), .stock_bytes = 0});
  ASSERT_TRUE(eager_client.ok()) << eager_client.status();
  internal::PoolMapping* mapping = nullptr;
  bool hold_export = false;
  // One lifecycle; returns the pool mapping's mprotect count after it.
  auto lifecycle = [&](Client& c, bool exclusive,
                       std::optional<WriteRevocation> r) -> uint64_t {
    absl::StatusOr<Buffer> buf = c.Create({.size_bytes = 64 << 10});
    EXPECT_TRUE(buf.ok()) << buf.status();
    const internal::Lease& lease = *buf->lease();
    mapping = *lease.core().Mapping(lease.placement().pool_id());
    std::memset(buf->data(), 3, 64 << 10);
    std::unique_ptr<internal::LeaseExport> exported;
    if (hold_export) {
      exported = std::make_unique<internal::LeaseExport>(buf->lease());
    }
    absl::StatusOr<SealedRef> ref =
        buf->Seal(exclusive, kLegacyDefaultStream, r);
    EXPECT_TRUE(ref.ok()) << ref.status();
    absl::StatusOr<View> v = c.Get(ref->ref());
    EXPECT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->writable(), exclusive);
    EXPECT_TRUE(AllBytes(*v, 3));
    exported.reset();
    // Both waiting: the memory is free again before the next Create, which
    // so gets the same range.
    EXPECT_TRUE(v->Release().ok());
    if (!exclusive) {
      EXPECT_TRUE(ref->Release().ok());
    }
    return mapping->protect_calls();
  };
  for (bool exclusive : {false, true}) {
    SCOPED_TRACE(exclusive ? "exclusive" : "shared");
    const uint64_t warm = lifecycle(*deferred, exclusive, std::nullopt);
    for (int i = 0; i < 20; ++i) {
      EXPECT_EQ(lifecycle(*deferred, exclusive, std::nullopt), warm);
    }
    // A seal that asks for kImmediate (a pointer may be left) closes at
    // once, so a taker must open the range again.
    const uint64_t before = lifecycle(*deferred, exclusive, std::nullopt);
    EXPECT_EQ(lifecycle(*deferred, exclusive, WriteRevocation::kImmediate),
              before + (exclusive ? 2 : 1));
    // So does an export alive at the seal, whatever the caller vouched for
    // (the lease counts it: nobody can vouch for it).
    const uint64_t vouched = lifecycle(*deferred, exclusive, std::nullopt);
    hold_export = true;
    EXPECT_EQ(lifecycle(*deferred, exclusive, std::nullopt),
              vouched + (exclusive ? 2 : 1));
    hold_export = false;
    // The default client: open and close for every writable use.
    const uint64_t eager = lifecycle(*eager_client, exclusive, std::nullopt);
    EXPECT_EQ(lifecycle(*eager_client, exclusive, std::nullopt),
              eager + (exclusive ? 4 : 2));
  }
}

TEST_F(SafetyTest, SigkilledClientIsReclaimedWithinOneSecond) {  // [P9]
  std::unique_ptr<Subprocess> child = Child({"hold"});
  ASSERT_EQ(*child->ReadLine(), "ready");
  absl::StatusOr<StoreStats> before = client_->Stats();
  // Its objects, and its stock (buffers granted ahead of its puts; an
  // unsealed buffer taken from it still counts as stock): all go.
  EXPECT_GE(before->pools[0].used_bytes, 4u << 20);
  EXPECT_EQ(before->pending_transfers, 1u);
  EXPECT_EQ(before->sessions, 2u);

  child->Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  child->Wait();
  StoreStats after;
  do {
    after = *client_->Stats();
    if (after.pools[0].used_bytes == 0 && after.sessions == 1) break;
    absl::SleepFor(absl::Milliseconds(5));
  } while (absl::Now() - killed < absl::Seconds(1));
  EXPECT_EQ(after.pools[0].used_bytes, 0u);
  EXPECT_EQ(after.sessions, 1u);
  EXPECT_EQ(after.leases, 0u);
  EXPECT_EQ(after.pending_transfers, 0u);
  EXPECT_EQ(after.named_objects, 0u);
  // The half-written named buffer was never, and is not now, visible.
  EXPECT_EQ(client_->Get("half").status().code(), absl::StatusCode::kNotFound);
}

// A live client that cannot answer for a while (stopped, stalled in fork() of
// a large process, starved on a busy machine) keeps its session and leases:
// the daemon judges liveness by the socket, never by a ping deadline.
TEST_F(SafetyTest, StalledClientKeepsItsSessionAndLeases) {
  std::unique_ptr<Subprocess> child = Child({"hold"});
  ASSERT_EQ(*child->ReadLine(), "ready");
  const StoreStats at_ready = *client_->Stats();
  child->Signal(SIGSTOP);
  // What the daemon holds for it once stopped: its stock's refill may still
  // have been on its way at "ready" (and a call it sent before the stop is
  // still answered), so the figures are read until three in a row agree.
  // They may only have grown since "ready": nothing is reclaimed from a
  // stopped client, in the settling as after it.
  StoreStats before = *client_->Stats();
  for (int same = 0, i = 0; same < 2 && i < 100; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    const StoreStats now = *client_->Stats();
    same = now.leases == before.leases &&
                   now.pools[0].used_bytes == before.pools[0].used_bytes
               ? same + 1
               : 0;
    before = now;
  }
  EXPECT_EQ(before.sessions, at_ready.sessions);
  EXPECT_GE(before.leases, at_ready.leases);
  EXPECT_GE(before.pools[0].used_bytes, at_ready.pools[0].used_bytes);
  absl::SleepFor(absl::Seconds(17));  // Past any 10 s ping + 5 s timeout.
  const StoreStats during = *client_->Stats();
  child->Signal(SIGCONT);
  EXPECT_EQ(during.sessions, before.sessions);
  EXPECT_EQ(during.leases, before.leases);
  EXPECT_EQ(during.pools[0].used_bytes, before.pools[0].used_bytes);
  EXPECT_EQ(during.pending_transfers, 1u);
}

TEST_F(SafetyTest, FullPoolMakesProducerWaitNotOverwrite) {  // [P2]
  absl::StatusOr<Buffer> first = client_->Create({.size_bytes = 40 << 20});
  ASSERT_TRUE(first.ok());
  std::memset(first->data(), 1, 40 << 20);
  SealedRef held = *first->Seal();
  Client producer = Connect();
  std::thread consumer_done([&] {
    absl::SleepFor(absl::Milliseconds(300));
    held.Reset();  // The last view goes: now the memory may be reused.
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<Buffer> second =
      producer.Create({.size_bytes = 40 << 20, .timeout = absl::Seconds(20)});
  consumer_done.join();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
}

TEST_F(SafetyTest, FullPoolFailsAfterTimeoutWithPreciseMessage) {
  absl::StatusOr<Buffer> hog = client_->Create({.size_bytes = 60 << 20});
  ASSERT_TRUE(hog.ok());
  Client producer = Connect();
  absl::StatusOr<Buffer> b = producer.Create(
      {.size_bytes = 8 << 20, .timeout = absl::Milliseconds(200)});
  ASSERT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string msg(b.status().message());
  EXPECT_TRUE(absl::StrContains(msg, "pool 'default'")) << msg;
  EXPECT_TRUE(absl::StrContains(msg, "asked for 8388608 bytes")) << msg;
  EXPECT_TRUE(absl::StrContains(msg, "4194304 of 67108864 bytes free")) << msg;
  EXPECT_TRUE(absl::StrContains(msg, "holds 62914560 bytes")) << msg;
}

}  // namespace
}  // namespace shmtensor
