// The batch ring's protocol (client/batch_ring.h) between real processes: a
// slot is written again only after its consumer released it, a stale
// handle is refused, a dead producer's slot is lost rather than reused, and
// a forked child frees nothing of its parent's.
#include "client/batch_ring.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>

#include "gtest/gtest.h"

namespace shmtensor {
namespace {

constexpr uint64_t kAlign = 4096;
constexpr int kSlots = 3;
constexpr uint64_t kSlotBytes = 5000;  // Two pages per slot.

// Shared memory two processes see at one address (forked after mapping).
class SharedMemory {
 public:
  explicit SharedMemory(uint64_t size) : size_(size) {
    base_ = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  }
  ~SharedMemory() { munmap(base_, size_); }
  void* base() const { return base_; }
  uint64_t size() const { return size_; }

 private:
  void* base_;
  uint64_t size_;
};

// Runs `body` in a forked child; returns its exit code (the body's return
// value), 128 + the signal that killed it, or -1 when fork failed.
template <typename Body>
int InChild(Body body) {
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

class BatchRingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<uint64_t> bytes =
        BatchRing::Bytes(kSlots, kSlotBytes, kAlign);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    memory_ = std::make_unique<SharedMemory>(*bytes);
    ASSERT_NE(memory_->base(), MAP_FAILED);
    producer_ = Open(true);
    consumer_ = Open(false);
  }
  std::unique_ptr<BatchRing> Open(bool create) {
    absl::StatusOr<std::unique_ptr<BatchRing>> r = BatchRing::Open(
        memory_->base(), memory_->size(), kSlots, kSlotBytes, kAlign, create);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : nullptr;
  }
  // Claims a slot, fills it with `byte` and hands it; returns the slot.
  int Produce(BatchRing& ring, uint8_t byte) {
    const int slot = ring.Claim();
    if (slot < 0) return slot;
    uint8_t* data = *ring.Target(slot, kSlotBytes);
    std::memset(data, byte, kSlotBytes);
    EXPECT_TRUE(ring.Hand(slot).ok());
    return slot;
  }

  std::unique_ptr<SharedMemory> memory_;
  std::unique_ptr<BatchRing> producer_;
  std::unique_ptr<BatchRing> consumer_;
};

TEST(BatchRingBytes, RefusesBadShapesNamingTheValue) {
  EXPECT_EQ(*BatchRing::Bytes(2, 1, 4096), 2 * 4096 + 2 * 64);
  EXPECT_EQ(*BatchRing::Bytes(1, 4097, 4096), 8192 + 64);
  auto message = [](absl::StatusOr<uint64_t> r) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(r.status().message());
  };
  EXPECT_NE(message(BatchRing::Bytes(0, 1, 4096)).find("not 0"),
            std::string::npos);
  EXPECT_NE(message(BatchRing::Bytes(65, 1, 4096)).find("not 65"),
            std::string::npos);
  EXPECT_NE(message(BatchRing::Bytes(1, 0, 4096)).find("not 0"),
            std::string::npos);
  EXPECT_NE(message(BatchRing::Bytes(1, 1, 3000)).find("not 3000"),
            std::string::npos);
  EXPECT_NE(message(BatchRing::Bytes(1, ~uint64_t{0}, 4096)).find("bytes"),
            std::string::npos);
}

TEST(BatchRingOpen, RefusesMemoryTooSmallForTheRing) {
  SharedMemory m(4096);
  absl::StatusOr<std::unique_ptr<BatchRing>> r =
      BatchRing::Open(m.base(), m.size(), 2, 4096, 4096, true);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("too small"), absl::string_view::npos);
}

TEST_F(BatchRingTest, ASlotIsWrittenAgainOnlyAfterItsConsumerReleasedIt) {
  // Fill every slot; the producer then finds none free.
  int slots[kSlots];
  for (int i = 0; i < kSlots; ++i) slots[i] = Produce(*producer_, 0x10 + i);
  EXPECT_EQ(producer_->Claim(), -1);
  const uint32_t gen0 = producer_->Generation(slots[0]);

  // Another process adopts slot 0, checks its bytes and releases it.
  EXPECT_EQ(InChild([&] {
              std::unique_ptr<BatchRing> ring = Open(false);
              absl::StatusOr<BatchRing::Adopted> a =
                  ring->Adopt(slots[0], gen0, kSlotBytes);
              if (!a.ok()) return 1;
              for (uint64_t i = 0; i < kSlotBytes; ++i) {
                if (a->data[i] != 0x10) return 2;
              }
              a->release();
              return 0;
            }),
            0);
  // Only that slot came back, with a new generation once claimed.
  EXPECT_EQ(producer_->Claim(), slots[0]);
  EXPECT_EQ(producer_->Generation(slots[0]), gen0 + 1);
  EXPECT_EQ(producer_->Claim(), -1);
}

TEST_F(BatchRingTest, AStaleOrRepeatedHandleIsRefusedNeverServed) {
  const int slot = Produce(*producer_, 0x21);
  const uint32_t gen = producer_->Generation(slot);
  // Wrong generation: refused, and the slot stays handed for the right one.
  absl::StatusOr<BatchRing::Adopted> stale =
      consumer_->Adopt(slot, gen + 1, kSlotBytes);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.status().message().find("stale"), absl::string_view::npos);
  absl::StatusOr<BatchRing::Adopted> a =
      consumer_->Adopt(slot, gen, kSlotBytes);
  ASSERT_TRUE(a.ok()) << a.status();
  // The same handle a second time (another unpickling of it): refused.
  EXPECT_EQ(consumer_->Adopt(slot, gen, kSlotBytes).status().code(),
            absl::StatusCode::kFailedPrecondition);
  a->release();
  // Freed, refilled: the old handle names a generation that is gone.
  ASSERT_EQ(Produce(*producer_, 0x22), slot);
  EXPECT_EQ(consumer_->Adopt(slot, gen, kSlotBytes).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(consumer_->Adopt(slot, gen + 1, kSlotBytes).ok());
}

TEST_F(BatchRingTest, AForkedChildsReleaseFreesNothingOfItsParents) {
  const int slot = Produce(*producer_, 0x31);
  absl::StatusOr<BatchRing::Adopted> a =
      consumer_->Adopt(slot, producer_->Generation(slot), kSlotBytes);
  ASSERT_TRUE(a.ok());
  // A child forked while the parent holds the slot (a DataLoader worker
  // forked from the training process) drops its copy of the tensor.
  EXPECT_EQ(InChild([&] {
              a->release();
              return 0;
            }),
            0);
  int claimed = 0;
  while (producer_->Claim() >= 0) ++claimed;
  EXPECT_EQ(claimed, kSlots - 1);  // The parent's slot is still in use.
}

TEST_F(BatchRingTest, ASlotWhoseProducerDiedWhileFillingIsNeverReused) {
  EXPECT_EQ(InChild([&] {
              std::unique_ptr<BatchRing> ring = Open(false);
              const int slot = ring->Claim();
              std::memset(*ring->Target(slot, 10), 0x41, 10);
              raise(SIGKILL);  // Dies mid-fill.
              return 0;
            }),
            128 + SIGKILL);
  int claimed = 0;
  while (producer_->Claim() >= 0) ++claimed;
  EXPECT_EQ(claimed, kSlots - 1);
}

TEST_F(BatchRingTest, AFailedFillReturnsTheSlotAndTargetsAreBounded) {
  const int slot = producer_->Claim();
  ASSERT_GE(slot, 0);
  EXPECT_EQ(producer_->Target(slot, kSlotBytes + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(producer_->Target(kSlots, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(producer_->Target(-1, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(producer_->Unclaim(slot).ok());
  // Not being filled any more: neither handed nor unclaimed twice.
  EXPECT_EQ(producer_->Hand(slot).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(producer_->Unclaim(slot).code(),
            absl::StatusCode::kFailedPrecondition);
  // Never handed: nothing to adopt.
  EXPECT_FALSE(consumer_->Adopt(slot, producer_->Generation(slot), 1).ok());
  int claimed = 0;
  while (producer_->Claim() >= 0) ++claimed;
  EXPECT_EQ(claimed, kSlots);
}

}  // namespace
}  // namespace shmtensor
