// The promise held against clients that lose their connection, lie, or
// flood the daemon, and against other users of the machine
// (docs/pitfalls.md P14, P15). Each test makes an attack and checks what
// the attacker gets; every process is real (fork/exec, setresuid, SIGKILL).
#include <dirent.h>
#include <fcntl.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "shmtensor/client.h"
#include "shmtensor/errors.h"
#include "shmtensor/v1/monitor.grpc.pb.h"
#include "shmtensor/v1/shmtensor.grpc.pb.h"
#include "tests/break_connection.h"
#include "tests/test_util.h"

namespace shmtensor {
namespace {

using testing::BreakDaemonConnections;
using testing::BreakMode;
using testing::Subprocess;

constexpr uint64_t kMiB = 1 << 20;
constexpr uid_t kNobody = 65534;

std::unique_ptr<Subprocess> Spawn(std::vector<std::string> args) {
  args.insert(args.begin(), SHMTENSOR_HARDENING_CHILD_PATH);
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn(args);
  if (!p.ok()) {
    ADD_FAILURE() << p.status();
    std::abort();
  }
  return *std::move(p);
}

bool AllBytes(const View& v, uint8_t byte) {
  const auto* p = static_cast<const uint8_t*>(v.data());
  for (uint64_t i = 0; i < v.size_bytes(); ++i) {
    if (p[i] != byte) return false;
  }
  return true;
}

class HardeningTest : public testing::DaemonTest {
 protected:
  v1::ListClientsResponse Clients() {
    return testing::MonitorClients(daemon_->address());
  }
  uint64_t UsedNow() { return Status().pools(0).used_bytes(); }
  v1::DaemonStatus Status() {
    return testing::MonitorStatus(daemon_->address());
  }
  // Fills the rest of the pool with 1 MiB objects of `byte` from a new
  // client (its connection unbroken), held until the returned client goes.
  std::pair<Client, std::vector<SealedRef>> FillPool(uint8_t byte) {
    Client other = Connect();
    std::vector<SealedRef> refs;
    std::vector<uint8_t> data(kMiB, byte);
    while (true) {
      absl::StatusOr<SealedRef> r =
          other.Put(data.data(), {.size_bytes = kMiB});
      if (!r.ok()) {
        EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted)
            << r.status();
        break;
      }
      refs.push_back(*std::move(r));
    }
    return {std::move(other), std::move(refs)};
  }
};

// [P14] A live client's connection breaks. Were the daemon to end its
// session, it would hand the client's memory to the next writer and the
// client's view would read another's bytes. Three ways to break it: a
// shutdown socket, bytes that are no HTTP/2, and a Create naming a
// 9,000-byte pool (an error that echoed the name whole would pass the
// client's metadata limit). Other writers fill the pool and the view keeps
// its bytes; the session resumes, and its releases apply.
TEST_F(HardeningTest, ABrokenConnectionNeverChangesALiveClientsViews) {
  for (int way = 0; way < 3; ++way) {
    SCOPED_TRACE(way);
    Client a = Connect();
    std::vector<uint8_t> aa(kMiB, 0xAA);
    absl::StatusOr<SealedRef> ref = a.Put(aa.data(), {.size_bytes = kMiB});
    ASSERT_TRUE(ref.ok()) << ref.status();
    absl::StatusOr<View> view = a.Get(ref->ref());
    ASSERT_TRUE(view.ok());
    const uint64_t used_before = UsedNow();
    if (way == 0) {
      ASSERT_GT(
          BreakDaemonConnections(daemon_->address(), BreakMode::kShutdown), 0);
    } else if (way == 1) {
      ASSERT_GT(BreakDaemonConnections(daemon_->address(), BreakMode::kGarbage),
                0);
    } else {
      absl::StatusOr<Buffer> b =
          a.Create({.size_bytes = 4096, .pool = std::string(9000, 'p')});
      ASSERT_FALSE(b.ok());
      EXPECT_EQ(b.status().code(), absl::StatusCode::kNotFound) << b.status();
      EXPECT_LE(b.status().message().size(), 1024u);
      EXPECT_TRUE(absl::StrContains(b.status().message(), "(9000 bytes)"))
          << b.status();
    }
    // Every other writer gets all the memory there is: none of it is a's.
    {
      auto [other, filled] = FillPool(0xBB);
      EXPECT_FALSE(filled.empty());
      EXPECT_TRUE(AllBytes(*view, 0xAA));
    }
    // The session resumes: at most one call fails (UNAVAILABLE, saying so),
    // then a's calls work and its releases reach the daemon.
    absl::StatusOr<StoreStats> s = a.Stats();
    if (!s.ok()) {
      EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable)
          << s.status();
      EXPECT_TRUE(absl::StrContains(s.status().message(), "resumed"))
          << s.status();
      s = a.Stats();
    }
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_TRUE(AllBytes(*view, 0xAA));
    EXPECT_EQ(UsedNow(), used_before);
    *view = View();
    ref->Reset();
    ASSERT_TRUE(a.Stats().ok());  // Applies a's releases.
    EXPECT_EQ(UsedNow(), used_before - kMiB);
  }
}

// A live process that broke its own connection keeps its session
// (detached, as the monitor says) and every byte of its view while others
// fill the pool; when it dies, its leases go within a second.
TEST_F(HardeningTest, ADetachedSessionKeepsItsMemoryUntilItsProcessExits) {
  auto victim = Spawn({"victim", daemon_->address(), "break"});
  absl::StatusOr<std::string> ready = victim->ReadLine();
  ASSERT_TRUE(ready.ok() && absl::StartsWith(*ready, "ready")) << *ready;
  ASSERT_EQ(victim->ReadLine().value_or(""), "broken");
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (Status().detached_sessions() == 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(Status().detached_sessions(), 1u);
  bool saw_detached = false;
  const v1::ListClientsResponse clients = Clients();
  for (const v1::ClientStatus& c : clients.clients()) {
    if (c.pid() == victim->pid()) saw_detached = !c.connected();
  }
  EXPECT_TRUE(saw_detached);
  {
    auto [other, filled] = FillPool(0xBB);
    EXPECT_FALSE(filled.empty());
    // The victim checks its view every 10 ms and says CHANGED if it did.
    absl::StatusOr<std::string> line = victim->ReadLine(absl::Seconds(1));
    EXPECT_FALSE(line.ok()) << *line;
  }
  victim->Signal(SIGKILL);
  victim->Wait();
  const absl::Time deadline = absl::Now() + absl::Seconds(1);
  while (absl::Now() < deadline && Status().leases() != 0) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(Status().leases(), 0u);
  EXPECT_EQ(Status().sessions(), 1u);  // The fixture's client alone.
}

// [P15] Another process tries to act for a session with the client ids the
// monitor lists and with the session's own (leaked) secret. A session acts
// only for the process that opened it: every request is refused, and none
// releases its leases, deletes its names, makes objects on its account or
// ends it.
TEST_F(HardeningTest, ASessionActsOnlyForItsOwnProcess) {
  auto victim = Spawn({"victim", daemon_->address()});
  absl::StatusOr<std::string> ready = victim->ReadLine();
  ASSERT_TRUE(ready.ok() && absl::StartsWith(*ready, "ready")) << *ready;
  const std::vector<std::string> f = absl::StrSplit(*ready, ' ');
  ASSERT_EQ(f.size(), 3u);
  std::vector<std::string> ids = {f[1]};  // The leaked secret.
  const v1::ListClientsResponse clients = Clients();
  for (const v1::ClientStatus& c : clients.clients()) {
    ids.push_back(absl::StrFormat("%x", c.client_id()));  // What is listed.
  }
  const uint64_t leases = Status().leases();
  for (const std::string& id : ids) {
    auto hijack = Spawn({"hijack", daemon_->address(), id, "64"});
    const std::string out = hijack->ReadAll();
    EXPECT_TRUE(absl::StrContains(out, "accepted 0 refused 67")) << out;
    EXPECT_TRUE(absl::StrContains(out, "is not open for this process")) << out;
  }
  EXPECT_EQ(Status().leases(), leases);
  absl::StatusOr<View> v = client_->Get("victim");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(AllBytes(*v, 0xAA));
  EXPECT_FALSE(victim->ReadLine(absl::Milliseconds(200)).ok());  // No CHANGED.
}

// An attacker guesses refs (slot and generation, with and without a made-up
// nonce) and tries those the monitor lists. A ref needs its object's 64-bit
// nonce, which the monitor leaves out: no guessed or listed ref gets an
// object.
TEST_F(HardeningTest, GuessedAndListedRefsGetNothing) {
  std::vector<SealedRef> refs;
  std::vector<uint8_t> data(4096, 7);
  // Without stock: the listing below is of these 20 objects only.
  Client producer =
      *Client::Connect({.address = daemon_->address(), .stock_bytes = 0});
  for (int i = 0; i < 20; ++i) {
    refs.push_back(*producer.Put(data.data(), {.size_bytes = 4096}));
  }
  Client attacker = Connect();
  int found = 0;
  for (uint32_t slot = 0; slot < 64; ++slot) {
    for (uint32_t gen = 1; gen <= 3; ++gen) {
      ObjectRef guess{attacker.daemon_epoch(), slot, gen, false, 0};
      found += attacker.Get(guess).ok();
      guess.nonce = 0x0123456789abcdefull * (slot + gen);
      found += attacker.Get(guess).ok();
    }
  }
  EXPECT_EQ(found, 0);
  auto stub = v1::Monitor::NewStub(grpc::CreateChannel(
      daemon_->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::ListObjectsResponse listed;
  ASSERT_TRUE(stub->ListObjects(&ctx, {}, &listed).ok());
  ASSERT_EQ(listed.objects_size(), 20);
  for (const v1::ObjectStatus& o : listed.objects()) {
    EXPECT_EQ(o.ref().nonce(), 0u);
    absl::StatusOr<View> v =
        attacker.Get(ObjectRef{o.ref().daemon_epoch(), o.ref().slot(),
                               o.ref().generation(), false, o.ref().nonce()});
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument)
        << v.status();
  }
  // The real refs work, and were never confused with the guesses.
  EXPECT_TRUE(attacker.Get(refs[7].ref()).ok());
}

// Makes a directory anyone can write (like /tmp), for squatters.
std::string WorldWritableDir() {
  char dir[] = "/tmp/shmtensor-open-XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  chmod(dir, 01777);
  return dir;
}

// A second user puts a socket at the address first. The client checks who
// serves the socket before it sends anything: it refuses to connect, naming
// the uid, and the squatter receives no bytes.
TEST_F(HardeningTest, AClientSendsNothingToASocketOfAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to become another user";
  const std::string dir = WorldWritableDir();
  const std::string path = dir + "/d.sock";
  auto squatter = Spawn({"--uid", std::to_string(kNobody), "squat", path, "2"});
  ASSERT_EQ(squatter->ReadLine().value_or(""), "ready");
  absl::StatusOr<Client> c = Client::Connect({.address = "unix:" + path});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(c.status().message(), "uid 65534"))
      << c.status();
  EXPECT_EQ(squatter->ReadLine(absl::Seconds(10)).value_or(""), "bytes 0");
  // With that uid named, the client would talk to it.
  unlink(path.c_str());
  rmdir(dir.c_str());
}

// Nor can another user take the daemon's address: the daemon refuses a
// socket directory others can write, and makes its default one 0700.
TEST_F(HardeningTest, TheDaemonRefusesASocketDirectoryOthersCanWrite) {
  const std::string dir = WorldWritableDir();
  auto p =
      Subprocess::Spawn({testing::DaemonPath(), "--listen",
                         "unix:" + dir + "/d.sock", "--pool-size", "4MiB"});
  ASSERT_TRUE(p.ok());
  const std::string out = (*p)->ReadAll();
  const int status = (*p)->Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "has mode 1777: others can write it"))
      << out;
  rmdir(dir.c_str());
  // A directory the daemon makes is 0700.
  struct stat st;
  const std::string own = daemon_->socket_path();
  ASSERT_EQ(stat(own.substr(0, own.rfind('/')).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

// The lock file is a symbolic or a hard link to another file, which a root
// daemon would truncate. The lock file is opened without following links,
// and only a plain file of the daemon's user with one link is used: the
// other file keeps its bytes.
TEST_F(HardeningTest, TheLockFileIsNeverALinkToAnotherFile) {
  for (bool hard : {false, true}) {
    SCOPED_TRACE(hard);
    char dir[] = "/tmp/shmtensor-lock-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    const std::string precious = std::string(dir) + "-precious";
    std::ofstream(precious) << "precious";
    const std::string lock = std::string(dir) + "/d.sock.lock";
    ASSERT_EQ(hard ? link(precious.c_str(), lock.c_str())
                   : symlink(precious.c_str(), lock.c_str()),
              0);
    auto p = Subprocess::Spawn({testing::DaemonPath(), "--listen",
                                absl::StrCat("unix:", dir, "/d.sock"),
                                "--pool-size", "4MiB"});
    ASSERT_TRUE(p.ok());
    const std::string out = (*p)->ReadAll();
    (*p)->Wait();
    std::ifstream in(precious);
    std::string content((std::istreambuf_iterator<char>(in)), {});
    EXPECT_EQ(content, "precious") << out;
    EXPECT_TRUE(absl::StrContains(
        out, hard ? "with one link" : "cannot open lock file"))
        << out;
    unlink(lock.c_str());
    unlink(precious.c_str());
    rmdir(dir);
  }
}

// Two daemons start with the same relative address (the same address
// string) from two directories while the fixture's runs. Pools are unnamed
// memory, which no starting daemon can sweep: all three keep theirs.
TEST_F(HardeningTest, AStartingDaemonNeverTakesALiveDaemonsPools) {
  const std::vector<std::string> before = daemon_->Pools();
  ASSERT_FALSE(before.empty());
  std::vector<std::unique_ptr<Subprocess>> others;
  std::vector<std::string> dirs;
  for (int i = 0; i < 2; ++i) {
    char dir[] = "/tmp/shmtensor-cwd-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dirs.push_back(dir);
    others.push_back(*Subprocess::Spawn(
        {"/bin/sh", "-c",
         absl::StrCat("cd ", dir, " && exec ", testing::DaemonPath(),
                      " --listen unix:s/d.sock --pool-size 4MiB")}));
    const std::string sock = std::string(dir) + "/s/d.sock";
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (access(sock.c_str(), F_OK) != 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    // Serving: a client connects (and maps the pool).
    absl::StatusOr<Client> c = Client::Connect({.address = "unix:" + sock});
    EXPECT_TRUE(c.ok()) << c.status();
  }
  // The first relative-address daemon's pools survived the second's start,
  // and so did the fixture's.
  EXPECT_EQ(daemon_->Pools(), before);
  absl::StatusOr<Client> first =
      Client::Connect({.address = "unix:" + dirs[0] + "/s/d.sock"});
  EXPECT_TRUE(first.ok()) << first.status();
  for (auto& o : others) {
    o->Signal(SIGTERM);
    o->Wait();
  }
  for (const std::string& d : dirs) {
    rmdir((d + "/s").c_str());
    rmdir(d.c_str());
  }
}

// Threads of the daemon ("Threads:" in /proc/<pid>/status).
int ThreadsOf(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    int n;
    if (absl::StartsWith(line, "Threads:") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(8)), &n)) {
      return n;
    }
  }
  return -1;
}

// One session makes 10,000 get-by-name calls that wait. Waiters are capped
// (per session, per uid, in all), each one past a cap is refused at once
// naming it, the daemon's threads stay bounded, others are served
// meanwhile, and cancelled waits end within a poll.
TEST_F(HardeningTest, WaitingCallsAreBoundedAndFreedWhenCancelled) {
  auto channel = grpc::CreateChannel(daemon_->address(),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::ObjectStore::NewStub(channel);
  grpc::ClientContext session_ctx;
  auto session = stub->Session(&session_ctx);
  std::optional<v1::SessionOpened> opened =
      testing::OpenRawSession(session.get(), "waiter");
  ASSERT_TRUE(opened.has_value());
  const uint64_t id = opened->session_id();

  constexpr int kCalls = 10000;
  grpc::CompletionQueue cq;
  struct Call {
    grpc::ClientContext ctx;
    v1::GetResponse resp;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::GetResponse>> rpc;
  };
  std::vector<std::unique_ptr<Call>> calls;
  v1::GetRequest req;
  req.set_session_id(id);
  req.set_name("never-sealed");
  req.set_timeout_ms(60000);
  for (int i = 0; i < kCalls; ++i) {
    auto c = std::make_unique<Call>();
    c->rpc = stub->AsyncGet(&c->ctx, req, &cq);
    c->rpc->Finish(&c->resp, &c->status, c.get());
    calls.push_back(std::move(c));
  }
  // Everything past the per-session cap is refused at once.
  int refused = 0;
  std::map<std::string, int> messages;
  while (refused < kCalls - 64) {
    void* tag;
    bool ok;
    ASSERT_EQ(cq.AsyncNext(
                  &tag, &ok,
                  std::chrono::system_clock::now() + std::chrono::seconds(60)),
              grpc::CompletionQueue::NextStatus::GOT_EVENT);
    Call* c = static_cast<Call*>(tag);
    ASSERT_EQ(c->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << c->status.error_message();
    ++messages[c->status.error_message().substr(0, 60)];
    ++refused;
  }
  std::string all;
  for (const auto& [m, n] : messages) absl::StrAppend(&all, n, " x ", m, "\n");
  EXPECT_EQ(messages.size(), 1u) << all;
  EXPECT_TRUE(
      absl::StrContains(messages.begin()->first, "has 64 calls waiting"))
      << all;
  EXPECT_EQ(Status().waiters(), 64u);
  // No thread per waiting call (the daemon runs a few dozen in all).
  EXPECT_LT(ThreadsOf(daemon_->process().pid()), 64);
  // Another client is served meanwhile.
  EXPECT_TRUE(client_->Stats().ok());
  std::vector<uint8_t> data(4096, 1);
  EXPECT_TRUE(client_->Put(data.data(), {.size_bytes = 4096}).ok());
  // Cancelled, the waits end: the daemon polls every 100 ms.
  for (auto& c : calls) c->ctx.TryCancel();
  const absl::Time deadline = absl::Now() + absl::Seconds(1);
  while (absl::Now() < deadline && Status().waiters() != 0) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(Status().waiters(), 0u);
  for (int i = refused; i < kCalls; ++i) {
    void* tag;
    bool ok;
    cq.Next(&tag, &ok);
  }
  session->WritesDone();
  session_ctx.TryCancel();
  session->Finish();
}

// A hog opens more connections than the daemon has descriptors for, and
// dies. The daemon accepts again as soon as descriptors come back.
TEST_F(HardeningTest, TheDaemonAcceptsAgainAfterDescriptorsRunOut) {
  absl::StatusOr<std::unique_ptr<testing::DaemonProcess>> d =
      testing::DaemonProcess::Start({"--pool-size", "4MiB"}, "",
                                    {"/usr/bin/prlimit", "--nofile=96", "--"});
  ASSERT_TRUE(d.ok()) << d.status();
  auto hog = Spawn({"hog", (*d)->socket_path(), "300"});
  ASSERT_TRUE(absl::StartsWith(hog->ReadLine().value_or(""), "opened"));
  hog->Signal(SIGKILL);
  hog->Wait();
  absl::StatusOr<Client> c = Client::Connect(
      {.address = (*d)->address(), .connect_timeout = absl::Seconds(10)});
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<uint8_t> data(4096, 3);
  absl::StatusOr<SealedRef> r = c->Put(data.data(), {.size_bytes = 4096});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(c->Get(r->ref()).ok());
}

// A daemon in its own pid namespace (a container) cannot see its clients'
// pids: the kernel gives it 0. Such a client's session is tied to its
// connection (nobody else can act for it, even with its secret), and with
// SO_PEERPIDFD (Linux 6.5+) a broken connection still keeps its memory
// until the process exits.
TEST_F(HardeningTest,
       ClientsWhosePidTheDaemonCannotSeeAreTiedToTheirConnection) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for a pid namespace";
  absl::StatusOr<std::unique_ptr<testing::DaemonProcess>> d =
      testing::DaemonProcess::Start(
          {"--pool-size", "16MiB"}, "",
          {"/usr/bin/unshare", "--pid", "--fork", "--kill-child", "--"});
  ASSERT_TRUE(d.ok()) << d.status();
  auto victim = Spawn({"victim", (*d)->address(), "break"});
  absl::StatusOr<std::string> ready = victim->ReadLine();
  ASSERT_TRUE(ready.ok() && absl::StartsWith(*ready, "ready")) << *ready;
  ASSERT_EQ(victim->ReadLine().value_or(""), "broken");
  const std::vector<std::string> f = absl::StrSplit(*ready, ' ');
  auto stub = v1::Monitor::NewStub(
      grpc::CreateChannel((*d)->address(), grpc::InsecureChannelCredentials()));
  auto status = [&] {
    grpc::ClientContext ctx;
    v1::DaemonStatus r;
    EXPECT_TRUE(stub->GetStatus(&ctx, {}, &r).ok());
    return r;
  };
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (status().detached_sessions() == 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(status().detached_sessions(), 1u);  // Kept: its process lives.
  {
    grpc::ClientContext ctx;
    v1::ListClientsResponse clients;
    ASSERT_TRUE(stub->ListClients(&ctx, {}, &clients).ok());
    ASSERT_EQ(clients.clients_size(), 1) << clients.DebugString();
    EXPECT_EQ(clients.clients(0).pid(), 0);  // Not visible from in there.
  }
  // Its leaked secret is worth nothing on another connection.
  auto hijack = Spawn({"hijack", (*d)->address(), f[1], "8"});
  EXPECT_TRUE(absl::StrContains(hijack->ReadAll(), "accepted 0 refused 11"));
  // Its ref's lease, which its view shares.
  EXPECT_EQ(status().leases(), 1u);
  victim->Signal(SIGKILL);
  victim->Wait();
  const absl::Time deadline = absl::Now() + absl::Seconds(1);
  while (absl::Now() < deadline && status().sessions() != 0) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(status().sessions(), 0u);
  EXPECT_EQ(status().leases(), 0u);
}

class UidLimitsTest : public HardeningTest {
 protected:
  std::vector<std::string> DaemonArgs() override {
    config_ = absl::StrCat("/tmp/shmtensor-limits-", getpid(), ".toml");
    std::ofstream(config_)
        << "[limits]\nmax_sessions_per_uid = 3\n"
           "max_bytes_per_uid = \"2MiB\"\n"
           "[[pool]]\nname = \"default\"\nsize = \"16MiB\"\n";
    return {"--config", config_};
  }
  void TearDown() override { unlink(config_.c_str()); }
  std::string config_;
};

// One uid opens sessions, and holds bytes across them, past its per-uid
// limits (more sessions must not get round a per-client limit). The session
// and the create past a cap are refused, naming the limit.
TEST_F(UidLimitsTest, SessionsAndBytesAreCappedPerUid) {
  Client b = Connect();
  absl::StatusOr<Client> c = Client::Connect({.address = daemon_->address()});
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<Client> d = Client::Connect({.address = daemon_->address()});
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(d.status().message(),
                                "limits.max_sessions_per_uid = 3"))
      << d.status();
  absl::StatusOr<Buffer> one = b.Create({.size_bytes = kMiB});
  absl::StatusOr<Buffer> two = c->Create({.size_bytes = kMiB});
  ASSERT_TRUE(one.ok() && two.ok());
  absl::StatusOr<Buffer> three = client_->Create({.size_bytes = kMiB});
  ASSERT_FALSE(three.ok());
  EXPECT_TRUE(absl::StrContains(three.status().message(),
                                "limits.max_bytes_per_uid = 2097152"))
      << three.status();
}

// Names and metadata: a name of any size gets a bounded error (its length
// and a prefix), and the session goes on.
TEST_F(HardeningTest, OversizedNamesGetBoundedErrorsAndTheSessionGoesOn) {
  const std::string huge(100000, 'n');
  absl::StatusOr<View> v = client_->Get(huge);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LE(v.status().message().size(), 1024u);
  EXPECT_TRUE(absl::StrContains(v.status().message(), "(100000 bytes)"))
      << v.status();
  EXPECT_FALSE(client_->Delete(huge).ok());
  EXPECT_FALSE(client_->Create({.size_bytes = 4096, .name = huge}).ok());
  EXPECT_FALSE(client_->Create({.size_bytes = 4096, .pool = huge}).ok());
  absl::StatusOr<Client> named =
      Client::Connect({.address = daemon_->address(), .client_name = huge});
  EXPECT_FALSE(named.ok());
  EXPECT_LE(named.status().message().size(), 2048u);
  EXPECT_TRUE(client_->Stats().ok());
  EXPECT_EQ(Status().detached_sessions(), 0u);
}

// Bytes that are no request (bad wire format, a name that is not UTF-8)
// get INVALID_ARGUMENT naming the request type, and the session goes on.
TEST_F(HardeningTest, UnparsableRequestsGetInvalidArgumentNamingTheType) {
  grpc::GenericStub stub(grpc::CreateChannel(
      daemon_->address(), grpc::InsecureChannelCredentials()));
  auto call = [&](const std::string& method, const std::string& bytes) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::ClientContext ctx;
    grpc::CompletionQueue cq;
    auto rpc = stub.PrepareUnaryCall(&ctx, method, request, &cq);
    rpc->StartCall();
    grpc::Status status;
    rpc->Finish(&response, &status, nullptr);
    void* tag;
    bool ok;
    cq.Next(&tag, &ok);
    return status;
  };
  // Field 5 (name), a length-delimited string that is not UTF-8.
  v1::CreateRequest bad_name;
  bad_name.set_size_bytes(4096);
  std::string wire =
      bad_name.SerializeAsString() + std::string("\x2a\x02\xff\xfe", 4);
  for (const auto& [method, bytes, type] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"/shmtensor.v1.ObjectStore/Create", "\xff\xff\xff\xff",
            "shmtensor.v1.CreateRequest"},
           {"/shmtensor.v1.ObjectStore/Create", wire,
            "shmtensor.v1.CreateRequest"},
           {"/shmtensor.v1.ObjectStore/Get", "\x0a\x05zz",
            "shmtensor.v1.GetRequest"},
           {"/shmtensor.v1.ObjectStore/Release", "\x08",
            "shmtensor.v1.ReleaseRequest"},
       }) {
    grpc::Status st = call(method, bytes);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << method << ": " << st.error_message();
    EXPECT_TRUE(absl::StrContains(st.error_message(), type))
        << st.error_message();
  }
  // The session stream too: an unparsable first message ends the stream
  // with INVALID_ARGUMENT naming the type, not with OK as if the client had
  // closed it.
  {
    grpc::ClientContext ctx;
    grpc::CompletionQueue cq;
    auto stream =
        stub.PrepareCall(&ctx, "/shmtensor.v1.ObjectStore/Session", &cq);
    void* tag;
    bool ok;
    stream->StartCall(reinterpret_cast<void*>(1));
    cq.Next(&tag, &ok);
    grpc::Slice slice(std::string("\xff\xff\xff\xff"));
    grpc::ByteBuffer junk(&slice, 1);
    stream->Write(junk, reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
    grpc::Status status;
    stream->Finish(&status, reinterpret_cast<void*>(3));
    cq.Next(&tag, &ok);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << status.error_message();
    EXPECT_TRUE(absl::StrContains(status.error_message(),
                                  "shmtensor.v1.SessionRequest"))
        << status.error_message();
  }
  EXPECT_TRUE(client_->Stats().ok());
}

// About 390,000 unknown lease ids, most in three messages of 130,000: the
// daemon logs them rate-limited, each line naming a few ids and a count of
// the rest, under 16 KiB in all.
TEST_F(HardeningTest, FloodsOfBadReleasesAreLoggedRateLimited) {
  auto stub = v1::ObjectStore::NewStub(grpc::CreateChannel(
      daemon_->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto session = stub->Session(&ctx);
  ASSERT_TRUE(testing::OpenRawSession(session.get(), "flood").has_value());
  for (int m = 1; m <= 300; ++m) {
    v1::SessionRequest r;
    r.mutable_release()->set_seq(m);
    for (int i = 0; i < (m <= 3 ? 130000 : 10); ++i) {
      r.mutable_release()->add_lease_ids(1000000 + i);
    }
    ASSERT_TRUE(session->Write(r));
  }
  EXPECT_TRUE(client_->Stats().ok());
  absl::SleepFor(absl::Milliseconds(300));
  std::string log;
  while (true) {
    absl::StatusOr<std::string> line =
        daemon_->process().ReadLine(absl::Milliseconds(300));
    if (!line.ok()) break;
    log += *line + "\n";
  }
  EXPECT_LT(log.size(), 16u << 10) << log.substr(0, 2000);
  EXPECT_TRUE(absl::StrContains(log, "and 129992 more")) << log.substr(0, 2000);
  session->WritesDone();
  ctx.TryCancel();
  session->Finish();
}

// A daemon stops and another starts on the same address. An old client's
// calls fail (from the second on, saying its session ended) and never
// answer from the new daemon: a session is with one daemon instance.
TEST_F(HardeningTest, AClientNeverTalksToTheNextDaemonAsIfItWereTheSame) {
  Client a = Connect();
  ASSERT_TRUE(a.Stats().ok());
  const std::string address = daemon_->address();
  ASSERT_EQ(daemon_->Stop(), 0);
  daemon_.reset();
  absl::StatusOr<std::unique_ptr<testing::DaemonProcess>> next =
      testing::DaemonProcess::Start({"--pool-size", "64MiB"}, address);
  ASSERT_TRUE(next.ok()) << next.status();
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<StoreStats> s = a.Stats();
    EXPECT_FALSE(s.ok());
    if (i > 0) {
      EXPECT_TRUE(IsSessionEnded(s.status())) << s.status();
    }
  }
  daemon_ = *std::move(next);
  client_ = Connect();
}

// Listings page: many objects list whole through shmtensorctl (one reply
// for enough objects would pass gRPC's message limit).
TEST_F(HardeningTest, ListingsPageThroughManyObjects) {
  constexpr int kObjects = 25000;
  std::vector<SealedRef> refs;
  refs.reserve(kObjects);
  for (int i = 0; i < kObjects; ++i) {
    absl::StatusOr<SealedRef> r =
        client_->Put(nullptr, {.dtype = DType::kFloat32, .shape = {0}});
    ASSERT_TRUE(r.ok()) << r.status();
    refs.push_back(*std::move(r));
  }
  FILE* ctl = popen(absl::StrCat(SHMTENSOR_CTL_PATH, " --address ",
                                 daemon_->address(), " objects --json")
                        .c_str(),
                    "r");
  ASSERT_NE(ctl, nullptr);
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), ctl)) > 0) out.append(buf, n);
  ASSERT_EQ(pclose(ctl), 0) << out.substr(0, 500);
  size_t count = 0;
  for (size_t p = out.find("\"slot\""); p != std::string::npos;
       p = out.find("\"slot\"", p + 1)) {
    ++count;
  }
  // Slot 0 is printed without its field (proto3 JSON omits zeros).
  EXPECT_GE(count, static_cast<size_t>(kObjects - 1));
  EXPECT_TRUE(absl::StrContains(out, absl::StrCat("\"total\": \"", kObjects)))
      << out.substr(out.size() - 200);
}

}  // namespace
}  // namespace shmtensor
