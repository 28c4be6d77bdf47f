#include "client/batch_ring.h"

#include <unistd.h>

#include <limits>
#include <utility>

#include "absl/strings/str_format.h"
#include "client/fork_guard.h"

namespace shmtensor {
namespace {

constexpr uint64_t kPage = 4096;

uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

bool Cas(uint32_t* word, uint32_t from, uint32_t to) {
  return __atomic_compare_exchange_n(word, &from, to, /*weak=*/false,
                                     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

}  // namespace

absl::StatusOr<uint64_t> BatchRing::Bytes(int slots, uint64_t slot_bytes,
                                          uint64_t align) {
  if (align < kPage || align > (uint64_t{1} << 30) ||
      (align & (align - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a batch ring's slot alignment is a power of two from 4096 to 2^30, "
        "not %d",
        align));
  }
  if (slots < 1 || slots > kMaxSlots) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a batch ring has 1 to %d slots, not %d", kMaxSlots, slots));
  }
  const uint64_t max = std::numeric_limits<uint64_t>::max() / 2 / kMaxSlots;
  if (slot_bytes == 0 || slot_bytes > max) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a batch ring's slots hold 1 to %d bytes, not %d", max, slot_bytes));
  }
  return slots * RoundUp(slot_bytes, align) + slots * kHeaderLine;
}

absl::StatusOr<std::unique_ptr<BatchRing>> BatchRing::Open(
    void* base, uint64_t size, int slots, uint64_t slot_bytes, uint64_t align,
    bool create) {
  absl::StatusOr<uint64_t> need = Bytes(slots, slot_bytes, align);
  if (!need.ok()) return need.status();
  if (size < *need) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "object of %d bytes is too small for a ring of %d slots of %d bytes "
        "(%d bytes)",
        size, slots, slot_bytes, *need));
  }
  std::unique_ptr<BatchRing> ring(
      new BatchRing(base, slots, slot_bytes, align));
  if (create) {
    for (int i = 0; i < slots; ++i) {
      __atomic_store_n(ring->GenerationWord(i), 0, __ATOMIC_RELAXED);
      __atomic_store_n(ring->StateWord(i), kFree, __ATOMIC_RELEASE);
    }
  }
  return ring;
}

BatchRing::BatchRing(void* base, int slots, uint64_t slot_bytes, uint64_t align)
    : base_(static_cast<uint8_t*>(base)),
      slots_(slots),
      slot_bytes_(slot_bytes),
      stride_align_(align),
      stride_(RoundUp(slot_bytes, align)),
      pid_(getpid()) {}

uint32_t* BatchRing::StateWord(int slot) const {
  return reinterpret_cast<uint32_t*>(base_ + slots_ * stride_ +
                                     slot * kHeaderLine);
}

uint32_t* BatchRing::GenerationWord(int slot) const {
  return StateWord(slot) + 1;
}

uint8_t* BatchRing::SlotData(int slot) const { return base_ + slot * stride_; }

absl::Status BatchRing::CheckSlot(int slot, uint64_t nbytes) const {
  if (slot < 0 || slot >= slots_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("slot %d is not in a ring of %d", slot, slots_));
  }
  if (nbytes > slot_bytes_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d bytes do not fit a slot of %d", nbytes, slot_bytes_));
  }
  return absl::OkStatus();
}

int BatchRing::Claim() {
  for (int i = 0; i < slots_; ++i) {
    if (Cas(StateWord(i), kFree, kFilling)) {
      // Only the claimer changes the generation, and only while filling.
      __atomic_fetch_add(GenerationWord(i), 1, __ATOMIC_RELEASE);
      return i;
    }
  }
  return -1;
}

uint32_t BatchRing::Generation(int slot) const {
  if (!CheckSlot(slot, 0).ok()) return 0;
  return __atomic_load_n(GenerationWord(slot), __ATOMIC_ACQUIRE);
}

absl::StatusOr<uint8_t*> BatchRing::Target(int slot, uint64_t nbytes) {
  if (absl::Status s = CheckSlot(slot, nbytes); !s.ok()) return s;
  return SlotData(slot);
}

absl::Status BatchRing::Hand(int slot) { return EndFilling(slot, kHanded); }

absl::Status BatchRing::Unclaim(int slot) { return EndFilling(slot, kFree); }

absl::Status BatchRing::EndFilling(int slot, SlotState to) {
  if (absl::Status s = CheckSlot(slot, 0); !s.ok()) return s;
  if (!Cas(StateWord(slot), kFilling, to)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("slot %d is not being filled", slot));
  }
  return absl::OkStatus();
}

absl::StatusOr<BatchRing::Adopted> BatchRing::Adopt(int slot,
                                                    uint32_t generation,
                                                    uint64_t nbytes) {
  if (absl::Status s = CheckSlot(slot, nbytes); !s.ok()) return s;
  // The generation is checked while the slot is handed: the producer
  // changes it only in kFilling, which a handed slot reaches only after this
  // process freed it (checked again after the swap).
  if (__atomic_load_n(GenerationWord(slot), __ATOMIC_ACQUIRE) != generation ||
      !Cas(StateWord(slot), kHanded, kAdopted)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "stale batch handle: slot %d of the ring no longer holds batch "
        "generation %d",
        slot, generation));
  }
  if (__atomic_load_n(GenerationWord(slot), __ATOMIC_ACQUIRE) != generation) {
    // Between the check and the swap another thread of this process adopted
    // the same handle, its tensors died and the producer filled and handed
    // the slot again: that newer batch stays handed for its own handle.
    __atomic_store_n(StateWord(slot), kHanded, __ATOMIC_RELEASE);
    return absl::FailedPreconditionError(
        absl::StrFormat("slot %d changed generation while handed", slot));
  }
  uint32_t* state = StateWord(slot);
  const pid_t owner = pid_;
  const uint64_t forks = internal::ForksMade();
  return Adopted{SlotData(slot), [state, owner, forks] {
                   if (getpid() != owner) return;
                   __atomic_store_n(
                       state, internal::ForksMade() == forks ? kFree : kRetired,
                       __ATOMIC_RELEASE);
                 }};
}

}  // namespace shmtensor
