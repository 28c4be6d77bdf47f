#include "ctl/render.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "google/protobuf/util/json_util.h"
#include "shmtensor/dtype.h"

namespace shmtensor::ctl {

std::string HumanBytes(uint64_t bytes) {
  static const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double v = static_cast<double>(bytes) / 1024;
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return absl::StrFormat("%.1f %s", v, kUnits[u]);
}

std::string HumanAge(uint64_t ms) {
  if (ms < 1000) return absl::StrCat(ms, "ms");
  const uint64_t s = ms / 1000;
  if (s < 60) return absl::StrFormat("%.1fs", ms / 1000.0);
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, s % 86400 / 3600);
}

std::string Table(const std::vector<std::string>& header,
                  const std::vector<std::vector<std::string>>& rows,
                  const std::vector<size_t>& right) {
  std::vector<size_t> width(header.size(), 0);
  auto measure = [&](const std::vector<std::string>& row) {
    for (size_t i = 0; i < row.size() && i < width.size(); ++i) {
      width[i] = std::max(width[i], row[i].size());
    }
  };
  measure(header);
  for (const auto& r : rows) measure(r);
  auto line = [&](const std::vector<std::string>& row) {
    std::string out;
    for (size_t i = 0; i < width.size(); ++i) {
      const std::string cell = i < row.size() ? row[i] : "";
      const std::string pad(width[i] - cell.size(), ' ');
      const bool r = std::find(right.begin(), right.end(), i) != right.end();
      if (i > 0) out += "  ";
      out += r ? pad + cell : cell + (i + 1 < width.size() ? pad : "");
    }
    return out + "\n";
  };
  std::string out = line(header);
  for (const auto& r : rows) out += line(r);
  return out;
}

namespace {

std::string StateName(v1::ObjectState s) {
  switch (s) {
    case v1::OBJECT_STATE_WRITING:
      return "writing";
    case v1::OBJECT_STATE_SEALED:
      return "sealed";
    case v1::OBJECT_STATE_PENDING_TRANSFER:
      return "pending-transfer";
    case v1::OBJECT_STATE_TAKEN:
      return "taken";
    case v1::OBJECT_STATE_SHARED_WRITABLE:
      return "shared-writable";
    default:
      return "?";
  }
}

std::string KindName(v1::MemoryKind k) {
  switch (k) {
    case v1::MEMORY_KIND_HOST:
      return "host";
    case v1::MEMORY_KIND_CUDA_DEVICE:
      return "cuda";
    default:
      return "?";
  }
}

std::string Percent(uint64_t part, uint64_t whole) {
  return whole == 0 ? "-" : absl::StrFormat("%.1f%%", 100.0 * part / whole);
}

}  // namespace

std::string RenderStatus(const v1::DaemonStatus& s) {
  std::string out =
      absl::StrFormat("shmtensord %s  pid %d  up %s  epoch %016x%s\n",
                      s.version(), s.pid(), HumanAge(s.uptime_ms()),
                      s.daemon_epoch(), s.serving() ? "" : "  SHUTTING DOWN");
  absl::StrAppend(&out, "serving on ", absl::StrJoin(s.addresses(), ", "),
                  "\n");
  absl::StrAppendFormat(&out,
                        "sessions %d  objects %d (named %d)  leases %d  "
                        "pending transfers %d\n",
                        s.sessions(), s.objects(), s.named_objects(),
                        s.leases(), s.pending_transfers());
  const v1::Limits& l = s.limits();
  auto limit = [](uint64_t v, bool bytes) {
    return v == 0  ? std::string("none")
           : bytes ? HumanBytes(v)
                   : absl::StrCat(v);
  };
  absl::StrAppend(&out, "limits: objects ", limit(l.max_objects(), false),
                  ", leases per client ",
                  limit(l.max_leases_per_client(), false),
                  ", bytes per client ", limit(l.max_bytes_per_client(), true),
                  ", leases ", limit(l.max_leases(), false), ", bytes per uid ",
                  limit(l.max_bytes_per_uid(), true), ", sessions per uid ",
                  limit(l.max_sessions_per_uid(), false), ", waiters ",
                  limit(l.max_waiters(), false), "\n");
  if (s.uids_size() > 0) {
    // Each uid's use against its share (limits.uid_share_percent).
    absl::StrAppendFormat(&out, "per uid (share %d%%):\n",
                          l.uid_share_percent());
    std::vector<std::vector<std::string>> uid_rows;
    auto of = [&](uint64_t used, uint64_t cap, bool bytes) {
      return absl::StrCat(bytes ? HumanBytes(used) : absl::StrCat(used), "/",
                          limit(cap, bytes));
    };
    for (const v1::UidUsage& u : s.uids()) {
      uid_rows.push_back(
          {absl::StrCat(u.uid()),
           of(u.sessions(), l.max_sessions_per_uid(), false),
           of(u.objects(), l.max_objects_per_uid(), false),
           of(u.leases(), l.max_leases_per_uid(), false),
           of(u.pins(), l.max_pins_per_uid(), false),
           of(u.stock_bytes(), l.max_stock_bytes_per_uid(), true),
           of(u.waiters(), l.max_waiters_per_uid(), false),
           of(u.bytes(), l.max_bytes_per_uid(), true)});
    }
    absl::StrAppend(&out, Table({"UID", "SESSIONS", "OBJECTS", "LEASES", "PINS",
                                 "STOCK", "WAITERS", "BYTES"},
                                uid_rows, {1, 2, 3, 4, 5, 6, 7}));
  }
  absl::StrAppend(&out, "waiting calls ", s.waiters(), "  detached sessions ",
                  s.detached_sessions(), "  fork holds ", s.fork_holds(),
                  "  offers ", s.offers(), "\n");
  if (s.refused_records() > 0) {
    absl::StrAppend(&out,
                    "ledger records refused at adoption: ", s.refused_records(),
                    " (named in the daemon's log; what they stood for is "
                    "kept from reuse)\n");
  }
  if (s.awaited_sessions() > 0 || s.quarantined_bytes() > 0) {
    absl::StrAppend(&out, "after a restart: ", s.awaited_sessions(),
                    " sessions not yet resumed; ",
                    HumanBytes(s.quarantined_bytes()),
                    " quarantined (kept until their processes resume or "
                    "exit)\n");
  }
  absl::StrAppend(&out, "\n");
  std::vector<std::vector<std::string>> rows;
  for (const v1::PoolStatus& p : s.pools()) {
    rows.push_back(
        {p.info().name(), KindName(p.info().kind()),
         HumanBytes(p.info().huge_page_size() > 0 ? p.info().huge_page_size()
                                                  : p.info().page_size()),
         HumanBytes(p.info().size_bytes()), HumanBytes(p.used_bytes()),
         Percent(p.used_bytes(), p.info().size_bytes()),
         HumanBytes(p.free_bytes()), HumanBytes(p.largest_free_bytes()),
         HumanBytes(p.high_water_bytes()), absl::StrCat(p.objects()),
         absl::StrCat(p.leases())});
  }
  absl::StrAppend(
      &out, Table({"POOL", "KIND", "PAGES", "SIZE", "USED", "USED%", "FREE",
                   "LARGEST FREE", "HIGH WATER", "OBJECTS", "LEASES"},
                  rows, {2, 3, 4, 5, 6, 7, 8, 9, 10}));
  for (const v1::UnavailablePool& u : s.unavailable_pools()) {
    absl::StrAppend(&out, "unavailable: pool ", u.name(), " (",
                    KindName(u.kind()), "): ", u.reason(), "\n");
  }
  return out;
}

std::string RenderObjects(const v1::ListObjectsResponse& r) {
  std::vector<std::vector<std::string>> rows;
  for (const v1::ObjectStatus& o : r.objects()) {
    rows.push_back(
        {absl::StrCat(o.ref().slot(), ".", o.ref().generation()),
         o.name().empty() ? "-" : o.name(), o.pool(),
         HumanBytes(o.size_bytes()),
         shmtensor::DTypeName(static_cast<DType>(o.layout().dtype())),
         absl::StrCat("[", absl::StrJoin(o.layout().shape(), ", "), "]"),
         StateName(o.state()), absl::StrCat(o.leases()), HumanAge(o.age_ms()),
         o.creator()});
  }
  std::string out = Table({"ID", "NAME", "POOL", "SIZE", "DTYPE", "SHAPE",
                           "STATE", "LEASES", "AGE", "CREATOR"},
                          rows, {3, 7, 8});
  if (static_cast<uint64_t>(r.objects_size()) < r.total()) {
    absl::StrAppendFormat(&out, "(%d of %d objects shown)\n", r.objects_size(),
                          r.total());
  }
  return out;
}

std::string RenderClients(const v1::ListClientsResponse& r) {
  std::vector<std::vector<std::string>> rows;
  for (const v1::ClientStatus& c : r.clients()) {
    std::string cmd = c.has_process() ? c.command_line() : "(not visible)";
    for (char& ch : cmd) {
      if (absl::ascii_iscntrl(static_cast<unsigned char>(ch))) ch = ' ';
    }
    if (cmd.size() > 60) cmd = cmd.substr(0, 57) + "...";
    // "default:rw gpu:ro", pool names cut to 32 bytes each.
    std::vector<std::string> access;
    for (const v1::PoolGrant& g : c.pools()) {
      std::string pool = g.pool().substr(0, 32);
      for (char& ch : pool) {
        if (absl::ascii_iscntrl(static_cast<unsigned char>(ch))) ch = ' ';
      }
      access.push_back(absl::StrCat(
          pool, g.access() == v1::POOL_ACCESS_READ_WRITE ? ":rw" : ":ro"));
    }
    rows.push_back(
        {absl::StrCat(c.client_id(), c.connected() ? "" : " (detached)"),
         c.client_name(), absl::StrCat(c.pid()),
         c.has_process() ? absl::StrCat(c.uid()) : "-",
         access.empty() ? "-" : absl::StrJoin(access, " "),
         absl::StrCat(c.leases()), HumanBytes(c.bytes_held()),
         HumanBytes(c.stock_bytes()),
         // Messages its release ring brought; "-": it has none (its seals
         // and releases all come by its stream).
         c.has_release_ring() ? absl::StrCat(c.ring_messages()) : "-",
         absl::StrCat(c.pending_transfers()), HumanAge(c.age_ms()), cmd});
  }
  return Table({"CLIENT", "NAME", "PID", "UID", "ACCESS", "LEASES", "HELD",
                "STOCK", "RING", "TRANSFERS", "AGE", "COMMAND"},
               rows, {2, 3, 5, 6, 7, 8, 9, 10});
}

std::string ToJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  // Serialising a valid message cannot fail; an error leaves "{}".
  if (!google::protobuf::util::MessageToJsonString(m, &out, options).ok()) {
    out = "{}";
  }
  if (out.empty() || out.back() != '\n') out += "\n";
  return out;
}

namespace {

// A label value with \, " and newline escaped, as the format demands.
std::string LabelValue(const std::string& v) {
  return absl::StrReplaceAll(v,
                             {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}});
}

class Exposition {
 public:
  void Family(const std::string& name, const std::string& type,
              const std::string& help) {
    absl::StrAppend(&out_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ",
                    type, "\n");
  }
  void Sample(const std::string& name,
              const std::vector<std::pair<std::string, std::string>>& labels,
              double value) {
    out_ += name;
    if (!labels.empty()) {
      std::vector<std::string> parts;
      for (const auto& [k, v] : labels) {
        parts.push_back(absl::StrCat(k, "=\"", LabelValue(v), "\""));
      }
      absl::StrAppend(&out_, "{", absl::StrJoin(parts, ","), "}");
    }
    // Integers (bytes, counts) exactly; fractions to the millisecond.
    const bool integral =
        value == static_cast<double>(static_cast<int64_t>(value));
    absl::StrAppend(&out_, " ",
                    integral ? absl::StrFormat("%.0f", value)
                             : absl::StrFormat("%.3f", value),
                    "\n");
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

}  // namespace

std::string RenderMetrics(const v1::DaemonStatus& s,
                          const v1::ListClientsResponse& clients) {
  Exposition e;
  e.Family("shmtensor_up", "gauge", "1 when shmtensord answered.");
  e.Sample("shmtensor_up", {}, 1);
  e.Family("shmtensor_info", "gauge",
           "Constant 1, labelled with the daemon's version and epoch.");
  e.Sample("shmtensor_info",
           {{"version", s.version()},
            {"epoch", absl::StrFormat("%016x", s.daemon_epoch())}},
           1);
  e.Family("shmtensor_uptime_seconds", "gauge", "Seconds since start.");
  e.Sample("shmtensor_uptime_seconds", {}, s.uptime_ms() / 1000.0);
  struct Global {
    const char* name;
    const char* help;
    uint64_t value;
  };
  const Global globals[] = {
      {"shmtensor_sessions", "Open client sessions.", s.sessions()},
      {"shmtensor_objects", "Live objects, all pools.", s.objects()},
      {"shmtensor_named_objects", "Names bound.", s.named_objects()},
      {"shmtensor_leases", "Leases held, all clients.", s.leases()},
      {"shmtensor_pending_transfers", "Exclusive transfers not yet taken.",
       s.pending_transfers()},
      {"shmtensor_fork_holds", "Objects pinned for forked children: holds.",
       s.fork_holds()},
      {"shmtensor_offers",
       "Objects sent by reference that no receiver took yet: offers.",
       s.offers()},
      {"shmtensor_awaited_sessions",
       "Sessions adopted from the previous daemon, not yet resumed.",
       s.awaited_sessions()},
      {"shmtensor_quarantined_bytes",
       "Bytes kept for sessions not yet resumed and stranded fork holds.",
       s.quarantined_bytes()},
  };
  for (const Global& g : globals) {
    e.Family(g.name, "gauge", g.help);
    e.Sample(g.name, {}, static_cast<double>(g.value));
  }
  e.Family("shmtensor_refused_ledger_records", "gauge",
           "Ledger records refused when the daemon adopted its "
           "predecessor's.");
  e.Sample("shmtensor_refused_ledger_records", {},
           static_cast<double>(s.refused_records()));
  // Each uid's use of the tables shared between uids, and its share.
  struct UidGauge {
    const char* name;
    const char* help;
    uint64_t (v1::UidUsage::*used)() const;
    uint64_t (v1::Limits::*share)() const;
  };
  const UidGauge uid_gauges[] = {
      {"shmtensor_uid_sessions", "Sessions of the uid.",
       &v1::UidUsage::sessions, &v1::Limits::max_sessions_per_uid},
      {"shmtensor_uid_objects", "Live objects the uid created.",
       &v1::UidUsage::objects, &v1::Limits::max_objects_per_uid},
      {"shmtensor_uid_leases", "Leases of the uid's sessions.",
       &v1::UidUsage::leases, &v1::Limits::max_leases_per_uid},
      {"shmtensor_uid_pins", "Objects the uid's offers and fork holds pin.",
       &v1::UidUsage::pins, &v1::Limits::max_pins_per_uid},
      {"shmtensor_uid_stock_bytes", "Bytes of the uid's stock.",
       &v1::UidUsage::stock_bytes, &v1::Limits::max_stock_bytes_per_uid},
      {"shmtensor_uid_waiters", "Calls of the uid waiting.",
       &v1::UidUsage::waiters, &v1::Limits::max_waiters_per_uid},
      {"shmtensor_uid_bytes", "Bytes the uid holds.", &v1::UidUsage::bytes,
       &v1::Limits::max_bytes_per_uid},
  };
  for (const UidGauge& g : uid_gauges) {
    e.Family(g.name, "gauge", g.help);
    for (const v1::UidUsage& u : s.uids()) {
      e.Sample(g.name, {{"uid", absl::StrCat(u.uid())}},
               static_cast<double>((u.*g.used)()));
    }
    const std::string limit_name = absl::StrCat(g.name, "_limit");
    e.Family(limit_name, "gauge",
             "The per-uid limit (0: none) of the gauge above.");
    e.Sample(limit_name, {}, static_cast<double>((s.limits().*g.share)()));
  }
  struct PoolGauge {
    const char* name;
    const char* help;
    uint64_t (v1::PoolStatus::*get)() const;
  };
  const PoolGauge pool_gauges[] = {
      {"shmtensor_pool_used_bytes", "Bytes reserved by live objects.",
       &v1::PoolStatus::used_bytes},
      {"shmtensor_pool_free_bytes", "Bytes free.", &v1::PoolStatus::free_bytes},
      {"shmtensor_pool_largest_free_bytes",
       "Largest single allocation possible now.",
       &v1::PoolStatus::largest_free_bytes},
      {"shmtensor_pool_high_water_bytes", "Most bytes ever used at once.",
       &v1::PoolStatus::high_water_bytes},
      {"shmtensor_pool_objects", "Live objects in the pool.",
       &v1::PoolStatus::objects},
      {"shmtensor_pool_leases", "Leases on objects of the pool.",
       &v1::PoolStatus::leases},
  };
  e.Family("shmtensor_pool_size_bytes", "gauge", "Bytes in the pool.");
  for (const v1::PoolStatus& p : s.pools()) {
    e.Sample("shmtensor_pool_size_bytes",
             {{"pool", p.info().name()}, {"kind", KindName(p.info().kind())}},
             static_cast<double>(p.info().size_bytes()));
  }
  e.Family("shmtensor_pool_page_bytes", "gauge",
           "Size of the pages backing the pool: 2097152 for huge pages.");
  for (const v1::PoolStatus& p : s.pools()) {
    e.Sample("shmtensor_pool_page_bytes", {{"pool", p.info().name()}},
             static_cast<double>(p.info().huge_page_size() > 0
                                     ? p.info().huge_page_size()
                                     : p.info().page_size()));
  }
  for (const PoolGauge& g : pool_gauges) {
    e.Family(g.name, "gauge", g.help);
    for (const v1::PoolStatus& p : s.pools()) {
      e.Sample(g.name, {{"pool", p.info().name()}},
               static_cast<double>((p.*g.get)()));
    }
  }
  e.Family("shmtensor_pool_cleared_bytes_total", "counter",
           "Bytes zeroed because another uid had written them.");
  for (const v1::PoolStatus& p : s.pools()) {
    e.Sample("shmtensor_pool_cleared_bytes_total", {{"pool", p.info().name()}},
             static_cast<double>(p.cleared_bytes()));
  }
  e.Family("shmtensor_client_leases", "gauge", "Leases one client holds.");
  for (const v1::ClientStatus& c : clients.clients()) {
    e.Sample("shmtensor_client_leases",
             {{"client_id", absl::StrCat(c.client_id())},
              {"client", c.client_name()},
              {"pid", absl::StrCat(c.pid())}},
             static_cast<double>(c.leases()));
  }
  e.Family("shmtensor_client_bytes_held", "gauge",
           "Bytes of the objects one client keeps alive.");
  for (const v1::ClientStatus& c : clients.clients()) {
    e.Sample("shmtensor_client_bytes_held",
             {{"client_id", absl::StrCat(c.client_id())},
              {"client", c.client_name()},
              {"pid", absl::StrCat(c.pid())}},
             static_cast<double>(c.bytes_held()));
  }
  e.Family("shmtensor_client_stock_bytes", "gauge",
           "Bytes one client holds ahead of its puts (its stock, unsealed).");
  for (const v1::ClientStatus& c : clients.clients()) {
    e.Sample("shmtensor_client_stock_bytes",
             {{"client_id", absl::StrCat(c.client_id())},
              {"client", c.client_name()},
              {"pid", absl::StrCat(c.pid())}},
             static_cast<double>(c.stock_bytes()));
  }
  e.Family("shmtensor_client_ring_messages_total", "counter",
           "Messages (seals and releases) one client's release ring brought "
           "the daemon; clients without a ring are left out.");
  for (const v1::ClientStatus& c : clients.clients()) {
    if (!c.has_release_ring()) continue;
    e.Sample("shmtensor_client_ring_messages_total",
             {{"client_id", absl::StrCat(c.client_id())},
              {"client", c.client_name()},
              {"pid", absl::StrCat(c.pid())}},
             static_cast<double>(c.ring_messages()));
  }
  return e.Take();
}

std::string RenderMetricsDown() {
  Exposition e;
  e.Family("shmtensor_up", "gauge", "1 when shmtensord answered.");
  e.Sample("shmtensor_up", {}, 0);
  return e.Take();
}

}  // namespace shmtensor::ctl
