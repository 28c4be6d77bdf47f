// Chaos: producers and consumers pass objects by ref, by name and by
// exclusive hand-off while a random one of them is SIGKILLed every second
// and the living ones keep losing their connections (a shutdown socket,
// bytes that are no HTTP/2). Every byte a consumer reads is checked against
// the pattern its producer wrote, and every view is checked again just
// before it is dropped. Run as root, half of the processes are another user
// of the same pool, and every new buffer a producer gets is checked for the
// other user's bytes [P21]. A second run does all that while the daemon
// itself is replaced after each round (a SIGKILL and a restart through its
// descriptor store, or a take-over, in turn; a reload every fifth round).
// The promise: no mismatch and no session ended, ever; and once the last
// process is killed, the daemon holds nothing of theirs within a second.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "shmtensor/client.h"
#include "shmtensor/v1/monitor.grpc.pb.h"
#include "testing/cpp/fd_store.h"
#include "tests/test_util.h"

namespace shmtensor {
namespace {

using testing::DaemonProcess;
using testing::Subprocess;

// The second user, in the pool's `users` (root is the first).
constexpr int kOtherUser = 65522;

std::string PoolsToml() {
  return absl::StrCat(
      "[[pool]]\nname = \"default\"\nsize = \"128MiB\"\nusers = [", kOtherUser,
      "]\n");
}

class ChaosTest : public ::testing::Test {
 protected:
  void SetUp() override { two_uids_ = geteuid() == 0; }
  // A daemon others may reach (DaemonProcess::StartShared), and the
  // fixture's client of it.
  void StartDaemon() {
    absl::StatusOr<std::unique_ptr<DaemonProcess>> d =
        DaemonProcess::StartShared(PoolsToml());
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    address_ = daemon_->address();
    Connect();
  }
  // The same, run as systemd runs the unit (testing/cpp/fd_store.h): its
  // config kept for its successors, its descriptors stored.
  void StartDaemonUnderStore() {
    address_ = testing::FreshAddress();
    socket_dir_ = address_.substr(5, address_.rfind('/') - 5);
    ASSERT_EQ(mkdir(socket_dir_.c_str(), 0755), 0);
    ASSERT_EQ(chmod(socket_dir_.c_str(), 0755), 0);
    config_ = socket_dir_ + ".toml";
    std::ofstream(config_) << "socket_mode = \"0666\"\n" << PoolsToml();
    systemd_.emplace();
    ASSERT_TRUE(systemd_->Start(DaemonArgs()).ok());
    ASSERT_TRUE(systemd_->WaitReady()) << systemd_->Log();
    Connect();
  }
  std::vector<std::string> DaemonArgs() const {
    return {"--config", config_, "--listen", address_};
  }
  void Connect() {
    absl::StatusOr<Client> c = Client::Connect({.address = address_});
    ASSERT_TRUE(c.ok()) << c.status();
    client_.emplace(*std::move(c));
  }
  void TearDown() override {
    client_.reset();
    daemon_.reset();
    if (systemd_.has_value()) {
      systemd_.reset();
      const std::string path = address_.substr(5);
      for (const char* suffix : {"", ".fd", ".lock"}) {
        unlink((path + suffix).c_str());
      }
      rmdir(socket_dir_.c_str());
      unlink(config_.c_str());
    }
  }
  // Replaces the daemon the clients use, in the way `round` picks: a
  // SIGKILL and a restart with the stored descriptors, a reload (SIGHUP),
  // or a take-over by a successor. Returns what it did.
  std::string Restart(uint64_t round) {
    // A reload now and then, on top.
    if (round % 5 == 4) {
      kill(systemd_->pid(), SIGHUP);
      EXPECT_TRUE(systemd_->WaitReady()) << systemd_->Log();
      ++reloads_;
    }
    if (round % 2 == 0) {
      systemd_->Kill();
      EXPECT_TRUE(systemd_->Start(DaemonArgs()).ok());
    } else {
      EXPECT_TRUE(systemd_->StartSuccessor(DaemonArgs()).ok());
    }
    EXPECT_TRUE(systemd_->WaitReady()) << systemd_->Log();
    return round % 2 == 0 ? "SIGKILL" : "take-over";
  }
  // The chaos run, with the daemon replaced each round when `restarts`.
  void Run(bool restarts);
  v1::DaemonStatus Status() { return testing::MonitorStatus(address_); }
  std::vector<std::string> Names() {
    const v1::ListObjectsResponse r = testing::MonitorObjects(address_);
    std::vector<std::string> names;
    for (const v1::ObjectStatus& o : r.objects()) {
      if (!o.name().empty()) names.push_back(o.name());
    }
    return names;
  }

  bool two_uids_ = false;
  std::string address_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::optional<testing::FdStore> systemd_;
  int reloads_ = 0;
  std::string socket_dir_;
  std::string config_;
  std::optional<Client> client_;
};

struct Role {
  std::string kind;  // "producer" or "consumer".
  int id = 0;
  std::unique_ptr<Subprocess> process;
  uint64_t checked = 0;    // Last report of a consumer.
  bool other_uid = false;  // Runs as kOtherUser.
};

void ChaosTest::Run(bool restarts) {
  const std::string log =
      absl::StrCat("/tmp/shmtensor-chaos-", getpid(), ".log");
  unlink(log.c_str());
  // Both users append to it.
  close(open(log.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
  chmod(log.c_str(), 0666);
  int next_id = 0;
  auto spawn = [&](Role& r) {
    r.id = next_id++;
    std::vector<std::string> argv = {SHMTENSOR_HARDENING_CHILD_PATH};
    if (r.other_uid) {
      argv.insert(argv.end(), {"--uid", std::to_string(kOtherUser)});
    }
    argv.insert(argv.end(), {r.kind, address_, log, std::to_string(r.id)});
    absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn(argv);
    ASSERT_TRUE(p.ok()) << p.status();
    r.process = *std::move(p);
    r.checked = 0;
  };
  std::vector<Role> roles(6);
  for (size_t i = 0; i < roles.size(); ++i) {
    roles[i].kind = i < 3 ? "producer" : "consumer";
    roles[i].other_uid = two_uids_ && i % 2 == 1;
    spawn(roles[i]);
  }
  uint64_t checked = 0, kills = 0, daemon_restarts = 0;
  constexpr uint64_t kPinnedBytes = 64 << 10;
  struct Pinned {
    SealedRef ref;
    View view;
    uint8_t byte;
  };
  std::vector<Pinned> pinned;
  std::vector<std::string> mismatches;
  // Reads what a child said so far; consumers report "checked N bad M".
  auto drain = [&](Role& r) {
    while (true) {
      absl::StatusOr<std::string> line =
          r.process->ReadLine(absl::Milliseconds(10));
      if (!line.ok()) break;
      uint64_t n;
      std::vector<std::string> f = absl::StrSplit(*line, ' ');
      if (f.size() == 4 && f[0] == "checked" && absl::SimpleAtoi(f[1], &n)) {
        r.checked = n;
      } else if (absl::StartsWith(*line, "MISMATCH") ||
                 absl::StartsWith(*line, "ENDED") ||
                 absl::StartsWith(*line, "FOREIGN") ||
                 absl::StartsWith(*line, "CHANGED") ||
                 absl::StartsWith(*line, "error")) {
        mismatches.push_back(*line);
      }
    }
  };
  std::mt19937 rng(getpid());
  // 20 rounds of about a second each; a loaded machine gets up to a
  // minute for them (the count of kills, not the time, makes the test).
  const absl::Time end = absl::Now() + absl::Seconds(60);
  while (kills < 20 && absl::Now() < end) {
    absl::SleepFor(absl::Seconds(1));
    for (Role& r : roles) drain(r);
    Role& victim = roles[rng() % roles.size()];
    victim.process->Signal(SIGKILL);
    victim.process->Wait();
    drain(victim);
    checked += victim.checked;
    ++kills;
    spawn(victim);
    if (restarts) {
      // A ref and a view of the fixture's client made before each restart
      // resolve to their bytes after it, and after every later one.
      std::vector<uint8_t> bytes(kPinnedBytes, static_cast<uint8_t>(kills));
      absl::StatusOr<SealedRef> ref =
          client_->Put(bytes.data(), {.size_bytes = kPinnedBytes});
      ASSERT_TRUE(ref.ok()) << ref.status();
      absl::StatusOr<View> view = client_->Get(ref->ref());
      ASSERT_TRUE(view.ok()) << view.status();
      pinned.push_back(
          {*std::move(ref), *std::move(view), static_cast<uint8_t>(kills)});
      const std::string how = Restart(daemon_restarts++);
      // The first call may be the one in flight at the break (it resumes).
      (void)client_->Stats();
      ASSERT_TRUE(client_->Stats().ok()) << "after a " << how;
      for (const Pinned& p : pinned) {
        absl::StatusOr<View> again = client_->Get(p.ref.ref());
        ASSERT_TRUE(again.ok()) << "after a " << how << ": " << again.status();
        for (const View* v : {static_cast<const View*>(&*again), &p.view}) {
          const auto* b = static_cast<const uint8_t*>(v->data());
          if (b[0] != p.byte || b[kPinnedBytes - 1] != p.byte) {
            mismatches.push_back(
                absl::StrCat("pinned ", p.byte, " after a ", how));
          }
        }
      }
    }
  }
  pinned.clear();
  for (Role& r : roles) {
    drain(r);
    r.process->Signal(SIGKILL);
    r.process->Wait();
    drain(r);
    checked += r.checked;
  }
  const absl::Time last_kill = absl::Now();
  EXPECT_TRUE(mismatches.empty()) << absl::StrJoin(mismatches, "\n");
  // Enough traffic that a broken promise would have shown.
  EXPECT_GT(checked, 200u) << "consumers checked too few objects";
  EXPECT_GE(kills, 19u);
  // Names outlive their creators by design (Delete ends them): the ones
  // left by killed producers go here; the rest must go by itself.
  // (A name of a buffer its killed producer never sealed goes with the
  // producer's session, maybe between the listing and the delete.)
  for (const std::string& name : Names()) {
    const absl::Status deleted = client_->Delete(name);
    EXPECT_TRUE(deleted.ok() || absl::IsNotFound(deleted)) << deleted;
  }
  // The fixture's own stock (buffers granted ahead of its puts) goes with
  // its session: a new one holds nothing.
  client_.reset();
  Connect();
  v1::DaemonStatus s = Status();
  while (absl::Now() - last_kill < absl::Seconds(1) &&
         (s.leases() != 0 || s.objects() != 0 || s.sessions() != 1)) {
    absl::SleepFor(absl::Milliseconds(20));
    s = Status();
  }
  EXPECT_EQ(s.leases(), 0u);
  EXPECT_EQ(s.objects(), 0u)
      << testing::MonitorObjects(address_).DebugString().substr(0, 4000);
  EXPECT_EQ(s.pools(0).used_bytes(), 0u);
  EXPECT_EQ(s.sessions(), 1u);  // The fixture's client.
  EXPECT_EQ(s.detached_sessions(), 0u);
  // The two users did share memory: the check above had work to do.
  if (two_uids_) {
    EXPECT_GT(s.pools(0).cleared_bytes(), 0u);
  }
  if (restarts) {
    // 10 SIGKILL restarts, 10 take-overs, 4 reloads.
    EXPECT_GE(daemon_restarts, 19u);
    // Every client resumed each time: none was refused.
    EXPECT_FALSE(absl::StrContains(systemd_->Log(), "not adopting"))
        << systemd_->Log();
  }
  std::printf(
      "chaos: %llu objects checked, %llu kills, %s, %zu mismatches, %s, %llu "
      "bytes cleared between them\n",
      static_cast<unsigned long long>(checked),
      static_cast<unsigned long long>(kills),
      restarts ? absl::StrCat(daemon_restarts,
                              " daemon restarts (half SIGKILL, half "
                              "take-over) and ",
                              reloads_, " reloads")
                     .c_str()
               : "no daemon restart",
      mismatches.size(), two_uids_ ? "two uids" : "one uid (not root)",
      static_cast<unsigned long long>(s.pools(0).cleared_bytes()));
  unlink(log.c_str());
}

TEST_F(ChaosTest, KilledAndDisconnectedClientsNeverReadAnotherObjectsBytes) {
  StartDaemon();
  Run(/*restarts=*/false);
}

// The same, while the daemon itself is replaced after each round: SIGKILLed
// and restarted through its descriptor store, and taken over by a
// successor, in turn (10 each), with a reload in place every fifth round.
// The clients resume each time (a session that ended is a failure), a ref
// and a view made before each restart resolve to their bytes after every
// later one, and the promise holds across daemons.
TEST_F(ChaosTest, TheSameWhileTheDaemonIsKilledReloadedAndTakenOver) {
  StartDaemonUnderStore();
  Run(/*restarts=*/true);
}

}  // namespace
}  // namespace shmtensor
