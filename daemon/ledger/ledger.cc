#include "daemon/ledger/ledger.h"

#include <fcntl.h>
#include <openssl/sha.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/indexes/iset_index.hpp>
#include <boost/interprocess/managed_external_buffer.hpp>
#include <boost/interprocess/mem_algo/rbtree_best_fit.hpp>
#include <boost/interprocess/sync/mutex_family.hpp>
#include <boost/version.hpp>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "shmtensor/defaults.h"

namespace shmtensor::daemon {

// The on-memory layout (docs/shm_layout.md, "The ledger"). Every record is
// naturally aligned; its `word` is the one field a reader trusts first.
struct Ledger::Layout {
  static constexpr uint64_t kMagic = 0x3152474c44454c53;  // "SLEDLGR1"
  static constexpr uint32_t kVersion = 1;
  static constexpr uint64_t kPage = 4096;
  static constexpr uint64_t kDirectoryOffset = kPage;
  static constexpr uint64_t kDirectoryBytes = 64 * 1024;
  static constexpr uint64_t kCountersOffset =
      kDirectoryOffset + kDirectoryBytes;
  static constexpr uint64_t kReserveStep = uint64_t{1} << 20;
  static constexpr char kHeaderName[] = "shmtensor.ledger.header.v1";
  static constexpr char kTablesName[] = "shmtensor.ledger.tables.v1";

  struct Preamble {
    std::atomic<uint64_t> magic;  // Stored last, when the ledger is whole.
    uint32_t version;
    uint32_t boost_version;  // The directory's format is Boost's.
    uint64_t total_bytes;
    uint64_t directory_offset;
    uint64_t directory_bytes;
    uint64_t directory_checksum;  // FNV-1a 64 of the directory.
  };

  // Named structures in the directory, written once at creation.
  struct PoolEntry {
    char name[64];
    uint32_t kind;
    uint32_t pad;
    uint64_t size_bytes;
    uint64_t page_size;
    uint64_t huge_page_size;
  };
  struct Header {
    uint64_t epoch;
    uint32_t daemon_uid;
    uint32_t pool_count;
    int64_t created_ns;
    PoolEntry pools[kMaxPools];
  };
  enum TableId { kObjects, kLeases, kSessions, kPins, kExt, kTables };
  struct TableDesc {
    uint64_t offset;
    uint32_t stride;
    uint32_t capacity;
    uint32_t version;
    uint32_t pad;
  };

  // The counters page: stored with release before what they cover.
  struct Counters {
    // Every lease id, serial and fork hold id issued is below these.
    std::atomic<uint64_t> reserved[3];
    // No record at or past these indexes was ever published (a successor
    // reads no further: a read of a page never written would allocate it).
    std::atomic<uint64_t> high[4];
  };

  // Object word: kLive | state << 1 | kNamed | creator's uid << 32 (a
  // ledger written before the uid was recorded has 0 there).
  static constexpr uint64_t kLive = 1;
  static constexpr uint64_t kNamed = 1u << 4;
  static constexpr uint32_t kMaxState = 4;
  static constexpr uint32_t kInExt = 1;
  struct ObjectRecord {
    std::atomic<uint64_t> word;
    uint32_t generation;  // Live: the object's. Free: its last object's.
    uint32_t pool;
    uint64_t offset, size, capacity, nonce, creator, serial;
    int64_t created_ns;
    uint16_t name_len, layout_len;
    uint32_t flags;  // kInExt: name and layout are in the ext table.
    char bytes[432];
  };
  struct ExtRecord {
    char bytes[2048];
  };
  struct LeaseRecord {
    std::atomic<uint64_t> word;  // The lease id; 0: free.
    uint64_t client_id;
    uint32_t slot;
    uint32_t write;
    uint64_t pad;
  };
  struct SessionRecord {
    std::atomic<uint64_t> word;  // The client id; 0: free.
    std::atomic<uint64_t> releases_applied;
    std::atomic<uint64_t> instance;
    uint8_t id_hash[kSessionHashBytes];
    uint32_t uid, gid;
    int32_t pid;
    uint32_t read_only;
    uint64_t serial;
    int64_t opened_ns;
    uint16_t name_len;
    uint16_t access_count;
    uint32_t pad;
    uint8_t access[kMaxPools];
    char name[256];
    uint8_t secret_hash[kSessionHashBytes];
    char tail[64];
  };
  struct PinRecord {
    std::atomic<uint64_t> word;  // The key (token or hold id); 0: free.
    uint32_t kind, slot, generation, uid;
    uint64_t client_id, bytes;
    std::atomic<int64_t> expires_ns;
    uint64_t pad[2];
  };
  static_assert(sizeof(ObjectRecord) == 512);
  static_assert(sizeof(LeaseRecord) == 32);
  static_assert(sizeof(SessionRecord) == 512);
  static_assert(sizeof(PinRecord) == 64);
  static_assert(std::atomic<uint64_t>::is_always_lock_free);

  static constexpr uint32_t kStride[kTables] = {
      sizeof(ObjectRecord), sizeof(LeaseRecord), sizeof(SessionRecord),
      sizeof(PinRecord), sizeof(ExtRecord)};
};

namespace {

namespace bip = boost::interprocess;
using Directory = bip::basic_managed_external_buffer<
    char, bip::rbtree_best_fit<bip::null_mutex_family>, bip::iset_index>;
using L = Ledger::Layout;

uint64_t Fnv1a(const char* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 0x100000001b3;
  }
  return h;
}

uint64_t ObjectWord(uint32_t state, bool named, uint32_t uid) {
  return L::kLive | (uint64_t{state} << 1) | (named ? L::kNamed : 0) |
         (uint64_t{uid} << 32);
}

uint64_t PageUp(uint64_t n) { return (n + L::kPage - 1) & ~(L::kPage - 1); }

absl::Status Refused(absl::string_view why) {
  return absl::FailedPreconditionError(absl::StrCat("ledger refused: ", why));
}

}  // namespace

SessionHash HashSecret(absl::string_view secret) {
  SessionHash out;
  SHA256(reinterpret_cast<const unsigned char*>(secret.data()), secret.size(),
         out.data());
  return out;
}

SessionHash HashSessionId(uint64_t session_id) {
  SessionHash out;
  SHA256(reinterpret_cast<const unsigned char*>(&session_id),
         sizeof(session_id), out.data());
  return out;
}

Ledger::Ledger(UniqueFd fd, MappedFd map)
    : fd_(std::move(fd)),
      map_(std::move(map)),
      base_(static_cast<char*>(map_.data())) {}

Ledger::~Ledger() = default;

uint64_t Ledger::bytes() const { return map_.size(); }

absl::StatusOr<std::unique_ptr<Ledger>> Ledger::Create(
    uint64_t epoch, std::vector<LedgerPool> pools, LedgerCapacity capacity) {
  if (pools.empty() || pools.size() > kMaxPools) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a ledger holds 1 to %d pools, not %d", kMaxPools, pools.size()));
  }
  const uint32_t caps[L::kTables] = {capacity.objects, capacity.leases,
                                     capacity.sessions, capacity.pins,
                                     capacity.objects};
  L::TableDesc desc[L::kTables];
  uint64_t at = L::kCountersOffset + L::kPage;
  for (int t = 0; t < L::kTables; ++t) {
    if (caps[t] == 0) {
      return absl::InvalidArgumentError("a ledger table of 0 records");
    }
    desc[t] = {at, L::kStride[t], caps[t], L::kVersion, 0};
    at = PageUp(at + uint64_t{L::kStride[t]} * caps[t]);
  }
  const int raw =
      memfd_create("shmtensor-ledger", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (raw < 0) {
    return absl::InternalError(
        absl::StrFormat("ledger: memfd_create: %s", std::strerror(errno)));
  }
  UniqueFd fd(raw);
  if (fchmod(fd.get(), 0600) != 0 ||
      ftruncate(fd.get(), static_cast<off_t>(at)) != 0 ||
      fcntl(fd.get(), F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) !=
          0) {
    return absl::InternalError(absl::StrFormat(
        "ledger: sizing a memfd to %d bytes: %s", at, std::strerror(errno)));
  }
  absl::StatusOr<MappedFd> map = MappedFd::Map(fd.get(), 0, at);
  if (!map.ok()) return map.status();
  std::unique_ptr<Ledger> ledger(new Ledger(std::move(fd), *std::move(map)));
  char* base = ledger->base_;
  try {
    Directory dir(bip::create_only, base + L::kDirectoryOffset,
                  L::kDirectoryBytes);
    L::Header* h = dir.construct<L::Header>(L::kHeaderName)();
    h->epoch = epoch;
    h->daemon_uid = geteuid();
    h->pool_count = static_cast<uint32_t>(pools.size());
    h->created_ns = absl::ToUnixNanos(absl::Now());
    for (size_t i = 0; i < pools.size(); ++i) {
      L::PoolEntry& e = h->pools[i];
      std::strncpy(e.name, pools[i].name.c_str(), sizeof(e.name) - 1);
      e.kind = pools[i].kind;
      e.size_bytes = pools[i].size_bytes;
      e.page_size = pools[i].page_size;
      e.huge_page_size = pools[i].huge_page_size;
    }
    L::TableDesc* t = dir.construct<L::TableDesc>(L::kTablesName)[L::kTables]();
    std::copy(desc, desc + L::kTables, t);
  } catch (const bip::interprocess_exception& e) {
    return absl::InternalError(
        absl::StrFormat("ledger: laying out its directory: %s", e.what()));
  } catch (const std::bad_alloc&) {
    return absl::InternalError("ledger: its directory does not fit");
  }
  auto* pre = reinterpret_cast<L::Preamble*>(base);
  pre->version = L::kVersion;
  pre->boost_version = BOOST_VERSION;
  pre->total_bytes = at;
  pre->directory_offset = L::kDirectoryOffset;
  pre->directory_bytes = L::kDirectoryBytes;
  pre->directory_checksum =
      Fnv1a(base + L::kDirectoryOffset, L::kDirectoryBytes);
  pre->magic.store(L::kMagic, std::memory_order_release);
  if (absl::Status s = ledger->Bind(/*fresh=*/true); !s.ok()) return s;
  return ledger;
}

absl::Status Ledger::Bind(bool fresh) {
  const auto* pre = reinterpret_cast<const L::Preamble*>(base_);
  if (pre->magic.load(std::memory_order_acquire) != L::kMagic) {
    return Refused("wrong magic (not a ledger, or one torn at creation)");
  }
  if (pre->version != L::kVersion) {
    return Refused(absl::StrFormat("version %d, this daemon reads %d",
                                   pre->version, L::kVersion));
  }
  if (pre->boost_version != BOOST_VERSION) {
    return Refused(absl::StrFormat(
        "its directory was laid out by Boost %d, this daemon has %d",
        pre->boost_version, BOOST_VERSION));
  }
  if (pre->total_bytes != map_.size() ||
      pre->directory_offset != L::kDirectoryOffset ||
      pre->directory_bytes != L::kDirectoryBytes) {
    return Refused(absl::StrFormat(
        "its preamble says %d bytes with a directory at %d of %d bytes; the "
        "file has %d",
        pre->total_bytes, pre->directory_offset, pre->directory_bytes,
        map_.size()));
  }
  if (!fresh && Fnv1a(base_ + L::kDirectoryOffset, L::kDirectoryBytes) !=
                    pre->directory_checksum) {
    return Refused("its directory does not match its checksum");
  }
  const L::Header* h = nullptr;
  const L::TableDesc* t = nullptr;
  try {
    Directory dir(bip::open_only, base_ + L::kDirectoryOffset,
                  L::kDirectoryBytes);
    auto header = dir.find<L::Header>(L::kHeaderName);
    auto tables = dir.find<L::TableDesc>(L::kTablesName);
    if (header.first == nullptr || header.second != 1) {
      return Refused(absl::StrCat("no ", L::kHeaderName));
    }
    if (tables.first == nullptr || tables.second != L::kTables) {
      return Refused(
          absl::StrCat("no ", L::kTablesName, " of ", L::kTables, " tables"));
    }
    h = header.first;
    t = tables.first;
  } catch (const bip::interprocess_exception& e) {
    return Refused(absl::StrCat("its directory: ", e.what()));
  }
  if (h->daemon_uid != geteuid()) {
    return Refused(
        absl::StrFormat("it was written by uid %d, this daemon "
                        "runs as uid %d",
                        h->daemon_uid, geteuid()));
  }
  if (h->pool_count == 0 || h->pool_count > kMaxPools) {
    return Refused(absl::StrFormat("%d pools", h->pool_count));
  }
  for (int i = 0; i < L::kTables; ++i) {
    const uint64_t end = t[i].offset + uint64_t{t[i].stride} * t[i].capacity;
    if (t[i].version != L::kVersion || t[i].stride != L::kStride[i] ||
        t[i].capacity == 0 || t[i].offset % L::kPage != 0 ||
        t[i].offset < L::kCountersOffset + L::kPage || end > map_.size()) {
      return Refused(absl::StrFormat(
          "table %d: version %d, %d records of %d bytes at %d", i, t[i].version,
          t[i].capacity, t[i].stride, t[i].offset));
    }
    if (i < 4) tables_[i] = t[i].offset;
  }
  if (t[L::kExt].capacity != t[L::kObjects].capacity) {
    return Refused("its object and extension tables differ in size");
  }
  ext_offset_ = t[L::kExt].offset;
  counters_offset_ = L::kCountersOffset;
  epoch_ = h->epoch;
  capacity_ = {t[L::kObjects].capacity, t[L::kLeases].capacity,
               t[L::kSessions].capacity, t[L::kPins].capacity};
  auto* c = reinterpret_cast<L::Counters*>(base_ + counters_offset_);
  for (int i = 0; i < 3; ++i) {
    reserved_[i] = c->reserved[i].load(std::memory_order_acquire);
  }
  return absl::OkStatus();
}

namespace {

template <typename Record>
Record* At(char* base, uint64_t table, uint32_t index) {
  return reinterpret_cast<Record*>(base + table) + index;
}

}  // namespace

namespace {

// The checks of a handed ledger's file before anything in it is read.
absl::StatusOr<off_t> CheckLedgerFile(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return Refused(absl::StrFormat("fstat: %s", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) return Refused("not a regular file or memfd");
  if (st.st_uid != geteuid()) {
    return Refused(
        absl::StrFormat("it belongs to uid %d, not to this daemon's uid %d",
                        st.st_uid, geteuid()));
  }
  if (st.st_size < static_cast<off_t>(L::kCountersOffset + L::kPage) ||
      st.st_size > (off_t{1} << 40)) {
    return Refused(absl::StrFormat("%d bytes", st.st_size));
  }
  return st.st_size;
}

}  // namespace

absl::StatusOr<UniqueFd> Ledger::CopyForAdoption(int fd) {
  absl::StatusOr<off_t> size = CheckLedgerFile(fd);
  if (!size.ok()) return size.status();
  UniqueFd copy(
      memfd_create("shmtensor-ledger", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!copy.valid() || fchmod(copy.get(), 0600) != 0 ||
      ftruncate(copy.get(), *size) != 0) {
    return absl::InternalError(absl::StrFormat("ledger: a copy of %d bytes: %s",
                                               *size, std::strerror(errno)));
  }
  // Only the pages written (SEEK_DATA, SEEK_HOLE): a ledger is sparse, its
  // tables sized for the limits and mostly never touched.
  std::vector<char> buf(1 << 20);
  off_t at = 0;
  while (at < *size) {
    const off_t data = lseek(fd, at, SEEK_DATA);
    if (data < 0) break;  // ENXIO: no data past `at`.
    off_t hole = lseek(fd, data, SEEK_HOLE);
    if (hole < 0) hole = *size;
    for (off_t o = data; o < hole;) {
      const size_t n = static_cast<size_t>(
          std::min<off_t>(hole - o, static_cast<off_t>(buf.size())));
      const ssize_t got = pread(fd, buf.data(), n, o);
      if (got <= 0 ||
          pwrite(copy.get(), buf.data(), static_cast<size_t>(got), o) != got) {
        return absl::InternalError(absl::StrFormat("ledger: copying at %d: %s",
                                                   o, std::strerror(errno)));
      }
      o += got;
    }
    at = hole;
  }
  if (fcntl(copy.get(), F_ADD_SEALS,
            F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    return absl::InternalError(
        absl::StrFormat("ledger: sealing its copy: %s", std::strerror(errno)));
  }
  return copy;
}

absl::StatusOr<std::unique_ptr<Ledger>> Ledger::Adopt(UniqueFd fd,
                                                      LedgerState* state) {
  absl::StatusOr<off_t> size = CheckLedgerFile(fd.get());
  if (!size.ok()) return size.status();
  struct stat st;
  st.st_size = *size;
  absl::StatusOr<MappedFd> map =
      MappedFd::Map(fd.get(), 0, static_cast<size_t>(st.st_size));
  if (!map.ok()) return map.status();
  std::unique_ptr<Ledger> ledger(new Ledger(std::move(fd), *std::move(map)));
  if (absl::Status s = ledger->Bind(/*fresh=*/false); !s.ok()) return s;
  // The header again, for the pools (Bind checked it).
  const L::Header* h = nullptr;
  try {
    Directory dir(bip::open_only, ledger->base_ + L::kDirectoryOffset,
                  L::kDirectoryBytes);
    h = dir.find<L::Header>(L::kHeaderName).first;
  } catch (const bip::interprocess_exception& e) {
    return Refused(absl::StrCat("its directory: ", e.what()));
  }
  LedgerState out;
  out.epoch = h->epoch;
  out.capacity = ledger->capacity_;
  for (uint32_t i = 0; i < h->pool_count; ++i) {
    const L::PoolEntry& e = h->pools[i];
    out.pools.push_back({std::string(e.name, strnlen(e.name, sizeof(e.name))),
                         e.kind, e.size_bytes, e.page_size, e.huge_page_size});
  }
  char* base = ledger->base_;
  auto* c = reinterpret_cast<L::Counters*>(base + ledger->counters_offset_);
  uint64_t high[4];
  const uint32_t caps[4] = {ledger->capacity_.objects, ledger->capacity_.leases,
                            ledger->capacity_.sessions, ledger->capacity_.pins};
  for (int i = 0; i < 4; ++i) {
    high[i] =
        std::min<uint64_t>(c->high[i].load(std::memory_order_acquire), caps[i]);
  }
  auto refuse = [&out](LedgerRefusal::Table table, uint32_t index,
                       std::string why) {
    ++out.refused_records;
    if (out.refusals.size() < kMaxRefusalsKept) {
      out.refusals.push_back({table, index, std::move(why)});
    }
  };
  // Objects.
  for (uint32_t slot = 0; slot < high[L::kObjects]; ++slot) {
    auto* r = At<L::ObjectRecord>(base, ledger->tables_[L::kObjects], slot);
    const uint64_t word = r->word.load(std::memory_order_acquire);
    if ((word & L::kLive) == 0) {
      if (r->generation != 0) {
        uint32_t next = r->generation + 1;
        if (next == 0) next = 1;
        out.free_generations.emplace_back(slot, next);
      }
      continue;
    }
    LedgerObject o;
    o.slot = slot;
    o.generation = r->generation;
    o.pool = r->pool;
    o.offset = r->offset;
    o.size = r->size;
    o.capacity = r->capacity;
    o.nonce = r->nonce;
    o.creator = r->creator;
    o.serial = r->serial;
    o.created_ns = r->created_ns;
    o.state = static_cast<uint32_t>((word >> 1) & 7);
    o.named = (word & L::kNamed) != 0;
    o.uid = static_cast<uint32_t>(word >> 32);
    const bool ext = (r->flags & L::kInExt) != 0;
    const size_t room = ext ? sizeof(L::ExtRecord::bytes) : sizeof(r->bytes);
    const bool range_known =
        o.pool < h->pool_count && o.capacity >= o.size &&
        o.offset <= h->pools[o.pool].size_bytes &&
        o.capacity <= h->pools[o.pool].size_bytes - o.offset;
    if (o.generation == 0 || !range_known || o.state > L::kMaxState ||
        r->name_len > kMaxLedgerNameBytes ||
        r->layout_len > kMaxLedgerLayoutBytes ||
        size_t{r->name_len} + r->layout_len > room) {
      refuse(LedgerRefusal::kObject, slot,
             absl::StrFormat("object record %d is out of bounds (pool %d, "
                             "range %d+%d, state %d, name %d and layout %d "
                             "bytes)",
                             slot, o.pool, o.offset, o.capacity, o.state,
                             r->name_len, r->layout_len));
      out.retired_slots.push_back(
          {slot, range_known, o.pool, o.offset, o.capacity});
      // Withdrawn (this daemon never uses the slot again): a later
      // successor finds it free, every ref to what it held stale.
      r->word.store(0, std::memory_order_release);
      r->generation = o.generation + 1 == 0 ? 1 : o.generation + 1;
      continue;
    }
    const char* bytes =
        ext ? At<L::ExtRecord>(base, ledger->ext_offset_, slot)->bytes
            : r->bytes;
    o.name.assign(bytes, r->name_len);
    o.layout.assign(bytes + r->name_len, r->layout_len);
    out.objects.push_back(std::move(o));
  }
  // Leases.
  for (uint32_t i = 0; i < high[L::kLeases]; ++i) {
    auto* r = At<L::LeaseRecord>(base, ledger->tables_[L::kLeases], i);
    const uint64_t id = r->word.load(std::memory_order_acquire);
    if (id == 0) {
      ledger->free_leases_.push_back(i);
      continue;
    }
    if (r->slot >= ledger->capacity_.objects || id >= ledger->reserved_[0]) {
      refuse(LedgerRefusal::kLease, i,
             absl::StrFormat("lease record %d is out of bounds (id %d, slot "
                             "%d)",
                             i, id, r->slot));
      if (r->slot < ledger->capacity_.objects) {
        out.quarantined_slots.push_back(r->slot);
      }
      // Withdrawn, its index never reused by this daemon: its id may be
      // one this daemon issues later, which a later successor must not
      // read twice.
      r->word.store(0, std::memory_order_release);
      continue;
    }
    out.leases.push_back({id, r->client_id, r->slot, r->write != 0});
    ledger->lease_at_[id] = i;
  }
  // Sessions.
  for (uint32_t i = 0; i < high[L::kSessions]; ++i) {
    auto* r = At<L::SessionRecord>(base, ledger->tables_[L::kSessions], i);
    const uint64_t client_id = r->word.load(std::memory_order_acquire);
    if (client_id == 0) {
      ledger->free_sessions_.push_back(i);
      continue;
    }
    if (r->name_len > sizeof(r->name) - 1 || r->access_count > kMaxPools) {
      refuse(LedgerRefusal::kSession, i,
             absl::StrFormat("session record %d (client %d) is out of bounds "
                             "(name %d bytes, %d pools)",
                             i, client_id, r->name_len, r->access_count));
      out.refused_clients.push_back(client_id);
      r->word.store(0, std::memory_order_release);  // As a lease's, above.
      continue;
    }
    LedgerSession s;
    s.client_id = client_id;
    std::memcpy(s.id_hash.data(), r->id_hash, kSessionHashBytes);
    std::memcpy(s.secret_hash.data(), r->secret_hash, kSessionHashBytes);
    s.uid = r->uid;
    s.gid = r->gid;
    s.pid = r->pid;
    s.instance = r->instance.load(std::memory_order_acquire);
    s.serial = r->serial;
    s.opened_ns = r->opened_ns;
    s.read_only = r->read_only != 0;
    s.access.assign(r->access, r->access + r->access_count);
    s.client_name.assign(r->name, r->name_len);
    s.releases_applied = r->releases_applied.load(std::memory_order_acquire);
    out.sessions.push_back(std::move(s));
    ledger->session_at_[client_id] = i;
  }
  // Pins.
  for (uint32_t i = 0; i < high[L::kPins]; ++i) {
    auto* r = At<L::PinRecord>(base, ledger->tables_[L::kPins], i);
    const uint64_t key = r->word.load(std::memory_order_acquire);
    if (key == 0) {
      ledger->free_pins_.push_back(i);
      continue;
    }
    if ((r->kind != LedgerPin::kOffer && r->kind != LedgerPin::kForkHold) ||
        r->slot >= ledger->capacity_.objects) {
      refuse(LedgerRefusal::kPin, i,
             absl::StrFormat("pin record %d is out of bounds (kind %d, slot "
                             "%d)",
                             i, r->kind, r->slot));
      if (r->slot < ledger->capacity_.objects) {
        out.quarantined_slots.push_back(r->slot);
      }
      r->word.store(0, std::memory_order_release);  // As a lease's, above.
      continue;
    }
    LedgerPin p;
    p.kind = static_cast<LedgerPin::Kind>(r->kind);
    p.key = key;
    p.slot = r->slot;
    p.generation = r->generation;
    p.client_id = r->client_id;
    p.uid = r->uid;
    p.bytes = r->bytes;
    p.expires_ns = r->expires_ns.load(std::memory_order_acquire);
    out.pins.push_back(p);
    ++ledger->pins_used_;
    if (p.kind == LedgerPin::kOffer) {
      ledger->offer_at_[key] = i;
    } else {
      ledger->hold_at_[key].push_back(i);
    }
  }
  // Free lists hand out the lowest index last-in-first-out: reverse, so the
  // next record used is the lowest free one.
  std::reverse(ledger->free_leases_.begin(), ledger->free_leases_.end());
  std::reverse(ledger->free_sessions_.begin(), ledger->free_sessions_.end());
  std::reverse(ledger->free_pins_.begin(), ledger->free_pins_.end());
  out.next_lease_id = std::max<uint64_t>(ledger->reserved_[0], 1);
  out.next_serial = std::max<uint64_t>(ledger->reserved_[1], 1);
  out.next_fork_hold = std::max<uint64_t>(ledger->reserved_[2], 1);
  *state = std::move(out);
  return ledger;
}

namespace {

// The index a new record of a table of `capacity` records goes to: a free
// one, or the next past the high-water mark, raised first (release) so a
// successor reads it. RESOURCE_EXHAUSTED, writing nothing, when the table
// is full (the store checks for room first; this is the check where the
// record is written).
absl::StatusOr<uint32_t> TakeIndex(std::vector<uint32_t>& free,
                                   std::atomic<uint64_t>& high,
                                   uint32_t capacity, absl::string_view what) {
  if (!free.empty()) {
    const uint32_t i = free.back();
    free.pop_back();
    return i;
  }
  const uint64_t i = high.load(std::memory_order_relaxed);
  if (i >= capacity) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the daemon's ledger holds at most %d %s", capacity, what));
  }
  high.store(i + 1, std::memory_order_release);
  return static_cast<uint32_t>(i);
}

}  // namespace

#define SHMTENSOR_COUNTERS \
  (reinterpret_cast<L::Counters*>(base_ + counters_offset_))

absl::Status Ledger::CheckObjectFits(size_t name_bytes, size_t layout_bytes) {
  if (name_bytes > kMaxLedgerNameBytes ||
      layout_bytes > kMaxLedgerLayoutBytes ||
      name_bytes + layout_bytes > sizeof(L::ExtRecord::bytes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "an object's record holds a name of at most %d bytes and a layout of "
        "at most %d; got %d and %d",
        kMaxLedgerNameBytes, kMaxLedgerLayoutBytes, name_bytes, layout_bytes));
  }
  return absl::OkStatus();
}

absl::Status Ledger::PutObject(const LedgerObject& o) {
  // Checked where the record is written: nothing a client sent may pass it.
  if (o.slot >= capacity_.objects) {
    return absl::OutOfRangeError(absl::StrFormat(
        "object slot %d: the ledger holds %d", o.slot, capacity_.objects));
  }
  if (absl::Status s = CheckObjectFits(o.name.size(), o.layout.size());
      !s.ok()) {
    return s;
  }
  auto* r = At<L::ObjectRecord>(base_, tables_[L::kObjects], o.slot);
  std::atomic<uint64_t>& high = SHMTENSOR_COUNTERS->high[L::kObjects];
  if (o.slot >= high.load(std::memory_order_relaxed)) {
    high.store(o.slot + 1, std::memory_order_release);
  }
  // The record is free (word 0): nothing here is believed until the word
  // is stored.
  r->generation = o.generation;
  r->pool = o.pool;
  r->offset = o.offset;
  r->size = o.size;
  r->capacity = o.capacity;
  r->nonce = o.nonce;
  r->creator = o.creator;
  r->serial = o.serial;
  r->created_ns = o.created_ns;
  r->name_len = static_cast<uint16_t>(o.name.size());
  r->layout_len = static_cast<uint16_t>(o.layout.size());
  char* bytes = r->bytes;
  r->flags = 0;
  if (o.name.size() + o.layout.size() > sizeof(r->bytes)) {
    r->flags = L::kInExt;
    bytes = At<L::ExtRecord>(base_, ext_offset_, o.slot)->bytes;
  }
  std::memcpy(bytes, o.name.data(), o.name.size());
  std::memcpy(bytes + o.name.size(), o.layout.data(), o.layout.size());
  r->word.store(ObjectWord(o.state, o.named, o.uid), std::memory_order_release);
  return absl::OkStatus();
}

void Ledger::SetObjectState(uint32_t slot, uint32_t state, bool named) {
  if (slot >= capacity_.objects) return;
  auto* r = At<L::ObjectRecord>(base_, tables_[L::kObjects], slot);
  const uint64_t word = r->word.load(std::memory_order_relaxed);
  r->word.store(ObjectWord(state, named, static_cast<uint32_t>(word >> 32)),
                std::memory_order_release);
}

absl::Status Ledger::SetObjectLayout(uint32_t slot, uint64_t size,
                                     const std::string& layout) {
  if (slot >= capacity_.objects) {
    return absl::OutOfRangeError(absl::StrFormat(
        "object slot %d: the ledger holds %d", slot, capacity_.objects));
  }
  auto* r = At<L::ObjectRecord>(base_, tables_[L::kObjects], slot);
  const size_t name_len = r->name_len;
  if (absl::Status s = CheckObjectFits(name_len, layout.size()); !s.ok()) {
    return s;
  }
  char* bytes = (r->flags & L::kInExt) != 0
                    ? At<L::ExtRecord>(base_, ext_offset_, slot)->bytes
                    : r->bytes;
  if ((r->flags & L::kInExt) == 0 &&
      name_len + layout.size() > sizeof(r->bytes)) {
    // Moves to the ext record: the name first, then the flag.
    char* ext = At<L::ExtRecord>(base_, ext_offset_, slot)->bytes;
    std::memcpy(ext, r->bytes, name_len);
    bytes = ext;
    std::memcpy(bytes + name_len, layout.data(), layout.size());
    // The flag before the length: a crash between the two leaves the
    // record's lengths inside the ext record (a layout that may not
    // parse, ignored for an unsealed object), never past the inline room.
    r->flags = L::kInExt;
    r->layout_len = static_cast<uint16_t>(layout.size());
  } else {
    std::memcpy(bytes + name_len, layout.data(), layout.size());
    r->layout_len = static_cast<uint16_t>(layout.size());
  }
  r->size = size;
  return absl::OkStatus();
}

void Ledger::FreeObject(uint32_t slot, uint32_t next_generation) {
  if (slot >= capacity_.objects) return;
  auto* r = At<L::ObjectRecord>(base_, tables_[L::kObjects], slot);
  r->word.store(0, std::memory_order_release);
  // A successor takes a free slot's generation + 1: whether or not this
  // store landed, every ref to the object freed is stale there.
  r->generation = next_generation;
}

uint64_t Ledger::unused_records(int t, uint32_t capacity) const {
  const uint64_t high =
      SHMTENSOR_COUNTERS->high[t].load(std::memory_order_relaxed);
  return high >= capacity ? 0 : capacity - high;
}

uint64_t Ledger::lease_records() const {
  return capacity_.leases - unused_records(L::kLeases, capacity_.leases) -
         free_leases_.size();
}

bool Ledger::has_lease_room(size_t n) const {
  return free_leases_.size() + unused_records(L::kLeases, capacity_.leases) >=
         n;
}
bool Ledger::has_session_room() const {
  return !free_sessions_.empty() ||
         unused_records(L::kSessions, capacity_.sessions) > 0;
}
bool Ledger::has_pin_room(size_t n) const {
  return free_pins_.size() + unused_records(L::kPins, capacity_.pins) >= n;
}

absl::Status Ledger::AddLease(const LedgerLease& lease) {
  absl::StatusOr<uint32_t> i =
      TakeIndex(free_leases_, SHMTENSOR_COUNTERS->high[L::kLeases],
                capacity_.leases, "leases");
  if (!i.ok()) return i.status();
  auto* r = At<L::LeaseRecord>(base_, tables_[L::kLeases], *i);
  r->client_id = lease.client_id;
  r->slot = lease.slot;
  r->write = lease.write ? 1 : 0;
  r->word.store(lease.id, std::memory_order_release);
  lease_at_[lease.id] = *i;
  return absl::OkStatus();
}

void Ledger::DropLease(uint64_t lease_id) {
  auto it = lease_at_.find(lease_id);
  if (it == lease_at_.end()) return;
  At<L::LeaseRecord>(base_, tables_[L::kLeases], it->second)
      ->word.store(0, std::memory_order_release);
  free_leases_.push_back(it->second);
  lease_at_.erase(it);
}

absl::Status Ledger::AddSession(const LedgerSession& s) {
  auto* probe = static_cast<L::SessionRecord*>(nullptr);
  if (s.client_name.size() > sizeof(probe->name) - 1 ||
      s.access.size() > sizeof(probe->access)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a session's record holds a client name of at most %d bytes and "
        "access to at most %d pools; got %d and %d",
        sizeof(probe->name) - 1, sizeof(probe->access), s.client_name.size(),
        s.access.size()));
  }
  absl::StatusOr<uint32_t> i =
      TakeIndex(free_sessions_, SHMTENSOR_COUNTERS->high[L::kSessions],
                capacity_.sessions, "sessions");
  if (!i.ok()) return i.status();
  auto* r = At<L::SessionRecord>(base_, tables_[L::kSessions], *i);
  r->releases_applied.store(s.releases_applied, std::memory_order_relaxed);
  r->instance.store(s.instance, std::memory_order_relaxed);
  std::memcpy(r->id_hash, s.id_hash.data(), kSessionHashBytes);
  std::memcpy(r->secret_hash, s.secret_hash.data(), kSessionHashBytes);
  r->uid = s.uid;
  r->gid = s.gid;
  r->pid = s.pid;
  r->read_only = s.read_only ? 1 : 0;
  r->serial = s.serial;
  r->opened_ns = s.opened_ns;
  r->name_len = static_cast<uint16_t>(s.client_name.size());
  std::memcpy(r->name, s.client_name.data(), s.client_name.size());
  r->access_count = static_cast<uint16_t>(s.access.size());
  // An empty vector's data() may be null, which memcpy may not be given.
  if (!s.access.empty()) {
    std::memcpy(r->access, s.access.data(), s.access.size());
  }
  r->word.store(s.client_id, std::memory_order_release);
  session_at_[s.client_id] = *i;
  return absl::OkStatus();
}

void Ledger::DropSession(uint64_t client_id) {
  auto it = session_at_.find(client_id);
  if (it == session_at_.end()) return;
  At<L::SessionRecord>(base_, tables_[L::kSessions], it->second)
      ->word.store(0, std::memory_order_release);
  free_sessions_.push_back(it->second);
  session_at_.erase(it);
}

void Ledger::SetReleasesApplied(uint64_t client_id, uint64_t seq) {
  auto it = session_at_.find(client_id);
  if (it == session_at_.end()) return;
  At<L::SessionRecord>(base_, tables_[L::kSessions], it->second)
      ->releases_applied.store(seq, std::memory_order_release);
}

void Ledger::SetSessionInstance(uint64_t client_id, uint64_t instance) {
  auto it = session_at_.find(client_id);
  if (it == session_at_.end()) return;
  At<L::SessionRecord>(base_, tables_[L::kSessions], it->second)
      ->instance.store(instance, std::memory_order_release);
}

absl::Status Ledger::AddPin(const LedgerPin& pin) {
  absl::StatusOr<uint32_t> i =
      TakeIndex(free_pins_, SHMTENSOR_COUNTERS->high[L::kPins], capacity_.pins,
                "offers and fork-held objects");
  if (!i.ok()) return i.status();
  auto* r = At<L::PinRecord>(base_, tables_[L::kPins], *i);
  r->kind = pin.kind;
  r->slot = pin.slot;
  r->generation = pin.generation;
  r->uid = pin.uid;
  r->client_id = pin.client_id;
  r->bytes = pin.bytes;
  r->expires_ns.store(pin.expires_ns, std::memory_order_relaxed);
  r->word.store(pin.key, std::memory_order_release);
  ++pins_used_;
  if (pin.kind == LedgerPin::kOffer) {
    offer_at_[pin.key] = *i;
  } else {
    hold_at_[pin.key].push_back(*i);
  }
  return absl::OkStatus();
}

void Ledger::DropOffer(uint64_t token) {
  auto it = offer_at_.find(token);
  if (it == offer_at_.end()) return;
  At<L::PinRecord>(base_, tables_[L::kPins], it->second)
      ->word.store(0, std::memory_order_release);
  free_pins_.push_back(it->second);
  --pins_used_;
  offer_at_.erase(it);
}

void Ledger::DropForkHold(uint64_t hold_id) {
  auto it = hold_at_.find(hold_id);
  if (it == hold_at_.end()) return;
  for (uint32_t i : it->second) {
    At<L::PinRecord>(base_, tables_[L::kPins], i)
        ->word.store(0, std::memory_order_release);
    free_pins_.push_back(i);
    --pins_used_;
  }
  hold_at_.erase(it);
}

void Ledger::MarkForkHoldGranted(uint64_t hold_id) {
  auto it = hold_at_.find(hold_id);
  if (it == hold_at_.end()) return;
  for (uint32_t i : it->second) {
    At<L::PinRecord>(base_, tables_[L::kPins], i)
        ->expires_ns.store(INT64_MAX, std::memory_order_release);
  }
}

void Ledger::SetOfferExpiry(uint64_t token, int64_t expires_ns) {
  auto it = offer_at_.find(token);
  if (it == offer_at_.end()) return;
  At<L::PinRecord>(base_, tables_[L::kPins], it->second)
      ->expires_ns.store(expires_ns, std::memory_order_release);
}

namespace {

void Reserve(uint64_t value, uint64_t& reserved, std::atomic<uint64_t>& word) {
  if (value < reserved) return;
  reserved = value + L::kReserveStep;
  word.store(reserved, std::memory_order_release);
}

}  // namespace

void Ledger::NoteLeaseId(uint64_t id) {
  Reserve(id, reserved_[0], SHMTENSOR_COUNTERS->reserved[0]);
}
void Ledger::NoteSerial(uint64_t serial) {
  Reserve(serial, reserved_[1], SHMTENSOR_COUNTERS->reserved[1]);
}
void Ledger::NoteForkHold(uint64_t id) {
  Reserve(id, reserved_[2], SHMTENSOR_COUNTERS->reserved[2]);
}

#undef SHMTENSOR_COUNTERS

}  // namespace shmtensor::daemon
