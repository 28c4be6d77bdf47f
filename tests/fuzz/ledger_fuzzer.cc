// Fuzzer from the wire into the ledger and out of it, as a successor reads
// it ([P23], [P24]). The input is a program of requests from four sessions
// of two uids that share one pool: Creates built as the gRPC adapter builds
// them from a CreateRequest (CreateArgsOf), whose layout comes off the wire
// with, at times, kilobytes of fields the daemon does not know; unary and
// one-way seals carrying such layouts; client names past their bound;
// offers, fork holds, names, releases and sessions that end and reopen.
// After every request: no uid uses more than its share of any table, and a
// copy of the ledger reads back whole (no record refused) with the store's
// objects, leases and sessions. At the end a successor adopts the ledger
// as a restarted daemon would: it refuses nothing, and serves the same
// names with the same layouts.
//
// Built two ways, as the store fuzzer is: with Debian's clang, libFuzzer and
// ASan (deploy/fuzz.sh ledger), and in the suite with standalone_main.cc.
#include <fcntl.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "daemon/memory/fake_segment.h"
#include "daemon/store/object_store.h"
#include "google/protobuf/unknown_field_set.h"
#include "shmtensor/v1/monitor.pb.h"
#include "spdlog/spdlog.h"
#include "testing/cpp/blocking_store.h"
#include "tests/fuzz/fuzz_input.h"

namespace shmtensor::daemon {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kPoolPages = 64;
constexpr uid_t kOwner = 1000;   // The daemon's uid: the pool's owner.
constexpr uid_t kTenant = 2000;  // In the pool's users.

using fuzz::Broken;
using fuzz::Input;

std::unique_ptr<Pool> NewPool() {
  PoolAccessConfig access;
  access.users = {std::to_string(kTenant)};
  return std::make_unique<Pool>(
      "default", std::make_unique<FakeSegment>(kPoolPages * kPage),
      *PoolAccessRules::Resolve("default", access, kOwner, -1));
}

// A layout off the wire, with at times a field the daemon does not know of
// up to ~8 KiB: what a raw gRPC client may send.
v1::Layout LayoutFrom(Input& in) {
  v1::Layout layout;
  layout.ParseFromString(in.Bytes(in.Byte() % 32));
  if (in.Byte() % 4 == 0) {
    layout.GetReflection()->MutableUnknownFields(&layout)->AddLengthDelimited(
        1 + in.Byte() % 64, std::string(size_t{in.Byte()} * 32, 'j'));
  }
  return layout;
}

// No uid uses more of a shared table than its share.
void CheckShares(ObjectStore& store) {
  const v1::DaemonStatus st = store.Status();
  const v1::Limits& l = st.limits();
  for (const v1::UidUsage& u : st.uids()) {
    if (u.objects() > l.max_objects_per_uid()) Broken("objects past share");
    if (u.leases() > l.max_leases_per_uid()) Broken("leases past share");
    if (u.pins() > l.max_pins_per_uid()) Broken("pins past share");
    if (u.stock_bytes() > l.max_stock_bytes_per_uid()) {
      Broken("stock past share");
    }
  }
}

// A copy of the ledger reads back whole, with the store's counts.
LedgerState CheckLedger(ObjectStore& store) {
  LedgerState state;
  absl::StatusOr<std::unique_ptr<Ledger>> copy = Ledger::Adopt(
      UniqueFd(fcntl(store.ledger_fd(), F_DUPFD_CLOEXEC, 3)), &state);
  if (!copy.ok()) Broken("the ledger does not read back");
  if (state.refused_records != 0) Broken("a record the daemon wrote refused");
  const v1::DaemonStatus st = store.Status();
  if (state.objects.size() != st.objects()) Broken("ledger objects differ");
  if (state.leases.size() != st.leases()) Broken("ledger leases differ");
  if (state.sessions.size() != st.sessions()) Broken("ledger sessions differ");
  for (const LedgerObject& o : state.objects) {
    v1::Layout layout;
    if (!layout.ParseFromString(o.layout) && o.state != 0) {
      Broken("a sealed object's layout does not parse");
    }
  }
  return state;
}

// The sealed named objects (name -> serialised layout) of a store.
std::map<std::string, std::string> Names(ObjectStore& store) {
  std::map<std::string, std::string> out;
  uint64_t token = 0;
  do {
    v1::ListObjectsResponse page = store.ListObjects(100, token);
    for (const v1::ObjectStatus& o : page.objects()) {
      if (!o.name().empty() && o.state() == v1::OBJECT_STATE_SEALED) {
        out[o.name()] = o.layout().SerializeAsString();
      }
    }
    token = page.next_page_token();
  } while (token != 0);
  return out;
}

void Run(const uint8_t* data, size_t size) {
  Input in(data, size);
  std::vector<std::unique_ptr<Pool>> pools;
  pools.push_back(NewPool());
  StoreLimits limits;
  limits.max_objects = 24;
  limits.max_offers_per_session = 6;
  limits.max_fork_holds_per_uid = 3;
  limits.max_stock_bytes_per_client = 16 * kPage;
  const LedgerCapacity capacity{32, 256, 16, 48};
  std::unique_ptr<Ledger> ledger = *Ledger::Create(
      7, {{"default", 1, kPoolPages * kPage, kPage, 0}}, capacity);
  ObjectStore store(std::move(pools), 7, limits, std::move(ledger));
  struct Client {
    uint64_t id = 0;
    pid_t pid = 0;
    uid_t uid = 0;
    uint64_t seq = 0;
    std::string secret;
  };
  std::vector<Client> clients(4);
  auto open = [&](Client& c, pid_t pid, uid_t uid) {
    // A client name of up to 510 bytes: past 255 the session is refused.
    const std::string name(size_t{in.Byte()} * 2, 'n');
    absl::StatusOr<OpenedSession> s = store.OpenSession(
        name, PeerInfo{{pid, uid, uid}, OwnerKey{uid, pid, 1}, nullptr, ""});
    if (s.ok() && name.size() > kMaxLedgerNameBytes) {
      Broken("a client name past its record was stored");
    }
    c = Client{s.ok() ? s->id : 0, pid, uid, 0,
               s.ok() ? s->descriptor_secret : ""};
  };
  for (size_t i = 0; i < clients.size(); ++i) {
    open(clients[i], static_cast<pid_t>(100 + i), i % 2 ? kTenant : kOwner);
  }
  std::vector<uint64_t> leases;
  std::vector<v1::ObjectRef> refs;
  std::vector<uint64_t> holds;
  const char* names[] = {"a", "b", "c", ""};
  for (int step = 0; step < 300 && !in.done(); ++step) {
    const uint8_t op = in.Byte();
    Client& c = clients[in.Byte() % clients.size()];
    auto pick_lease = [&]() -> uint64_t {
      const uint8_t b = in.Byte();
      if (b < 220 && !leases.empty()) return leases[b % leases.size()];
      return b;
    };
    switch (op % 12) {
      case 0:
      case 1: {  // Create, as the adapter makes it of a CreateRequest.
        v1::CreateRequest req;
        req.set_session_id(c.id);
        *req.mutable_layout() = LayoutFrom(in);
        req.set_size_bytes(in.Byte() % 3 == 0 ? (in.Byte() % 16) * 1000 : 0);
        if (req.layout().dtype() == v1::DTYPE_UNSPECIFIED &&
            req.size_bytes() == 0 && in.Byte() % 2) {
          req.set_size_bytes(1 + in.Byte() * 64);
        }
        req.set_name(names[in.Byte() % 4]);
        req.set_shared_writable(in.Byte() % 9 == 0);
        CreateArgs args = CreateArgsOf(req);
        args.caller = c.id;
        args.stock = op % 2 == 1 && in.Byte() % 3 == 0;
        absl::StatusOr<Handout> h = CreateBlocking(store, args);
        if (h.ok()) {
          leases.push_back(h->lease_id);
          refs.push_back(h->ref);
        }
        break;
      }
      case 2: {  // A unary seal.
        absl::StatusOr<SealResult> r =
            store.Seal(c.id, pick_lease(), in.Byte() % 3 == 0);
        if (r.ok()) {
          refs.push_back(r->ref);
          if (r->lease_id != 0) leases.push_back(r->lease_id);
        }
        break;
      }
      case 3: {  // A one-way seal with a layout off the wire.
        v1::OneWaySeal seal;
        seal.set_lease_id(pick_lease());
        seal.set_exclusive(in.Byte() % 4 == 0);
        if (in.Byte() % 2) *seal.mutable_layout() = LayoutFrom(in);
        seal.set_size_bytes(in.Byte() % 3 == 0 ? in.Byte() * 16 : 0);
        if (store.ReleaseBatch(c.id, c.seq + 1, {}, {seal}).code() !=
            absl::StatusCode::kInvalidArgument) {
          ++c.seq;
        }
        break;
      }
      case 4: {
        absl::StatusOr<OfferGrant> o = store.Offer(c.id, pick_lease());
        (void)o;
        break;
      }
      case 5: {
        if (refs.empty()) break;
        absl::StatusOr<Handout> h =
            store.Get(c.id, refs[in.Byte() % refs.size()]);
        if (h.ok()) leases.push_back(h->lease_id);
        break;
      }
      case 6: {
        absl::StatusOr<Handout> h = GetByNameBlocking(
            store, c.id, names[in.Byte() % 4], absl::ZeroDuration());
        if (h.ok()) leases.push_back(h->lease_id);
        break;
      }
      case 7:
        store.Release(c.id, pick_lease()).IgnoreError();
        break;
      case 8:
        store.Delete(c.id, names[in.Byte() % 4]).IgnoreError();
        break;
      case 9:
        store.EndSession(c.id);
        open(c, c.pid, c.uid);
        break;
      case 10: {
        absl::StatusOr<ForkHoldGrant> h =
            store.HoldForFork(c.id, c.secret, OwnerKey{c.uid, c.pid, 1});
        if (h.ok()) {
          store.ForkHoldGranted(h->hold_id);
          holds.push_back(h->hold_id);
        }
        break;
      }
      case 11:
        if (!holds.empty()) {
          const size_t i = in.Byte() % holds.size();
          store.EndForkHold(holds[i]);
          holds.erase(holds.begin() + i);
        }
        break;
    }
    CheckShares(store);
    if (step % 16 == 0) CheckLedger(store);
  }
  CheckLedger(store);
  // A successor adopts the ledger (the processes are gone: their sessions
  // end there, what nothing holds is freed): nothing is refused, and every
  // name is served with its layout.
  std::map<std::string, std::string> named = Names(store);
  LedgerState state;
  absl::StatusOr<std::unique_ptr<Ledger>> adopted = Ledger::Adopt(
      UniqueFd(fcntl(store.ledger_fd(), F_DUPFD_CLOEXEC, 3)), &state);
  if (!adopted.ok()) Broken("the successor refused the ledger");
  std::vector<std::unique_ptr<Pool>> successor_pools;
  successor_pools.push_back(NewPool());
  absl::StatusOr<std::unique_ptr<ObjectStore>> successor =
      ObjectStore::Adopt(std::move(successor_pools), limits,
                         *std::move(adopted), std::move(state));
  if (!successor.ok()) Broken("the successor's store refused the ledger");
  const v1::DaemonStatus st = (*successor)->Status();
  if (st.refused_records() != 0) Broken("the successor refused a record");
  if (Names(**successor) != named) Broken("the successor's names differ");
}

}  // namespace
}  // namespace shmtensor::daemon

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    spdlog::set_level(spdlog::level::off);
    return true;
  }();
  (void)quiet;
  shmtensor::daemon::Run(data, size);
  return 0;
}
