#include "tests/test_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <linux/perf_event.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "shmtensor/v1/monitor.grpc.pb.h"

namespace shmtensor::testing {

std::string ChildPath() { return SHMTENSOR_CHILD_PATH; }

std::optional<v1::SessionOpened> OpenRawSession(
    grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionEvent>* stream,
    absl::string_view client_name, uint64_t resume_session_id,
    bool present_leases) {
  v1::SessionRequest open;
  open.mutable_open()->set_client_name(std::string(client_name));
  open.mutable_open()->set_resume_session_id(resume_session_id);
  open.mutable_open()->set_present_leases(present_leases);
  v1::SessionEvent event;
  if (!stream->Write(open) || !stream->Read(&event) || !event.has_opened()) {
    ADD_FAILURE() << "no SessionOpened for OpenSession of " << client_name;
    return std::nullopt;
  }
  return event.opened();
}

namespace {
// One Monitor call on a channel of its own, over a connection of its own
// (gRPC would share one with earlier channels to the address, which may
// have been to a daemon since replaced).
template <typename Req, typename Resp>
Resp Monitor(const std::string& address,
             grpc::Status (v1::Monitor::Stub::*method)(grpc::ClientContext*,
                                                       const Req&, Resp*)) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto stub = v1::Monitor::NewStub(grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  Resp r;
  grpc::Status st = (stub.get()->*method)(&ctx, Req(), &r);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return r;
}
}  // namespace

v1::DaemonStatus MonitorStatus(const std::string& address) {
  return Monitor(address, &v1::Monitor::Stub::GetStatus);
}
v1::ListClientsResponse MonitorClients(const std::string& address) {
  return Monitor(address, &v1::Monitor::Stub::ListClients);
}
uint64_t MonitorLeasesOf(const std::string& address, uint64_t client_id) {
  const v1::ListClientsResponse clients = MonitorClients(address);
  for (const v1::ClientStatus& s : clients.clients()) {
    if (s.client_id() == client_id) return s.leases();
  }
  return UINT64_MAX;
}
v1::ListObjectsResponse MonitorObjects(const std::string& address) {
  return Monitor(address, &v1::Monitor::Stub::ListObjects);
}

std::vector<std::string> ShmtensorFilesInDevShm() {
  std::vector<std::string> out;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* e = readdir(dir)) {
      if (absl::StartsWith(e->d_name, "shmtensor")) out.push_back(e->d_name);
    }
    closedir(dir);
  }
  return out;
}

uint64_t ShmemBytes() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    if (absl::StartsWith(line, "Shmem:")) {
      return std::stoull(line.substr(6)) * 1024;
    }
  }
  return 0;
}

void DaemonTest::SetUp() {
  absl::StatusOr<std::unique_ptr<DaemonProcess>> d =
      DaemonProcess::Start(DaemonArgs());
  ASSERT_TRUE(d.ok()) << d.status();
  daemon_ = *std::move(d);
  client_ = Connect();
}

Client DaemonTest::Connect() {
  absl::StatusOr<Client> c = Client::Connect({.address = daemon_->address()});
  if (!c.ok()) {
    ADD_FAILURE() << c.status();
    std::abort();
  }
  return *std::move(c);
}

std::unique_ptr<Subprocess> DaemonTest::Child(
    const std::vector<std::string>& command) {
  std::vector<std::string> argv = {ChildPath(), command[0], daemon_->address()};
  argv.insert(argv.end(), command.begin() + 1, command.end());
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn(argv);
  if (!p.ok()) {
    ADD_FAILURE() << p.status();
    std::abort();
  }
  return *std::move(p);
}

uint64_t DaemonTest::Used() {
  absl::StatusOr<StoreStats> s = client_->Stats();
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? s->pools[0].used_bytes - s->pools[0].stock_bytes
                : ~uint64_t{0};
}

namespace {

// Built with a sanitizer, whose shadow memory a checked access touches (and
// faults in) beside the bytes themselves.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kShadowMemory = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kShadowMemory = true;
#else
constexpr bool kShadowMemory = false;
#endif
#else
constexpr bool kShadowMemory = false;
#endif

}  // namespace

ThreadFaults::ThreadFaults() {
  if (kShadowMemory) return;  // ok() false: its faults are not the test's.
  perf_event_attr attr{};
  attr.type = PERF_TYPE_SOFTWARE;
  attr.size = sizeof(attr);
  attr.config = PERF_COUNT_SW_PAGE_FAULTS;
  fd_ = static_cast<int>(
      syscall(SYS_perf_event_open, &attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC));
}

ThreadFaults::~ThreadFaults() {
  if (fd_ >= 0) close(fd_);
}

uint64_t ThreadFaults::count() const {
  uint64_t n = 0;
  if (fd_ < 0 || read(fd_, &n, sizeof(n)) != sizeof(n)) return 0;
  return n;
}

bool PagesPresent(const void* p, uint64_t bytes) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t first = reinterpret_cast<uintptr_t>(p) / page;
  const uint64_t last = (reinterpret_cast<uintptr_t>(p) + bytes - 1) / page;
  const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::vector<uint64_t> entries(last - first + 1);
  const ssize_t want = static_cast<ssize_t>(entries.size() * 8);
  const bool read_all =
      pread(fd, entries.data(), want, static_cast<off_t>(first * 8)) == want;
  close(fd);
  if (!read_all) return false;
  for (uint64_t e : entries) {
    if ((e & (uint64_t{3} << 62)) == 0) return false;  // Neither bit 63 nor 62.
  }
  return true;
}

}  // namespace shmtensor::testing
