// shmtensorctl: look at a running shmtensord (status, objects, clients,
// watch, metrics) and unbind names (delete).
//
// Exit codes: 0 success; 1 bad usage; 2 the daemon does not answer; 3 the
// name or thing asked for does not exist; 4 any other error, or `health`
// finding the daemon not serving.
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "ctl/render.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "shmtensor/client.h"
#include "shmtensor/defaults.h"
#include "shmtensor/v1/monitor.grpc.pb.h"

namespace {

using shmtensor::v1::Monitor;

constexpr int kOk = 0;
constexpr int kUnavailable = 2;
constexpr int kNotFound = 3;
constexpr int kFailed = 4;

struct Options {
  std::string address;
  double timeout_s = 5;
  bool json = false;
  uint32_t limit = 0;
  uint32_t interval_ms = 1000;
  uint32_t count = 0;
  std::string name;
};

int ExitCodeOf(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return kUnavailable;
    case grpc::StatusCode::NOT_FOUND:
      return kNotFound;
    default:
      return kFailed;
  }
}

// Prints why a call failed, naming the address, and returns the exit code.
int Fail(const Options& o, const grpc::Status& st) {
  if (st.error_code() == grpc::StatusCode::UNAVAILABLE ||
      st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    std::cerr << "shmtensorctl: no shmtensord answers at " << o.address << " ("
              << st.error_message()
              << "); is it running? (deploy/run.sh, or --address)\n";
  } else {
    std::cerr << "shmtensorctl: " << st.error_message() << "\n";
  }
  return ExitCodeOf(st.error_code());
}

class Ctl {
 public:
  explicit Ctl(const Options& o)
      : o_(o),
        channel_(
            grpc::CreateChannel(o.address, grpc::InsecureChannelCredentials())),
        stub_(Monitor::NewStub(channel_)) {}

  // The standard health check: exit 0 only when SERVING.
  int Health() {
    auto health = grpc::health::v1::Health::NewStub(channel_);
    grpc::ClientContext ctx;
    ctx.set_deadline(
        absl::ToChronoTime(absl::Now() + absl::Seconds(o_.timeout_s)));
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status st = health->Check(&ctx, {}, &resp);
    if (!st.ok()) return Fail(o_, st);
    std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
                     resp.status())
              << "\n";
    return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING
               ? kOk
               : kFailed;
  }

  // Unary Monitor call with the deadline and wait-for-ready (so a daemon
  // that is still starting gets the whole timeout to answer).
  template <typename Req, typename Resp>
  grpc::Status Call(grpc::Status (Monitor::Stub::*m)(grpc::ClientContext*,
                                                     const Req&, Resp*),
                    const Req& req, Resp* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(
        absl::ToChronoTime(absl::Now() + absl::Seconds(o_.timeout_s)));
    return (stub_.get()->*m)(&ctx, req, resp);
  }

  // One listing: the call, then JSON or the human table.
  template <typename Req, typename Resp>
  int Show(grpc::Status (Monitor::Stub::*m)(grpc::ClientContext*, const Req&,
                                            Resp*),
           const Req& req, std::string (*render)(const Resp&)) {
    Resp r;
    grpc::Status st = Call(m, req, &r);
    if (!st.ok()) return Fail(o_, st);
    std::cout << (o_.json ? shmtensor::ctl::ToJson(r) : render(r));
    return kOk;
  }

  int Status() {
    return Show(&Monitor::Stub::GetStatus, shmtensor::v1::GetStatusRequest(),
                &shmtensor::ctl::RenderStatus);
  }

  // Every object (or the --limit oldest), a page at a time: one response
  // for a million objects would pass gRPC's message limit.
  int Objects() {
    shmtensor::v1::ListObjectsResponse all;
    shmtensor::v1::ListObjectsRequest req;
    while (true) {
      const uint64_t want =
          o_.limit == 0 ? 0
                        : o_.limit - static_cast<uint64_t>(all.objects_size());
      req.set_limit(static_cast<uint32_t>(std::min<uint64_t>(want, 10000)));
      shmtensor::v1::ListObjectsResponse page;
      grpc::Status st = Call(&Monitor::Stub::ListObjects, req, &page);
      if (!st.ok()) return Fail(o_, st);
      all.set_total(page.total());
      for (auto& o : *page.mutable_objects()) *all.add_objects() = std::move(o);
      if (page.next_page_token() == 0 ||
          (o_.limit != 0 && all.objects_size() >= static_cast<int>(o_.limit))) {
        break;
      }
      req.set_page_token(page.next_page_token());
    }
    std::cout << (o_.json ? shmtensor::ctl::ToJson(all)
                          : shmtensor::ctl::RenderObjects(all));
    return kOk;
  }

  int Clients() {
    return Show(&Monitor::Stub::ListClients,
                shmtensor::v1::ListClientsRequest(),
                &shmtensor::ctl::RenderClients);
  }

  int Metrics() {
    shmtensor::v1::DaemonStatus s;
    shmtensor::v1::ListClientsResponse c;
    grpc::Status st = Call(&Monitor::Stub::GetStatus, {}, &s);
    if (st.ok()) st = Call(&Monitor::Stub::ListClients, {}, &c);
    if (!st.ok()) {
      std::cout << shmtensor::ctl::RenderMetricsDown();
      return Fail(o_, st);
    }
    std::cout << shmtensor::ctl::RenderMetrics(s, c);
    return kOk;
  }

  // A live view: the status and the clients holding the most, redrawn at
  // each message of the Watch stream (cleared in place on a terminal).
  int Watch() {
    shmtensor::v1::WatchRequest req;
    req.set_interval_ms(o_.interval_ms);
    req.set_count(o_.count);
    grpc::ClientContext ctx;
    auto reader = stub_->Watch(&ctx, req);
    const bool tty = isatty(STDOUT_FILENO);
    shmtensor::v1::DaemonStatus s;
    while (reader->Read(&s)) {
      if (o_.json) {
        std::cout << shmtensor::ctl::ToJson(s) << std::flush;
        continue;
      }
      std::string screen = shmtensor::ctl::RenderStatus(s);
      shmtensor::v1::ListClientsResponse c;
      if (Call(&Monitor::Stub::ListClients, {}, &c).ok()) {
        std::sort(c.mutable_clients()->begin(), c.mutable_clients()->end(),
                  [](const auto& a, const auto& b) {
                    return a.bytes_held() > b.bytes_held();
                  });
        while (c.clients_size() > 10) c.mutable_clients()->RemoveLast();
        absl::StrAppend(&screen, "\n", shmtensor::ctl::RenderClients(c));
      }
      std::cout << (tty ? "\033[H\033[2J" : "\n") << screen << std::flush;
    }
    grpc::Status st = reader->Finish();
    if (!st.ok()) return Fail(o_, st);
    return kOk;
  }

 private:
  const Options& o_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Monitor::Stub> stub_;
};

int Delete(const Options& o) {
  absl::StatusOr<shmtensor::Client> c = shmtensor::Client::Connect(
      {.address = o.address,
       .client_name = "shmtensorctl",
       .connect_timeout = absl::Seconds(o.timeout_s)});
  if (!c.ok()) {
    std::cerr << "shmtensorctl: " << c.status().message() << "\n";
    return kUnavailable;
  }
  absl::Status s = c->Delete(o.name);
  if (!s.ok()) {
    std::cerr << "shmtensorctl: " << s.message() << "\n";
    return absl::IsNotFound(s) ? kNotFound : kFailed;
  }
  std::cout << "deleted '" << o.name << "'\n";
  return kOk;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"shmtensorctl: inspect a running shmtensord"};
  app.set_version_flag("--version", "shmtensorctl " SHMTENSOR_VERSION);
  app.require_subcommand(1);
  // Global flags go before or after the subcommand (shmtensorctl objects
  // --address X), as with kubectl and docker: subcommands made below
  // inherit this and hand the flags they lack to the app.
  app.fallthrough();
  Options o;
  o.address = shmtensor::DefaultAddress();
  app.add_option("--address", o.address,
                 "daemon address (default: $SHMTENSOR_ADDRESS or the "
                 "daemon's default socket)");
  app.add_option("--timeout", o.timeout_s, "seconds to wait for an answer")
      ->check(CLI::PositiveNumber);
  auto* status = app.add_subcommand("status", "daemon, pools and counters");
  auto* objects = app.add_subcommand("objects", "live objects, oldest first");
  auto* clients =
      app.add_subcommand("clients", "sessions and what each one holds");
  auto* watch =
      app.add_subcommand("watch", "live view, redrawn every interval");
  auto* metrics = app.add_subcommand(
      "metrics", "Prometheus text format (for a textfile collector or scrape)");
  auto* health = app.add_subcommand(
      "health", "standard gRPC health check; exit 0 only when SERVING");
  auto* del = app.add_subcommand("delete",
                                 "unbind a name (memory follows "
                                 "when no view of it remains)");
  for (auto* sc : {status, objects, clients, watch}) {
    sc->add_flag("--json", o.json, "JSON instead of a table");
  }
  objects->add_option("--limit", o.limit, "at most this many (0: all)");
  watch->add_option("--interval-ms", o.interval_ms,
                    "milliseconds between refreshes (100 to 3600000)");
  watch->add_option("--count", o.count, "stop after this many (0: never)");
  del->add_option("name", o.name, "object name")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 1;
  }
  std::signal(SIGPIPE, SIG_IGN);
  if (*del) return Delete(o);
  Ctl ctl(o);
  if (*status) return ctl.Status();
  if (*objects) return ctl.Objects();
  if (*clients) return ctl.Clients();
  if (*watch) return ctl.Watch();
  if (*metrics) return ctl.Metrics();
  if (*health) return ctl.Health();
  return kFailed;  // require_subcommand(1) leaves no other case.
}
