#include "common/release_ring.h"

#include <atomic>
#include <cstring>

#include "absl/strings/str_format.h"

namespace shmtensor {
namespace {

static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  sizeof(std::atomic<uint64_t>) == sizeof(uint64_t),
              "the ring's counters are plain 64-bit words in shared memory");
static_assert(std::atomic<uint32_t>::is_always_lock_free &&
                  sizeof(std::atomic<uint32_t>) == sizeof(uint32_t),
              "the nudge is a plain 32-bit word in shared memory");

constexpr size_t kSlotsAt = 8;
constexpr size_t kSlotBytesAt = 12;
constexpr size_t kHeadAt = 64;
constexpr size_t kConsumedAt = 128;
constexpr size_t kAppliedAt = 136;
constexpr size_t kNudgeAt = 144;

std::atomic<uint64_t>& Word64(char* base, size_t at) {
  return *reinterpret_cast<std::atomic<uint64_t>*>(base + at);
}
std::atomic<uint32_t>& Word32(char* base, size_t at) {
  return *reinterpret_cast<std::atomic<uint32_t>*>(base + at);
}
char* Slot(char* base, uint64_t record) {
  return base + kReleaseRingHeaderBytes +
         (record % kReleaseRingSlots) * kReleaseRingSlotBytes;
}

}  // namespace

ReleaseRingReader::ReleaseRingReader(void* base)
    : base_(static_cast<char*>(base)) {
  const uint64_t magic = kReleaseRingMagic;
  const uint32_t slots = kReleaseRingSlots;
  const uint32_t slot_bytes = kReleaseRingSlotBytes;
  std::memcpy(base_, &magic, sizeof(magic));
  std::memcpy(base_ + kSlotsAt, &slots, sizeof(slots));
  std::memcpy(base_ + kSlotBytesAt, &slot_bytes, sizeof(slot_bytes));
  // Published by the descriptor's hand-over (a system call) before the
  // client maps it.
}

absl::Status ReleaseRingReader::Drain(
    absl::FunctionRef<Take(absl::string_view record)> take) {
  if (broken_) return absl::OkStatus();
  // seq_cst: ordered after a RequestNudge that came before (see
  // ReleaseRingWriter::NudgeRequested).
  const uint64_t head = Word64(base_, kHeadAt).load(std::memory_order_seq_cst);
  const uint64_t start = consumed_;
  absl::Status broke;
  if (head - consumed_ > kReleaseRingSlots) {
    broke = absl::DataLossError(absl::StrFormat(
        "release ring head %d is not within %d records of the %d read", head,
        kReleaseRingSlots, consumed_));
  }
  // The client may rewrite a slot while it is copied out (a hostile or
  // broken one: an honest client never writes a slot it has not seen
  // consumed). The copy is all that is looked at, so such a race yields at
  // worst a malformed record, never a read outside the slot.
  char record[kReleaseRingMaxRecord];
  while (broke.ok() && consumed_ != head) {
    const char* slot = Slot(base_, consumed_);
    uint32_t length;
    std::memcpy(&length, slot, sizeof(length));
    if (length == 0 || length > kReleaseRingMaxRecord) {
      broke = absl::DataLossError(
          absl::StrFormat("release ring record %d has length %d (1 to %d)",
                          consumed_, length, kReleaseRingMaxRecord));
      break;
    }
    std::memcpy(record, slot + sizeof(length), length);
    const Take t = take(absl::string_view(record, length));
    if (t == Take::kLater) break;
    if (t == Take::kMalformed) {
      broke = absl::DataLossError(
          absl::StrFormat("release ring record %d (%d bytes) is not a message",
                          consumed_, length));
      break;
    }
    ++consumed_;
  }
  if (consumed_ != start) {
    Word64(base_, kConsumedAt).store(consumed_, std::memory_order_release);
  }
  if (!broke.ok()) broken_ = true;
  return broke;
}

void ReleaseRingReader::PublishApplied(uint64_t seq) {
  Word64(base_, kAppliedAt).store(seq, std::memory_order_release);
}

void ReleaseRingReader::RequestNudge() {
  Word32(base_, kNudgeAt).store(1, std::memory_order_seq_cst);
}

bool ReleaseRingReader::TakeNudge() {
  std::atomic<uint32_t>& nudge = Word32(base_, kNudgeAt);
  // A plain load first: the usual answer is no, and it needs no write.
  if (nudge.load(std::memory_order_relaxed) == 0) return false;
  return nudge.exchange(0, std::memory_order_seq_cst) != 0;
}

absl::StatusOr<ReleaseRingWriter> ReleaseRingWriter::Attach(void* base,
                                                            size_t size) {
  char* const b = static_cast<char*>(base);
  if (size < kReleaseRingBytes) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "release ring of %d bytes, at least %d", size, kReleaseRingBytes));
  }
  uint64_t magic;
  uint32_t slots, slot_bytes;
  std::memcpy(&magic, b, sizeof(magic));
  std::memcpy(&slots, b + kSlotsAt, sizeof(slots));
  std::memcpy(&slot_bytes, b + kSlotBytesAt, sizeof(slot_bytes));
  if (magic != kReleaseRingMagic || slots != kReleaseRingSlots ||
      slot_bytes != kReleaseRingSlotBytes) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "release ring header: magic %#x, %d slots of %d bytes; this client "
        "knows magic %#x, %d slots of %d bytes",
        magic, slots, slot_bytes, kReleaseRingMagic, kReleaseRingSlots,
        kReleaseRingSlotBytes));
  }
  ReleaseRingWriter writer(b);
  writer.head_ = Word64(b, kHeadAt).load(std::memory_order_relaxed);
  return writer;
}

bool ReleaseRingWriter::Post(absl::string_view record) {
  if (record.empty() || record.size() > kReleaseRingMaxRecord) return false;
  const uint64_t consumed =
      Word64(base_, kConsumedAt).load(std::memory_order_acquire);
  if (head_ - consumed >= kReleaseRingSlots) return false;
  char* slot = Slot(base_, head_);
  const uint32_t length = static_cast<uint32_t>(record.size());
  std::memcpy(slot + sizeof(length), record.data(), record.size());
  std::memcpy(slot, &length, sizeof(length));
  ++head_;
  // seq_cst: ordered before NudgeRequested's load (a Dekker pair with the
  // daemon's RequestNudge and then Drain: one of them sees the other).
  Word64(base_, kHeadAt).store(head_, std::memory_order_seq_cst);
  return true;
}

bool ReleaseRingWriter::NudgeRequested() const {
  return Word32(base_, kNudgeAt).load(std::memory_order_seq_cst) != 0;
}

uint64_t ReleaseRingWriter::applied() const {
  return Word64(base_, kAppliedAt).load(std::memory_order_acquire);
}

}  // namespace shmtensor
