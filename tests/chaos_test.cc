// Chaos: producers and consumers pass objects by ref, by name and by
// exclusive hand-off while a random one of them is SIGKILLed every second
// and the living ones keep losing their connections (a shutdown socket,
// bytes that are no HTTP/2). Every byte a consumer reads is checked against
// the pattern its producer wrote, and every view is checked again just
// before it is dropped. The promise: no mismatch, ever; and once the last
// process is killed, the daemon holds nothing of theirs within a second.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <map>
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
#include "tests/test_util.h"

namespace shmtensor {
namespace {

using testing::Subprocess;

class ChaosTest : public testing::DaemonTest {
 protected:
  std::vector<std::string> DaemonArgs() override {
    return {"--pool-size", "128MiB"};
  }
  v1::DaemonStatus Status() {
    return testing::MonitorStatus(daemon_->address());
  }
  std::vector<std::string> Names() {
    const v1::ListObjectsResponse r =
        testing::MonitorObjects(daemon_->address());
    std::vector<std::string> names;
    for (const v1::ObjectStatus& o : r.objects()) {
      if (!o.name().empty()) names.push_back(o.name());
    }
    return names;
  }
};

struct Role {
  std::string kind;  // "producer" or "consumer".
  int id = 0;
  std::unique_ptr<Subprocess> process;
  uint64_t checked = 0;  // Last report of a consumer.
};

TEST_F(ChaosTest, KilledAndDisconnectedClientsNeverReadAnotherObjectsBytes) {
  const std::string log =
      absl::StrCat("/tmp/shmtensor-chaos-", getpid(), ".log");
  unlink(log.c_str());
  int next_id = 0;
  auto spawn = [&](Role& r) {
    r.id = next_id++;
    absl::StatusOr<std::unique_ptr<Subprocess>> p =
        Subprocess::Spawn({SHMTENSOR_HARDENING_CHILD_PATH, r.kind,
                           daemon_->address(), log, std::to_string(r.id)});
    ASSERT_TRUE(p.ok()) << p.status();
    r.process = *std::move(p);
    r.checked = 0;
  };
  std::vector<Role> roles(6);
  for (size_t i = 0; i < roles.size(); ++i) {
    roles[i].kind = i < 3 ? "producer" : "consumer";
    spawn(roles[i]);
  }
  uint64_t checked = 0, kills = 0;
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
                 absl::StartsWith(*line, "CHANGED") ||
                 absl::StartsWith(*line, "error")) {
        mismatches.push_back(*line);
      }
    }
  };
  std::mt19937 rng(getpid());
  const absl::Time end = absl::Now() + absl::Seconds(20);
  while (absl::Now() < end) {
    absl::SleepFor(absl::Seconds(1));
    for (Role& r : roles) drain(r);
    Role& victim = roles[rng() % roles.size()];
    victim.process->Signal(SIGKILL);
    victim.process->Wait();
    drain(victim);
    checked += victim.checked;
    ++kills;
    spawn(victim);
  }
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
  for (const std::string& name : Names()) {
    EXPECT_TRUE(client_->Delete(name).ok()) << name;
  }
  v1::DaemonStatus s = Status();
  while (absl::Now() - last_kill < absl::Seconds(1) &&
         (s.leases() != 0 || s.objects() != 0 || s.sessions() != 1)) {
    absl::SleepFor(absl::Milliseconds(20));
    s = Status();
  }
  EXPECT_EQ(s.leases(), 0u);
  EXPECT_EQ(s.objects(), 0u);
  EXPECT_EQ(s.pools(0).used_bytes(), 0u);
  EXPECT_EQ(s.sessions(), 1u);  // The fixture's client.
  EXPECT_EQ(s.detached_sessions(), 0u);
  std::printf("chaos: %llu objects checked, %llu kills, %zu mismatches\n",
              static_cast<unsigned long long>(checked),
              static_cast<unsigned long long>(kills), mismatches.size());
  unlink(log.c_str());
}

}  // namespace
}  // namespace shmtensor
