// A ring of batch slots in one shared-writable object: the DataLoader's way
// to hand batches from a worker to the training process with no call to the
// daemon per batch (docs/shm_layout.md, "Batch rings").
//
// The worker (producer) creates the object and owns the ring; the training
// process (consumer) joins it with Get. The object holds the slots, each at
// a multiple of `align` (the pool's page size: a batch is whole pages, huge
// ones in a huge-page pool), then one 64-byte header line per slot,
// {uint32 state, uint32 generation}, that both processes change with atomic
// instructions only (no lock: a process that dies cannot wedge the other):
//
//   kFree --Claim (producer)--> kFilling --Hand (producer)--> kHanded
//   kHanded --Adopt (consumer, generation must match)--> kAdopted
//   kAdopted --last tensor over the slot dies (consumer)--> kFree
//   kFilling --Unclaim (producer, its fill failed)--> kFree
//   kAdopted --last tensor dies, but the consumer forked since it adopted
//             the slot (a child may read it still)--> kRetired, for good
//
// So a slot is written again only after the consumer's last tensor over it
// died, and a handle whose slot moved on (its generation is gone) is refused,
// never served with another batch's bytes. The producer bumps the generation
// at each Claim. A slot whose producer died while filling it stays kFilling
// until the ring goes: lost, never reused.
//
// The ring only reads and writes the memory it is given; the caller keeps
// that memory mapped while the ring, or anything over its slots, lives (the
// Python binding: a share of the object's lease in every tensor it makes).
//
// Thread safety: thread-safe (the header is changed atomically).
#ifndef SHMTENSOR_CLIENT_BATCH_RING_H_
#define SHMTENSOR_CLIENT_BATCH_RING_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shmtensor {

class BatchRing {
 public:
  enum SlotState : uint32_t {
    kFree = 0,
    kFilling = 1,
    kHanded = 2,
    kAdopted = 3,
    // Never reused: the consumer forked while it had the slot adopted, so
    // a child may still read the batch (docs/pitfalls.md P18). The ring has
    // one slot less from then on.
    kRetired = 4
  };
  // Bytes of one slot's header line, and the most slots a ring has.
  static constexpr uint64_t kHeaderLine = 64;
  static constexpr int kMaxSlots = 64;

  // Bytes an object needs for `slots` slots of `slot_bytes` each, each slot
  // rounded up to a multiple of `align`, then the header lines.
  // INVALID_ARGUMENT for slots outside [1, kMaxSlots], slot_bytes 0 or too
  // large to add up, or `align` not a power of two from 4 KiB to 1 GiB.
  static absl::StatusOr<uint64_t> Bytes(int slots, uint64_t slot_bytes,
                                        uint64_t align);

  // The ring over the `size` writable bytes at `base` (the mapping of a
  // shared-writable object, page aligned). `create`: this process made the
  // object and nobody else has it yet: every slot starts kFree.
  // INVALID_ARGUMENT as Bytes(), or when `size` is smaller than Bytes().
  static absl::StatusOr<std::unique_ptr<BatchRing>> Open(
      void* base, uint64_t size, int slots, uint64_t slot_bytes, uint64_t align,
      bool create);

  int slots() const { return slots_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint64_t align() const { return stride_align_; }

  // Producer. A kFree slot made kFilling with its generation bumped, or -1
  // when every slot is in use.
  int Claim();
  uint32_t Generation(int slot) const;
  // The first byte of a slot this process claimed, to fill `nbytes` (it
  // does not change the slot's state). INVALID_ARGUMENT for a slot outside
  // the ring or `nbytes` over slot_bytes().
  absl::StatusOr<uint8_t*> Target(int slot, uint64_t nbytes);
  // kFilling -> kHanded: the batch is complete.
  absl::Status Hand(int slot);
  // kFilling -> kFree: the fill failed, the slot was never handed.
  absl::Status Unclaim(int slot);

  // Consumer. kHanded -> kAdopted when `generation` is the slot's: the
  // slot's bytes, and `release`, to be called once when the last user of
  // them is done, which makes the slot kFree again (in this process only: a
  // forked child that calls it frees nothing of the parent's), or kRetired
  // when this process forked meanwhile (internal::ForksMade()).
  // FAILED_PRECONDITION (stale) when the slot is not handed with that
  // generation.
  struct Adopted {
    uint8_t* data = nullptr;
    std::function<void()> release;
  };
  absl::StatusOr<Adopted> Adopt(int slot, uint32_t generation, uint64_t nbytes);

 private:
  BatchRing(void* base, int slots, uint64_t slot_bytes, uint64_t align);
  uint32_t* StateWord(int slot) const;
  uint32_t* GenerationWord(int slot) const;
  uint8_t* SlotData(int slot) const;
  absl::Status CheckSlot(int slot, uint64_t nbytes) const;
  // kFilling -> `to`.
  absl::Status EndFilling(int slot, SlotState to);

  uint8_t* const base_;
  const int slots_;
  const uint64_t slot_bytes_;
  const uint64_t stride_align_;
  const uint64_t stride_;  // Bytes from one slot to the next.
  const pid_t pid_;        // This process: a forked child frees nothing.
};

}  // namespace shmtensor

#endif  // SHMTENSOR_CLIENT_BATCH_RING_H_
