// Side-by-side benchmark of the shmtensor object lifecycle, run in one go:
//
//  1. Lifecycle (create, fill, seal, get, release) at 64 KiB, 1 MiB and
//     16 MiB against a bare unary gRPC round trip on the same socket, and the
//     minor page faults and mprotect calls per lifecycle in steady state
//     (getrusage; the pool mapping's count): with the client's defaults,
//     filled with Buffer::CopyFrom, and through Client::Put. Section 5 runs
//     the same lifecycle filled through Buffer::data(), the raw pointer whose
//     seal closes the range at once (two page-table changes a lifecycle).
//  2. Copy-in bandwidth: memcpy into a pool buffer vs into private memory, and
//     vs a fresh shared-memory segment per object (what torch's DataLoader
//     pays per batch).
//  3. Scale: 10,000 live objects held by 64 concurrent clients; lifecycle p99
//     against the one-client figure, and the daemon's memory outside pools.
//  4. Monitoring: 4 clients run 64 KiB lifecycles flat out, in rounds that
//     alternate without and with an operator's monitoring load (a Watch at
//     100 ms plus status, clients and objects listings 4 times a second, with
//     1,000 live objects to list); the clients' throughput with against
//     without.
//  5. Section 1's lifecycle filled through data(). Last: a range data() ever
//     pointed into closes at every later seal in this process (view.h,
//     WriteRevocation::kWhenExposed), which would change what 1-4 measure.
//  6. Clearing between users (docs/shm_layout.md): what the daemon pays to
//     zero a range another uid wrote before a create of another uid gets it
//     (HostSegment::Clear, pwrite of zeros into a memfd), against memset of
//     private memory already faulted in (the ideal bound), per size.
//
// Sections 1 and 2 run twice, side by side: with the default pool, a memfd
// (4 KiB pages), and in a tmpfs mounted huge=always (2 MiB pages; mounted for
// the run when the bench may, i.e. as root, or given with --huge-dir DIR).
//
//  7. The fast path: put from the stock with a one-way seal, get in one
//     round trip or none (a share), GetMany, each against its bound.
//
// Usage: lifecycle_bench [--quick] [--monitoring (section 4 only)]
// [--fast-path (section 7 only)]
// [--huge-dir DIR | --no-huge]. Starts its own shmtensord (from the build
// tree) on a private socket with a 2 GiB pool, and stops it at the end.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/lease.h"
#include "client/stock.h"
#include "daemon/memory/host_segment.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "shmtensor/client.h"
#include "shmtensor/v1/monitor.grpc.pb.h"
#include "testing/cpp/daemon_process.h"
#include "testing/cpp/scoped_tmpfs.h"

namespace {

using Clock = std::chrono::steady_clock;
using shmtensor::Client;

double Us(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

struct Summary {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0;
};

Summary Summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.p50 = v[v.size() / 2];
  s.p90 = v[v.size() * 9 / 10];
  s.p99 = v[std::min(v.size() - 1, v.size() * 99 / 100)];
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / v.size();
  return s;
}

long MinorFaults() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

// CPU time this process used so far, all its threads, in microseconds.
double ProcessCpuUs() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

[[noreturn]] void Die(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "lifecycle_bench: %s: %s\n", what.c_str(),
               s.ToString().c_str());
  std::exit(1);
}

template <typename T>
T Check(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) Die(what, v.status());
  return *std::move(v);
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) Die(what, s);
}

using shmtensor::testing::DaemonProcess;

// A daemon with one pool of `pool_size` in `pool_dir` (empty: a memfd, the
// default), on a private socket (testing/cpp/daemon_process.h).
std::unique_ptr<DaemonProcess> StartDaemon(const std::string& pool_size,
                                           const std::string& pool_dir) {
  std::vector<std::string> args = {"--pool-size", pool_size};
  if (!pool_dir.empty()) args.insert(args.end(), {"--pool-dir", pool_dir});
  return Check(DaemonProcess::Start(args), "daemon start");
}

// Phases of one lifecycle, in microseconds.
struct Phases {
  double create, fill, seal, get, release_view, release_ref;
};

// How a lifecycle fills its buffer: Buffer::CopyFrom (no pointer handed
// out), or memcpy through Buffer::data() (a raw pointer that may outlive the
// seal, so the default revocation closes the range at once).
enum class Fill { kCopyFrom, kDataPointer };

// One lifecycle with the client's default revocation; returns its duration
// and (out) the time of each phase and the mprotect count of the pool's
// mapping in this process after it.
Clock::duration Lifecycle(Client& c, uint64_t bytes, const void* src,
                          Phases* phases, Fill fill = Fill::kCopyFrom,
                          uint64_t* protect_calls = nullptr) {
  const auto t0 = Clock::now();
  shmtensor::Buffer buf = Check(c.Create({.size_bytes = bytes}), "create");
  const auto t1 = Clock::now();
  if (fill == Fill::kCopyFrom) {
    Check(buf.CopyFrom(src, bytes), "copy");
  } else {
    std::memcpy(buf.data(), src, bytes);
  }
  const auto t2 = Clock::now();
  if (protect_calls != nullptr) {
    const std::shared_ptr<shmtensor::internal::Lease>& lease = buf.lease();
    *protect_calls =
        Check(lease->core().Mapping(lease->placement().pool_id()), "mapping")
            ->protect_calls();
  }
  shmtensor::SealedRef ref = Check(buf.Seal(), "seal");
  const auto t3 = Clock::now();
  std::optional<shmtensor::View> v = Check(c.Get(ref.ref()), "get");
  const auto t4 = Clock::now();
  if (static_cast<const uint8_t*>(v->data())[bytes - 1] != 0xab) {
    Die("verify", absl::DataLossError("bytes differ"));
  }
  v.reset();  // Releases the view's lease.
  const auto t5 = Clock::now();
  ref.Reset();  // Releases the creator's lease: the object is freed.
  const auto t6 = Clock::now();
  if (phases != nullptr) {
    *phases = {Us(t1 - t0), Us(t2 - t1), Us(t3 - t2),
               Us(t4 - t3), Us(t5 - t4), Us(t6 - t5)};
  }
  return t6 - t0;
}

// Create, Seal and Get are unary round trips; the two releases are one-way
// ReleaseLeases messages on the session stream (no reply awaited).
constexpr int kLifecycleRoundTrips = 3;
constexpr int kLifecycleOneWayCalls = 2;

// The same lifecycle through Client::Put, which copies in with pwrite and so
// opens no writable range: no page-table change at all. Same 3 round trips.
Clock::duration PutLifecycle(Client& c, uint64_t bytes, const void* src) {
  const auto t0 = Clock::now();
  shmtensor::SealedRef ref = Check(c.Put(src, {.size_bytes = bytes}), "put");
  {
    shmtensor::View v = Check(c.Get(ref.ref()), "get");
    if (static_cast<const uint8_t*>(v.data())[bytes - 1] != 0xab) {
      Die("verify", absl::DataLossError("bytes differ"));
    }
  }
  ref.Reset();
  return Clock::now() - t0;
}

// What the page-table changes of the seal guarantee cost on this machine, in
// this (multi-threaded) process: mprotect of a shared range from read-only to
// read-write (Create opens the range) and back (Seal closes it), per size.
struct ProtectCost {
  double open_us = 0, close_us = 0;
};

ProtectCost CalibrateMprotect(const std::string& dir, size_t bytes) {
  // Memory like the pool's: a memfd, or a file of that tmpfs.
  const std::string path =
      absl::StrCat(dir, "/shmtensor-bench-mprotect-", getpid());
  const int fd = dir.empty()
                     ? memfd_create("shmtensor-bench-mprotect", MFD_CLOEXEC)
                     : open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (!dir.empty()) unlink(path.c_str());
  if (fd < 0 || posix_fallocate(fd, 0, bytes) != 0) return {};
  // Aligned like a client maps a pool with huge pages.
  const size_t align = 2u << 20;
  auto* reserve = static_cast<uint8_t*>(mmap(
      nullptr, bytes + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  auto* at = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(reserve) + align - 1) & ~(align - 1));
  auto* p = static_cast<uint8_t*>(
      mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0));
  close(fd);
  std::memset(p, 1, bytes);
  std::vector<double> open, close_;
  for (int i = 0; i < 50; ++i) {
    const auto t0 = Clock::now();
    mprotect(p, bytes, PROT_READ);
    const auto t1 = Clock::now();
    mprotect(p, bytes, PROT_READ | PROT_WRITE);
    const auto t2 = Clock::now();
    p[0] = 2;
    close_.push_back(Us(t1 - t0));
    open.push_back(Us(t2 - t1));
  }
  munmap(reserve, bytes + align);
  return {Summarize(open).p50, Summarize(close_).p50};
}

std::string SizeName(uint64_t bytes) {
  return bytes >= (1u << 20) ? absl::StrCat(bytes >> 20, "MiB")
                             : absl::StrCat(bytes >> 10, "KiB");
}

// A pool under test: where its daemon keeps it, and a client of it.
struct Target {
  std::string label;  // e.g. "memfd (4 KiB pages)".
  std::string dir;    // Empty: the default pool, a memfd.
  Client* client;
};

// The lifecycle's skeleton without shmtensor: three bare round trips (Stats)
// with the same copy of `bytes` between the first and the second, into
// private memory (`dst`). A 16 MiB copy evicts the caches the RPC path runs
// from, so the round trips after it cost more than on a quiet loop; this is
// the reference for "one round trip per RPC" in the conditions the lifecycle
// runs in. Run interleaved with the lifecycles, so that the machine's drift
// (large on a shared machine) reaches both alike. Returns the round trips'
// time (without the copy), in microseconds.
double SkeletonRoundTrips(Client& c, uint64_t bytes, const void* src,
                          void* dst) {
  const auto t0 = Clock::now();
  Check(c.Stats(), "stats");
  const auto t1 = Clock::now();
  std::memcpy(dst, src, bytes);
  const auto t2 = Clock::now();
  Check(c.Stats(), "stats");
  Check(c.Stats(), "stats");
  const auto t3 = Clock::now();
  return Us(t1 - t0) + Us(t3 - t2);
}

// One table of lifecycles at each size, filled as `fill` says.
void BenchLifecycleTable(Client& c, const std::vector<uint64_t>& sizes,
                         const std::vector<ProtectCost>& protect, Fill how,
                         double rtt, int iters) {
  std::printf("%-8s %9s %9s %9s %12s %14s %20s %16s %10s %10s %10s   %s\n",
              "size", "p50 us", "p99 us", "fill us", "overhead us",
              "overhead/3 RTT", "(minus mprotect)/3RTT", "vs 3 RTT+fill",
              "vs 5 calls", "minflt/op", "mprotect/op",
              "p50 us: create seal get release(view) release(ref)");
  for (size_t k = 0; k < sizes.size(); ++k) {
    const uint64_t bytes = sizes[k];
    std::vector<uint8_t> src(bytes, 0xab);
    const int n = bytes >= (16u << 20) ? std::max(iters / 8, 20) : iters;
    for (int i = 0; i < 10; ++i) {
      Lifecycle(c, bytes, src.data(), nullptr, how);
    }
    std::vector<uint8_t> dst(bytes, 0);  // The skeleton's, faulted in.
    std::vector<double> total, fill, create, seal, get, rel_view, rel_ref,
        skeleton;
    long faults = 0;
    uint64_t protects0 = 0, protects1 = 0;
    for (int i = 0; i < n; ++i) {
      skeleton.push_back(SkeletonRoundTrips(c, bytes, src.data(), dst.data()));
      Phases p;
      const long faults0 = MinorFaults();
      total.push_back(Us(Lifecycle(c, bytes, src.data(), &p, how,
                                   i == 0 ? &protects0 : &protects1)));
      faults += MinorFaults() - faults0;
      fill.push_back(p.fill);
      create.push_back(p.create);
      seal.push_back(p.seal);
      get.push_back(p.get);
      rel_view.push_back(p.release_view);
      rel_ref.push_back(p.release_ref);
    }
    const double faults_per_op = double(faults) / n;
    const double protects =
        n > 1 ? double(protects1 - protects0) / (n - 1) : 0.0;
    const Summary t = Summarize(total), fl = Summarize(fill);
    const double overhead = t.p50 - fl.p50;
    const double budget = kLifecycleRoundTrips * rtt;
    // The page-table changes actually made, at their calibrated cost.
    const double mprotect_us =
        protects / 2 * (protect[k].open_us + protect[k].close_us);
    std::printf(
        "%-8s %9.1f %9.1f %9.1f %12.1f %14.2f %20.2f %16.2f %10.2f %10.2f "
        "%10.2f   %.0f %.0f %.0f %.0f %.0f\n",
        SizeName(bytes).c_str(), t.p50, t.p99, fl.p50, overhead,
        overhead / budget, (overhead - mprotect_us) / budget,
        overhead / Summarize(skeleton).p50,
        overhead / (Summarize(skeleton).p50 *
                    (kLifecycleRoundTrips + kLifecycleOneWayCalls) /
                    kLifecycleRoundTrips),
        faults_per_op, protects, Summarize(create).p50, Summarize(seal).p50,
        Summarize(get).p50, Summarize(rel_view).p50, Summarize(rel_ref).p50);
  }
}

// The bare unary round trip (Stats) on `c`'s socket: p50 and mean, printed.
double MeasureRtt(Client& c, int iters) {
  std::vector<double> rtt;
  for (int i = 0; i < iters * 4; ++i) {
    const auto t0 = Clock::now();
    Check(c.Stats(), "stats");
    rtt.push_back(Us(Clock::now() - t0));
  }
  const Summary r = Summarize(rtt);
  std::printf("bare unary RPC (Stats) round trip: p50 %.1f us, mean %.1f us\n",
              r.p50, r.mean);
  return r.p50;
}

// A round trip that does nothing but travel: gRPC's health check, on a
// channel of its own to the daemon's socket. Section 7's bound. (Stats
// drains every session's release ring first, as every monitoring view
// does, so it carries whatever releases the sessions posted: not bare.)
class BareRoundTrip {
 public:
  explicit BareRoundTrip(const std::string& address)
      : stub_(grpc::health::v1::Health::NewStub(grpc::CreateChannel(
            address, grpc::InsecureChannelCredentials()))) {}

  void Once() {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckResponse resp;
    const grpc::Status st = stub_->Check(&ctx, {}, &resp);
    if (!st.ok()) {
      Die("health check", absl::UnavailableError(st.error_message()));
    }
  }

 private:
  std::unique_ptr<grpc::health::v1::Health::Stub> stub_;
};

const std::vector<uint64_t>& LifecycleSizes() {
  static const std::vector<uint64_t> sizes = {
      uint64_t{64} << 10, uint64_t{1} << 20, uint64_t{16} << 20};
  return sizes;
}

void PrintLifecycleLegend() {
  std::printf(
      "lifecycle = create, fill, seal, get, release view, release ref, in "
      "one client: the budget counts %d round trips + 2 one-way messages, "
      "as before the stock (create from the stock, the seal one way and the "
      "get a share of the creator's lease take none now: section 7 has the "
      "fast path against its own bounds)\n"
      "vs 3 RTT+fill: overhead / (3 bare round trips with the same copy "
      "between them, minus the copy, run alternately with the lifecycles): "
      "the budget in the lifecycle's own cache conditions, drift "
      "cancelled; vs 5 calls: the same with one such round trip for each of "
      "the %d calls the lifecycle makes (the one-way releases too)\n",
      kLifecycleRoundTrips, kLifecycleRoundTrips + kLifecycleOneWayCalls);
}

void BenchLifecycle(const Target& target, int iters) {
  Client& c = *target.client;
  std::printf(
      "\n== 1. Lifecycle vs bare unary RPC (same socket), pool in %s ==\n",
      target.label.c_str());
  const double rtt = MeasureRtt(c, iters);
  const std::vector<uint64_t>& sizes = LifecycleSizes();
  PrintLifecycleLegend();
  std::printf(
      "the client's defaults (WriteRevocation::kWhenExposed), filled with "
      "Buffer::CopyFrom: no pointer is left, so the seal needs no page-table "
      "change and the range stays open for its next writable use here:\n");
  BenchLifecycleTable(c, sizes, std::vector<ProtectCost>(sizes.size()),
                      Fill::kCopyFrom, rtt, iters);
  std::printf(
      "via Client::Put (from the stock, mapped copy-in, one-way seal; the "
      "budget still counts 3 round trips):\n");
  std::printf("%-8s %9s %9s %12s %15s %10s\n", "size", "p50 us", "p99 us",
              "memcpy us", "overhead/3 RTT", "minflt/op");
  for (uint64_t bytes : sizes) {
    std::vector<uint8_t> src(bytes, 0xab);
    const int n = bytes >= (16u << 20) ? std::max(iters / 8, 20) : iters;
    for (int i = 0; i < 10; ++i) PutLifecycle(c, bytes, src.data());
    std::vector<double> total;
    const long faults0 = MinorFaults();
    for (int i = 0; i < n; ++i) {
      total.push_back(Us(PutLifecycle(c, bytes, src.data())));
    }
    const double faults = double(MinorFaults() - faults0) / n;
    // The copy in user space, as the share of the time that is not RPCs.
    std::vector<uint8_t> dst(bytes, 0);
    const auto c0 = Clock::now();
    for (int i = 0; i < 10; ++i) std::memcpy(dst.data(), src.data(), bytes);
    const double copy = Us(Clock::now() - c0) / 10;
    const Summary t = Summarize(total);
    std::printf("%-8s %9.1f %9.1f %12.1f %15.2f %10.2f\n",
                SizeName(bytes).c_str(), t.p50, t.p99, copy,
                (t.p50 - copy) / (kLifecycleRoundTrips * rtt), faults);
  }
}

// Section 5: section 1's lifecycle filled through Buffer::data(), whose
// pointer may outlive the seal: the seal closes the range (mprotect) and the
// next buffer opens it again. Run last (see the file comment).
void BenchPointerLifecycle(const Target& target, int iters) {
  Client& c = *target.client;
  std::printf(
      "\n== 5. Lifecycle filled through Buffer::data(), pool in %s ==\n",
      target.label.c_str());
  const double rtt = MeasureRtt(c, iters);
  const std::vector<uint64_t>& sizes = LifecycleSizes();
  std::vector<ProtectCost> protect;
  std::printf("page-table cost of the seal guarantee here (mprotect p50):\n");
  for (uint64_t bytes : sizes) {
    protect.push_back(CalibrateMprotect(target.dir, bytes));
    std::printf(
        "  %-6s read-only->writable %8.0f us, writable->read-only "
        "%6.0f us\n",
        SizeName(bytes).c_str(), protect.back().open_us,
        protect.back().close_us);
  }
  PrintLifecycleLegend();
  std::printf(
      "the client's defaults, filled with memcpy through Buffer::data(): the "
      "pointer may outlive the seal, so the seal closes the range (a write "
      "through it faults) and the next buffer there opens it again:\n");
  BenchLifecycleTable(c, sizes, protect, Fill::kDataPointer, rtt, iters);
}

// GB/s of `reps` copies of `bytes` made by `copy`, after one to warm up.
template <typename Copy>
double CopyGBps(uint64_t bytes, int reps, Copy copy) {
  copy();
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) copy();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return double(bytes) * reps / s / 1e9;
}

void BenchCopyIn(const Target& target, int reps) {
  Client& c = *target.client;
  std::printf(
      "\n== 2. Copy-in bandwidth (16 MiB, %d copies each), pool in %s ==\n",
      reps, target.label.c_str());
  const uint64_t bytes = 16u << 20;
  std::vector<uint8_t> src(bytes, 0x5c);
  std::vector<uint8_t> priv(bytes, 0);  // Private, faulted in.
  shmtensor::Buffer buf = Check(c.Create({.size_bytes = bytes}), "create");
  double pool = 0, priv_bw = 0;
  // Interleave to share the machine's noise evenly.
  for (int round = 0; round < 3; ++round) {
    priv_bw += CopyGBps(bytes, reps,
                        [&] { std::memcpy(priv.data(), src.data(), bytes); });
    // The way to fill a buffer that leaves no pointer (Buffer::CopyFrom).
    pool += CopyGBps(bytes, reps,
                     [&] { Check(buf.CopyFrom(src.data(), bytes), "copy"); });
  }
  pool /= 3;
  priv_bw /= 3;
  // torch's DataLoader path: a fresh segment per batch, faulted in page by
  // page as it is filled.
  const auto t0 = Clock::now();
  const int fresh_reps = std::max(reps / 4, 4);
  for (int i = 0; i < fresh_reps; ++i) {
    const std::string name = absl::StrCat("/shmtensor-bench-fresh-", getpid());
    const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, bytes) != 0)
      Die("shm", absl::InternalError("fresh"));
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    std::memcpy(p, src.data(), bytes);
    munmap(p, bytes);
    close(fd);
    shm_unlink(name.c_str());
  }
  const double fresh =
      double(bytes) * fresh_reps /
      std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
  std::printf("memcpy into private memory:      %6.2f GB/s\n", priv_bw);
  std::printf(
      "CopyFrom into a pool buffer:     %6.2f GB/s  (%.0f%% of private)\n",
      pool, 100 * pool / priv_bw);
  std::printf(
      "fresh shm segment per object:    %6.2f GB/s  (pool is %.1fx faster)\n",
      fresh, pool / fresh);
}

void BenchScale(const DaemonProcess& d, Client& solo, int iters, int clients,
                int live_objects) {
  std::printf("\n== 3. Scale: %d live objects, %d concurrent clients ==\n",
              live_objects, clients);
  const uint64_t bytes = 64u << 10;
  std::vector<uint8_t> src(bytes, 0xab);
  auto measure = [&](Client& c, int n) {
    std::vector<double> v;
    for (int i = 0; i < n; ++i)
      v.push_back(Us(Lifecycle(c, bytes, src.data(), nullptr)));
    return Summarize(v);
  };
  for (int i = 0; i < 50; ++i) Lifecycle(solo, bytes, src.data(), nullptr);
  const Summary one = measure(solo, iters);
  const int64_t rss_before = d.PrivateRss();

  // Each client holds its share of the live objects (4 KiB each, sealed).
  std::vector<Client> cs;
  std::vector<std::vector<shmtensor::SealedRef>> held(clients);
  for (int i = 0; i < clients; ++i) {
    cs.push_back(
        Check(Client::Connect({.address = d.address(),
                               .client_name = absl::StrCat("bench-", i)}),
              "connect"));
  }
  {
    std::vector<std::thread> ts;
    for (int i = 0; i < clients; ++i) {
      ts.emplace_back([&, i] {
        for (int k = i; k < live_objects; k += clients) {
          shmtensor::Buffer b =
              Check(cs[i].Create({.size_bytes = 4096}), "create");
          Check(b.Fill([k](absl::Span<uint8_t> bytes) {
            std::memset(bytes.data(), k, bytes.size());
          }),
                "fill");
          held[i].push_back(Check(b.Seal(), "seal"));
        }
      });
    }
    for (auto& t : ts) t.join();
  }
  const auto st = Check(solo.Stats(), "stats");
  const Summary loaded_idle = measure(solo, iters);

  // All clients run lifecycles at once.
  std::vector<std::vector<double>> per(clients);
  {
    std::vector<std::thread> ts;
    const int each = std::max(iters / 4, 25);
    for (int i = 0; i < clients; ++i) {
      ts.emplace_back([&, i] {
        for (int k = 0; k < each; ++k) {
          per[i].push_back(Us(Lifecycle(cs[i], bytes, src.data(), nullptr)));
        }
      });
    }
    const auto t0 = Clock::now();
    for (auto& t : ts) t.join();
    const double secs =
        std::chrono::duration<double>(Clock::now() - t0).count();
    std::vector<double> all;
    for (auto& v : per) all.insert(all.end(), v.begin(), v.end());
    const Summary busy = Summarize(all);
    std::printf("live objects %llu, sessions %llu, leases %llu\n",
                (unsigned long long)st.objects, (unsigned long long)st.sessions,
                (unsigned long long)st.leases);
    std::printf("%-44s %9s %9s %10s\n", "64 KiB lifecycle", "p50 us", "p99 us",
                "p99 ratio");
    std::printf("%-44s %9.1f %9.1f %10s\n", "one client, empty daemon", one.p50,
                one.p99, "1.00");
    std::printf("%-44s %9.1f %9.1f %10.2f\n",
                "one client, 10k objects + 64 sessions open", loaded_idle.p50,
                loaded_idle.p99, loaded_idle.p99 / one.p99);
    std::printf("%-44s %9.1f %9.1f %10.2f\n",
                "all 64 clients at once (2 cores)", busy.p50, busy.p99,
                busy.p99 / one.p99);
    std::printf("aggregate throughput, 64 clients: %.0f lifecycles/s\n",
                all.size() / secs);
  }
  const int64_t rss_after = d.PrivateRss();
  std::printf(
      "daemon memory outside pools: %.1f MiB before, %.1f MiB with 10k "
      "objects and 64 sessions (limit 64 MiB)\n",
      rss_before / 1048576.0, rss_after / 1048576.0);
}

void BenchMonitoring(const DaemonProcess& d, int rounds, double round_s) {
  constexpr int kClients = 4;
  std::printf(
      "\n== 4. Monitoring while %d clients run 64 KiB lifecycles flat "
      "out ==\n",
      kClients);
  const uint64_t bytes = 64u << 10;
  std::vector<uint8_t> src(bytes, 0xab);
  // Something to list: 1,000 live named objects.
  Client holder =
      Check(Client::Connect({.address = d.address(), .client_name = "holder"}),
            "connect");
  std::vector<shmtensor::SealedRef> held;
  for (int i = 0; i < 1000; ++i) {
    held.push_back(Check(holder.Put(src.data(), {.size_bytes = 4096,
                                                 .name = absl::StrCat("o", i)}),
                         "put"));
  }
  std::vector<Client> cs;
  for (int i = 0; i < kClients; ++i) {
    cs.push_back(
        Check(Client::Connect({.address = d.address(),
                               .client_name = absl::StrCat("worker-", i)}),
              "connect"));
  }
  std::atomic<bool> stop{false}, monitoring{false};
  std::atomic<uint64_t> done{0}, monitor_calls{0};
  std::vector<std::thread> workers;
  for (int i = 0; i < kClients; ++i) {
    workers.emplace_back([&, i] {
      while (!stop) {
        Lifecycle(cs[i], bytes, src.data(), nullptr);
        ++done;
      }
    });
  }
  // The operator: a Watch stream and listings, only while `monitoring`.
  auto channel =
      grpc::CreateChannel(d.address(), grpc::InsecureChannelCredentials());
  auto monitor = shmtensor::v1::Monitor::NewStub(channel);
  std::thread operator_thread([&] {
    while (!stop) {
      if (!monitoring) {
        usleep(10000);
        continue;
      }
      grpc::ClientContext watch_ctx;
      shmtensor::v1::WatchRequest req;
      req.set_interval_ms(100);
      auto watch = monitor->Watch(&watch_ctx, req);
      std::thread watcher([&] {
        shmtensor::v1::DaemonStatus s;
        while (watch->Read(&s)) ++monitor_calls;
      });
      while (monitoring && !stop) {
        grpc::ClientContext c1, c2, c3;
        shmtensor::v1::DaemonStatus s;
        shmtensor::v1::ListClientsResponse cl;
        shmtensor::v1::ListObjectsResponse ob;
        monitor->GetStatus(&c1, {}, &s);
        monitor->ListClients(&c2, {}, &cl);
        monitor->ListObjects(&c3, {}, &ob);
        if (ob.objects_size() < 1000) {
          Die("monitor", absl::InternalError("listing lost objects"));
        }
        monitor_calls += 3;
        usleep(250000);
      }
      watch_ctx.TryCancel();
      watcher.join();
      watch->Finish();
    }
  });
  std::vector<double> off, on;
  for (int r = 0; r < 2 * rounds; ++r) {
    const bool with = r % 2 == 1;
    monitoring = with;
    usleep(200000);  // Let the load settle.
    const uint64_t n0 = done;
    const auto t0 = Clock::now();
    usleep(static_cast<useconds_t>(round_s * 1e6));
    const double rate =
        (done - n0) / std::chrono::duration<double>(Clock::now() - t0).count();
    (with ? on : off).push_back(rate);
  }
  stop = true;
  monitoring = false;
  for (auto& t : workers) t.join();
  operator_thread.join();
  const double off_p50 = Summarize(off).p50, on_p50 = Summarize(on).p50;
  std::printf("rounds of %.1f s, alternating; %llu monitoring calls answered\n",
              round_s, (unsigned long long)monitor_calls.load());
  std::printf("%-34s %14s\n", "4 clients, 64 KiB lifecycles", "lifecycles/s");
  std::printf("%-34s %14.0f\n", "without monitoring (median)", off_p50);
  std::printf("%-34s %14.0f\n", "with monitoring (median)", on_p50);
  std::printf(
      "throughput with monitoring: %.1f%% of without (drop %.1f%%, "
      "target under 5%%)\n",
      100 * on_p50 / off_p50, 100 * (1 - on_p50 / off_p50));
}

}  // namespace

// Section 6.
void BenchClearing(int reps) {
  std::printf(
      "\n== 6. Clearing a range another uid wrote (per create of another "
      "uid) ==\n");
  constexpr uint64_t kSegment = 64ull << 20;
  absl::StatusOr<std::unique_ptr<shmtensor::daemon::HostSegment>> seg =
      shmtensor::daemon::HostSegment::Create(
          {.label = "bench-clear", .size_bytes = kSegment});
  if (!seg.ok()) {
    std::printf("no segment: %s\n", seg.status().ToString().c_str());
    return;
  }
  std::vector<uint8_t> private_memory(kSegment, 1);
  std::printf("%-8s %14s %14s %10s %12s\n", "size", "clear (us)", "memset (us)",
              "ratio", "clear GB/s");
  for (uint64_t size : {64ull << 10, 1ull << 20, 16ull << 20, 64ull << 20}) {
    double clear_s = 0, memset_s = 0;
    // Untimed first round: both memories faulted in and cached alike.
    Check((*seg)->Clear(0, size), "clear");
    std::memset(private_memory.data(), 0, size);
    for (int i = 0; i < reps; ++i) {
      Clock::time_point t0 = Clock::now();
      Check((*seg)->Clear(0, size), "clear");
      Clock::time_point t1 = Clock::now();
      std::memset(private_memory.data(), i & 0xFF, size);
      Clock::time_point t2 = Clock::now();
      clear_s += std::chrono::duration<double>(t1 - t0).count();
      memset_s += std::chrono::duration<double>(t2 - t1).count();
    }
    std::printf("%-8s %14.1f %14.1f %9.2fx %12.2f\n",
                absl::StrFormat("%d KiB", size >> 10).c_str(),
                clear_s / reps * 1e6, memset_s / reps * 1e6, clear_s / memset_s,
                size * reps / clear_s / 1e9);
  }
  std::printf(
      "(a create by the uid that last wrote the range clears nothing; the "
      "ratio is the clear against memset of private memory)\n");
}

// Section 7: the fast path (docs/shm_layout.md, "Stock and one-way seals")
// between two sessions (a producer and a consumer client), each figure
// against its bound measured in the same loop:
//  - lifecycle: put (stock, mapped copy-in, one-way seal), get in the other
//    session (one round trip), release both (one way), against the same
//    copy into private memory followed by one bare round trip (1 RTT +
//    copy, in that order: what a put and a get cost with nothing else);
//  - put alone against the copy alone (memcpy into private memory already
//    faulted in), + 5 us, and against the copy into a mapped pool buffer
//    held open (Buffer::CopyFrom: the copy-in speed of the pool's pages);
//  - a get of an object the session holds a view of (a share: no call);
//  - GetMany of 64 objects against one bare round trip.
void BenchFastPath(const DaemonProcess& daemon, int iters) {
  std::printf(
      "\n== 7. Fast path: put without a round trip, get in one, many per "
      "call (two sessions, pool in a memfd) ==\n");
  Client producer = Check(Client::Connect({.address = daemon.address(),
                                           .client_name = "fast-producer"}),
                          "connect");
  Client consumer = Check(Client::Connect({.address = daemon.address(),
                                           .client_name = "fast-consumer"}),
                          "connect");
  MeasureRtt(consumer, iters);
  BareRoundTrip bare(daemon.address());
  {
    std::vector<double> rtt;  // Also connects and warms the channel.
    for (int i = 0; i < iters * 4; ++i) {
      const auto t0 = Clock::now();
      bare.Once();
      rtt.push_back(Us(Clock::now() - t0));
    }
    std::printf(
        "bare round trip (gRPC health check, the bound below): p50 %.1f us\n",
        Summarize(rtt).p50);
  }
  {
    // What writing memory costs when it was last written a while ago: a
    // 16 MiB copy into one buffer, 1 ms and 30 ms after its last write
    // (busy-waiting between: no memory traffic). On the dev VM the second
    // costs far more, with no page fault in the guest (a cost of the host's,
    // docs/performance.md), and the bound's destination below is written
    // every few ms, where a put's stock range is one of two in turn.
    const uint64_t bytes = uint64_t{16} << 20;
    std::vector<uint8_t> src(bytes, 1), dst(bytes, 0);
    auto after = [&](absl::Duration idle) {
      std::vector<double> us;
      for (int i = 0; i < 9; ++i) {
        std::memcpy(dst.data(), src.data(), bytes);
        const absl::Time until = absl::Now() + idle;
        while (absl::Now() < until) {
        }
        const auto t0 = Clock::now();
        std::memcpy(dst.data(), src.data(), bytes);
        us.push_back(Us(Clock::now() - t0));
      }
      return Summarize(us).p50;
    };
    const double warm = after(absl::Milliseconds(1));
    const double cold = after(absl::Milliseconds(30));
    std::printf(
        "a 16MiB copy into memory last written 1 ms before: %.0f us; 30 ms "
        "before: %.0f us (%.2fx)\n",
        warm, cold, cold / warm);
  }
  std::printf("%-8s %12s %14s %8s %10s %10s %12s %12s %14s %12s\n", "size",
              "lifecycle us", "1 RTT+copy us", "ratio", "put us", "copy us",
              "put/(copy+5)", "pool copy us", "put/(pool+5)", "get held us");
  for (uint64_t bytes : LifecycleSizes()) {
    std::vector<uint8_t> src(bytes, 0xab), dst(bytes, 0);
    const int n = bytes >= (16u << 20) ? std::max(iters / 8, 20) : iters;
    // Each lifecycle's parts, timed apart: where its time goes beyond the
    // round trip (the put's copy and stock take, the get's round trip, the
    // hand-off of the view's release to the writer thread, the ring post of
    // the ref's).
    std::vector<double> part_put, part_get, part_view, part_ref;
    auto lifecycle = [&] {
      const auto t0 = Clock::now();
      shmtensor::SealedRef ref =
          Check(producer.Put(src.data(), {.size_bytes = bytes}), "put");
      const auto t1 = Clock::now();
      std::optional<shmtensor::View> v = Check(consumer.Get(ref.ref()), "get");
      const auto t2 = Clock::now();
      if (static_cast<const uint8_t*>(v->data())[bytes - 1] != 0xab) {
        Die("verify", absl::DataLossError("bytes differ"));
      }
      v.reset();
      const auto t3 = Clock::now();
      ref.Reset();
      const auto t4 = Clock::now();
      part_put.push_back(Us(t1 - t0));
      part_get.push_back(Us(t2 - t1));
      part_view.push_back(Us(t3 - t2));
      part_ref.push_back(Us(t4 - t3));
    };
    for (int i = 0; i < 20; ++i) lifecycle();
    for (auto* part : {&part_put, &part_get, &part_view, &part_ref}) {
      part->clear();  // The warm-up's.
    }
    // The copy-in speed of a mapped pool buffer (item 4's bound): CopyFrom
    // into one buffer held open, faulted in.
    shmtensor::Buffer pool_buf = Check(
        producer.Create({.size_bytes = bytes, .name = "pool-copy"}), "create");
    Check(pool_buf.CopyFrom(src.data(), bytes), "copy");
    std::vector<double> life, bound, put, copy, held, pool_copy;
    long put_faults = 0;
    shmtensor::internal::PoolMapping* mapping =
        Check(pool_buf.lease()->core().Mapping(
                  pool_buf.lease()->placement().pool_id()),
              "mapping");
    const uint64_t protects0 = mapping->protect_calls();
    // The bound in the lifecycle's order: the copy, then the round trip
    // that tells the other side (a copy larger than the caches leaves the
    // round trip's code and data cold, in the bound as in the lifecycle).
    // Each appends its time in us.
    auto time_bound = [&](std::vector<double>& us) {
      const auto t0 = Clock::now();
      std::memcpy(dst.data(), src.data(), bytes);
      bare.Once();
      us.push_back(Us(Clock::now() - t0));
    };
    auto time_lifecycle = [&](std::vector<double>& us) {
      const auto t0 = Clock::now();
      lifecycle();
      us.push_back(Us(Clock::now() - t0));
    };
    for (int i = 0; i < n; ++i) {
      time_bound(bound);
      time_lifecycle(life);
      auto t0 = Clock::now();
      std::memcpy(dst.data(), src.data(), bytes);
      auto t1 = Clock::now();
      copy.push_back(Us(t1 - t0));
      t0 = Clock::now();
      Check(pool_buf.CopyFrom(src.data(), bytes), "copy");
      t1 = Clock::now();
      pool_copy.push_back(Us(t1 - t0));
      const long faults0 = MinorFaults();
      t0 = Clock::now();
      shmtensor::SealedRef ref =
          Check(producer.Put(src.data(), {.size_bytes = bytes}), "put");
      t1 = Clock::now();
      put_faults += MinorFaults() - faults0;
      put.push_back(Us(t1 - t0));
      shmtensor::View first = Check(consumer.Get(ref.ref()), "get");
      t0 = Clock::now();
      shmtensor::View again = Check(consumer.Get(ref.ref()), "get held");
      t1 = Clock::now();
      held.push_back(Us(t1 - t0));
    }
    const double l = Summarize(life).p50, b = Summarize(bound).p50,
                 p = Summarize(put).p50, c = Summarize(copy).p50,
                 pc = Summarize(pool_copy).p50;
    std::printf(
        "%-8s %12.1f %14.1f %8.2f %10.1f %10.1f %12.2f %12.1f %14.2f "
        "%12.2f\n",
        SizeName(bytes).c_str(), l, b, l / b, p, c, p / (c + 5), pc,
        p / (pc + 5), Summarize(held).p50);
    std::printf(
        "         lifecycle's parts, p50: put %.1f us, get %.1f us, the view's "
        "release %.1f us, the ref's release %.1f us\n",
        Summarize(part_put).p50, Summarize(part_get).p50,
        Summarize(part_view).p50, Summarize(part_ref).p50);
    std::printf("         put: %.2f minor faults, %.2f mprotect per put\n",
                double(put_faults) / n,
                double(mapping->protect_calls() - protects0) / n);
    if (bytes >= (uint64_t{16} << 20)) {
      // The loop above writes the bound's destination twice an iteration
      // (the bound's copy and the copy alone), and each of the stock's
      // ranges, which take turns, once in one or two: at this size an
      // iteration is ~10 ms, and on the dev VM memory not written for that
      // long costs more to write (the probe above). The lifecycle and its
      // bound alone, in turn, each writing its destination every few ms:
      std::vector<double> alone_life, alone_bound;
      for (int i = 0; i < n; ++i) {
        time_bound(alone_bound);
        time_lifecycle(alone_life);
      }
      const double al = Summarize(alone_life).p50,
                   ab = Summarize(alone_bound).p50;
      std::printf(
          "         alone, in turn: lifecycle %.1f us, 1 RTT+copy %.1f us, "
          "ratio %.2f\n",
          al, ab, al / ab);
    }
  }
  // Puts back to back, each ref dropped at once (a producer that puts as
  // fast as it can): what the stock's refill keeps up with. A put the
  // stock cannot serve makes its buffer in a round trip, which shows in
  // the tail and the mean, not in the median.
  // A handle on the producer's session (its stock's counters).
  shmtensor::Buffer probe = Check(
      producer.Create({.size_bytes = 4096, .name = "stock-probe"}), "create");
  for (uint64_t bytes :
       {uint64_t{4} << 10, uint64_t{64} << 10, uint64_t{1} << 20}) {
    std::vector<uint8_t> src(bytes, 0x5a), dst(bytes, 0);
    std::vector<double> put, copy;
    const int n = bytes >= (uint64_t{1} << 20) ? std::max(iters, 200)
                                               : std::max(iters * 10, 2000);
    // What the daemon made for the stock over the timed puts: a buffer per
    // put, unless calls for the same class overlap and bring surplus.
    const shmtensor::internal::Stock* stock = probe.lease()->core().stock();
    uint64_t made0 = 0;
    // The CPU the puts cost the daemon and this process (all its threads:
    // the producer's, its writer's and its stock's refills), over the timed
    // puts: on this VM's 2 CPUs, their sum over 2 bounds the mean from
    // below when the puts outrun the daemon.
    double daemon_cpu0 = 0, own_cpu0 = 0;
    for (int i = 0; i < n + 500; ++i) {
      if (i == 500) {
        if (stock != nullptr) made0 = stock->made();
        daemon_cpu0 = daemon.CpuUs();
        own_cpu0 = ProcessCpuUs();
      }
      auto t0 = Clock::now();
      Check(producer.Put(src.data(), {.size_bytes = bytes}), "put");
      auto t1 = Clock::now();
      std::memcpy(dst.data(), src.data(), bytes);
      auto t2 = Clock::now();
      if (i < 500) continue;  // The stock grows to its size first.
      put.push_back(Us(t1 - t0));
      copy.push_back(Us(t2 - t1));
    }
    const double daemon_cpu = (daemon.CpuUs() - daemon_cpu0) / n;
    const double own_cpu = (ProcessCpuUs() - own_cpu0) / n;
    const Summary p = Summarize(put);
    const double c = Summarize(copy).p50;
    std::printf(
        "%d puts of %s back to back: p50 %.1f us, p90 %.1f, p99 %.1f, mean "
        "%.1f; copy alone %.1f us; mean/(copy+5) %.2f; stock buffers made a "
        "put %.2f; CPU a put: daemon %.1f us, this process (copy alone "
        "included) %.1f us\n",
        n, SizeName(bytes).c_str(), p.p50, p.p90, p.p99, p.mean, c,
        p.mean / (c + 5),
        stock == nullptr ? 0.0 : double(stock->made() - made0) / n, daemon_cpu,
        own_cpu);
  }
  for (uint64_t bytes : {uint64_t{4} << 10, uint64_t{64} << 10}) {
    std::vector<std::vector<uint8_t>> data(64,
                                           std::vector<uint8_t>(bytes, 0xcd));
    std::vector<shmtensor::PutItem> items(64);
    for (size_t k = 0; k < items.size(); ++k) {
      items[k].data = data[k].data();
      items[k].options.size_bytes = bytes;
    }
    std::vector<double> many, put_many, one_rtt;
    for (int i = 0; i < std::max(iters / 10, 20); ++i) {
      auto t0 = Clock::now();
      std::vector<shmtensor::SealedRef> refs =
          Check(producer.PutMany(items), "put_many");
      auto t1 = Clock::now();
      put_many.push_back(Us(t1 - t0));
      std::vector<shmtensor::ObjectRef> wanted;
      for (const auto& r : refs) wanted.push_back(r.ref());
      t0 = Clock::now();
      bare.Once();
      t1 = Clock::now();
      one_rtt.push_back(Us(t1 - t0));
      t0 = Clock::now();
      std::vector<absl::StatusOr<shmtensor::View>> views =
          consumer.GetMany(wanted);
      t1 = Clock::now();
      for (const auto& v : views) Check(v.status(), "get_many");
      many.push_back(Us(t1 - t0));
    }
    const double m = Summarize(many).p50, r = Summarize(one_rtt).p50;
    std::printf(
        "get_many(64 x %s): p50 %.1f us = %.2f round trips (bare RTT %.1f "
        "us); put_many(64): p50 %.1f us\n",
        SizeName(bytes).c_str(), m, m / r, r, Summarize(put_many).p50);
  }
  {
    // What a put's one-way seal pays to send its message (an empty
    // ReleaseLeases, no seal, no release): posted in the session's release
    // ring, or, without one, handed to the writer thread. Back to back, and
    // after the writer's CPU idled for a while (a hand-off to the writer
    // then pays the cross-CPU wake-up of an idle CPU, which on a VM grows
    // with how long that CPU idled, as a put of a larger object lets it; a
    // ring post wakes nobody).
    shmtensor::Buffer b =
        Check(producer.Create({.size_bytes = 4096, .name = "stream-probe"}),
              "create");
    shmtensor::internal::ClientCore& core = b.lease()->core();
    std::printf("a one-way seal's message (%s):",
                core.has_release_ring() ? "posted in the release ring"
                                        : "handed to the writer thread");
    for (int idle_us : {0, 100, 1000}) {
      std::vector<double> writes;
      for (int i = 0; i < iters; ++i) {
        if (idle_us > 0) {
          // Busy, as a copy is, so that only the writer's CPU idles.
          const auto until = Clock::now() + std::chrono::microseconds(idle_us);
          while (Clock::now() < until) {
          }
        }
        const auto t0 = Clock::now();
        Check(core.SendSeals({}), "stream write");
        writes.push_back(Us(Clock::now() - t0));
      }
      std::printf(" p50 %.1f us (%d us since the last)", Summarize(writes).p50,
                  idle_us);
      if (idle_us == 0) std::printf(",");
    }
    std::printf("\n");
  }
  std::printf(
      "(ratio: lifecycle over 1 RTT + copy, goal <= 1.2; put/(copy+5): goal "
      "<= 1.2; get held: goal <= 5 us; get_many: goal <= 2 round trips; the "
      "round trip is the bare one, measured in each loop)\n");
}

int main(int argc, char** argv) {
  bool quick = false, monitoring_only = false, huge = true, fast_only = false;
  std::string huge_dir;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    quick |= a == "--quick";
    monitoring_only |= a == "--monitoring";
    fast_only |= a == "--fast-path";
    huge &= a != "--no-huge";
    if (a == "--huge-dir" && i + 1 < argc) huge_dir = argv[++i];
  }
  std::unique_ptr<DaemonProcess> daemon_process = StartDaemon("2GiB", "");
  const DaemonProcess& daemon = *daemon_process;
  Client client = Check(
      Client::Connect({.address = daemon.address(), .client_name = "bench"}),
      "connect");
  std::printf("shmtensor lifecycle benchmark%s (daemon %s)\n",
              quick ? " --quick" : "", daemon.address().c_str());
  if (fast_only) {
    BenchFastPath(daemon, quick ? 200 : 2000);
    return 0;
  }
  if (!monitoring_only) {
    std::vector<Target> targets = {{"memfd (4 KiB pages)", "", &client}};
    // The same daemon with its pool on a tmpfs mounted huge=always (2 MiB
    // pages), side by side: mounted here for the run when we may, or the
    // directory given with --huge-dir.
    std::unique_ptr<shmtensor::testing::ScopedTmpfs> tmpfs;
    std::unique_ptr<DaemonProcess> huge_daemon;
    std::optional<Client> huge_client;
    if (huge && huge_dir.empty()) {
      absl::StatusOr<std::unique_ptr<shmtensor::testing::ScopedTmpfs>> t =
          shmtensor::testing::ScopedTmpfs::Mount(
              "huge=always,size=2200m,mode=0700");
      if (t.ok()) {
        tmpfs = *std::move(t);
        huge_dir = tmpfs->path();
      } else {
        std::printf("no huge-page pool in this run: %s\n",
                    t.status().ToString().c_str());
      }
    }
    if (huge && !huge_dir.empty()) {
      huge_daemon = StartDaemon("2GiB", huge_dir);
      huge_client = Check(Client::Connect({.address = huge_daemon->address(),
                                           .client_name = "bench-huge"}),
                          "connect");
      const uint64_t page =
          Check(huge_client->Stats(), "stats").pools[0].huge_page_size;
      if (page == 0) {
        std::printf("%s gives no huge pages; no huge-page pool in this run\n",
                    huge_dir.c_str());
      } else {
        targets.push_back(
            {absl::StrFormat("a huge=always tmpfs (%d KiB pages)", page >> 10),
             huge_dir, &*huge_client});
      }
    }
    for (const Target& t : targets) BenchLifecycle(t, quick ? 200 : 2000);
    for (const Target& t : targets) BenchCopyIn(t, quick ? 8 : 40);
    BenchScale(daemon, client, quick ? 200 : 2000, 64, 10000);
    BenchMonitoring(daemon, quick ? 3 : 8, quick ? 1.0 : 2.0);
    // Before section 5, which marks the memory data() pointed into.
    BenchFastPath(daemon, quick ? 200 : 2000);
    for (const Target& t : targets) {
      BenchPointerLifecycle(t, quick ? 200 : 2000);
    }
    BenchClearing(quick ? 5 : 40);
    return 0;
  }
  BenchMonitoring(daemon, quick ? 3 : 8, quick ? 1.0 : 2.0);
  return 0;
}
