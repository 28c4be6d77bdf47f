// Operations: the Monitor service, shmtensorctl, health, limits and the TCP
// monitoring listener, against a real daemon and real client processes.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "shmtensor/client.h"
#include "shmtensor/v1/monitor.grpc.pb.h"
#include "shmtensor/v1/shmtensor.grpc.pb.h"
#include "tests/test_util.h"

namespace shmtensor {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckResponse;
using testing::Subprocess;

constexpr uint64_t kKiB = 1024, kMiB = 1024 * 1024;

int Count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + needle.size())) {
    ++n;
  }
  return n;
}

// Runs a shell command line; returns its exit code and stdout+stderr.
std::pair<int, std::string> Sh(const std::string& command) {
  absl::StatusOr<std::unique_ptr<Subprocess>> p =
      Subprocess::Spawn({"/bin/sh", "-c", command + " 2>&1"});
  EXPECT_TRUE(p.ok());
  std::string out = (*p)->ReadAll(absl::Seconds(30));
  const int status = (*p)->Wait();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

template <typename Message>
Message FromJson(const std::string& json) {
  Message m;
  auto st = google::protobuf::util::JsonStringToMessage(json, &m);
  EXPECT_TRUE(st.ok()) << st.ToString() << "\n" << json;
  return m;
}

// Checks the Prometheus text exposition format (0.0.4) line by line: HELP
// and TYPE before a family's samples, each family once, valid metric and
// label names, quoted and escaped label values, a float value. Returns the
// samples as "name{labels}" -> value.
std::map<std::string, double> ParsePrometheus(const std::string& text) {
  static const std::regex kHelp(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .*)");
  static const std::regex kType(
      R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (gauge|counter|untyped|summary|histogram))");
  static const std::regex kSample(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*")(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*")*\})? (-?[0-9.eE+-]+|NaN|\+Inf|-Inf))");
  std::map<std::string, double> samples;
  std::set<std::string> typed, helped;
  EXPECT_TRUE(!text.empty() && text.back() == '\n');
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const std::string l(line);
    std::smatch m;
    if (std::regex_match(l, m, kHelp)) {
      EXPECT_TRUE(helped.insert(m[1]).second) << "HELP twice: " << l;
    } else if (std::regex_match(l, m, kType)) {
      EXPECT_TRUE(typed.insert(m[1]).second) << "TYPE twice: " << l;
      EXPECT_TRUE(helped.count(m[1])) << "TYPE before HELP: " << l;
    } else if (std::regex_match(l, m, kSample)) {
      EXPECT_TRUE(typed.count(m[1])) << "sample before its TYPE: " << l;
      const size_t space = l.rfind(' ');
      samples[l.substr(0, space)] = std::stod(l.substr(space + 1));
    } else {
      ADD_FAILURE() << "not Prometheus text: '" << l << "'";
    }
  }
  return samples;
}

class MonitorTest : public testing::DaemonTest {
 protected:
  void SetUp() override {
    testing::DaemonTest::SetUp();
    channel_ = grpc::CreateChannel(daemon_->address(),
                                   grpc::InsecureChannelCredentials());
    monitor_ = v1::Monitor::NewStub(channel_);
  }

  Client Named(const std::string& name) {
    absl::StatusOr<Client> c =
        Client::Connect({.address = daemon_->address(), .client_name = name});
    EXPECT_TRUE(c.ok()) << c.status();
    return *std::move(c);
  }
  std::string Ctl(const std::string& args) {
    return absl::StrCat(SHMTENSOR_CTL_PATH, " --address ", daemon_->address(),
                        " ", args);
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Monitor::Stub> monitor_;
};

TEST_F(MonitorTest, ListingsAndMetricsReflectAKnownWorkload) {
  Client producer = Named("producer");
  Client reader = Named("reader");
  std::vector<float> w(256 * 1024, 1.0f);  // 1 MiB.
  SealedRef weights = *producer.Put(w.data(), {.size_bytes = 0,
                                               .dtype = DType::kFloat32,
                                               .shape = {256, 1024},
                                               .name = "weights"});
  Buffer unsealed = *producer.Create({.size_bytes = 64 * kKiB});
  std::vector<uint8_t> batch(128 * kKiB, 7);
  SealedRef transfer =
      *producer.Put(batch.data(), {.size_bytes = batch.size()}, true);
  View view = *reader.Get("weights");

  const uint64_t producer_bytes = kMiB + 64 * kKiB + 128 * kKiB;
  // Listings through shmtensorctl --json, parsed back into the messages.
  auto [rc, out] = Sh(Ctl("objects --json"));
  ASSERT_EQ(rc, 0) << out;
  auto objects = FromJson<v1::ListObjectsResponse>(out);
  ASSERT_EQ(objects.total(), 3u);
  ASSERT_EQ(objects.objects_size(), 3);  // Oldest first.
  const v1::ObjectStatus& o0 = objects.objects(0);
  EXPECT_EQ(o0.name(), "weights");
  EXPECT_EQ(o0.pool(), "default");
  EXPECT_EQ(o0.size_bytes(), kMiB);
  EXPECT_EQ(o0.layout().dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(o0.layout().shape_size(), 2);
  EXPECT_EQ(o0.state(), v1::OBJECT_STATE_SEALED);
  EXPECT_EQ(o0.leases(), 2u);  // The producer's ref and the reader's view.
  EXPECT_EQ(o0.creator(), absl::StrCat("'producer' pid ", getpid()));
  EXPECT_EQ(o0.ref().slot(), weights.ref().slot);
  EXPECT_EQ(o0.ref().nonce(), 0u);  // A listing hands out no usable ref.
  EXPECT_NE(weights.ref().nonce, 0u);
  EXPECT_EQ(objects.objects(1).state(), v1::OBJECT_STATE_WRITING);
  EXPECT_EQ(objects.objects(1).leases(), 1u);
  EXPECT_EQ(objects.objects(1).size_bytes(), 64 * kKiB);
  EXPECT_EQ(objects.objects(2).state(), v1::OBJECT_STATE_PENDING_TRANSFER);
  EXPECT_EQ(objects.objects(2).leases(), 0u);
  std::tie(rc, out) = Sh(Ctl("objects --json --limit 1"));
  EXPECT_EQ(FromJson<v1::ListObjectsResponse>(out).objects_size(), 1);

  std::tie(rc, out) = Sh(Ctl("clients --json"));
  ASSERT_EQ(rc, 0) << out;
  auto clients = FromJson<v1::ListClientsResponse>(out);
  ASSERT_EQ(clients.clients_size(), 3);  // The fixture's, producer, reader.
  const v1::ClientStatus& p = clients.clients(1);
  EXPECT_EQ(p.client_name(), "producer");
  // The public id, never the session's secret one.
  EXPECT_EQ(p.client_id(), producer.client_id());
  EXPECT_NE(p.client_id(), producer.session_id());
  EXPECT_TRUE(p.connected());
  EXPECT_EQ(p.pid(), getpid());
  EXPECT_TRUE(p.has_process());
  EXPECT_EQ(p.uid(), getuid());
  EXPECT_TRUE(absl::StrContains(p.command_line(), "monitor_test"))
      << p.command_line();
  EXPECT_EQ(p.leases(), 2u);  // Its ref and its write lease.
  EXPECT_EQ(p.bytes_held(), producer_bytes);
  EXPECT_EQ(p.pending_transfers(), 1u);
  EXPECT_EQ(clients.clients(2).client_name(), "reader");
  EXPECT_EQ(clients.clients(2).leases(), 1u);
  EXPECT_EQ(clients.clients(2).bytes_held(), kMiB);
  EXPECT_EQ(clients.clients(0).leases(), 0u);

  std::tie(rc, out) = Sh(Ctl("status --json"));
  ASSERT_EQ(rc, 0) << out;
  auto status = FromJson<v1::DaemonStatus>(out);
  EXPECT_EQ(status.version(), SHMTENSOR_VERSION);
  EXPECT_EQ(status.addresses(0), daemon_->address());
  EXPECT_EQ(status.sessions(), 3u);
  EXPECT_EQ(status.objects(), 3u);
  EXPECT_EQ(status.named_objects(), 1u);
  EXPECT_EQ(status.leases(), 3u);
  EXPECT_EQ(status.pending_transfers(), 1u);
  EXPECT_TRUE(status.serving());
  ASSERT_EQ(status.pools_size(), 1);
  EXPECT_EQ(status.pools(0).used_bytes(), producer_bytes);
  EXPECT_EQ(status.pools(0).free_bytes(), 64 * kMiB - producer_bytes);
  EXPECT_EQ(status.pools(0).high_water_bytes(), producer_bytes);
  EXPECT_EQ(status.pools(0).objects(), 3u);
  EXPECT_EQ(status.pools(0).leases(), 3u);

  // Human tables: aligned, sizes in binary units.
  std::tie(rc, out) = Sh(Ctl("clients"));
  EXPECT_TRUE(absl::StrContains(out, "producer")) << out;
  EXPECT_TRUE(absl::StrContains(out, "1.2 MiB")) << out;
  std::tie(rc, out) = Sh(Ctl("status"));
  EXPECT_TRUE(absl::StrContains(out, "64.0 MiB")) << out;
  EXPECT_TRUE(absl::StrContains(out, "pending transfers 1")) << out;

  std::tie(rc, out) = Sh(Ctl("metrics"));
  ASSERT_EQ(rc, 0) << out;
  std::map<std::string, double> m = ParsePrometheus(out);
  EXPECT_EQ(m["shmtensor_up"], 1);
  EXPECT_EQ(m["shmtensor_objects"], 3);
  EXPECT_EQ(m["shmtensor_leases"], 3);
  EXPECT_EQ(m["shmtensor_pending_transfers"], 1);
  EXPECT_EQ(m["shmtensor_pool_used_bytes{pool=\"default\"}"], producer_bytes);
  EXPECT_EQ(m["shmtensor_pool_size_bytes{pool=\"default\",kind=\"host\"}"],
            64 * kMiB);
  const std::string producer_labels =
      absl::StrFormat("{client_id=\"%d\",client=\"producer\",pid=\"%d\"}",
                      producer.client_id(), getpid());
  EXPECT_EQ(m["shmtensor_client_bytes_held" + producer_labels], producer_bytes);
  EXPECT_EQ(m["shmtensor_client_leases" + producer_labels], 2);

  // Releases show at once (the listing follows the workload, not a cache).
  view = View();
  weights.Reset();
  auto after =
      FromJson<v1::ListClientsResponse>(Sh(Ctl("clients --json")).second);
  // The name keeps "weights" alive, but no longer on the producer's account.
  EXPECT_EQ(after.clients(1).bytes_held(), 64 * kKiB + 128 * kKiB);
  EXPECT_EQ(after.clients(1).leases(), 1u);
  EXPECT_EQ(after.clients(2).bytes_held(), 0u);
}

TEST_F(MonitorTest, WatchStreamsAtTheIntervalAndEndsCleanly) {
  v1::WatchRequest req;
  req.set_interval_ms(200);
  req.set_count(4);
  grpc::ClientContext ctx;
  const absl::Time start = absl::Now();
  auto reader = monitor_->Watch(&ctx, req);
  std::vector<uint64_t> stamps;
  v1::DaemonStatus s;
  while (reader->Read(&s)) stamps.push_back(s.time_unix_ms());
  grpc::Status st = reader->Finish();
  EXPECT_TRUE(st.ok()) << st.error_message();
  ASSERT_EQ(stamps.size(), 4u);
  for (size_t i = 1; i < stamps.size(); ++i) {
    EXPECT_GE(stamps[i] - stamps[i - 1], 190u) << i;  // Never faster.
  }
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(590));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  // A caller that goes away ends its watch at once.
  grpc::ClientContext endless_ctx;
  req.set_count(0);
  auto endless = monitor_->Watch(&endless_ctx, req);
  ASSERT_TRUE(endless->Read(&s));
  endless_ctx.TryCancel();
  while (endless->Read(&s)) {
  }
  EXPECT_EQ(endless->Finish().error_code(), grpc::StatusCode::CANCELLED);

  grpc::ClientContext bad_ctx;
  req.set_interval_ms(5);
  auto bad = monitor_->Watch(&bad_ctx, req);
  EXPECT_FALSE(bad->Read(&s));
  st = bad->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(st.error_message(), "interval_ms 5"))
      << st.error_message();

  // shmtensorctl watch: one screen per message, then exit 0.
  auto [rc, out] = Sh(Ctl("watch --interval-ms 100 --count 3"));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(Count(out, "shmtensord " SHMTENSOR_VERSION), 3) << out;
  EXPECT_EQ(Count(out, "POOL "), 3) << out;
}

TEST_F(MonitorTest, HealthIsServingThenNotServingDuringShutdown) {
  auto health = Health::NewStub(channel_);
  {
    grpc::ClientContext ctx;
    HealthCheckResponse r;
    ASSERT_TRUE(health->Check(&ctx, {}, &r).ok());
    EXPECT_EQ(r.status(), HealthCheckResponse::SERVING);
  }
  EXPECT_EQ(Sh(Ctl("health")), std::make_pair(0, std::string("SERVING\n")));
  grpc::ClientContext ctx;
  auto watch = health->Watch(&ctx, {});
  HealthCheckResponse r;
  ASSERT_TRUE(watch->Read(&r));
  EXPECT_EQ(r.status(), HealthCheckResponse::SERVING);
  daemon_->process().Signal(SIGTERM);
  ASSERT_TRUE(watch->Read(&r)) << "no update before the stream ended";
  EXPECT_EQ(r.status(), HealthCheckResponse::NOT_SERVING);
  while (watch->Read(&r)) {
  }
  watch->Finish();
  const int status = daemon_->process().Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST_F(MonitorTest, CtlSaysClearlyWhenTheDaemonIsDown) {
  const std::string gone = "unix:/tmp/shmtensor-no-daemon-here.sock";
  for (const char* cmd : {"status", "objects", "clients", "health"}) {
    auto [rc, out] = Sh(absl::StrCat(SHMTENSOR_CTL_PATH, " --address ", gone,
                                     " --timeout 1 ", cmd));
    EXPECT_EQ(rc, 2) << cmd << ": " << out;
    EXPECT_TRUE(absl::StrContains(out, "no shmtensord answers at " + gone))
        << out;
  }
  auto [rc, out] = Sh(absl::StrCat(SHMTENSOR_CTL_PATH, " --address ", gone,
                                   " --timeout 1 metrics"));
  EXPECT_EQ(rc, 2);
  EXPECT_TRUE(absl::StrContains(out, "shmtensor_up 0\n")) << out;
  std::tie(rc, out) = Sh(Ctl("delete no-such-name"));
  EXPECT_EQ(rc, 3) << out;
  EXPECT_TRUE(absl::StrContains(out, "'no-such-name'")) << out;
  std::tie(rc, out) = Sh(Ctl("frobnicate"));
  EXPECT_EQ(rc, 1) << out;
}

TEST_F(MonitorTest, GlobalFlagsGoBeforeOrAfterTheSubcommand) {
  std::vector<uint8_t> data(4096, 1);
  ASSERT_TRUE(
      client_->Put(data.data(), {.size_bytes = 4096, .name = "flags"}).ok());
  const std::string ctl = SHMTENSOR_CTL_PATH;
  const std::string at = " --address " + daemon_->address();
  for (const std::string& cmd :
       {ctl + at + " objects --json", ctl + " objects" + at + " --json",
        ctl + " objects --json" + at + " --timeout 5",
        ctl + " --timeout 5 objects --json" + at}) {
    auto [rc, out] = Sh(cmd);
    EXPECT_EQ(rc, 0) << cmd << ": " << out;
    EXPECT_TRUE(absl::StrContains(out, "\"flags\"")) << cmd << ": " << out;
  }
  // A flag no command knows is still refused, after the subcommand too.
  auto [rc, out] = Sh(ctl + " objects" + at + " --no-such-flag");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_TRUE(absl::StrContains(out, "--no-such-flag")) << out;
  std::tie(rc, out) = Sh(ctl + " delete flags" + at);
  EXPECT_EQ(rc, 0) << out;
}

TEST_F(MonitorTest, DeleteUnbindsAName) {
  std::vector<uint8_t> data(4096, 1);
  ASSERT_TRUE(
      client_->Put(data.data(), {.size_bytes = 4096, .name = "old"}).ok());
  auto [rc, out] = Sh(Ctl("delete old"));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "deleted 'old'\n");
  EXPECT_TRUE(absl::IsNotFound(client_->Get("old").status()));
}

class SmallPoolTest : public MonitorTest {
 protected:
  std::vector<std::string> DaemonArgs() override {
    return {"--pool-size", "8MiB"};
  }
};

TEST_F(SmallPoolTest, PoolExhaustionNamesTheHolderInErrorAndListing) {
  Client hog = Named("hog");
  Buffer all = *hog.Create({.size_bytes = 8 * kMiB});
  absl::StatusOr<Buffer> more =
      client_->Create({.size_bytes = 4096, .timeout = absl::Milliseconds(100)});
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(
      more.status().message(),
      absl::StrCat("'hog' pid ", getpid(), " holds 8388608 bytes")))
      << more.status();
  auto clients =
      FromJson<v1::ListClientsResponse>(Sh(Ctl("clients --json")).second);
  ASSERT_EQ(clients.clients_size(), 2);
  EXPECT_EQ(clients.clients(1).client_name(), "hog");
  EXPECT_EQ(clients.clients(1).bytes_held(), 8 * kMiB);
}

class LimitsTest : public MonitorTest {
 protected:
  std::vector<std::string> DaemonArgs() override {
    const std::string path = ::testing::TempDir() + "/shmtensord_limits.toml";
    std::ofstream(path)
        << "[limits]\nmax_objects = 4\nuid_share_percent = 100\n"
           "max_leases_per_client = 3\n"
           "max_bytes_per_client = \"64KiB\"\n"
           "[[pool]]\nname = \"default\"\nsize = \"8MiB\"\n";
    return {"--config", path};
  }
};

TEST_F(LimitsTest, PerClientAndObjectLimitsFailWithPreciseErrors) {
  Client a = Named("greedy");
  absl::StatusOr<Buffer> big = a.Create({.size_bytes = 65 * kKiB});
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(big.status().message(),
                                "limits.max_bytes_per_client = 65536"))
      << big.status();
  std::vector<SealedRef> refs;
  for (int i = 0; i < 3; ++i) {
    std::vector<uint8_t> d(4096, i);
    refs.push_back(*a.Put(d.data(), {.size_bytes = 4096}));
  }
  absl::StatusOr<Buffer> fourth = a.Create({.size_bytes = 4096});
  EXPECT_EQ(fourth.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(
      fourth.status().message(),
      "'greedy' pid " + std::to_string(getpid()) +
          " holds 3 leases, the limit (limits.max_leases_per_client = 3)"))
      << fourth.status();
  // Another client is not limited by greedy's holdings, only by the global
  // object limit.
  Client b = Named("modest");
  absl::StatusOr<Buffer> b1 = b.Create({.size_bytes = 4096});
  ASSERT_TRUE(b1.ok()) << b1.status();
  absl::StatusOr<Buffer> fifth = b.Create({.size_bytes = 4096});
  EXPECT_EQ(fifth.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(
      absl::StrContains(fifth.status().message(), "limits.max_objects = 4"))
      << fifth.status();
  // Nothing stored was harmed; releasing makes room again.
  absl::StatusOr<View> v = b.Get(refs[2].ref());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(static_cast<const uint8_t*>(v->data())[0], 2);
  // Waits until the daemon dropped modest's lease: dropping the view would
  // send the release one-way, which greedy's next call need not see yet.
  ASSERT_TRUE(v->Release().ok());
  refs.pop_back();  // Frees an object and a lease of greedy's.
  EXPECT_TRUE(a.Create({.size_bytes = 4096}).ok());
  auto status = FromJson<v1::DaemonStatus>(Sh(Ctl("status --json")).second);
  EXPECT_EQ(status.limits().max_leases_per_client(), 3u);
}

// The IPv4 address of a non-loopback interface, or "" if there is none.
std::string NonLoopbackAddress() {
  struct ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return "";
  std::string found;
  for (auto* i = ifs; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN];
    auto* in = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    if (!absl::StartsWith(buf, "127.")) found = buf;
  }
  freeifaddrs(ifs);
  return found;
}

class RemoteMonitorTest : public MonitorTest {
 protected:
  std::vector<std::string> DaemonArgs() override {
    return {"--pool-size", "8MiB", "--monitor-listen", "0.0.0.0:0"};
  }
};

TEST_F(RemoteMonitorTest, MonitoringServesRemoteCallersTheDataPlaneRefuses) {
  v1::DaemonStatus s;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(monitor_->GetStatus(&ctx, {}, &s).ok());
  }
  ASSERT_EQ(s.addresses_size(), 2);
  const std::string port = s.addresses(1).substr(s.addresses(1).rfind(':') + 1);
  ASSERT_NE(port, "0");  // The port actually bound is reported.
  // Even loopback TCP gets monitoring only: the data plane serves the Unix
  // socket, where the kernel says who the caller is.
  auto loop = grpc::CreateChannel("127.0.0.1:" + port,
                                  grpc::InsecureChannelCredentials());
  {
    grpc::ClientContext ctx;
    v1::StatsResponse r;
    EXPECT_EQ(v1::ObjectStore::NewStub(loop)->Stats(&ctx, {}, &r).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    grpc::ClientContext ctx2;
    v1::DaemonStatus s2;
    EXPECT_TRUE(v1::Monitor::NewStub(loop)->GetStatus(&ctx2, {}, &s2).ok());
  }
  const std::string ip = NonLoopbackAddress();
  if (ip.empty()) GTEST_SKIP() << "no non-loopback IPv4 interface here";
  auto remote =
      grpc::CreateChannel(ip + ":" + port, grpc::InsecureChannelCredentials());
  {
    grpc::ClientContext ctx;
    v1::DaemonStatus rs;
    grpc::Status st = v1::Monitor::NewStub(remote)->GetStatus(&ctx, {}, &rs);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(rs.daemon_epoch(), s.daemon_epoch());
  }
  {
    grpc::ClientContext ctx;
    v1::StatsResponse r;
    grpc::Status st = v1::ObjectStore::NewStub(remote)->Stats(&ctx, {}, &r);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_TRUE(absl::StrContains(st.error_message(), "ipv4:" + ip))
        << st.error_message();
    EXPECT_TRUE(absl::StrContains(st.error_message(),
                                  "did not connect to the daemon's"))
        << st.error_message();
  }
  {
    grpc::ClientContext ctx;
    auto stream = v1::ObjectStore::NewStub(remote)->Session(&ctx);
    v1::SessionRequest open;
    open.mutable_open()->set_client_name("remote");
    stream->Write(open);
    v1::SessionEvent ev;
    EXPECT_FALSE(stream->Read(&ev));
    EXPECT_EQ(stream->Finish().error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    grpc::ClientContext ctx;
    HealthCheckResponse r;
    EXPECT_TRUE(Health::NewStub(remote)->Check(&ctx, {}, &r).ok());
  }
}

}  // namespace
}  // namespace shmtensor
