// Who may map what (docs/shm_layout.md): per-pool access by uid and group,
// read-only clients the kernel keeps read-only, the descriptor socket under
// attack, and a client in a container's mount namespace. Real processes and
// real uids: the children drop to other users with setresuid, so most tests
// need root (CI runs as root) and skip without it.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "shmtensor/client.h"
#include "shmtensor/errors.h"
#include "tests/descriptor_probe.h"
#include "tests/test_util.h"

namespace shmtensor {
namespace {

using testing::DaemonProcess;
using testing::Subprocess;

// Not 65534 (nobody): that is also the uid SO_PEERCRED reports for a peer
// in a user namespace that maps no uid of the daemon's.
constexpr int kWriter = 65520;       // In the pool's `users`.
constexpr int kStranger = 65532;     // On no list.
constexpr int kGroupWriter = 65531;  // A member of `groups`' 4242.
constexpr int kReader = 65533;       // In `read_only_users`.
constexpr int kGroupReader = 65530;  // A member of `read_only_groups`' 4343.

// The child's output until "done" (or its end), as lines keyed by their
// first word.
std::map<std::string, std::string> Report(Subprocess& p) {
  std::map<std::string, std::string> out;
  while (true) {
    absl::StatusOr<std::string> line = p.ReadLine(absl::Seconds(30));
    if (!line.ok() || *line == "done") break;
    const size_t space = line->find(' ');
    out[line->substr(0, space)] =
        space == std::string::npos ? "" : line->substr(space + 1);
  }
  return out;
}

// Entries in /proc/PID/fd.
int OpenFds(pid_t pid) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(
           absl::StrCat("/proc/", pid, "/fd"))) {
    (void)e;
    ++n;
  }
  return n;
}

class AccessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to become other users";
    absl::StatusOr<std::unique_ptr<DaemonProcess>> d =
        DaemonProcess::StartShared(absl::StrCat(
            "[[pool]]\nname = \"default\"\nsize = \"", PoolSize(),
            "\"\nusers = [", kWriter, "]\ngroups = [4242]\n",
            "read_only_users = [", kReader, "]\nread_only_groups = [4343]\n",
            "[[pool]]\nname = \"private\"\nsize = \"8MiB\"\n"));
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    address_ = daemon_->address();
    absl::StatusOr<Client> c = Client::Connect({.address = address_});
    ASSERT_TRUE(c.ok()) << c.status();
    client_.emplace(*std::move(c));
    std::vector<uint8_t> bytes(4096, 0x42);
    ASSERT_TRUE(
        client_->Put(bytes.data(), {.size_bytes = 4096, .name = "shared"})
            .ok());
  }
  virtual std::string PoolSize() { return "64MiB"; }

  std::unique_ptr<Subprocess> Child(std::vector<std::string> args) {
    args.insert(args.begin(), SHMTENSOR_ACCESS_CHILD_PATH);
    absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn(args);
    EXPECT_TRUE(p.ok()) << p.status();
    return *std::move(p);
  }
  // `use` as `uid` with `groups`; the report, the child kept alive.
  std::map<std::string, std::string> Use(int uid, const std::string& groups,
                                         bool read_only = false) {
    std::vector<std::string> args = {"--uid", absl::StrCat(uid)};
    if (!groups.empty()) args.insert(args.end(), {"--groups", groups});
    args.insert(args.end(), {"use", address_});
    if (read_only) args.push_back("read_only");
    children_.push_back(Child(args));
    return Report(*children_.back());
  }

  std::string address_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::optional<Client> client_;
  std::vector<std::unique_ptr<Subprocess>> children_;
};

TEST_F(AccessTest, AUserInUsersReadsAndWritesAndSeesOnlyItsPools) {
  std::map<std::string, std::string> r = Use(kWriter, "");
  EXPECT_EQ(r["pools"], "default");  // Not "private": root's and ours only.
  EXPECT_EQ(r["fds"], "rdwr");
  EXPECT_EQ(r["put"], "ok");
  EXPECT_EQ(r["get"], "ok 66");
  EXPECT_EQ(r["private"], "error NOT_FOUND");  // A pool it cannot see.
}

TEST_F(AccessTest, AUidAllowedOnNoPoolIsRefusedNamingIt) {
  std::map<std::string, std::string> r = Use(kStranger, "");
  ASSERT_TRUE(r.count("connect")) << "connected";
  EXPECT_TRUE(absl::StartsWith(r["connect"], "error PERMISSION_DENIED"))
      << r["connect"];
  EXPECT_TRUE(
      absl::StrContains(r["connect"], absl::StrCat("uid ", kStranger, " (pid")))
      << r["connect"];
}

TEST_F(AccessTest, AMemberOfAGroupInGroupsReadsAndWrites) {
  // Its primary group is its own; 4242 is a supplementary one, which the
  // daemon learns from the kernel (SO_PEERGROUPS).
  std::map<std::string, std::string> r = Use(kGroupWriter, "4242");
  EXPECT_EQ(r["fds"], "rdwr");
  EXPECT_EQ(r["put"], "ok");
  EXPECT_EQ(r["get"], "ok 66");
  // Without the group it may use nothing.
  r = Use(kGroupWriter, "");
  EXPECT_TRUE(absl::StartsWith(r["connect"], "error PERMISSION_DENIED"))
      << r["connect"];
}

// A read-only user holds only O_RDONLY descriptors: no mapping of them can
// be made writable (mmap fails EACCES, and reopening one read-write through
// /proc fails too), its mappings have no write permission, and put fails.
TEST_F(AccessTest, AReadOnlyUserCanNeverMapThePoolWritable) {
  for (const auto& [uid, groups] : std::vector<std::pair<int, std::string>>{
           {kReader, ""}, {kGroupReader, "4343"}}) {
    SCOPED_TRACE(uid);
    std::map<std::string, std::string> r = Use(uid, groups);
    EXPECT_EQ(r["pools"], "default");
    EXPECT_EQ(r["fds"], "rdonly");
    EXPECT_EQ(r["mmap_write"], "EACCES");
    EXPECT_EQ(r["reopen_rdwr"], "EACCES");
    ASSERT_FALSE(r["maps"].empty());
    EXPECT_FALSE(absl::StrContains(r["maps"], "w")) << r["maps"];
    EXPECT_TRUE(absl::StartsWith(r["put"], "error PERMISSION_DENIED"))
        << r["put"];
    EXPECT_TRUE(absl::StrContains(r["put"], "may only read")) << r["put"];
    EXPECT_EQ(r["get"], "ok 66");  // Reading is what it may do.
  }
  // Operators see each session's uid and access.
  FILE* ctl = popen(
      absl::StrCat(SHMTENSOR_CTL_PATH, " --address ", address_, " clients 2>&1")
          .c_str(),
      "r");
  ASSERT_NE(ctl, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), ctl)) out.append(buf, n);
  pclose(ctl);
  EXPECT_TRUE(absl::StrContains(out, "ACCESS")) << out;
  EXPECT_TRUE(absl::StrContains(out, absl::StrCat(kReader))) << out;
  EXPECT_TRUE(absl::StrContains(out, "default:ro")) << out;
  EXPECT_TRUE(absl::StrContains(out, "default:rw private:rw")) << out;  // Us.
}

TEST_F(AccessTest, AReadOnlySessionOfAWriterIsReadOnlyByTheKernel) {
  std::map<std::string, std::string> r = Use(kWriter, "", /*read_only=*/true);
  EXPECT_EQ(r["fds"], "rdonly");
  EXPECT_EQ(r["mmap_write"], "EACCES");
  EXPECT_EQ(r["reopen_rdwr"], "EACCES");
  EXPECT_FALSE(absl::StrContains(r["maps"], "w")) << r["maps"];
  EXPECT_TRUE(absl::StartsWith(r["put"], "error PERMISSION_DENIED"))
      << r["put"];
  EXPECT_TRUE(absl::StrContains(r["put"], "opened read-only")) << r["put"];
  EXPECT_EQ(r["get"], "ok 66");
  v1::ListClientsResponse clients = testing::MonitorClients(address_);
  bool seen = false;
  for (const v1::ClientStatus& c : clients.clients()) {
    if (c.uid() != static_cast<uint32_t>(kWriter)) continue;
    seen = true;
    EXPECT_TRUE(c.read_only());
    ASSERT_EQ(c.pools_size(), 1);
    EXPECT_EQ(c.pools(0).access(), v1::POOL_ACCESS_READ);
  }
  EXPECT_TRUE(seen);
}

// Monitoring shows a user who is neither root nor the daemon's only the
// pools it may use, their objects and its own sessions.
TEST_F(AccessTest, MonitoringShowsAnotherUserOnlyWhatItMayUse) {
  std::vector<uint8_t> bytes(4096, 1);
  ASSERT_TRUE(
      client_
          ->Put(bytes.data(),
                {.size_bytes = 4096, .name = "secret", .pool = "private"})
          .ok());
  std::map<std::string, std::string> held = Use(kReader, "");  // Stays open.
  ASSERT_EQ(held["fds"], "rdonly");
  children_.push_back(
      Child({"--uid", absl::StrCat(kReader), "monitor", address_}));
  std::map<std::string, std::string> r = Report(*children_.back());
  EXPECT_EQ(r["status_pools"], "default");
  EXPECT_EQ(r["objects"], "shared");  // Not "secret", in "private".
  EXPECT_EQ(r["clients"], absl::StrCat(kReader));  // Not root's session.
  // Root (an operator) sees everything.
  children_.push_back(Child({"monitor", address_}));
  r = Report(*children_.back());
  EXPECT_EQ(r["status_pools"], "default,private");
  EXPECT_TRUE(absl::StrContains(r["objects"], "secret")) << r["objects"];
  EXPECT_TRUE(absl::StrContains(r["clients"], "0")) << r["clients"];
}

// The descriptor socket hands descriptors to the session's own process
// with the session's secret, and to nobody else.
TEST_F(AccessTest, OnlyTheSessionsProcessWithItsSecretGetsDescriptors) {
  absl::StatusOr<std::unique_ptr<testing::RawSession>> s =
      testing::OpenRawSession(address_);
  ASSERT_TRUE(s.ok()) << s.status();
  const uint64_t id = (*s)->opened.session_id();
  const std::string secret = (*s)->opened.descriptor_secret();
  ASSERT_EQ(secret.size(), 32u);
  const std::string path = daemon_->socket_path();
  auto ask = [&](uint64_t session, const std::string& key) {
    absl::StatusOr<testing::DescriptorAnswer> a = testing::AskDescriptors(
        path, testing::DescriptorRequestBytes(session, key));
    EXPECT_TRUE(a.ok()) << a.status();
    return a.value_or(testing::DescriptorAnswer{});
  };
  // The right process and secret: both pools, writable, and the session's
  // release ring. Once: a second ask of the same session gets nothing.
  testing::DescriptorAnswer ok = ask(id, secret);
  EXPECT_EQ(ok.code, 0) << ok.message;
  EXPECT_EQ(ok.access_modes, (std::vector<int>{O_RDWR, O_RDWR, O_RDWR}));
  testing::DescriptorAnswer again = ask(id, secret);
  EXPECT_EQ(again.code,
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(again.access_modes.empty());
  // A wrong, short, empty or another session's secret: nothing.
  std::string wrong = secret;
  wrong[31] ^= 1;
  for (const auto& [session, key] :
       std::vector<std::pair<uint64_t, std::string>>{{id, wrong},
                                                     {id, secret.substr(0, 31)},
                                                     {id, ""},
                                                     {id ^ 1, secret},
                                                     {0, secret}}) {
    testing::DescriptorAnswer a = ask(session, key);
    EXPECT_EQ(a.code, static_cast<int>(absl::StatusCode::kPermissionDenied));
    EXPECT_TRUE(a.access_modes.empty());
  }
  // Another process with this session's id and secret (as if they had
  // leaked): refused, since SO_PEERCRED names another pid.
  std::unique_ptr<Subprocess> thief =
      Child({"fdreq_for", address_, absl::StrCat(absl::Hex(id)),
             absl::BytesToHexString(secret)});
  EXPECT_EQ(thief->ReadLine().value_or(""),
            "answer code=7 fds=0 descriptor request refused: no open session "
            "of this process has that id and secret");
  // The same process once it became another user: refused (its uid is not
  // the session's). And, as a control, the same without the change.
  std::unique_ptr<Subprocess> turned =
      Child({"fdreq", address_, absl::StrCat(kWriter)});
  EXPECT_TRUE(
      absl::StartsWith(turned->ReadLine().value_or(""), "answer code=7 fds=0"));
  std::unique_ptr<Subprocess> same = Child({"fdreq", address_});
  EXPECT_TRUE(
      absl::StartsWith(same->ReadLine().value_or(""), "answer code=0 fds=3"));
  // Every refusal was logged.
  bool logged = false;
  for (int i = 0; i < 200 && !logged; ++i) {
    absl::StatusOr<std::string> line =
        daemon_->process().ReadLine(absl::Seconds(5));
    if (!line.ok()) break;
    logged = absl::StrContains(*line, "descriptor socket: refused pid");
  }
  EXPECT_TRUE(logged);
}

TEST_F(AccessTest, GarbageOversizedAndDescriptorCarryingRequestsGetNothing) {
  const std::string path = daemon_->socket_path();
  const int daemon_fds = OpenFds(daemon_->process().pid());
  for (const std::string& bytes :
       {std::string("\x00\x01\x02\x03", 4), std::string(1000, 'a'),
        std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11)}) {
    absl::StatusOr<testing::DescriptorAnswer> a =
        testing::AskDescriptors(path, bytes);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(a->replied);
    EXPECT_EQ(a->code, static_cast<int>(absl::StatusCode::kInvalidArgument))
        << a->message;
    EXPECT_TRUE(a->access_modes.empty());
  }
  // A peer that sends descriptors of its own along: the daemon never takes
  // them (its descriptor count does not grow), and answers as above.
  for (int i = 0; i < 20; ++i) {
    const int fd = testing::ConnectDescriptorSocket(path);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(testing::SendWithDescriptors(fd, "junk!!!", {0, 1, 2}))
        << std::strerror(errno);
    absl::StatusOr<testing::DescriptorAnswer> a = testing::ReadAnswer(fd, 5000);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(a->access_modes.empty());
    close(fd);
  }
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_LE(OpenFds(daemon_->process().pid()), daemon_fds);
  EXPECT_TRUE(client_->Stats().ok());  // Still serving.
}

TEST_F(AccessTest, SilentAndFloodingPeersTimeOutAndTheDaemonStaysUp) {
  const std::string path = daemon_->socket_path();
  const pid_t pid = daemon_->process().pid();
  const int daemon_fds = OpenFds(pid);
  // One that connects and never speaks is closed, with nothing.
  {
    absl::StatusOr<testing::DescriptorAnswer> a =
        testing::AskDescriptors(path, "", /*timeout_ms=*/10000);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_FALSE(a->replied);
    EXPECT_TRUE(a->access_modes.empty());
  }
  // 1,000 at once, none speaking.
  rlimit nofile;
  getrlimit(RLIMIT_NOFILE, &nofile);
  nofile.rlim_cur = std::max<rlim_t>(nofile.rlim_cur,
                                     std::min<rlim_t>(nofile.rlim_max, 4096));
  setrlimit(RLIMIT_NOFILE, &nofile);
  std::vector<int> flood;
  for (int i = 0; i < 1000; ++i) {
    const int fd = testing::ConnectDescriptorSocket(path);
    if (fd >= 0) flood.push_back(fd);
  }
  EXPECT_GE(flood.size(), 900u);
  // Meanwhile another user is served: the flood fills only root's share of
  // the waiting connections.
  std::map<std::string, std::string> r = Use(kWriter, "");
  EXPECT_EQ(r["fds"], "rdwr");
  EXPECT_EQ(r["put"], "ok");
  // Every flooding connection ends with no descriptor.
  size_t closed = 0, descriptors = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  for (int fd : flood) {
    const int left = static_cast<int>(std::max<int64_t>(
        0, absl::ToInt64Milliseconds(deadline - absl::Now())));
    absl::StatusOr<testing::DescriptorAnswer> a = testing::ReadAnswer(fd, left);
    if (a.ok()) {
      descriptors += a->access_modes.size();
      ++closed;
    }
    close(fd);
  }
  EXPECT_EQ(descriptors, 0u);
  EXPECT_EQ(closed, flood.size());
  // The daemon let go of every one of them and still serves everyone.
  const absl::Time settle = absl::Now() + absl::Seconds(10);
  while (OpenFds(pid) > daemon_fds + 2 && absl::Now() < settle) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_LE(OpenFds(pid), daemon_fds + 2);
  absl::StatusOr<Client> again = Client::Connect({.address = address_});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->Get("shared").ok());
}

// [P16] A container: its own mount namespace with a 16 MiB /dev/shm, and
// another uid. The pool is no file there; its descriptor crosses the
// socket, so a 256 MiB object goes in and comes back out.
class ContainerTest : public AccessTest {
  std::string PoolSize() override { return "320MiB"; }
};

TEST_F(ContainerTest, AClientWithA16MiBShmOfItsOwnUsesALargePool) {
  std::unique_ptr<Subprocess> c =
      Child({"--unshare-shm", "--uid", absl::StrCat(kWriter), "bigput",
             address_, absl::StrCat(256 << 20)});
  absl::StatusOr<std::string> shm = c->ReadLine(absl::Seconds(30));
  ASSERT_TRUE(shm.ok()) << shm.status();
  if (absl::StartsWith(*shm, "unshare failed")) GTEST_SKIP() << *shm;
  EXPECT_EQ(*shm, absl::StrCat("shm ", 16 << 20));
  EXPECT_EQ(c->ReadLine(absl::Seconds(120)).value_or(""),
            absl::StrCat("bigput ", 256 << 20, " ok"));
  const int status = c->Wait(absl::Seconds(30));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
}  // namespace shmtensor
