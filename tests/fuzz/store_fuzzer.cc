// Fuzzer over the daemon's request handling in-process: the input is a
// program of requests, from three sessions, with sizes, names, layouts
// (parsed as wire-format Layout messages from the input), leases and refs
// drawn from what the store handed out, forged, or made up. After every
// request the store's books must balance; at the end, with every session
// ended and every name deleted, the pool must be empty.
//
// Built two ways: with Debian's clang and libFuzzer (deploy/fuzz.sh, for
// long campaigns) and, in the suite, with a driver that runs a bounded
// number of generated programs (standalone_main.cc).
#include <fcntl.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "daemon/memory/fake_segment.h"
#include "daemon/store/object_store.h"
#include "shmtensor/errors.h"
#include "shmtensor/v1/monitor.pb.h"
#include "spdlog/spdlog.h"
#include "testing/cpp/blocking_store.h"
#include "tests/fuzz/fuzz_input.h"

namespace shmtensor::daemon {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kPoolPages = 64;

using fuzz::Broken;
using fuzz::Input;

// The store's books: every listed object's capacity adds up to the pool's
// use, leases to the total, transfers to the count.
void CheckBooks(ObjectStore& store) {
  const v1::DaemonStatus st = store.Status();
  uint64_t capacity = 0, leases = 0, pending = 0, listed = 0;
  uint64_t token = 0;
  do {
    v1::ListObjectsResponse page = store.ListObjects(7, token);
    for (const v1::ObjectStatus& o : page.objects()) {
      capacity += o.capacity_bytes();
      leases += o.leases();
      pending += o.state() == v1::OBJECT_STATE_PENDING_TRANSFER;
      if (o.ref().nonce() != 0) Broken("a listing shows a usable ref");
      ++listed;
    }
    token = page.next_page_token();
  } while (token != 0);
  if (listed != st.objects()) Broken("listing misses objects");
  if (capacity != st.pools(0).used_bytes()) Broken("pool use != capacities");
  if (leases != st.leases()) Broken("lease counts differ");
  if (pending != st.pending_transfers()) Broken("transfer counts differ");
  if (st.pools(0).used_bytes() > kPoolPages * kPage) Broken("pool overfull");
  if (st.waiters() != 0) Broken("a waiter left behind");
}

// The ledger mirrors the store: a successor reading it now would find the
// same live objects, capacities, leases and pending transfers.
void CheckLedger(ObjectStore& store) {
  if (store.ledger_fd() < 0) return;
  LedgerState state;
  absl::StatusOr<std::unique_ptr<Ledger>> copy = Ledger::Adopt(
      UniqueFd(fcntl(store.ledger_fd(), F_DUPFD_CLOEXEC, 3)), &state);
  if (!copy.ok()) Broken("the ledger does not read back");
  const v1::DaemonStatus st = store.Status();
  uint64_t capacity = 0, pending = 0;
  for (const LedgerObject& o : state.objects) {
    capacity += o.capacity;
    pending += o.state == 2;  // ObjectTable::State::kPendingTransfer
  }
  if (state.objects.size() != st.objects()) Broken("ledger objects differ");
  if (capacity != st.pools(0).used_bytes()) Broken("ledger capacity differs");
  if (state.leases.size() != st.leases()) Broken("ledger leases differ");
  if (pending != st.pending_transfers()) Broken("ledger transfers differ");
  if (state.sessions.size() != st.sessions()) Broken("ledger sessions differ");
}

void Run(const uint8_t* data, size_t size) {
  Input in(data, size);
  std::vector<std::unique_ptr<Pool>> pools;
  pools.push_back(std::make_unique<Pool>(
      "default",
      std::make_unique<FakeSegment>(kPoolPages * kPage,
                                    in.Byte() % 2 ? 0 : 16 * kPage),
      PoolAccessRules(1000)));  // The uid every session below runs as.
  StoreLimits limits;
  limits.max_objects = 40;
  limits.max_leases_per_client = 30;
  limits.max_bytes_per_uid = (in.Byte() % 2) ? 48 * kPage : 0;
  limits.max_sessions_per_uid = 6;
  limits.max_offers_per_session = 4;
  // With a grace, an untaken offer keeps its object past its session's end.
  const bool grace = in.Byte() % 2;
  limits.offer_grace_ms = grace ? 300000 : 0;
  // Half the programs also write a ledger, checked against the store.
  std::unique_ptr<Ledger> ledger;
  if (in.Byte() % 2) {
    ledger = *Ledger::Create(7, {{"default", 1, kPoolPages * kPage, kPage, 0}},
                             LedgerCapacity{64, 1024, 64, 256});
  }
  ObjectStore store(std::move(pools), 7, limits, std::move(ledger));
  struct Client {
    uint64_t id = 0;
    uint64_t stream = 0;
    pid_t pid = 0;
    uint64_t seq = 0;
    std::string secret;  // Its descriptor secret.
  };
  std::vector<Client> clients(3);
  auto open = [&](Client& c, pid_t pid) {
    absl::StatusOr<OpenedSession> s = store.OpenSession(
        "fuzz",
        PeerInfo{{pid, 1000, 1000}, OwnerKey{1000, pid, 1}, nullptr, ""});
    c = Client{s.ok() ? s->id : 0, s.ok() ? s->stream : 0, pid, 0,
               s.ok() ? s->descriptor_secret : ""};
  };
  for (size_t i = 0; i < clients.size(); ++i) open(clients[i], 100 + i);
  std::vector<uint64_t> leases;
  std::vector<v1::ObjectRef> refs;
  std::vector<uint64_t> holds;  // Fork holds taken and not yet ended.
  struct Offered {
    v1::ObjectRef ref;
    uint64_t token = 0;
    bool taken = false;
  };
  std::vector<Offered> offers;
  const char* names[] = {"a", "b", "c", ""};
  for (int step = 0; step < 400 && !in.done(); ++step) {
    const uint8_t op = in.Byte();
    Client& c = clients[in.Byte() % clients.size()];
    auto pick_lease = [&]() -> uint64_t {
      const uint8_t b = in.Byte();
      if (b < 200 && !leases.empty()) return leases[b % leases.size()];
      return b == 255 ? in.U64() : b;  // Made up.
    };
    switch (op % 17) {
      case 0:
      case 11: {  // Create, untyped or with a layout off the wire.
        CreateArgs a;
        a.caller = c.id;
        if (op % 13 == 11) {
          a.layout.ParseFromString(in.Bytes(in.Byte() % 24));
          a.size_bytes = in.Byte() % 3 == 0 ? in.U64() : 0;
        } else {
          a.size_bytes = (in.Byte() % 20) * 1000 + in.Byte();
        }
        a.name = names[in.Byte() % 4];
        a.shared_writable = in.Byte() % 7 == 0;
        absl::StatusOr<Handout> h = CreateBlocking(store, a);
        if (h.ok()) {
          leases.push_back(h->lease_id);
          refs.push_back(h->ref);
        }
        break;
      }
      case 1: {
        absl::StatusOr<SealResult> r =
            store.Seal(c.id, pick_lease(), in.Byte() % 3 == 0);
        if (r.ok()) {
          refs.push_back(r->ref);
          if (r->lease_id != 0) leases.push_back(r->lease_id);
        }
        break;
      }
      case 2: {  // Get by a ref: real, or forged from a real one.
        if (refs.empty()) break;
        v1::ObjectRef ref = refs[in.Byte() % refs.size()];
        switch (in.Byte() % 6) {
          case 0:
            ref.set_nonce(ref.nonce() ^ (1ull << (in.Byte() % 64)));
            break;
          case 1:
            ref.set_generation(ref.generation() + in.Byte() % 3);
            break;
          case 2:
            ref.set_slot(in.Byte());
            break;
          case 3:
            ref.set_daemon_epoch(in.U64());
            break;
          default:
            break;
        }
        absl::StatusOr<Handout> h = store.Get(c.id, ref);
        if (h.ok()) leases.push_back(h->lease_id);
        break;
      }
      case 3: {
        absl::StatusOr<Handout> h = GetByNameBlocking(
            store, c.id, names[in.Byte() % 4], absl::ZeroDuration());
        if (h.ok()) leases.push_back(h->lease_id);
        break;
      }
      case 4:
        store.Release(c.id, pick_lease()).IgnoreError();
        break;
      case 5: {
        std::vector<uint64_t> batch;
        for (int i = in.Byte() % 5; i > 0; --i) batch.push_back(pick_lease());
        const uint64_t seq = in.Byte() % 4 == 0 ? in.Byte() : c.seq + 1;
        if (store.ReleaseBatch(c.id, seq, batch).ok() || true) {
          if (seq == c.seq + 1) c.seq = seq;
        }
        break;
      }
      case 6:
        store.Delete(c.id, names[in.Byte() % 4]).IgnoreError();
        break;
      case 7:
        store.EndSession(c.id);
        open(c, c.pid);
        break;
      case 8:  // Its stream broke: no pidfd here, so the session ends.
        store.StreamEnded(c.id, c.stream);
        open(c, c.pid);
        break;
      case 9: {  // Resume: by its process, or by another one.
        const bool other = in.Byte() % 2;
        absl::StatusOr<OpenedSession> r = store.ResumeSession(
            c.id, OwnerKey{1000, other ? c.pid + 50 : c.pid, 1});
        if (other && r.ok()) Broken("another process resumed a session");
        if (r.ok()) c.stream = r->stream;
        break;
      }
      case 10: {  // Another process acting for this session.
        if (store.Authorize(c.id, OwnerKey{1000, c.pid, 2}).ok()) {
          Broken("a session acted for another process");
        }
        break;
      }
      case 12:
        store.ListObjects(in.Byte(), in.U64() % 64);
        store.ListClients();
        break;
      case 13: {  // A fork: by the session's process, or by another one.
        const bool other = in.Byte() % 4 == 0;
        absl::StatusOr<ForkHoldGrant> h =
            store.HoldForFork(c.id, other ? std::string("forged") : c.secret,
                              OwnerKey{1000, c.pid, 1});
        if (other && h.ok()) Broken("a forged secret took a fork hold");
        if (h.ok()) {
          // The daemon marks it granted once its descriptor is stored.
          if (in.Byte() % 2 == 0) store.ForkHoldGranted(h->hold_id);
          holds.push_back(h->hold_id);
        }
        break;
      }
      case 14:  // The children of a fork are gone (or a made-up hold).
        if (!holds.empty() && in.Byte() < 200) {
          const size_t i = in.Byte() % holds.size();
          store.EndForkHold(holds[i]);
          holds.erase(holds.begin() + i);
        } else {
          store.EndForkHold(in.U64());
        }
        break;
      case 15: {  // Offer a lease (any: only sealed read leases may go).
        absl::StatusOr<OfferGrant> o = store.Offer(c.id, pick_lease());
        if (o.ok()) offers.push_back({o->ref, o->token, false});
        break;
      }
      case 16: {  // Take an offer: its own, another object's, a made-up one.
        if (offers.empty()) break;
        Offered& o = offers[in.Byte() % offers.size()];
        const uint8_t how = in.Byte() % 4;
        const v1::ObjectRef& ref =
            how == 1 ? offers[in.Byte() % offers.size()].ref : o.ref;
        const uint64_t token = how == 2 ? in.U64() : o.token;
        absl::StatusOr<Handout> h = store.Get(c.id, ref, token);
        if (h.ok()) {
          leases.push_back(h->lease_id);
          // The pin moves only for that token of that object.
          if (token == o.token && ref.slot() == o.ref.slot() &&
              ref.generation() == o.ref.generation()) {
            o.taken = true;
          }
        } else if (grace && how != 1 && token == o.token && !o.taken &&
                   IsStaleReference(h.status())) {
          Broken("an untaken offer's object was freed");
        }
        break;
      }
    }
    CheckBooks(store);
    if (step % 64 == 0) CheckLedger(store);
  }
  CheckLedger(store);
  // Everything ends: nothing may be left but named objects, then nothing.
  for (Client& c : clients) store.EndSession(c.id);
  for (uint64_t h : holds) store.EndForkHold(h);
  store.ExpireOffers(absl::Now() + absl::Hours(1));
  if (store.Status().offers() != 0) Broken("an offer outlived its grace");
  CheckBooks(store);
  const uint64_t opener =
      store
          .OpenSession(
              "end",
              PeerInfo{{1, 1000, 1000}, OwnerKey{1000, 1, 1}, nullptr, ""})
          ->id;
  for (const char* n : names) {
    if (*n) store.Delete(opener, n).IgnoreError();
  }
  store.EndSession(opener);
  const v1::DaemonStatus st = store.Status();
  if (st.objects() != 0 || st.leases() != 0 || st.pools(0).used_bytes() != 0) {
    Broken("memory left after every session ended and every name went");
  }
}

}  // namespace
}  // namespace shmtensor::daemon

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    spdlog::set_level(spdlog::level::off);  // A session a request: too loud.
    return true;
  }();
  (void)quiet;
  shmtensor::daemon::Run(data, size);
  return 0;
}
