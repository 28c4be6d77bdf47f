// Users of one daemon against each other (docs/pitfalls.md P20, P21): a
// process that gets a dead client's pid never acts for its session, and
// bytes one user wrote never reach another. Real uids (setresuid) and real
// pid reuse (the kernel's ns_last_pid, as an unprivileged user cycling pids
// would get it), so the tests need root and skip without it.
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "shmtensor/client.h"
#include "shmtensor/v1/monitor.pb.h"
#include "tests/test_util.h"

namespace shmtensor {
namespace {

using testing::DaemonProcess;
using testing::Subprocess;

constexpr int kUserA = 65520;  // Both in the pool's `users`.
constexpr int kUserB = 65521;
constexpr int kStranger = 65532;  // On no list.
constexpr uint64_t kMiB = 1 << 20;

class TenancyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to become other users";
    absl::StatusOr<std::unique_ptr<DaemonProcess>> d =
        DaemonProcess::StartShared(absl::StrCat(
            "[[pool]]\nname = \"default\"\nsize = \"16MiB\"\nusers = [", kUserA,
            ", ", kUserB, "]\n"));
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    address_ = daemon_->address();
    absl::StatusOr<Client> c = Client::Connect({.address = address_});
    ASSERT_TRUE(c.ok()) << c.status();
    client_.emplace(*std::move(c));
  }
  void TearDown() override {
    client_.reset();
    daemon_.reset();
  }

  static std::unique_ptr<Subprocess> Spawn(std::vector<std::string> args) {
    args.insert(args.begin(), SHMTENSOR_HARDENING_CHILD_PATH);
    absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn(args);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : nullptr;
  }
  // `args` started as a process whose pid is `pid`, or null when the kernel
  // gave the pid to someone else first every time.
  static std::unique_ptr<Subprocess> SpawnWithPid(
      pid_t pid, std::vector<std::string> args) {
    for (int attempt = 0; attempt < 50; ++attempt) {
      std::ofstream("/proc/sys/kernel/ns_last_pid") << pid - 1;
      std::unique_ptr<Subprocess> p = Spawn(args);
      if (p != nullptr && p->pid() == pid) return p;
    }
    return nullptr;
  }
  uint64_t Used() {
    return testing::MonitorStatus(address_).pools(0).used_bytes();
  }

  std::string address_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::optional<Client> client_;
};

// [P20] A client loses its connection (its session waits for it, detached),
// then dies; before the daemon's reaper sees it, a process with the same pid
// resumes the session with the leaked session id and uses it. The process
// is another user (who may use no pool at all) or the same user (another
// process). Every try is refused.
TEST_F(TenancyTest, APidHandedOutAgainNeverActsForTheDeadProcessesSession) {
  int rounds = 0;
  std::vector<std::string> breaches;
  for (int round = 0; round < 8; ++round) {
    client_->Delete("victim").IgnoreError();
    std::unique_ptr<Subprocess> victim =
        Spawn({"--uid", absl::StrCat(kUserA), "victim", address_, "break"});
    ASSERT_NE(victim, nullptr);
    absl::StatusOr<std::string> ready = victim->ReadLine();
    ASSERT_TRUE(ready.ok() && absl::StartsWith(*ready, "ready")) << *ready;
    ASSERT_EQ(*victim->ReadLine(), "broken");
    const std::vector<std::string> f = absl::StrSplit(*ready, ' ');
    const pid_t pid = victim->pid();
    victim->Signal(SIGKILL);
    victim->Wait();
    const int uid = round % 2 == 0 ? kStranger : kUserA;
    std::unique_ptr<Subprocess> attacker = SpawnWithPid(
        pid, {"--uid", absl::StrCat(uid), "resume", address_, f[1]});
    if (attacker == nullptr) continue;
    ++rounds;
    const std::string out = attacker->ReadAll();
    if (!absl::StrContains(out, "refused: ") ||
        !absl::StrContains(out, "accepted 0 refused 3")) {
      breaches.push_back(absl::StrCat("uid ", uid, ": ", out));
    }
  }
  EXPECT_GT(rounds, 0) << "never got a dead victim's pid";
  EXPECT_TRUE(breaches.empty()) << absl::StrJoin(breaches, "\n");
}

// [P21] User A fills the pool with 0x5A and leaves (exclusive hand-offs
// nobody takes, reclaimed when it exits); user B, also a writer of the pool,
// then gets all of that memory: every byte is zero.
TEST_F(TenancyTest, BytesOneUserWroteNeverReachAnother) {
  for (uint64_t size : {kMiB, 3 * kMiB, 4 * kMiB, 8 * kMiB - 4096}) {
    std::unique_ptr<Subprocess> a =
        Spawn({"--uid", absl::StrCat(kUserA), "leave", address_,
               absl::StrCat(size), "90"});
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(*a->ReadLine(), "sealed");
    a->Wait();
  }
  for (int i = 0; i < 200 && Used() != 0; ++i) usleep(10000);
  ASSERT_EQ(Used(), 0u);
  std::unique_ptr<Subprocess> b = Spawn({"--uid", absl::StrCat(kUserB), "fresh",
                                         address_, absl::StrCat(16 * kMiB)});
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(*b->ReadLine(), "zero");
  // What it cost, as operators see it: every byte A had been given (its
  // objects reused one another's ranges: the largest covers them all).
  EXPECT_GE(testing::MonitorStatus(address_).pools(0).cleared_bytes(),
            8 * kMiB - 4096);
}

// [P23] A uid that may write its pool sends layouts the daemon's ledger
// record cannot hold; another uid's named object and view are in the same
// ledger. The attacker's Creates are refused, the daemon stays up, and a
// take-over (whose successor adopts the ledger) keeps the other uid's
// object. On the old code both Creates were stored, and the successor
// refused the whole ledger: the victim's name was gone.
TEST_F(TenancyTest, AnotherUidsLayoutNeverSpoilsTheLedger) {
  std::unique_ptr<Subprocess> victim =
      Spawn({"--uid", absl::StrCat(kUserB), "victim", address_});
  ASSERT_NE(victim, nullptr);
  absl::StatusOr<std::string> ready = victim->ReadLine();
  ASSERT_TRUE(ready.ok() && absl::StartsWith(*ready, "ready")) << *ready;
  std::unique_ptr<Subprocess> attacker =
      Spawn({"--uid", absl::StrCat(kUserA), "junk-layout", address_});
  ASSERT_NE(attacker, nullptr);
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::string> line = attacker->ReadLine();
    ASSERT_TRUE(line.ok()) << line.status();
    EXPECT_TRUE(absl::StartsWith(*line, "code 3: ")) << *line;  // INVALID_ARG
    EXPECT_TRUE(absl::StrContains(*line, "layout")) << *line;
  }
  // A take-over: the successor adopts the ledger.
  client_.reset();
  const std::string config = ::testing::TempDir() + "/tenancy_takeover.toml";
  std::ofstream(config) << "socket_mode = \"0666\"\n[[pool]]\nname = "
                           "\"default\"\nsize = \"16MiB\"\nusers = ["
                        << kUserA << ", " << kUserB << "]\n";
  absl::StatusOr<std::unique_ptr<DaemonProcess>> next =
      DaemonProcess::Start({"--config", config, "--take-over"}, address_);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(daemon_->process().Wait(), 0);
  // Kept to the end: its destructor removes what it left at the address.
  std::unique_ptr<DaemonProcess> predecessor = std::move(daemon_);
  daemon_ = *std::move(next);
  absl::StatusOr<View> v = absl::UnavailableError("not yet");
  for (int i = 0; i < 2; ++i) {  // A first call may meet the old connection.
    absl::StatusOr<Client> c = Client::Connect({.address = address_});
    if (!c.ok()) {
      v = c.status();
      continue;
    }
    v = c->Get("victim");
    client_.emplace(*std::move(c));
    if (v.ok()) break;
  }
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(static_cast<const uint8_t*>(v->data())[(1 << 20) - 1], 0xAA);
  attacker->Signal(SIGKILL);
  attacker->Wait();
  victim->Signal(SIGKILL);
  victim->Wait();
}

// [P24] One uid fills what it may of every table the daemon shares (object
// records with zero-byte objects, pins with offers of one view), then waits;
// the other uid's puts and fork holds go on. On the old code the flood took
// every object record and the victim's put failed LimitExceeded (and
// max_pins_per_uid was an unknown key).
TEST(TenancySharesTest, OneUidsTablesLeaveTheOtherUidsShare) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to become other users";
  absl::StatusOr<std::unique_ptr<DaemonProcess>> d = DaemonProcess::StartShared(
      absl::StrCat("[[pool]]\nname = \"default\"\nsize = \"16MiB\"\nusers = [",
                   kUserA, ", ", kUserB,
                   "]\n[limits]\nmax_objects = 64\nmax_pins_per_uid = 32\n"));
  ASSERT_TRUE(d.ok()) << d.status();
  const std::string address = (*d)->address();
  auto spawn = [](std::vector<std::string> args) {
    args.insert(args.begin(), SHMTENSOR_HARDENING_CHILD_PATH);
    return *Subprocess::Spawn(args);
  };
  std::unique_ptr<Subprocess> flood =
      spawn({"--uid", absl::StrCat(kUserA), "flood", address});
  absl::StatusOr<std::string> objects = flood->ReadLine();
  ASSERT_TRUE(objects.ok()) << objects.status();
  EXPECT_TRUE(absl::StartsWith(*objects, "objects 32: ")) << *objects;
  EXPECT_TRUE(absl::StrContains(*objects, "limits.max_objects_per_uid = 32"))
      << *objects;
  absl::StatusOr<std::string> offers = flood->ReadLine();
  ASSERT_TRUE(offers.ok()) << offers.status();
  EXPECT_TRUE(absl::StartsWith(*offers, "offers 32: ")) << *offers;
  EXPECT_TRUE(absl::StrContains(*offers, "limits.max_pins_per_uid = 32"))
      << *offers;
  // The other uid: puts, and a fork whose hold is granted.
  std::unique_ptr<Subprocess> victim =
      spawn({"--uid", absl::StrCat(kUserB), "forked", address});
  absl::StatusOr<std::string> forked = victim->ReadLine();
  ASSERT_TRUE(forked.ok() && absl::StartsWith(*forked, "forked "))
      << forked.status() << *forked;
  const v1::DaemonStatus st = testing::MonitorStatus(address);
  EXPECT_EQ(st.fork_holds(), 1u);
  EXPECT_EQ(st.offers(), 32u);
  // Each uid's use, against its share, for operators.
  bool saw_flood = false;
  for (const v1::UidUsage& u : st.uids()) {
    if (u.uid() == static_cast<uint32_t>(kUserA)) {
      saw_flood = true;
      EXPECT_EQ(u.objects(), 32u);
      EXPECT_EQ(u.pins(), 32u);
    }
  }
  EXPECT_TRUE(saw_flood);
  EXPECT_EQ(st.limits().max_objects_per_uid(), 32u);
  const pid_t child = std::stoi(forked->substr(7));
  kill(child, SIGKILL);
  victim->Signal(SIGKILL);
  victim->Wait();
  flood->Signal(SIGKILL);
  flood->Wait();
}

}  // namespace
}  // namespace shmtensor
