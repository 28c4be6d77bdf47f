// The ledger: what a successor daemon must know of this one's store, kept
// in a memfd that only the daemon maps and writes (clients never get its
// descriptor), so that it outlives the process: it goes to a successor with
// the pools, by take-over (descriptor socket) or through systemd's file
// descriptor store after a crash. The layout and the ordering rules are
// specified in docs/shm_layout.md ("The ledger").
//
// Crash consistency: every record is published by one 64-bit atomic store
// (its `word`), after the fields it publishes were written, with release
// order; it is withdrawn by one store of 0. A SIGKILL at any instruction
// therefore leaves each record either as it was before the change or after
// it, never half of one. The writer calls come from the store under its
// lock, before the call's answer leaves the daemon: whatever a client was
// told is in the ledger. What the ledger holds and a client was never told
// (the daemon died between the two) is held, never freed: a successor
// drops it only when its session ends.
//
// Layout: a preamble (magic written last, version, sizes, checksum of the
// directory), a directory laid out by Boost.Interprocess's
// managed_external_buffer (named, versioned structures built once when the
// ledger is created and never written again: the header and the table
// descriptors, found by name by a successor), the counters page, then the
// record tables, each at a page boundary. Nothing is allocated through
// Boost after creation, and no Boost mutex is used (null_mutex_family).
//
// Thread safety: not thread-safe; the owner (ObjectStore) serialises every
// call under its lock.
#ifndef SHMTENSOR_DAEMON_LEDGER_LEDGER_H_
#define SHMTENSOR_DAEMON_LEDGER_LEDGER_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/os/mapped_fd.h"
#include "daemon/os/peer.h"

namespace shmtensor::daemon {

// Bytes of a session id's hash (SHA-256): the ledger never holds a
// session's secret itself.
inline constexpr size_t kSessionHashBytes = 32;
using SessionHash = std::array<uint8_t, kSessionHashBytes>;
SessionHash HashSessionId(uint64_t session_id);
// SHA-256 of a descriptor secret.
SessionHash HashSecret(absl::string_view secret);

struct LedgerPool {
  std::string name;   // At most 63 bytes.
  uint32_t kind = 0;  // v1::MemoryKind.
  uint64_t size_bytes = 0;
  uint64_t page_size = 0;
  uint64_t huge_page_size = 0;
};

// One live object. `state` is ObjectTable::State as an integer; `named`
// whether `name` is still bound.
struct LedgerObject {
  uint32_t slot = 0;
  uint32_t generation = 0;
  uint32_t pool = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t capacity = 0;
  uint64_t nonce = 0;
  uint64_t creator = 0;  // The creating session's client id.
  uint64_t serial = 0;
  int64_t created_ns = 0;  // Unix time.
  uint32_t state = 0;
  bool named = false;
  uint32_t uid = 0;    // The creator's (0 in a ledger of an older daemon).
  std::string name;    // At most kMaxLedgerNameBytes.
  std::string layout;  // A serialised v1::Layout, kMaxLedgerLayoutBytes.
};
inline constexpr size_t kMaxLedgerNameBytes = 255;
inline constexpr size_t kMaxLedgerLayoutBytes = 1792;

struct LedgerLease {
  uint64_t id = 0;
  uint64_t client_id = 0;  // The holding session's.
  uint32_t slot = 0;
  bool write = false;
};

struct LedgerSession {
  uint64_t client_id = 0;
  SessionHash id_hash{};
  SessionHash secret_hash{};  // Of its descriptor secret.
  uint32_t uid = 0;
  uint32_t gid = 0;
  int32_t pid = 0;        // 0: a process the daemon could not see.
  uint64_t instance = 0;  // OwnerKey::instance.
  uint64_t serial = 0;
  int64_t opened_ns = 0;
  bool read_only = false;
  std::vector<uint8_t> access;  // v1::PoolAccess by pool id.
  std::string client_name;      // At most 255 bytes.
  uint64_t releases_applied = 0;
};

// A pin that is not a lease: an offer (key: its token) or one object of a
// fork hold (key: the hold's id; one record per object).
struct LedgerPin {
  enum Kind : uint32_t { kOffer = 1, kForkHold = 2 };
  Kind kind = kOffer;
  uint64_t key = 0;
  uint32_t slot = 0;
  uint32_t generation = 0;
  uint64_t client_id = 0;
  uint32_t uid = 0;
  uint64_t bytes = 0;
  // Offers: INT64_MAX while open. Fork holds: kForkHoldPending until the
  // hold's descriptor is kept where a successor gets it and the client may
  // be told (MarkForkHoldGranted), anything else after.
  int64_t expires_ns = INT64_MAX;
};
inline constexpr int64_t kForkHoldPending = INT64_MIN;
inline constexpr size_t kMaxRefusalsKept = 64;

struct LedgerCapacity {
  uint32_t objects = 0;  // Slots: 0 .. objects - 1.
  uint32_t leases = 0;
  uint32_t sessions = 0;
  uint32_t pins = 0;
};

// A record a successor refused: it could not trust what it says (a field
// out of bounds, a length past its record). The rest of the ledger is read
// as usual; what the record belonged to is refused with it. Adopt withdraws
// the record (a later successor finds it free) and never uses its index
// again.
struct LedgerRefusal {
  enum Table : uint32_t { kObject, kLease, kSession, kPin };
  Table table = kObject;
  uint32_t index = 0;  // The record's (an object's: its slot).
  std::string why;     // For the log, at most a line.
};

// An object record refused: its slot is never used again by this daemon
// (a ref to whatever it held stays stale), and its range, when the record
// places it inside its pool, is kept from reuse (a view of it may live).
struct LedgerRetiredSlot {
  uint32_t slot = 0;
  bool range_known = false;
  uint32_t pool = 0;
  uint64_t offset = 0;
  uint64_t capacity = 0;
};

// Everything a ledger holds, as read by a successor.
struct LedgerState {
  uint64_t epoch = 0;
  std::vector<LedgerPool> pools;
  LedgerCapacity capacity;
  std::vector<LedgerObject> objects;
  // Of each slot that ever held an object and holds none now: the
  // generation its next object must have at least (a ref to any object it
  // held is stale from then on).
  std::vector<std::pair<uint32_t, uint32_t>> free_generations;
  std::vector<LedgerLease> leases;
  std::vector<LedgerSession> sessions;
  std::vector<LedgerPin> pins;
  // Records refused, each once (at most kMaxRefusalsKept of them described;
  // refused_records counts them all), the object slots retired with them,
  // and the live objects a refused lease or pin may have pinned (kept alive
  // for this daemon's life: the view it stood for may be alive).
  std::vector<LedgerRefusal> refusals;
  uint64_t refused_records = 0;
  std::vector<LedgerRetiredSlot> retired_slots;
  std::vector<uint32_t> quarantined_slots;
  // Sessions whose record was refused: their leases pin their objects for
  // this daemon's life (quarantined), and no process resumes them.
  std::vector<uint64_t> refused_clients;
  // Above every id and serial the predecessor issued.
  uint64_t next_lease_id = 1;
  uint64_t next_serial = 1;
  uint64_t next_fork_hold = 1;
};

class Ledger {
 public:
  // A new ledger (a sealed memfd sized for `capacity`; its pages are
  // allocated as records are first written). RESOURCE_EXHAUSTED or INTERNAL
  // naming the system's error.
  static absl::StatusOr<std::unique_ptr<Ledger>> Create(
      uint64_t epoch, std::vector<LedgerPool> pools, LedgerCapacity capacity);
  // A predecessor's ledger, handed over as `fd`: its frame checked whole
  // before anything in it is believed (FAILED_PRECONDITION naming the first
  // fault: not a file of this daemon's uid, a size, the magic, the version,
  // the directory's checksum, a structure missing or of another version),
  // then each record on its own: one out of bounds is refused alone
  // (state->refusals), never the whole ledger. Then kept: this daemon goes
  // on writing it. `state` gets what it holds.
  static absl::StatusOr<std::unique_ptr<Ledger>> Adopt(UniqueFd fd,
                                                       LedgerState* state);
  // A private copy of the ledger `fd` (a new sealed memfd with the same
  // bytes, its holes kept), for a successor that must write nothing its
  // predecessor reads until the predecessor hands over (a take-over: the
  // predecessor serves on if the successor dies first). Refused
  // (FAILED_PRECONDITION) as Adopt refuses a file that is not a regular
  // file or memfd of this daemon's uid, or of an absurd size.
  static absl::StatusOr<UniqueFd> CopyForAdoption(int fd);

  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;
  ~Ledger();

  int fd() const { return fd_.get(); }
  const LedgerCapacity& capacity() const { return capacity_; }
  uint64_t epoch() const { return epoch_; }
  uint64_t bytes() const;

  // Every writer of a record checks, where it writes, that what it is given
  // fits the record (a client's bytes reach some of them): one that does
  // not fit writes nothing and returns INVALID_ARGUMENT (a name or layout
  // too long), OUT_OF_RANGE (a slot past the table) or RESOURCE_EXHAUSTED (a
  // full table), and the ledger is as it was.
  //
  // Whether a name and a layout of these sizes fit an object's record.
  static absl::Status CheckObjectFits(size_t name_bytes, size_t layout_bytes);
  // Objects: PutObject publishes a new object in its slot (< capacity
  // objects); SetObjectState changes what changes of it (its state and
  // whether its name is bound); FreeObject withdraws it, its slot's next
  // generation being `next_generation`.
  absl::Status PutObject(const LedgerObject& object);
  void SetObjectState(uint32_t slot, uint32_t state, bool named);
  // An unsealed object's size and layout (a one-way seal gives a stock
  // buffer its put's), before SetObjectState seals it. The record stays
  // live: a successor reads the old or the new ones, or (a crash inside
  // this call) a layout that may not parse, which it ignores for an
  // unsealed object (docs/shm_layout.md, "The ledger").
  absl::Status SetObjectLayout(uint32_t slot, uint64_t size,
                               const std::string& layout);
  void FreeObject(uint32_t slot, uint32_t next_generation);

  // Leases and sessions. Add* fail RESOURCE_EXHAUSTED when the table is
  // full (the store checks has_room first, so they never fail mid-change),
  // AddSession INVALID_ARGUMENT for a client name or access list longer
  // than its record holds.
  // Exact: a free record, or one never used, for each of `n` more.
  bool has_lease_room(size_t n = 1) const;
  bool has_session_room() const;
  bool has_pin_room(size_t n = 1) const;
  absl::Status AddLease(const LedgerLease& lease);
  void DropLease(uint64_t lease_id);
  absl::Status AddSession(const LedgerSession& session);
  void DropSession(uint64_t client_id);
  void SetReleasesApplied(uint64_t client_id, uint64_t seq);
  // The session's owner key changed (a resume from a process the daemon
  // could not see: its connection is its instance).
  void SetSessionInstance(uint64_t client_id, uint64_t instance);

  absl::Status AddPin(const LedgerPin& pin);
  void DropOffer(uint64_t token);
  void DropForkHold(uint64_t hold_id);
  // Every record of the hold: granted (see LedgerPin::expires_ns).
  void MarkForkHoldGranted(uint64_t hold_id);
  void SetOfferExpiry(uint64_t token, int64_t expires_ns);

  // Ids and serials: each issued one is below what the ledger reserves, so a
  // successor never issues one again.
  void NoteLeaseId(uint64_t id);
  void NoteSerial(uint64_t serial);
  void NoteForkHold(uint64_t id);

  // Lease records in use: live ones, and those Adopt refused (withdrawn,
  // their indexes never used again).
  uint64_t lease_records() const;

  // The records' layout in memory (ledger.cc; docs/shm_layout.md).
  struct Layout;

 private:
  Ledger(UniqueFd fd, MappedFd map);
  // Checks the preamble and the directory and reads where the tables are.
  absl::Status Bind(bool fresh);

  UniqueFd fd_;
  MappedFd map_;
  char* base_ = nullptr;
  uint64_t epoch_ = 0;
  LedgerCapacity capacity_;
  uint64_t tables_[4] = {0, 0, 0, 0};  // Offsets: objects, leases, ...
  uint64_t ext_offset_ = 0;            // Long names and layouts.
  uint64_t counters_offset_ = 0;
  // Where each live record is (the daemon's private index of its tables).
  absl::flat_hash_map<uint64_t, uint32_t> lease_at_;
  std::vector<uint32_t> free_leases_;
  absl::flat_hash_map<uint64_t, uint32_t> session_at_;
  std::vector<uint32_t> free_sessions_;
  absl::flat_hash_map<uint64_t, uint32_t> offer_at_;
  absl::flat_hash_map<uint64_t, std::vector<uint32_t>> hold_at_;
  std::vector<uint32_t> free_pins_;
  size_t pins_used_ = 0;  // Live pin records (offers and held objects).
  uint64_t reserved_[3] = {0, 0, 0};  // Lease ids, serials, fork holds.
  // Records never used yet of table `t` (past its high-water mark).
  uint64_t unused_records(int t, uint32_t capacity) const;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_LEDGER_LEDGER_H_
