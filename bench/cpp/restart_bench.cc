// What surviving a restart costs and how long a restart is seen, in one run:
//  1. The ledger's cost on the store's own work: an object's life (create,
//     seal, get in a second session, release both) in a store that writes a
//     ledger against one that does not, alternating rounds; the ratio.
//  2. Adopting a ledger of N objects (100,000 by default), each held by a
//     lease: Ledger::Adopt plus ObjectStore::Adopt; its bound, reading the
//     ledger file's written bytes (pread into memory: what any adoption
//     reads).
//  3. The gap clients see: a take-over and a SIGKILL restart through a
//     descriptor store, 20 each, under a put/get load: from the moment the
//     replacement starts (or the kill) to the load's next completed round.
//     p50 and max. Its bounds, measured the same way: no restart at all
//     (from a moment to the load's next round: what a client sees of any
//     moment), and a daemon's cold start with nothing to adopt (exec to
//     serving: what any replacement process pays before it serves).
//  4. The fast path across a take-over: a 64 KiB lifecycle in the same two
//     sessions before and after it, and whether the producer posts in a
//     release ring after it.
//
//   restart_bench [--quick]
//
// Figures in docs/performance.md ("Restarts"); state the machine with them.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client_core.h"
#include "client/lease.h"
#include "daemon/memory/fake_segment.h"
#include "daemon/store/object_store.h"
#include "shmtensor/client.h"
#include "spdlog/spdlog.h"
#include "testing/cpp/blocking_store.h"
#include "testing/cpp/daemon_process.h"
#include "testing/cpp/fd_store.h"

namespace shmtensor {
namespace {

using daemon::FakeSegment;
using daemon::Ledger;
using daemon::LedgerState;
using daemon::ObjectStore;
using daemon::Pool;
using daemon::PoolAccessRules;

constexpr uint64_t kPoolBytes = uint64_t{8} << 30;

std::vector<std::unique_ptr<Pool>> Pools() {
  std::vector<std::unique_ptr<Pool>> pools;
  pools.push_back(std::make_unique<Pool>(
      "default", std::make_unique<FakeSegment>(kPoolBytes),
      PoolAccessRules(geteuid())));
  return pools;
}

std::unique_ptr<Ledger> NewLedger(uint64_t epoch, daemon::StoreLimits limits) {
  return *Ledger::Create(epoch, {{"default", 1, kPoolBytes, 4096, 0}},
                         daemon::LedgerCapacityFor(limits));
}

daemon::PeerInfo Me() {
  const pid_t pid = getpid();
  return daemon::PeerInfo{
      {pid, geteuid(), getegid()},
      // Alive: a successor keeps the session.
      daemon::OwnerKey{geteuid(), pid, *daemon::ProcessStartTime(pid)},
      nullptr,
      ""};
}

// ns per object life in `store`.
double Lives(ObjectStore& store, int n) {
  const uint64_t a = store.OpenSession("a", Me())->id;
  const uint64_t b = store.OpenSession("b", Me())->id;
  const absl::Time start = absl::Now();
  for (int i = 0; i < n; ++i) {
    daemon::CreateArgs args;
    args.caller = a;
    args.size_bytes = 65536;
    daemon::Handout h = *CreateBlocking(store, args);
    (void)store.ClearStale(a, h);
    daemon::SealResult sealed = *store.Seal(a, h.lease_id, false);
    daemon::Handout got = *store.Get(b, sealed.ref);
    (void)store.Release(b, got.lease_id);
    (void)store.Release(a, h.lease_id);
  }
  const double ns = absl::ToDoubleNanoseconds(absl::Now() - start) / n;
  store.EndSession(a);
  store.EndSession(b);
  return ns;
}

void LedgerCost(bool quick) {
  const int n = quick ? 20000 : 200000;
  std::vector<double> with, without;
  for (int round = 0; round < 5; ++round) {
    ObjectStore plain(Pools(), 1);
    without.push_back(Lives(plain, n));
    ObjectStore journaled(Pools(), 2, {}, NewLedger(2, {}));
    with.push_back(Lives(journaled, n));
  }
  std::sort(with.begin(), with.end());
  std::sort(without.begin(), without.end());
  std::printf(
      "1. An object's life in the store (create, seal, get elsewhere, release "
      "both), median of 5 rounds of %d\n"
      "   | without a ledger | with | ratio |\n   | --- | --- | --- |\n"
      "   | %.0f ns | %.0f ns | %.3f |\n\n",
      n, without[2], with[2], with[2] / without[2]);
}

void Adoption(int objects) {
  daemon::StoreLimits limits;
  limits.max_leases_per_client = 0;  // One session holds them all.
  ObjectStore old(Pools(), 3, limits, NewLedger(3, limits));
  const int ledger_fd = old.ledger_fd();
  const uint64_t a = old.OpenSession("a", Me())->id;
  for (int i = 0; i < objects; ++i) {
    daemon::CreateArgs args;
    args.caller = a;
    args.size_bytes = 4096;
    daemon::Handout h = *CreateBlocking(old, args);
    (void)old.ClearStale(a, h);
    (void)old.Seal(a, h.lease_id, false);
  }
  const absl::Time start = absl::Now();
  LedgerState state;
  absl::StatusOr<std::unique_ptr<Ledger>> ledger = Ledger::Adopt(
      daemon::UniqueFd(fcntl(ledger_fd, F_DUPFD_CLOEXEC, 3)), &state);
  const absl::Duration read = absl::Now() - start;
  absl::StatusOr<std::unique_ptr<ObjectStore>> next =
      ObjectStore::Adopt(Pools(), {}, *std::move(ledger), std::move(state));
  const absl::Duration all = absl::Now() - start;
  // The bound: the ledger's written bytes (its data extents: the file is
  // sparse) read, nothing checked.
  const off_t end = lseek(ledger_fd, 0, SEEK_END);
  std::vector<char> chunk(1 << 20);  // Read into, over and over.
  off_t bytes = 0;
  const absl::Time read_start = absl::Now();
  for (off_t at = lseek(ledger_fd, 0, SEEK_DATA); at >= 0 && at < end;) {
    const off_t hole = lseek(ledger_fd, at, SEEK_HOLE);
    while (at < hole) {
      const ssize_t got = pread(ledger_fd, chunk.data(),
                                std::min<size_t>(chunk.size(), hole - at), at);
      if (got <= 0) break;
      at += got;
      bytes += got;
    }
    at = lseek(ledger_fd, hole, SEEK_DATA);
  }
  const absl::Duration bound = absl::Now() - read_start;
  std::printf(
      "2. Adopting a ledger of %d objects, each with a lease: %s (reading "
      "and checking the ledger %s); %s. Bound: reading its %lld written "
      "bytes %s "
      "(%.1fx)\n\n",
      objects, absl::FormatDuration(all).c_str(),
      absl::FormatDuration(read).c_str(),
      next.ok() ? "adopted" : next.status().ToString().c_str(),
      static_cast<long long>(bytes), absl::FormatDuration(bound).c_str(),
      absl::FDivDuration(all, std::max(bound, absl::Nanoseconds(1))));
}

// A put/get load from this process; `rounds` counts completed rounds.
struct Load {
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> rounds{0};
  std::atomic<uint64_t> failures{0};
  std::thread thread;
  explicit Load(const std::string& address) {
    thread = std::thread([this, address] {
      ClientOptions o;
      o.address = address;
      o.resume_timeout = absl::Seconds(30);
      Client p = *Client::Connect(o);
      Client c = *Client::Connect(o);
      std::vector<uint8_t> data(65536, 1);
      CreateOptions co;
      co.size_bytes = data.size();
      while (!stop) {
        absl::StatusOr<SealedRef> ref = p.Put(data.data(), co);
        if (!ref.ok() || !c.Get(ref->ref()).ok()) {
          ++failures;
          continue;
        }
        ++rounds;
      }
    });
  }
  ~Load() {
    stop = true;
    thread.join();
  }
  // Time until the next round completes after `since`.
  absl::Duration NextRoundAfter(absl::Time since) {
    const uint64_t seen = rounds.load();
    while (rounds.load() == seen) absl::SleepFor(absl::Microseconds(100));
    return absl::Now() - since;
  }
};

std::string Summary(std::vector<absl::Duration> d) {
  std::sort(d.begin(), d.end());
  return absl::StrCat("p50 ", absl::FormatDuration(d[d.size() / 2]), ", max ",
                      absl::FormatDuration(d.back()));
}

// The bounds of the gap (see the file comment): the load's next round
// after a moment with no restart, and a cold start with nothing to adopt.
void GapBounds(int n) {
  std::unique_ptr<testing::DaemonProcess> d =
      *testing::DaemonProcess::Start({"--pool-size", "64MiB"});
  Load load(d->address());
  load.NextRoundAfter(absl::Now());
  std::vector<absl::Duration> gaps;
  for (int i = 0; i < n; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
    gaps.push_back(load.NextRoundAfter(absl::Now()));
  }
  std::printf("   | (bound) no restart | %s | %llu |\n", Summary(gaps).c_str(),
              static_cast<unsigned long long>(load.failures.load()));
  std::vector<absl::Duration> starts;
  for (int i = 0; i < n; ++i) {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::unique_ptr<testing::DaemonProcess>> cold =
        testing::DaemonProcess::Start({"--pool-size", "64MiB"});
    if (!cold.ok()) break;
    starts.push_back(absl::Now() - start);
  }
  if (!starts.empty()) {
    std::printf("   | (bound) cold start, nothing to adopt | %s | - |\n",
                Summary(starts).c_str());
  }
}

void TakeOverGap(int n) {
  std::vector<std::unique_ptr<testing::DaemonProcess>> daemons;
  daemons.push_back(*testing::DaemonProcess::Start({"--pool-size", "64MiB"}));
  const std::string address = daemons.back()->address();
  Load load(address);
  load.NextRoundAfter(absl::Now());
  std::vector<absl::Duration> gaps;
  for (int i = 0; i < n; ++i) {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::unique_ptr<testing::DaemonProcess>> next =
        testing::DaemonProcess::Start({"--pool-size", "64MiB", "--take-over"},
                                      address);
    daemons.back()->process().Wait();
    gaps.push_back(load.NextRoundAfter(start));
    daemons.push_back(*std::move(next));
  }
  std::printf("   | take-over | %s | %llu |\n", Summary(gaps).c_str(),
              static_cast<unsigned long long>(load.failures.load()));
}

// A SIGKILL restart through systemd's descriptor store (testing/cpp/
// fd_store.h plays systemd).
void KillGap(int n) {
  testing::FdStore systemd;
  const std::string address = testing::FreshAddress();
  const std::vector<std::string> args = {"--listen", address, "--pool-size",
                                         "64MiB"};
  if (!systemd.Start(args).ok() || !systemd.WaitReady()) {
    std::printf("   | SIGKILL restart (descriptor store) | did not start |\n");
    return;
  }
  Load load(address);
  load.NextRoundAfter(absl::Now());
  std::vector<absl::Duration> gaps;
  for (int i = 0; i < n; ++i) {
    const absl::Time start = absl::Now();
    systemd.Kill();
    if (!systemd.Start(args).ok() || !systemd.WaitReady()) {
      std::printf("   | SIGKILL restart (descriptor store) | failed |\n");
      return;
    }
    gaps.push_back(load.NextRoundAfter(start));
  }
  std::printf("   | SIGKILL restart (descriptor store) | %s | %llu |\n",
              Summary(gaps).c_str(),
              static_cast<unsigned long long>(load.failures.load()));
}

// One lifecycle of a 64 KiB object (put, get in the other session, release
// both); false when a call failed (a resume's UNAVAILABLE).
bool Lifecycle(Client& producer, Client& consumer,
               const std::vector<uint8_t>& data) {
  absl::StatusOr<SealedRef> ref =
      producer.Put(data.data(), {.size_bytes = data.size()});
  return ref.ok() && consumer.Get(ref->ref()).ok();
}

// p50 of `n` lifecycles, in microseconds.
double LifecycleP50(Client& producer, Client& consumer,
                    const std::vector<uint8_t>& data, int n) {
  std::vector<double> us;
  for (int i = 0; i < n; ++i) {
    const absl::Time t0 = absl::Now();
    if (Lifecycle(producer, consumer, data)) {
      us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
    }
  }
  if (us.empty()) return 0;
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// The fast path across a take-over: the same two sessions' lifecycles
// before and after it, and whether the producer posts in a release ring
// after it (the successor makes a resumed session a new ring).
void FastPathAcrossTakeOver(int n) {
  std::vector<std::unique_ptr<testing::DaemonProcess>> daemons;
  daemons.push_back(*testing::DaemonProcess::Start({"--pool-size", "64MiB"}));
  const std::string address = daemons.back()->address();
  ClientOptions o;
  o.address = address;
  o.resume_timeout = absl::Seconds(30);
  Client producer = *Client::Connect(o);
  Client consumer = *Client::Connect(o);
  const std::vector<uint8_t> data(65536, 1);
  LifecycleP50(producer, consumer, data, n);  // Warm-up: the stock grows.
  const double before = LifecycleP50(producer, consumer, data, n);
  absl::StatusOr<std::unique_ptr<testing::DaemonProcess>> next =
      testing::DaemonProcess::Start({"--pool-size", "64MiB", "--take-over"},
                                    address);
  if (!next.ok()) {
    std::printf("4. take-over failed: %s\n", next.status().ToString().c_str());
    return;
  }
  daemons.back()->process().Wait();
  daemons.push_back(*std::move(next));
  // The first calls of each session resume it (and may fail once, saying so).
  for (int ok = 0, tries = 0; ok < 20 && tries < 1000; ++tries) {
    if (Lifecycle(producer, consumer, data)) ++ok;
  }
  absl::StatusOr<Buffer> probe = producer.Create({.size_bytes = 4096});
  const bool ring = probe.ok() && probe->lease()->core().has_release_ring();
  LifecycleP50(producer, consumer, data, n);
  const double after = LifecycleP50(producer, consumer, data, n);
  std::printf(
      "4. A 64 KiB lifecycle (put, get in another session, release both) "
      "in the same two sessions, %d each, p50: before a take-over %.1f us, "
      "after it %.1f us (%.2fx); the producer posts in a release ring after "
      "it: %s\n",
      n, before, after, after / before, ring ? "yes" : "no");
}

}  // namespace
}  // namespace shmtensor

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  spdlog::set_level(spdlog::level::warn);
  std::printf("restart_bench%s\n\n", quick ? " --quick" : "");
  shmtensor::LedgerCost(quick);
  shmtensor::Adoption(quick ? 20000 : 100000);
  std::printf(
      "3. Gap a client sees (replacement started or daemon killed, to the "
      "load's next completed put+get), %d each\n"
      "   | how | gap | calls failed (UNAVAILABLE) |\n   | --- | --- | --- |\n",
      quick ? 5 : 20);
  shmtensor::GapBounds(quick ? 5 : 20);
  shmtensor::TakeOverGap(quick ? 5 : 20);
  shmtensor::KillGap(quick ? 5 : 20);
  std::printf("\n");
  shmtensor::FastPathAcrossTakeOver(quick ? 500 : 2000);
  return 0;
}
