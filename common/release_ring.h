// A session's release ring (docs/shm_layout.md, "The release ring"): a
// small shared-memory ring of records (serialized ReleaseLeases messages)
// that a client posts and the daemon pulls, so that a one-way seal needs no
// stream write and wakes nobody. The daemon makes the memory (one memfd per
// session, sealed against shrinking and growing) and hands its descriptor
// to the session's process with the pools'; this file is the layout and the
// two ends, over memory someone else mapped. Internal: not installed.
//
// Layout (every offset from the start of the memory; little-endian, the one
// byte order both ends run on):
//   0    uint64 magic kReleaseRingMagic, uint32 slots, uint32 slot_bytes
//                                                 written once, by the daemon
//   64   uint64 head       records posted, ever   the client (release store)
//   128  uint64 consumed   records read, ever     the daemon  (release store)
//   136  uint64 applied    the session's last ReleaseLeases seq applied
//                                                 the daemon  (release store)
//   144  uint32 nudge      1: a call waits for a record of this ring
//                                                 the daemon  (seq_cst)
//   256  slots x slot_bytes: record i is in slot i % slots, as
//        uint32 length (1 .. slot_bytes - 4), then its bytes.
//
// The daemon trusts nothing the client can write: it keeps its own read
// position and the geometry it made, reads `head` once per drain, copies a
// record out before it looks at it, and treats a ring whose head or record
// length is impossible as broken (it reads it no more; the client's
// messages still reach it on the stream). The client reads what the daemon
// writes as hints: a wrong `consumed` only makes it post less (it falls
// back to the stream), a wrong `applied` only confirms what it sent.
//
// Thread safety: each end is used by one thread at a time (the client posts
// under its outbox's lock, the daemon drains under the store's lock); the
// two ends run concurrently in different processes.
#ifndef SHMTENSOR_COMMON_RELEASE_RING_H_
#define SHMTENSOR_COMMON_RELEASE_RING_H_

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shmtensor {

inline constexpr uint64_t kReleaseRingMagic = 0x31474e4952544d53;  // SMTRING1
inline constexpr uint32_t kReleaseRingSlots = 256;
inline constexpr uint32_t kReleaseRingSlotBytes = 256;
inline constexpr size_t kReleaseRingHeaderBytes = 256;
// The largest record a slot holds.
inline constexpr size_t kReleaseRingMaxRecord = kReleaseRingSlotBytes - 4;
// The ring's size in bytes (header and slots).
inline constexpr size_t kReleaseRingBytes =
    kReleaseRingHeaderBytes +
    static_cast<size_t>(kReleaseRingSlots) * kReleaseRingSlotBytes;
// The most rings a session gets from one daemon: its first, and a new one
// after each resume (DescriptorRequest.release_ring_only), which drops the
// last. It bounds the ring descriptors the daemon sends a session (each in
// flight until read); a client holds one ring at a time.
inline constexpr uint32_t kMaxRingsPerSession = 8;

// The daemon's end, over `base` (kReleaseRingBytes, writable, mapped
// shared, made zero), which it initializes. Not copyable: it owns the read
// position.
class ReleaseRingReader {
 public:
  // What the daemon's `take` did with a record.
  enum class Take {
    kConsumed,  // Applied, or found applied already: the next one is read.
    kLater,     // Not due yet (a seq past the next one due): the drain stops
                // here and reads it again next time.
    kMalformed  // Not a message: the ring is broken.
  };

  explicit ReleaseRingReader(void* base);
  ReleaseRingReader(const ReleaseRingReader&) = delete;
  ReleaseRingReader& operator=(const ReleaseRingReader&) = delete;

  // Reads the records posted since the last drain, oldest first, each
  // handed to `take` as a copy of its bytes (valid during the call), until
  // one is kLater. Returns the error naming what broke the ring the one
  // time it finds it broken (OK every other time; a broken ring is read no
  // more). Bounded: at most kReleaseRingSlots records.
  absl::Status Drain(absl::FunctionRef<Take(absl::string_view record)> take);

  // Tells the client the session applied every message through `seq`.
  void PublishApplied(uint64_t seq);
  // Asks the client to send its next posts on the stream too (a call waits
  // for one). Drain after it: a record posted before it is found there.
  void RequestNudge();
  // Clears the request; true when it was set.
  bool TakeNudge();

  bool broken() const { return broken_; }
  // Records consumed so far.
  uint64_t consumed() const { return consumed_; }

 private:
  char* const base_;
  uint64_t consumed_ = 0;
  bool broken_ = false;
};

// The client's end, over memory the daemon initialized. Not copyable: it
// owns the post position.
class ReleaseRingWriter {
 public:
  // Checks the header (magic and geometry: FAILED_PRECONDITION naming
  // what differs) of `base`, `size` bytes mapped writable and shared.
  static absl::StatusOr<ReleaseRingWriter> Attach(void* base, size_t size);

  ReleaseRingWriter(ReleaseRingWriter&&) = default;
  ReleaseRingWriter& operator=(ReleaseRingWriter&&) = delete;
  ReleaseRingWriter(const ReleaseRingWriter&) = delete;

  // Posts one record: false when it is empty or over kReleaseRingMaxRecord,
  // or the ring is full (the daemon has not read far enough); the caller
  // sends it another way then.
  bool Post(absl::string_view record);
  // Whether the daemon asked for a nudge (RequestNudge). Call it after
  // Post: a nudge asked for before the post is seen here.
  bool NudgeRequested() const;
  // The daemon's last PublishApplied.
  uint64_t applied() const;

 private:
  explicit ReleaseRingWriter(char* base) : base_(base) {}
  char* base_;
  uint64_t head_ = 0;
};

}  // namespace shmtensor

#endif  // SHMTENSOR_COMMON_RELEASE_RING_H_
