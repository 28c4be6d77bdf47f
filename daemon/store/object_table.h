// The store's objects: the slots that hold them, each slot's generation, the
// names bound to them and their creation order.
//
// A ref (v1::ObjectRef) names a slot, the slot's generation when the object
// was made, and the object's random nonce. Freeing a slot moves its
// generation on (never to 0, so an all-zero ref is never valid): every ref
// to the object freed is stale from then on, however soon the slot is
// reused. The nonce keeps refs from being guessed from slot and generation.
//
// The table never touches pool memory or leases; the owner frees an
// object's memory and calls Free when nothing refers to it any more.
//
// Thread safety: not thread-safe; the owner (ObjectStore) serializes access.
#ifndef SHMTENSOR_DAEMON_STORE_OBJECT_TABLE_H_
#define SHMTENSOR_DAEMON_STORE_OBJECT_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "shmtensor/v1/shmtensor.pb.h"

namespace shmtensor::daemon {

// Longest object name, in bytes.
inline constexpr size_t kMaxNameBytes = 255;
// Most objects alive at once (slots in the object table).
inline constexpr uint32_t kMaxObjects = 1u << 24;

// INVALID_ARGUMENT naming the fault for a name that is empty, longer than
// kMaxNameBytes or holds a NUL byte; else OK.
absl::Status ValidateName(const std::string& name);
// `text` quoted for a message, cut to 64 bytes: a name from a request is
// echoed with its length, never whole (an error's size stays bounded).
std::string Quoted(const std::string& text);
// "ref(slot 3, generation 1)", for messages.
std::string RefString(const v1::ObjectRef& ref);

class ObjectTable {
 public:
  enum class State {
    kWriting,          // Created; only its creator's write lease sees it.
    kSealed,           // Readable by Get and, when named, GetByName.
    kPendingTransfer,  // Sealed exclusive, waiting for its one taker.
    kTaken,            // Sealed exclusive and taken.
    kSharedWritable,   // Never sealed; every Get of it is writable.
  };

  struct Object {
    uint32_t pool = 0;
    uint64_t offset = 0;
    uint64_t size = 0;
    uint64_t capacity = 0;
    v1::Layout layout;
    State state = State::kWriting;  // Changed through SetState only.
    std::string name;               // Non-empty while a name is bound to it.
    uint64_t creator = 0;           // Session that created it.
    // The creator's uid: the object counts against its share of the table
    // (SessionTable::CountObjects) until it is freed.
    uint32_t uid = 0;
    uint32_t leases = 0;
    // Fork holds pinning it (ObjectStore::HoldForFork): while any is left
    // its memory is not freed, whatever else lets go of it.
    uint32_t holds = 0;
    absl::Time created;
    uint64_t serial = 0;  // Creation order, for oldest-first listings.
    // Random, per object: a ref must carry it (ObjectRef.nonce).
    uint64_t nonce = 0;
    // Made ahead of need (CreateManyRequest.stock) and not sealed yet:
    // counted in its creator's Session::stock_bytes.
    bool stock = false;
  };

  // `epoch` (the daemon instance's id) goes into every ref; `random` draws
  // each object's nonce, and is called only from Add.
  ObjectTable(uint64_t epoch, std::function<uint64_t()> random);

  // Not copyable or movable: the owner's callbacks refer to it.
  ObjectTable(const ObjectTable&) = delete;
  ObjectTable& operator=(const ObjectTable&) = delete;

  // Whether every slot is taken: kMaxObjects slots, none free.
  bool full() const;
  // Puts `object` in a slot, the one freed last when there is one, with a
  // new nonce, and returns the slot. Its `serial` (new: no live object has
  // it) places it in by_serial(); its `name`, when not empty, is bound to
  // it, and must be bound to no other object (Named). Requires !full().
  uint32_t Add(Object object);
  // The object in live `slot`. The reference lives until the next Add.
  Object& object(uint32_t slot) { return slots_[slot].object; }
  const Object& object(uint32_t slot) const { return slots_[slot].object; }
  // Moves the object in `slot` to `state`, keeping pending_transfers().
  void SetState(uint32_t slot, State state);

  // The slot of the object bound to `name`, or nullopt.
  std::optional<uint32_t> Named(const std::string& name) const;
  // Unbinds the name of the object in `slot`, if it has one.
  void Unbind(uint32_t slot);

  // A successor's table, rebuilt from its predecessor's ledger: the object
  // in `slot` with its generation and nonce as they were (bound to its name
  // when `object.name` is set), and a free slot's next generation. Then
  // FinishRestore, once, before any Add.
  void Restore(uint32_t slot, uint32_t generation, Object object);
  void RestoreFree(uint32_t slot, uint32_t generation);
  // A slot whose ledger record the successor refused: never used again (a
  // ref to what it held stays stale). Before FinishRestore.
  void RestoreRetired(uint32_t slot);
  void FinishRestore();

  // Frees `slot`, whose object has no name left: it leaves by_serial(), its
  // generation moves on, and a later Add may reuse it.
  void Free(uint32_t slot);

  // The ref of the object in `slot`, nonce included.
  v1::ObjectRef MakeRef(uint32_t slot) const;
  // The slot of the live object `ref` names. NOT_FOUND (STALE_REFERENCE) for
  // a ref of another daemon instance or of an object that is gone;
  // INVALID_ARGUMENT for one this table never issued (a wrong nonce, a
  // generation or slot never reached, generation 0).
  absl::StatusOr<uint32_t> ResolveRef(const v1::ObjectRef& ref) const;

  // Whether `slot` holds a live object.
  bool live(uint32_t slot) const {
    return slot < slots_.size() && slots_[slot].live;
  }
  // The generation of `slot` (the live object's, or the next one's).
  uint32_t generation(uint32_t slot) const { return slots_[slot].generation; }
  uint64_t live() const { return live_; }
  // Slots RestoreRetired took out of use: they count against the object
  // table's size as live ones do (the ledger has a record for each slot).
  uint64_t retired() const { return retired_; }
  size_t named() const { return names_.size(); }
  // Objects in State::kPendingTransfer.
  uint64_t pending_transfers() const { return pending_transfers_; }
  // Live objects' slots by serial, oldest first.
  const absl::btree_map<uint64_t, uint32_t>& by_serial() const {
    return by_serial_;
  }

 private:
  struct Slot {
    uint32_t generation = 1;  // Never 0.
    bool live = false;
    bool retired = false;  // RestoreRetired: never free, never live.
    Object object;
  };

  const uint64_t epoch_;
  const std::function<uint64_t()> random_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  absl::flat_hash_map<std::string, uint32_t> names_;
  absl::btree_map<uint64_t, uint32_t> by_serial_;
  uint64_t live_ = 0;
  uint64_t retired_ = 0;
  uint64_t pending_transfers_ = 0;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_STORE_OBJECT_TABLE_H_
