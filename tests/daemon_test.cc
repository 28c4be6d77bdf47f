// shmtensord as a process: start, refuse, recover, stop.
#include "daemon/daemon.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/magic.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "shmtensor/client.h"
#include "shmtensor/errors.h"
#include "shmtensor/v1/monitor.grpc.pb.h"
#include "testing/cpp/scoped_tmpfs.h"
#include "tests/test_util.h"

namespace shmtensor {
namespace {

using testing::DaemonPath;
using testing::DaemonProcess;
using testing::Subprocess;

class DaemonTest : public testing::DaemonTest {};

// Runs the daemon to completion (it must fail) and returns exit code and
// output.
std::pair<int, std::string> RunFailing(std::vector<std::string> args) {
  args.insert(args.begin(), DaemonPath());
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn(args);
  EXPECT_TRUE(p.ok());
  std::string out = (*p)->ReadAll(absl::Seconds(20));
  const int status = (*p)->Wait();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST_F(DaemonTest, SigtermEndsSessionsRemovesItsFilesAndExitsZero) {  // [P9]
  absl::StatusOr<Buffer> buf = client_->Create({.size_bytes = 1 << 20});
  ASSERT_TRUE(buf.ok());
  SealedRef ref = *buf->Seal();
  View view = *client_->Get(ref.ref());
  ASSERT_EQ(daemon_->Pools().size(), 1u);
  EXPECT_TRUE(testing::ShmtensorFilesInDevShm().empty());
  const int status = daemon_->Stop();
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  struct stat st;
  EXPECT_NE(stat(daemon_->socket_path().c_str(), &st), 0);
  EXPECT_NE(stat((daemon_->socket_path() + ".fd").c_str(), &st), 0);
  EXPECT_NE(stat((daemon_->socket_path() + ".lock").c_str(), &st), 0);
  EXPECT_TRUE(testing::ShmtensorFilesInDevShm().empty());
  // This process's mapping stays valid (no SIGBUS) after the daemon let go.
  EXPECT_NE(view.data(), nullptr);
  volatile uint8_t b = static_cast<const uint8_t*>(view.data())[0];
  (void)b;
  absl::StatusOr<StoreStats> stats = client_->Stats();
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(DaemonTest, PoolIsUnnamedReservedSealedAndSocketsAreGroupAccessible) {
  std::vector<std::string> pools = daemon_->Pools();
  ASSERT_EQ(pools.size(), 1u);
  char target[256] = {0};
  ASSERT_GT(readlink(pools[0].c_str(), target, sizeof(target) - 1), 0);
  // A memfd: in no file system, under no name anyone could open.
  EXPECT_TRUE(absl::StartsWith(target, "/memfd:shmtensor:default")) << target;
  EXPECT_TRUE(testing::ShmtensorFilesInDevShm().empty());
  struct stat st;
  ASSERT_EQ(stat(pools[0].c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);  // No other user can reopen it.
  EXPECT_EQ(st.st_uid, geteuid());
  EXPECT_EQ(st.st_size, 64 << 20);
  EXPECT_GE(st.st_blocks * 512, 64 << 20);  // Reserved up front.
  // Its size is sealed: no client holding it writable can shrink it under
  // the others (SIGBUS) or grow it.
  const int fd = open(pools[0].c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  const int seals = fcntl(fd, F_GET_SEALS);
  close(fd);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
      << seals;
  for (const std::string& socket :
       {daemon_->socket_path(), daemon_->socket_path() + ".fd"}) {
    ASSERT_EQ(stat(socket.c_str(), &st), 0) << socket;
    EXPECT_TRUE(S_ISSOCK(st.st_mode)) << socket;
    EXPECT_EQ(st.st_mode & 0777, 0660u) << socket;
  }
}

TEST_F(DaemonTest, SecondDaemonOnSameAddressIsRefused) {
  auto [code, out] = RunFailing({"--listen", daemon_->address()});
  EXPECT_EQ(code, 1);
  EXPECT_TRUE(absl::StrContains(out, "already serves")) << out;
  // The first one is unharmed.
  EXPECT_TRUE(client_->Stats().ok());
  EXPECT_EQ(daemon_->Pools().size(), 1u);
  struct stat st;
  EXPECT_EQ(stat(daemon_->socket_path().c_str(), &st), 0);
}

TEST_F(DaemonTest, DaemonsRacingForTheAddressOfOneStoppingEndWithOneServing) {
  // Contenders start every 30 ms while the owner stops (SIGTERM, which
  // unlinks its lock file last). Those that came while it held the address
  // are refused; of the rest exactly one takes it, however their opens,
  // locks and the owner's unlink interleave.
  const std::string lock = daemon_->socket_path() + ".lock";
  // True once the child `pid` has exited (a zombie: not reaped yet).
  auto exited = [](pid_t pid) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string id, comm, state;
    stat >> id >> comm >> state;
    return state == "Z";
  };
  std::vector<std::unique_ptr<Subprocess>> contenders;
  daemon_->process().Signal(SIGTERM);
  // Until the owner is gone, however long its stop takes, and 5 more.
  for (int after = 0; after < 5 && contenders.size() < 300;) {
    absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn(
        {DaemonPath(), "--listen", daemon_->address(), "--pool-size", "4MiB"});
    ASSERT_TRUE(p.ok()) << p.status();
    contenders.push_back(*std::move(p));
    absl::SleepFor(absl::Milliseconds(30));
    if (exited(daemon_->process().pid())) ++after;
  }
  ASSERT_TRUE(WIFEXITED(daemon_->process().Wait()));
  absl::SleepFor(absl::Seconds(2));  // Every refused contender has exited.
  std::vector<Subprocess*> serving;
  for (const auto& c : contenders) {
    if (!exited(c->pid())) serving.push_back(c.get());
  }
  ASSERT_EQ(serving.size(), 1u);
  pid_t owner = 0;
  std::ifstream(lock) >> owner;
  EXPECT_EQ(owner, serving[0]->pid());
  {
    absl::StatusOr<Client> c = Client::Connect({.address = daemon_->address()});
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->Stats()->pools[0].size_bytes, 4u << 20);
  }
  // Stopped cleanly, it leaves nothing of the address behind.
  serving[0]->Signal(SIGTERM);
  const int status = serving[0]->Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  struct stat st;
  EXPECT_NE(stat(lock.c_str(), &st), 0);
  EXPECT_NE(stat(daemon_->socket_path().c_str(), &st), 0);
}

// [P9, P16] A daemon killed with SIGKILL leaves no file anywhere but its
// sockets and lock file (taken over by the next daemon on the address), and
// its pool goes back to the system when the last process mapping it exits:
// Shmem in /proc/meminfo returns to where it was. Until then that process
// still reads what it mapped.
TEST_F(DaemonTest, SigkilledDaemonLeavesNoFileAndItsMemoryGoesWithItsClients) {
  const std::vector<std::string> shm_before = testing::ShmtensorFilesInDevShm();
  EXPECT_TRUE(shm_before.empty());
  // Shmem is the machine's: tests running beside this one move it too
  // (their daemons' pools are 4-64 MiB). So the pool is large, each check
  // allows 128 MiB of others' traffic, and waits out a passing dip.
  constexpr int64_t kPool = 512 << 20;
  constexpr int64_t kSlack = 128 << 20;
  auto shmem = [] { return static_cast<int64_t>(testing::ShmemBytes()); };
  auto within = [&](absl::Duration d, const std::function<bool()>& ok) {
    const absl::Time deadline = absl::Now() + d;
    while (!ok() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    return ok();
  };
  const int64_t before = shmem();
  const std::string address = testing::FreshAddress();
  absl::StatusOr<std::unique_ptr<DaemonProcess>> d =
      DaemonProcess::Start({"--pool-size", "512MiB"}, address);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(testing::ShmtensorFilesInDevShm().empty());
  // The pool is reserved: Shmem grew by it.
  EXPECT_TRUE(within(absl::Seconds(5),
                     [&] { return shmem() >= before + kPool - kSlack; }))
      << shmem() << " bytes, " << before << " before";
  // A client process holds a view (and so a mapping) of it.
  std::unique_ptr<Subprocess> holder =
      *Subprocess::Spawn({testing::ChildPath(), "hold_put", address, "holder"});
  ASSERT_EQ(*holder->ReadLine(), "ready");
  EXPECT_TRUE(testing::ShmtensorFilesInDevShm().empty());
  // Taken just before the kill: tests beside this one start and end pools
  // of their own (some larger than the slack) in the seconds since
  // `before`, but hardly in the few milliseconds the kill takes.
  const int64_t live = shmem();
  (*d)->process().Signal(SIGKILL);
  (*d)->process().Wait();
  EXPECT_TRUE(testing::ShmtensorFilesInDevShm().empty());
  // The holder still maps it, so it is still there, and it reads its bytes.
  const int64_t held = shmem();
  EXPECT_GE(held, live - kSlack) << live << " before the kill";
  holder->Signal(SIGUSR1);
  EXPECT_EQ(*holder->ReadLine(), "read 0x5a");
  holder->Signal(SIGKILL);
  holder->Wait();
  // Gone with its last holder: Shmem drops by the pool.
  EXPECT_TRUE(within(absl::Seconds(10),
                     [&] { return shmem() <= held - kPool + kSlack; }))
      << "Shmem " << shmem() << " bytes, " << held << " while held, " << before
      << " before the daemon started";
  EXPECT_TRUE(testing::ShmtensorFilesInDevShm().empty());
  // The next daemon on the address takes its sockets and lock file over.
  struct stat st;
  EXPECT_EQ(stat(((*d)->socket_path() + ".lock").c_str(), &st), 0);
  absl::StatusOr<std::unique_ptr<DaemonProcess>> again =
      DaemonProcess::Start({"--pool-size", "8MiB"}, address);
  ASSERT_TRUE(again.ok()) << again.status();
  absl::StatusOr<Client> c = Client::Connect({.address = address});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->Stats()->pools[0].size_bytes, 8u << 20);
}

TEST(DaemonPriorityTest, NiceAppliesToEveryThreadOfTheDaemon) {
  // A positive value needs no privilege.
  absl::StatusOr<std::unique_ptr<DaemonProcess>> d = DaemonProcess::Start(
      {"--pool-size", "4MiB", "--nice", "7"}, testing::FreshAddress());
  ASSERT_TRUE(d.ok()) << d.status();
  Client c = *Client::Connect({.address = (*d)->address()});
  ASSERT_TRUE(c.Stats().ok());  // gRPC's threads are up and serving.
  const std::string tasks =
      absl::StrCat("/proc/", (*d)->process().pid(), "/task");
  int threads = 0;
  for (const auto& t : std::filesystem::directory_iterator(tasks)) {
    std::ifstream in(t.path() / "stat");
    std::string line;
    std::getline(in, line);
    // Fields after the command's closing parenthesis: state is 3rd, nice
    // the 19th.
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    std::string field;
    for (int i = 3; i <= 19; ++i) rest >> field;
    EXPECT_EQ(field, "7") << t.path();
    ++threads;
  }
  EXPECT_GT(threads, 1);
}

TEST_F(DaemonTest, PoolLargerThanMemoryFailsAtStartWithClearMessage) {
  // Refused before a page is taken: a memfd has no size limit of its own.
  auto [code, out] =
      RunFailing({"--listen", testing::FreshAddress(), "--pool-size", "64TiB"});
  EXPECT_EQ(code, 1);
  EXPECT_TRUE(absl::StrContains(out, "MemAvailable")) << out;
  EXPECT_TRUE(absl::StrContains(out, "70368744177664")) << out;
}

// A daemon in a cgroup whose memory.max cannot hold the pool refuses to
// start, naming the limit, instead of being OOM-killed while it reserves.
TEST(DaemonMemoryLimitTest, PoolOverTheCgroupLimitIsRefusedNamingIt) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a memory cgroup";
  // cgroup v1's memory hierarchy where it is mounted, else v2's.
  std::string cg, limit_file;
  if (access("/sys/fs/cgroup/memory/cgroup.procs", W_OK) == 0) {
    cg = absl::StrCat("/sys/fs/cgroup/memory/shmtensor-test-limit-", getpid());
    limit_file = "memory.limit_in_bytes";
  } else {
    std::ifstream controllers("/sys/fs/cgroup/cgroup.controllers");
    std::string all((std::istreambuf_iterator<char>(controllers)), {});
    if (!absl::StrContains(all, "memory")) {
      GTEST_SKIP() << "no memory cgroup controller here";
    }
    std::ofstream("/sys/fs/cgroup/cgroup.subtree_control") << "+memory";
    cg = absl::StrCat("/sys/fs/cgroup/shmtensor-test-limit-", getpid());
    limit_file = "memory.max";
  }
  if (mkdir(cg.c_str(), 0755) != 0) {
    GTEST_SKIP() << "cannot make a cgroup: " << std::strerror(errno);
  }
  std::ofstream(cg + "/" + limit_file) << (64 << 20);
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn(
      {"/bin/sh", "-c",
       absl::StrCat("echo $$ > ", cg, "/cgroup.procs && exec ", DaemonPath(),
                    " --listen ", testing::FreshAddress(),
                    " --pool-size 128MiB 2>&1")});
  ASSERT_TRUE(p.ok()) << p.status();
  const std::string out = (*p)->ReadAll(absl::Seconds(30));
  const int status = (*p)->Wait();
  rmdir(cg.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1)
      << status << ": " << out;
  EXPECT_TRUE(absl::StrContains(out, limit_file + " 67108864")) << out;
  EXPECT_TRUE(absl::StrContains(out, "MemoryMax=")) << out;
}

TEST_F(DaemonTest, BadFlagsAndConfigAreRejected) {
  auto [code, out] = RunFailing({"--pool-size", "12XB"});
  EXPECT_EQ(code, 2);
  EXPECT_TRUE(absl::StrContains(out, "12XB")) << out;
  const std::string path = ::testing::TempDir() + "/bad_shmtensord.toml";
  std::ofstream(path) << "[[pool]]\nname = \"a\"\nsize = \"-3\"\n";
  std::tie(code, out) = RunFailing({"--config", path});
  EXPECT_EQ(code, 2);
  EXPECT_TRUE(absl::StrContains(out, path + ":3")) << out;
}

class ConfigFileTest : public testing::DaemonTest {
  std::vector<std::string> DaemonArgs() override {
    const std::string path = ::testing::TempDir() + "/two_pools.toml";
    std::ofstream(path) << "[[pool]]\nname = \"batches\"\nsize = \"16MiB\"\n"
                           "[[pool]]\nname = \"weights\"\nsize = 4194304\n";
    return {"--config", path};
  }
};

TEST_F(ConfigFileTest, ServesEveryConfiguredPool) {
  StoreStats s = *client_->Stats();
  ASSERT_EQ(s.pools.size(), 2u);
  EXPECT_EQ(s.pools[0].name, "batches");
  EXPECT_EQ(s.pools[1].name, "weights");
  EXPECT_EQ(s.pools[1].size_bytes, 4u << 20);
  absl::StatusOr<Buffer> b =
      client_->Create({.size_bytes = 1 << 20, .pool = "weights"});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(client_->Stats()->pools[1].used_bytes, 1u << 20);
  EXPECT_EQ(daemon_->Pools().size(), 2u);
}

TEST(DaemonConfigTest, SocketModeAndGroupApplyToBothSockets) {
  struct group* g = getgrgid(getgid());
  ASSERT_NE(g, nullptr);
  const std::string path = ::testing::TempDir() + "/shmtensord_group.toml";
  std::ofstream(path) << "socket_mode = \"0600\"\nsocket_group = \""
                      << g->gr_name
                      << "\"\n[[pool]]\nname = \"p\"\nsize = \"8MiB\"\n";
  absl::StatusOr<std::unique_ptr<DaemonProcess>> d =
      DaemonProcess::Start({"--config", path});
  ASSERT_TRUE(d.ok()) << d.status();
  struct stat st;
  for (const std::string& socket :
       {(*d)->socket_path(), (*d)->socket_path() + ".fd"}) {
    ASSERT_EQ(stat(socket.c_str(), &st), 0) << socket;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << socket;
    EXPECT_EQ(st.st_gid, getgid()) << socket;
  }
  // The group's members may use the pools (tests/access_test.cc); the pool
  // memory itself has no name to give a group.
  EXPECT_EQ((*d)->Pools().size(), 1u);
}

TEST(DaemonConfigTest, UnknownGroupIsRefusedNamingIt) {
  const std::string path = ::testing::TempDir() + "/shmtensord_nogroup.toml";
  std::ofstream(path) << "socket_group = \"no-such-group-here\"\n";
  auto [code, out] =
      RunFailing({"--listen", testing::FreshAddress(), "--config", path});
  EXPECT_EQ(code, 1);
  EXPECT_TRUE(absl::StrContains(out, "'no-such-group-here' is not a group"))
      << out;
}

TEST(DaemonConfigTest, BadConfigFileNamesLineAndKeyAndExits2) {
  const std::string path = ::testing::TempDir() + "/shmtensord_bad.toml";
  std::ofstream(path) << "log_level = \"info\"\n[limits]\nmax_leasez = 3\n";
  auto [code, out] =
      RunFailing({"--listen", testing::FreshAddress(), "--config", path});
  EXPECT_EQ(code, 2);
  EXPECT_TRUE(absl::StrContains(out, path + ":3")) << out;
  EXPECT_TRUE(absl::StrContains(out, "unknown key 'limits.max_leasez'")) << out;
}

// Pool directories: a tmpfs other than /dev/shm, e.g. one with huge pages.

// Files in `dir` whose names start with "shmtensor": a daemon never makes
// any (a directory pool is an O_TMPFILE file, with no name).
std::vector<std::string> ShmtensorFilesIn(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (absl::StartsWith(name, "shmtensor")) out.push_back(name);
  }
  return out;
}

// kB of the mapping containing `p` mapped by huge-page (PMD) entries, from
// /proc/self/smaps; -1 when the mapping is not found.
long PmdMappedKb(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  bool in_vma = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t lo, hi;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 &&
        line.find(':') > line.find(' ')) {
      in_vma = lo <= at && at < hi;
      continue;
    }
    if (in_vma && absl::StartsWith(line, "ShmemPmdMapped:")) {
      return std::atol(line.c_str() + 15);
    }
  }
  return -1;
}

TEST(PoolDirectoryTest, DirectoryMustBeAnAbsoluteTmpfsPath) {
  auto [code, out] = RunFailing(
      {"--listen", testing::FreshAddress(), "--pool-dir", "relative/dir"});
  EXPECT_EQ(code, 2);
  EXPECT_TRUE(absl::StrContains(out, "'relative/dir'")) << out;
  EXPECT_TRUE(absl::StrContains(out, "absolute")) << out;

  const std::string disk = SHMTENSOR_BINARY_DIR;
  struct statfs fs;
  ASSERT_EQ(statfs(disk.c_str(), &fs), 0);
  if (fs.f_type == TMPFS_MAGIC) GTEST_SKIP() << disk << " is a tmpfs here";
  const std::string address = testing::FreshAddress();
  std::tie(code, out) = RunFailing({"--listen", address, "--pool-dir", disk});
  EXPECT_EQ(code, 1);
  EXPECT_TRUE(absl::StrContains(out, "'" + disk + "'")) << out;
  EXPECT_TRUE(absl::StrContains(out, "not a tmpfs")) << out;
  EXPECT_TRUE(ShmtensorFilesIn(disk).empty());  // Nothing written there.
}

// Mounts a tmpfs or skips the test saying why (mounting needs root).
#define MOUNT_TMPFS_OR_SKIP(var, options)                          \
  absl::StatusOr<std::unique_ptr<testing::ScopedTmpfs>> var##_or = \
      testing::ScopedTmpfs::Mount(options);                        \
  if (!var##_or.ok()) GTEST_SKIP() << var##_or.status();           \
  std::unique_ptr<testing::ScopedTmpfs> var = *std::move(var##_or)

TEST(PoolDirectoryTest, HugePagePoolMapsLargeObjectsWithHugePages) {
  MOUNT_TMPFS_OR_SKIP(tmpfs, "huge=always,size=96m,mode=0700");
  const std::string address = testing::FreshAddress();
  absl::StatusOr<std::unique_ptr<DaemonProcess>> d = DaemonProcess::Start(
      {"--pool-size", "64MiB", "--pool-dir", tmpfs->path()}, address);
  ASSERT_TRUE(d.ok()) << d.status();
  // The pool is an unnamed file of that tmpfs: the directory stays empty.
  EXPECT_TRUE(std::filesystem::is_empty(tmpfs->path()));
  std::vector<std::string> pools = (*d)->Pools();
  ASSERT_EQ(pools.size(), 1u);
  struct stat st, dir;
  ASSERT_EQ(stat(pools[0].c_str(), &st), 0);
  ASSERT_EQ(stat(tmpfs->path().c_str(), &dir), 0);
  EXPECT_EQ(st.st_dev, dir.st_dev);  // Its memory is that tmpfs's.
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_GE(st.st_blocks * 512, 64 << 20);
  // O_EXCL at creation: not even its owner can link it into the directory.
  EXPECT_NE(linkat(AT_FDCWD, pools[0].c_str(), AT_FDCWD,
                   (tmpfs->path() + "/linked").c_str(), AT_SYMLINK_FOLLOW),
            0);
  EXPECT_TRUE(std::filesystem::is_empty(tmpfs->path()));

  struct statfs fs;
  ASSERT_EQ(statfs(tmpfs->path().c_str(), &fs), 0);
  const uint64_t free_while_served = fs.f_bfree * fs.f_bsize;
  EXPECT_LE(free_while_served, 32u << 20);  // 64 of its 96 MiB reserved.
  {
    Client c = *Client::Connect({.address = address});
    StoreStats stats = *c.Stats();
    ASSERT_EQ(stats.pools.size(), 1u);
    ASSERT_EQ(stats.pools[0].huge_page_size, 2u << 20)
        << "the kernel gave a huge=always tmpfs no 2 MiB pages";

    constexpr size_t kBytes = (4 << 20) + 100;  // Three huge pages' worth.
    Buffer buf = *c.Create({.size_bytes = kBytes});
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buf.data()) % (2 << 20), 0u);
    std::memset(buf.data(), 0x5a, kBytes);
    EXPECT_EQ(c.Stats()->pools[0].used_bytes, 6u << 20);  // Whole huge pages.
    uint8_t* old = static_cast<uint8_t*>(buf.data());
    SealedRef ref = *buf.Seal();
    View view = *c.Get(ref.ref());
    const auto* bytes = static_cast<const uint8_t*>(view.data());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(bytes) % (2 << 20), 0u);
    EXPECT_EQ(bytes[0], 0x5a);
    EXPECT_EQ(bytes[kBytes - 1], 0x5a);
    // Readers map it with huge-page entries (6 MiB touched above: >= 2 MiB).
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < kBytes; i += 4096) sink += bytes[i];
    EXPECT_GE(PmdMappedKb(bytes), 2048) << "read mapping is not PMD-mapped";
    // Sealed is sealed here too: a write through the creator's old pointer
    // faults instead of changing what readers see.
    const pid_t child = fork();
    if (child == 0) {
      old[0] = 1;
      _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) << status;
    EXPECT_EQ(bytes[0], 0x5a);

    // A crash leaves nothing in the directory; this process, which maps the
    // pool, still reads it.
    (*d)->process().Signal(SIGKILL);
    (*d)->process().Wait();
    EXPECT_TRUE(std::filesystem::is_empty(tmpfs->path()));
    EXPECT_EQ(bytes[kBytes - 1], 0x5a);
  }
  // Its last holder gone, the tmpfs has its space back.
  ASSERT_EQ(statfs(tmpfs->path().c_str(), &fs), 0);
  EXPECT_GE(fs.f_bfree * fs.f_bsize, free_while_served + (60u << 20));
}

TEST(PoolDirectoryTest, RequiredHugePagesRefuseATmpfsWithout) {
  MOUNT_TMPFS_OR_SKIP(tmpfs, "huge=never,size=16m,mode=0700");
  const std::string path = ::testing::TempDir() + "/shmtensord_huge.toml";
  std::ofstream(path) << "[[pool]]\nname = \"p\"\nsize = \"8MiB\"\n"
                      << "directory = \"" << tmpfs->path() << "\"\n"
                      << "huge_pages = \"require\"\n";
  const std::string address = testing::FreshAddress();
  auto [code, out] = RunFailing({"--listen", address, "--config", path});
  EXPECT_EQ(code, 1);
  EXPECT_TRUE(absl::StrContains(out, tmpfs->path() + " gives no huge pages"))
      << out;
  EXPECT_TRUE(absl::StrContains(out, "huge=always")) << out;
  EXPECT_TRUE(std::filesystem::is_empty(tmpfs->path()));  // Nothing left.
}

// Where the kernel tells no huge-page size (no /sys mounted, as in a bare
// chroot; a kernel without transparent huge pages), "auto" serves 4 KiB
// pages and says so in its log, and "require" refuses to start, naming the
// file it could not read. The daemon runs in a mount namespace of its own
// with an empty tmpfs over /sys/kernel/mm/transparent_hugepage.
TEST(PoolDirectoryTest, UnknownHugePageSizeIsLoggedAndRefusedWhenRequired) {
  MOUNT_TMPFS_OR_SKIP(tmpfs, "huge=always,size=16m,mode=0700");
  const std::string hide =
      "unshare --mount --propagation private sh -c 'mount -t tmpfs -o "
      "size=64k shmtensor-nosys /sys/kernel/mm/transparent_hugepage && ";
  auto run = [&](const std::string& then) {
    absl::StatusOr<std::unique_ptr<testing::Subprocess>> p =
        testing::Subprocess::Spawn({"/bin/sh", "-c", hide + then + "' 2>&1"});
    EXPECT_TRUE(p.ok()) << p.status();
    std::string out = (*p)->ReadAll(absl::Seconds(30));
    const int status = (*p)->Wait();
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, out);
  };
  if (auto [code, out] = run("test ! -e /sys/kernel/mm/transparent_hugepage/"
                             "hpage_pmd_size");
      code != 0) {
    GTEST_SKIP() << "cannot hide /sys in a mount namespace here: " << out;
  }
  for (const char* mode : {"auto", "require"}) {
    const std::string path =
        absl::StrCat(::testing::TempDir(), "/shmtensord_nosys_", mode, ".toml");
    std::ofstream(path) << "[[pool]]\nname = \"p\"\nsize = \"8MiB\"\n"
                        << "directory = \"" << tmpfs->path() << "\"\n"
                        << "huge_pages = \"" << mode << "\"\n";
    const std::string address = testing::FreshAddress();
    // "auto" serves until timeout's SIGTERM, then exits 0 (timeout: 124).
    auto [code, out] =
        run(absl::StrCat("exec timeout -s TERM 2 ", DaemonPath(), " --listen ",
                         address, " --config ", path));
    if (std::string(mode) == "auto") {
      EXPECT_EQ(code, 124) << out;
      EXPECT_TRUE(absl::StrContains(
          out,
          "cannot read /sys/kernel/mm/transparent_hugepage/hpage_pmd_size"))
          << out;
      EXPECT_TRUE(absl::StrContains(out, "is /sys mounted?")) << out;
      EXPECT_TRUE(absl::StrContains(out, "serving 4 KiB pages")) << out;
    } else {
      EXPECT_EQ(code, 1) << out;
      EXPECT_TRUE(absl::StrContains(
          out,
          "huge_pages = \"require\", but cannot read "
          "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size"))
          << out;
    }
    EXPECT_TRUE(std::filesystem::is_empty(tmpfs->path())) << mode;
  }
}

// CUDA pools on this machine: served where a GPU is, reported unavailable
// (with the host pools served) where none is.
TEST(CudaPoolTest, HostPoolsServeAndStatusSaysWhyACudaPoolIsMissing) {
  const std::string path = ::testing::TempDir() + "/shmtensord_cuda.toml";
  std::ofstream(path) << "[[pool]]\nname = \"host\"\nsize = \"8MiB\"\n"
                      << "[[pool]]\nname = \"gpu0\"\nsize = \"64MiB\"\n"
                      << "kind = \"cuda\"\ndevice = 0\n";
  absl::StatusOr<std::unique_ptr<DaemonProcess>> d =
      DaemonProcess::Start({"--config", path});
  ASSERT_TRUE(d.ok()) << d.status();
  Client c = *Client::Connect({.address = (*d)->address()});
  auto monitor = v1::Monitor::NewStub(
      grpc::CreateChannel((*d)->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::DaemonStatus status;
  ASSERT_TRUE(monitor->GetStatus(&ctx, {}, &status).ok());
  // The host pool works either way.
  absl::StatusOr<Buffer> host = c.Create({.size_bytes = 4096, .pool = "host"});
  ASSERT_TRUE(host.ok()) << host.status();
  absl::StatusOr<Buffer> gpu = c.Create({.size_bytes = 4096, .pool = "gpu0"});
  if (status.unavailable_pools_size() == 1) {  // No usable GPU here.
    ASSERT_EQ(status.pools_size(), 1);
    EXPECT_EQ(status.unavailable_pools(0).name(), "gpu0");
    EXPECT_EQ(status.unavailable_pools(0).kind(), v1::MEMORY_KIND_CUDA_DEVICE);
    EXPECT_TRUE(absl::StrContains(status.unavailable_pools(0).reason(),
                                  "CUDA pools are unavailable"))
        << status.unavailable_pools(0).reason();
    EXPECT_EQ(gpu.status().code(), absl::StatusCode::kNotFound) << gpu.status();
    EXPECT_TRUE(absl::StrContains(gpu.status().message(), "'gpu0'"));
    EXPECT_EQ((*d)->Stop(), 0);
    const std::string log = (*d)->process().ReadAll();
    EXPECT_TRUE(absl::StrContains(log,
                                  "pool 'gpu0': CUDA pools are "
                                  "unavailable"))
        << log;
    EXPECT_TRUE(absl::StrContains(log, "serving without it")) << log;
  } else {  // A GPU: the pool is there, one cudaMalloc with its IPC handle.
    ASSERT_EQ(status.pools_size(), 2);
    EXPECT_EQ(status.pools(1).info().kind(), v1::MEMORY_KIND_CUDA_DEVICE);
    EXPECT_EQ(status.pools(1).info().cuda_ipc_handle().size(), 64u);
    EXPECT_EQ(status.pools(1).info().page_size(), 256u);
    // The client maps it (tests/cuda_test.cc tests the rest).
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    EXPECT_EQ(gpu->info().device, Device::Cuda(0));
  }
}

TEST(CudaPoolTest, ADaemonWithNoPoolItCanCreateDoesNotStart) {
  const std::string path = ::testing::TempDir() + "/shmtensord_cuda_only.toml";
  // Device 1000: no machine has it, so this holds with or without a GPU.
  std::ofstream(path) << "[[pool]]\nname = \"gpu\"\nsize = \"64MiB\"\n"
                      << "kind = \"cuda\"\ndevice = 1000\n";
  auto [code, out] =
      RunFailing({"--listen", testing::FreshAddress(), "--config", path});
  EXPECT_EQ(code, 1);
  EXPECT_TRUE(absl::StrContains(out, "no pool could be created")) << out;
  EXPECT_TRUE(absl::StrContains(out, "CUDA pools are unavailable")) << out;
}

}  // namespace
}  // namespace shmtensor
