// Test helper for tests/access_test.cc: a client process of some user, in
// some mount namespace, reporting on stdout what it could and could not do.
//
//   access_child [--unshare-shm] [--uid N] [--groups G,G...] COMMAND ARGS...
//
// --unshare-shm first moves to a mount namespace of its own with a 16 MiB
// tmpfs on /dev/shm (a container's); --uid N then drops to that uid (and
// gid N, with the supplementary --groups) with setresuid, as another user
// of the machine. Commands:
//   use ADDRESS [read_only]   connects; prints the pools it sees, the access
//                             mode of each pool descriptor it holds
//                             (/proc/self/fdinfo), what mmap(PROT_WRITE,
//                             MAP_SHARED) and a read-write reopen through
//                             /proc/self/fd of them give, the permissions
//                             of its pool mappings, whether put() and a get
//                             of the object named "shared" work; "done",
//                             then waits to be killed
//   fdreq ADDRESS [UID]       opens a raw session, then (after dropping to
//                             UID, when given: the same process as another
//                             user) asks for its descriptors with its own
//                             secret; prints the answer
//   fdreq_for ADDRESS SESSION_HEX SECRET_HEX
//                             asks for another session's descriptors
//   bigput ADDRESS BYTES      puts BYTES of a pattern, reads them back
//                             through a view, prints "bigput BYTES ok"
//   monitor ADDRESS           asks the Monitor service; prints the pools of
//                             its status, the names of the objects it lists
//                             and the uids of the clients it lists
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "shmtensor/client.h"
#include "shmtensor/errors.h"
#include "shmtensor/v1/monitor.grpc.pb.h"
#include "tests/descriptor_probe.h"

namespace {

using shmtensor::Client;

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

std::string CodeName(const absl::Status& s) {
  return absl::StatusCodeToString(s.code());
}

std::string ErrnoName(int e) {
  return e == EACCES  ? "EACCES"
         : e == EPERM ? "EPERM"
                      : absl::StrCat("errno", e);
}

// Descriptors of pool memory this process holds.
std::vector<int> PoolFds() {
  std::vector<int> out;
  for (int fd = 0; fd < 1024; ++fd) {
    char target[256];
    const ssize_t n = readlink(absl::StrCat("/proc/self/fd/", fd).c_str(),
                               target, sizeof(target) - 1);
    if (n > 0 && std::string(target, n).rfind("/memfd:shmtensor:", 0) == 0) {
      out.push_back(fd);
    }
  }
  return out;
}

// O_ACCMODE of `fd` as /proc/self/fdinfo says (octal "flags:").
std::string FdinfoMode(int fd) {
  std::ifstream in(absl::StrCat("/proc/self/fdinfo/", fd));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("flags:", 0) == 0) {
      const long flags = std::strtol(line.c_str() + 6, nullptr, 8);
      return (flags & O_ACCMODE) == O_RDONLY ? "rdonly"
             : (flags & O_ACCMODE) == O_RDWR ? "rdwr"
                                             : "other";
    }
  }
  return "unknown";
}

int Use(const std::string& address, bool read_only) {
  absl::StatusOr<Client> c =
      Client::Connect({.address = address, .read_only = read_only});
  if (!c.ok()) {
    Say(absl::StrCat("connect error ", CodeName(c.status()), " ",
                     c.status().message()));
    return 0;
  }
  std::vector<std::string> names;
  absl::StatusOr<shmtensor::StoreStats> stats = c->Stats();
  if (stats.ok()) {
    for (const auto& p : stats->pools) names.push_back(p.name);
  }
  Say("pools " + absl::StrJoin(names, ","));
  std::vector<std::string> modes, mmaps, reopens;
  for (int fd : PoolFds()) {
    modes.push_back(FdinfoMode(fd));
    void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    mmaps.push_back(p == MAP_FAILED ? ErrnoName(errno) : "ok");
    if (p != MAP_FAILED) munmap(p, 4096);
    const int again =
        open(absl::StrCat("/proc/self/fd/", fd).c_str(), O_RDWR | O_CLOEXEC);
    reopens.push_back(again < 0 ? ErrnoName(errno) : "ok");
    if (again >= 0) close(again);
  }
  Say("fds " + absl::StrJoin(modes, ","));
  Say("mmap_write " + absl::StrJoin(mmaps, ","));
  Say("reopen_rdwr " + absl::StrJoin(reopens, ","));
  std::vector<std::string> perms;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find("memfd:shmtensor:") != std::string::npos) {
      perms.push_back(std::vector<std::string>(absl::StrSplit(line, ' '))[1]);
    }
  }
  Say("maps " + absl::StrJoin(perms, ","));
  std::vector<uint8_t> bytes(1 << 20, 0x11);
  absl::StatusOr<shmtensor::SealedRef> put =
      c->Put(bytes.data(), {.size_bytes = bytes.size()});
  Say(put.ok() ? "put ok"
               : absl::StrCat("put error ", CodeName(put.status()), " ",
                              put.status().message()));
  absl::StatusOr<shmtensor::View> shared = c->Get("shared");
  Say(shared.ok() ? absl::StrCat("get ok ",
                                 static_cast<const uint8_t*>(shared->data())[0])
                  : absl::StrCat("get error ", CodeName(shared.status())));
  absl::StatusOr<shmtensor::Buffer> priv =
      c->Create({.size_bytes = 4096, .pool = "private"});
  Say(priv.ok() ? "private ok"
                : absl::StrCat("private error ", CodeName(priv.status())));
  Say("done");
  while (true) pause();
}

void SayAnswer(const absl::StatusOr<shmtensor::testing::DescriptorAnswer>& a) {
  if (!a.ok()) {
    Say(absl::StrCat("answer none ", a.status().message()));
    return;
  }
  Say(absl::StrCat("answer code=", a->code, " fds=", a->access_modes.size(),
                   " ", a->message));
}

int FdReq(const std::string& address, int drop_to) {
  auto s = shmtensor::testing::OpenRawSession(address);
  if (!s.ok()) {
    Say(absl::StrCat("session error ", s.status().message()));
    return 3;
  }
  if (drop_to >= 0 && (setresgid(drop_to, drop_to, drop_to) != 0 ||
                       setresuid(drop_to, drop_to, drop_to) != 0)) {
    Say("setresuid failed");
    return 3;
  }
  SayAnswer(shmtensor::testing::AskDescriptors(
      address.substr(5),
      shmtensor::testing::DescriptorRequestBytes(
          (*s)->opened.session_id(), (*s)->opened.descriptor_secret())));
  return 0;
}

int BigPut(const std::string& address, uint64_t n) {
  absl::StatusOr<Client> c = Client::Connect({.address = address});
  if (!c.ok()) {
    Say(absl::StrCat("connect error ", c.status().message()));
    return 3;
  }
  std::vector<uint8_t> bytes(n);
  for (uint64_t i = 0; i < n; ++i)
    bytes[i] = static_cast<uint8_t>(i * 31 % 251);
  absl::StatusOr<shmtensor::SealedRef> ref =
      c->Put(bytes.data(), {.size_bytes = n});
  if (!ref.ok()) {
    Say(absl::StrCat("put error ", ref.status().message()));
    return 3;
  }
  absl::StatusOr<shmtensor::View> v = c->Get(ref->ref());
  if (!v.ok()) {
    Say(absl::StrCat("get error ", v.status().message()));
    return 3;
  }
  const bool same =
      v->size_bytes() == n && memcmp(v->data(), bytes.data(), n) == 0;
  Say(absl::StrCat("bigput ", n, same ? " ok" : " bad"));
  return 0;
}

int Monitor(const std::string& address) {
  auto stub = shmtensor::v1::Monitor::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext c1, c2, c3;
  shmtensor::v1::DaemonStatus status;
  shmtensor::v1::ListObjectsResponse objects;
  shmtensor::v1::ListClientsResponse clients;
  if (!stub->GetStatus(&c1, {}, &status).ok() ||
      !stub->ListObjects(&c2, {}, &objects).ok() ||
      !stub->ListClients(&c3, {}, &clients).ok()) {
    Say("monitor error");
    return 3;
  }
  std::vector<std::string> pools, names, uids;
  for (const auto& p : status.pools()) pools.push_back(p.info().name());
  for (const auto& o : objects.objects()) names.push_back(o.name());
  for (const auto& c : clients.clients()) uids.push_back(absl::StrCat(c.uid()));
  Say("status_pools " + absl::StrJoin(pools, ","));
  Say("objects " + absl::StrJoin(names, ","));
  Say("clients " + absl::StrJoin(uids, ","));
  Say("done");
  return 0;
}

int Run(int argc, char** argv) {
  int i = 1;
  if (i < argc && std::string(argv[i]) == "--unshare-shm") {
    // Nothing mounted here may reach the host's namespace: every mount
    // private, or (in a chroot, whose / is no mount point) /dev/shm's.
    if (unshare(CLONE_NEWNS) != 0 ||
        (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 &&
         mount(nullptr, "/dev/shm", nullptr, MS_PRIVATE, nullptr) != 0) ||
        mount("shmtensor-test-shm", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV,
              "size=16m,mode=1777") != 0) {
      Say(absl::StrCat("unshare failed ", std::strerror(errno)));
      return 4;
    }
    struct statvfs fs;
    statvfs("/dev/shm", &fs);
    Say(absl::StrCat("shm ", fs.f_blocks * fs.f_frsize));
    ++i;
  }
  int uid = -1;
  std::vector<gid_t> groups;
  while (i + 1 < argc && argv[i][0] == '-') {
    const std::string flag = argv[i];
    if (flag == "--uid") uid = std::atoi(argv[i + 1]);
    if (flag == "--groups") {
      for (absl::string_view g : absl::StrSplit(argv[i + 1], ',')) {
        uint32_t v;
        if (absl::SimpleAtoi(g, &v)) groups.push_back(v);
      }
    }
    i += 2;
  }
  if (uid >= 0) {
    if (setgroups(groups.size(), groups.data()) != 0 ||
        setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0) {
      Say("setresuid failed");
      return 3;
    }
  }
  if (argc - i < 2) return 2;
  const std::string cmd = argv[i];
  const std::vector<std::string> a(argv + i + 1, argv + argc);
  if (cmd == "use") return Use(a[0], a.size() > 1 && a[1] == "read_only");
  if (cmd == "fdreq")
    return FdReq(a[0], a.size() > 1 ? std::atoi(a[1].c_str()) : -1);
  if (cmd == "fdreq_for" && a.size() == 3) {
    uint64_t session;
    std::string secret;
    if (!absl::SimpleHexAtoi(a[1], &session)) return 2;
    secret = absl::HexStringToBytes(a[2]);
    SayAnswer(shmtensor::testing::AskDescriptors(
        a[0].substr(5),
        shmtensor::testing::DescriptorRequestBytes(session, secret)));
    return 0;
  }
  if (cmd == "monitor") return Monitor(a[0]);
  if (cmd == "bigput" && a.size() == 2) {
    uint64_t n;
    if (!absl::SimpleAtoi(a[1], &n)) return 2;
    return BigPut(a[0], n);
  }
  return 2;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
