// Test helper for tests/hardening_test.cc: a process that attacks the daemon
// or serves as its victim, driven by arguments and stdout.
//
//   hardening_child [--uid N] COMMAND ARGS...
//
// --uid N drops to that uid (and gid) first with setresuid, as a second user
// of the machine would be. Commands:
//   victim ADDRESS [break]    makes a 1 MiB object of 0xAA named "victim",
//                             seals it, holds a view; prints "ready
//                             SESSION_HEX REF_HEX" (its secrets, as if
//                             leaked), with "break" breaks its own
//                             connection ("broken"), then checks its view
//                             every 10 ms ("CHANGED" if it ever did)
//   hijack ADDRESS SESSION_HEX MAX_LEASE
//                             with a raw stub, tries to act for that session:
//                             Release of leases 1..MAX_LEASE, Stats, Create,
//                             Delete; prints "accepted N refused M"
//   resume ADDRESS SESSION_HEX
//                             with a raw stub, tries to resume that session
//                             (its process died; this one may have its
//                             pid) and to use it: Get, Delete and Create;
//                             prints "resumed" or "refused: WHY", then
//                             "accepted N refused M"
//   leave ADDRESS SIZE BYTE   makes an object of SIZE bytes of BYTE, seals
//                             it for an exclusive hand-off nobody takes,
//                             prints "sealed" and exits
//   fresh ADDRESS SIZE        creates a buffer of SIZE bytes and prints
//                             "zero" if every byte is 0, else "byte B at I"
//   squat PATH SECONDS        binds a socket at PATH, accepts for SECONDS and
//                             prints "bytes N": what clients sent it
//   hog PATH COUNT            opens COUNT connections to PATH, prints
//                             "opened N", waits to be killed
//   producer ADDRESS LOG ID   chaos: publishes objects (refs, names,
//                             exclusive hand-offs) and appends lines to LOG;
//                             prints "FOREIGN N ..." when a new buffer holds
//                             words another uid's producer wrote
//   consumer ADDRESS LOG ID   chaos: reads LOG, gets what it names, checks
//                             every byte; prints "checked N bad M" each second
//   flood ADDRESS             [P24] keeps zero-byte objects until one is
//                             refused, then offers a view until an offer is
//                             refused; prints "objects N: WHY" and "offers
//                             M: WHY", then waits to be killed
//   junk-layout ADDRESS       [P23] with a raw stub, opens a session and sends
//                             Creates whose layouts carry 1,800 bytes and
//                             3 MiB of a field the daemon does not know;
//                             prints "code C: MESSAGE" for each, then waits
//                             to be killed
//   forked ADDRESS            puts an object, holds a view of it and forks a
//                             child that keeps it (until killed); prints
//                             "forked PID"
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "shmtensor/client.h"
#include "shmtensor/errors.h"
#include "shmtensor/v1/shmtensor.grpc.pb.h"
#include "tests/break_connection.h"
#include "tests/ref_hex.h"

namespace {

using shmtensor::Client;
using shmtensor::DType;
using shmtensor::ObjectRef;
using shmtensor::SealedRef;
using shmtensor::testing::RefFromHex;
using shmtensor::testing::RefToHex;

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

int Fail(const absl::Status& s) {
  Say("error " + s.ToString());
  return 3;
}

int Victim(const std::string& address, bool break_connection) {
  absl::StatusOr<Client> c = Client::Connect({.address = address});
  if (!c.ok()) return Fail(c.status());
  absl::StatusOr<shmtensor::Buffer> buf =
      c->Create({.size_bytes = 1 << 20, .name = "victim"});
  if (!buf.ok()) return Fail(buf.status());
  std::vector<uint8_t> aa(1 << 20, 0xAA);
  if (absl::Status s = buf->CopyFrom(aa.data(), aa.size()); !s.ok()) {
    return Fail(s);
  }
  absl::StatusOr<shmtensor::SealedRef> ref = buf->Seal();
  if (!ref.ok()) return Fail(ref.status());
  absl::StatusOr<shmtensor::View> view = c->Get(ref->ref());
  if (!view.ok()) return Fail(view.status());
  Say(absl::StrFormat("ready %016x %s", c->session_id(), RefToHex(ref->ref())));
  if (break_connection) {
    // A live process that lost its connection, and makes no call.
    shmtensor::testing::BreakDaemonConnections(
        address, shmtensor::testing::BreakMode::kShutdown);
    Say("broken");
  }
  // Checks its view every 10 ms until killed: a change is contamination.
  while (true) {
    const auto* p = static_cast<const uint8_t*>(view->data());
    for (size_t i = 0; i < aa.size(); ++i) {
      if (p[i] != 0xAA) {
        Say(absl::StrCat("CHANGED at ", i));
        return 4;
      }
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

int Hijack(const std::string& address, uint64_t session, uint64_t max_lease) {
  auto stub = shmtensor::v1::ObjectStore::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  int accepted = 0, refused = 0;
  auto count = [&](const grpc::Status& st) {
    (st.ok() ? accepted : refused)++;
    if (!st.ok() && refused <= 3) Say("refused: " + st.error_message());
  };
  for (uint64_t lease = 1; lease <= max_lease; ++lease) {
    shmtensor::v1::ReleaseRequest r;
    r.set_session_id(session);
    r.set_lease_id(lease);
    shmtensor::v1::ReleaseResponse resp;
    grpc::ClientContext ctx;
    count(stub->Release(&ctx, r, &resp));
  }
  {
    shmtensor::v1::DeleteRequest r;
    r.set_session_id(session);
    r.set_name("victim");
    shmtensor::v1::DeleteResponse resp;
    grpc::ClientContext ctx;
    count(stub->Delete(&ctx, r, &resp));
  }
  {
    shmtensor::v1::CreateRequest r;
    r.set_session_id(session);
    r.set_size_bytes(4096);
    shmtensor::v1::CreateResponse resp;
    grpc::ClientContext ctx;
    count(stub->Create(&ctx, r, &resp));
  }
  {
    shmtensor::v1::EndSessionRequest r;
    r.set_session_id(session);
    shmtensor::v1::EndSessionResponse resp;
    grpc::ClientContext ctx;
    count(stub->EndSession(&ctx, r, &resp));
  }
  Say(absl::StrCat("accepted ", accepted, " refused ", refused));
  return 0;
}

int Resume(const std::string& address, uint64_t session) {
  using namespace shmtensor::v1;
  auto stub = ObjectStore::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext session_ctx;
  auto stream = stub->Session(&session_ctx);
  SessionRequest open;
  open.mutable_open()->set_resume_session_id(session);
  SessionEvent opened;
  if (!stream->Write(open) || !stream->Read(&opened)) {
    Say("refused: " + stream->Finish().error_message());
  } else {
    Say("resumed");
  }
  int accepted = 0, refused = 0;
  auto count = [&](const grpc::Status& st) {
    (st.ok() ? accepted : refused)++;
  };
  {
    GetRequest r;
    r.set_session_id(session);
    r.set_name("victim");
    GetResponse resp;
    grpc::ClientContext ctx;
    count(stub->Get(&ctx, r, &resp));
  }
  {
    DeleteRequest r;
    r.set_session_id(session);
    r.set_name("victim");
    DeleteResponse resp;
    grpc::ClientContext ctx;
    count(stub->Delete(&ctx, r, &resp));
  }
  {
    CreateRequest r;
    r.set_session_id(session);
    r.set_size_bytes(4096);
    r.set_name("victim");
    CreateResponse resp;
    grpc::ClientContext ctx;
    count(stub->Create(&ctx, r, &resp));
  }
  Say(absl::StrCat("accepted ", accepted, " refused ", refused));
  session_ctx.TryCancel();
  return 0;
}

int Leave(const std::string& address, uint64_t size, int byte) {
  absl::StatusOr<Client> c = Client::Connect({.address = address});
  if (!c.ok()) return Fail(c.status());
  absl::StatusOr<shmtensor::Buffer> buf = c->Create({.size_bytes = size});
  if (!buf.ok()) return Fail(buf.status());
  std::vector<uint8_t> data(size, static_cast<uint8_t>(byte));
  if (absl::Status s = buf->CopyFrom(data.data(), size); !s.ok()) {
    return Fail(s);
  }
  absl::StatusOr<shmtensor::SealedRef> ref = buf->Seal(/*exclusive=*/true);
  if (!ref.ok()) return Fail(ref.status());
  Say("sealed");
  return 0;
}

int Fresh(const std::string& address, uint64_t size) {
  absl::StatusOr<Client> c = Client::Connect({.address = address});
  if (!c.ok()) return Fail(c.status());
  absl::StatusOr<shmtensor::Buffer> buf = c->Create({.size_bytes = size});
  if (!buf.ok()) return Fail(buf.status());
  const auto* p = static_cast<const uint8_t*>(buf->data());
  for (uint64_t i = 0; i < size; ++i) {
    if (p[i] != 0) {
      Say(absl::StrFormat("byte %d at %d", p[i], i));
      return 0;
    }
  }
  Say("zero");
  return 0;
}

int Flood(const std::string& address) {
  absl::StatusOr<Client> c = Client::Connect({.address = address});
  if (!c.ok()) return Fail(c.status());
  std::vector<SealedRef> kept;
  absl::Status why;
  // A typed object with an empty dimension: no pool memory, one record.
  for (int i = 0; i < 1000000 && why.ok(); ++i) {
    absl::StatusOr<shmtensor::Buffer> buf =
        c->Create({.dtype = DType::kFloat32, .shape = {0}});
    absl::StatusOr<SealedRef> ref =
        buf.ok() ? buf->Seal() : absl::StatusOr<SealedRef>(buf.status());
    if (ref.ok()) {
      kept.push_back(*std::move(ref));
    } else {
      why = ref.status();
    }
  }
  Say(absl::StrCat("objects ", kept.size(), ": ", why.message()));
  kept.pop_back();  // Room for one object to offer.
  uint8_t byte = 1;
  absl::StatusOr<SealedRef> ref = c->Put(&byte, {.size_bytes = 1});
  if (!ref.ok()) return Fail(ref.status());
  absl::StatusOr<shmtensor::View> view = c->Get(ref->ref());
  if (!view.ok()) return Fail(view.status());
  int offers = 0;
  for (why = absl::OkStatus(); offers < 1000000;) {
    absl::StatusOr<uint64_t> token = view->Offer();
    if (!token.ok()) {
      why = token.status();
      break;
    }
    ++offers;
  }
  Say(absl::StrCat("offers ", offers, ": ", why.message()));
  while (true) pause();
}

int JunkLayout(const std::string& address) {
  auto stub = shmtensor::v1::ObjectStore::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext stream_ctx;
  auto stream = stub->Session(&stream_ctx);
  shmtensor::v1::SessionRequest open;
  open.mutable_open()->set_client_name("junk");
  shmtensor::v1::SessionEvent opened;
  if (!stream->Write(open) || !stream->Read(&opened)) {
    return Fail(absl::UnavailableError("no session"));
  }
  for (size_t junk : {size_t{1800}, size_t{3} << 20}) {
    shmtensor::v1::CreateRequest req;
    req.set_session_id(opened.opened().session_id());
    req.mutable_layout()->set_dtype(shmtensor::v1::DTYPE_FLOAT32);
    req.mutable_layout()->add_shape(4);
    req.mutable_layout()
        ->GetReflection()
        ->MutableUnknownFields(req.mutable_layout())
        ->AddLengthDelimited(99, std::string(junk, 'x'));
    shmtensor::v1::CreateResponse resp;
    grpc::ClientContext ctx;
    const grpc::Status st = stub->Create(&ctx, req, &resp);
    Say(absl::StrCat("code ", st.error_code(), ": ",
                     st.error_message().substr(0, 200)));
  }
  while (true) pause();
}

int Forked(const std::string& address) {
  absl::StatusOr<Client> c = Client::Connect({.address = address});
  if (!c.ok()) return Fail(c.status());
  uint8_t byte = 0x42;
  absl::StatusOr<SealedRef> ref = c->Put(&byte, {.size_bytes = 1});
  if (!ref.ok()) return Fail(ref.status());
  absl::StatusOr<shmtensor::View> view = c->Get(ref->ref());
  if (!view.ok()) return Fail(view.status());
  const pid_t child = fork();
  if (child == 0) {
    // Reads what it inherited, then keeps it until killed.
    if (static_cast<const uint8_t*>(view->data())[0] != 0x42) _exit(1);
    while (true) pause();
  }
  Say(absl::StrCat("forked ", child));
  while (true) pause();
}

int Squat(const std::string& path, int seconds) {
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd, 16) != 0) {
    return Fail(absl::InternalError(std::strerror(errno)));
  }
  chmod(path.c_str(), 0777);
  Say("ready");
  uint64_t bytes = 0;
  std::vector<int> conns;
  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  while (absl::Now() < end) {
    std::vector<pollfd> p = {{fd, POLLIN, 0}};
    for (int c : conns) p.push_back({c, POLLIN, 0});
    if (poll(p.data(), p.size(), 50) <= 0) continue;
    if (p[0].revents & POLLIN) conns.push_back(accept(fd, nullptr, nullptr));
    for (size_t i = 1; i < p.size(); ++i) {
      if (!(p[i].revents & POLLIN)) continue;
      char buf[4096];
      const ssize_t n = read(p[i].fd, buf, sizeof(buf));
      if (n > 0) bytes += n;
    }
  }
  Say(absl::StrCat("bytes ", bytes));
  return 0;
}

int Hog(const std::string& path, int count) {
  int opened = 0;
  for (int i = 0; i < count; ++i) {
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    if (fd >= 0 &&
        connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      ++opened;
    }
  }
  Say(absl::StrCat("opened ", opened));
  while (true) pause();
}

// The bytes of chaos object `seed`: a pattern no other seed shares at any
// offset (the seed in every 8-byte word, mixed with the word's index), each
// word's top byte the writer's uid tag (the seed's top byte, UidTag).
uint64_t Word(uint64_t seed, size_t i) {
  return ((seed * 0x9E3779B97F4A7C15ull ^ i) & ~(uint64_t{0xFF} << 56)) |
         (seed & (uint64_t{0xFF} << 56));
}
void Fill(uint64_t seed, uint8_t* p, size_t n) {
  for (size_t i = 0; i + 8 <= n; i += 8) {
    const uint64_t w = Word(seed, i);
    std::memcpy(p + i, &w, 8);
  }
}
bool Check(uint64_t seed, const uint8_t* p, size_t n) {
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    if (w != Word(seed, i)) return false;
  }
  return true;
}
// This process's uid in a byte no zero word has.
uint8_t UidTag() { return static_cast<uint8_t>(0x80 | (geteuid() & 0x7F)); }
// Words of a new buffer that another uid's producer wrote: a new buffer
// holds zeros or this uid's own old patterns, never another uid's [P21].
size_t ForeignWords(const uint8_t* p, size_t n) {
  size_t foreign = 0;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    if (w != 0 && (w >> 56) != UidTag()) ++foreign;
  }
  return foreign;
}

void Append(const std::string& log, const std::string& line) {
  const int fd = open(log.c_str(), O_WRONLY | O_APPEND | O_CREAT, 0600);
  const std::string l = line + "\n";
  (void)!write(fd, l.data(), l.size());  // One write: atomic in O_APPEND.
  close(fd);
}

int Producer(const std::string& address, const std::string& log, int id) {
  absl::StatusOr<Client> c = Client::Connect({.address = address});
  if (!c.ok()) return Fail(c.status());
  std::mt19937_64 rng(id * 7919 + getpid());
  std::vector<shmtensor::SealedRef> held;  // Keeps recent refs alive.
  std::vector<std::string> names;
  std::vector<uint8_t> data(256 << 10);
  for (uint64_t n = 0;; ++n) {
    const uint64_t seed = (uint64_t{UidTag()} << 56) |
                          (uint64_t{static_cast<uint32_t>(getpid())} << 32) | n;
    const size_t size = 4096 * (1 + rng() % 64);
    const int kind = static_cast<int>(rng() % 4);
    if (kind == 3) {
      // Several shared objects in one round trip at most, sealed in one
      // stream message (PutMany).
      std::vector<std::vector<uint8_t>> sources(3);
      std::vector<shmtensor::PutItem> items(3);
      std::vector<uint64_t> seeds(3);
      for (size_t k = 0; k < items.size(); ++k) {
        seeds[k] = seed | (uint64_t{k + 1} << 24);
        sources[k].resize(4096 * (1 + rng() % 16));
        Fill(seeds[k], sources[k].data(), sources[k].size());
        items[k].data = sources[k].data();
        items[k].options.size_bytes = sources[k].size();
        items[k].options.timeout = absl::Milliseconds(200);
      }
      absl::StatusOr<std::vector<shmtensor::SealedRef>> refs =
          c->PutMany(items);
      if (!refs.ok()) {
        if (shmtensor::IsSessionEnded(refs.status())) {
          Say("ENDED " + refs.status().ToString());
          return 4;
        }
        continue;
      }
      for (size_t k = 0; k < refs->size(); ++k) {
        Append(log, absl::StrCat("R ", RefToHex((*refs)[k].ref()), " ",
                                 seeds[k], " ", sources[k].size(), " -"));
        held.push_back(std::move((*refs)[k]));
      }
      while (held.size() > 16) held.erase(held.begin());
      absl::SleepFor(absl::Milliseconds(2));
      continue;
    }
    absl::StatusOr<shmtensor::Buffer> buf =
        c->Create({.size_bytes = size,
                   .name = kind == 1 ? absl::StrCat("chaos-", seed) : "",
                   .timeout = absl::Milliseconds(200)});
    if (!buf.ok()) {
      // Pool full, or a resumed connection; a session that ended is said.
      if (shmtensor::IsSessionEnded(buf.status())) {
        Say("ENDED " + buf.status().ToString());
        return 4;
      }
      continue;
    }
    if (size_t f = ForeignWords(static_cast<uint8_t*>(buf->data()), size);
        f > 0) {
      Say(absl::StrCat("FOREIGN ", f, " words of another uid in a new buffer"));
    }
    // Through data(): a pointer the seal must revoke.
    Fill(seed, static_cast<uint8_t*>(buf->data()), size);
    absl::StatusOr<shmtensor::SealedRef> ref = buf->Seal(kind == 2);
    if (!ref.ok()) continue;
    const char* tag = kind == 0 ? "R" : kind == 1 ? "N" : "X";
    Append(log, absl::StrCat(tag, " ", RefToHex(ref->ref()), " ", seed, " ",
                             size, " ", absl::StrCat("chaos-", seed)));
    if (kind == 1) names.push_back(absl::StrCat("chaos-", seed));
    if (kind != 2) held.push_back(*std::move(ref));
    if (held.size() > 16) held.erase(held.begin());
    if (names.size() > 8) {
      c->Delete(names.front()).IgnoreError();
      names.erase(names.begin());
    }
    // Now and then this live process loses its connection.
    if (rng() % 50 == 0) {
      shmtensor::testing::BreakDaemonConnections(
          address, shmtensor::testing::BreakMode::kShutdown);
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
}

int Consumer(const std::string& address, const std::string& log, int id) {
  absl::StatusOr<Client> c = Client::Connect({.address = address});
  if (!c.ok()) return Fail(c.status());
  std::mt19937_64 rng(id * 104729 + getpid());
  uint64_t checked = 0, bad = 0, offset = 0;
  absl::Time last = absl::Now(), last_recheck = absl::Now();
  struct Kept {
    shmtensor::View view;
    uint64_t seed;
  };
  std::vector<Kept> kept;
  struct Wanted {
    ObjectRef ref;
    uint64_t seed, size;
    std::string line;
  };
  std::vector<Wanted> batch;
  // GetMany of the batch: each view checked as a single Get's is.
  auto get_batch = [&] {
    std::vector<ObjectRef> refs;
    for (const Wanted& w : batch) refs.push_back(w.ref);
    std::vector<absl::StatusOr<shmtensor::View>> views = c->GetMany(refs);
    for (size_t k = 0; k < views.size(); ++k) {
      if (!views[k].ok()) {
        if (shmtensor::IsSessionEnded(views[k].status())) {
          Say("ENDED " + views[k].status().ToString());
        }
        continue;
      }
      ++checked;
      const Wanted& w = batch[k];
      if (views[k]->size_bytes() != w.size ||
          !Check(w.seed, static_cast<const uint8_t*>(views[k]->data()),
                 w.size)) {
        ++bad;
        Say(absl::StrCat("MISMATCH ", w.line));
      }
      kept.push_back({*std::move(views[k]), w.seed});
      if (kept.size() > 8) kept.erase(kept.begin());
    }
    batch.clear();
  };
  // Every view kept is checked again now and then: memory under a live
  // view never changes, whatever happened to connections meanwhile.
  auto recheck = [&] {
    for (const Kept& k : kept) {
      ++checked;
      if (!Check(k.seed, static_cast<const uint8_t*>(k.view.data()),
                 k.view.size_bytes())) {
        ++bad;
        Say(absl::StrCat("CHANGED ", k.seed));
      }
    }
  };
  while (true) {
    std::ifstream in(log);
    in.seekg(static_cast<std::streamoff>(offset));
    std::string line;
    while (std::getline(in, line)) {
      if (in.eof()) break;  // A line still being written.
      offset += line.size() + 1;
      std::vector<std::string> f = absl::StrSplit(line, ' ');
      if (f.size() != 5 || rng() % 2 != 0) continue;
      uint64_t seed, size;
      if (!absl::SimpleAtoi(f[2], &seed) || !absl::SimpleAtoi(f[3], &size)) {
        continue;
      }
      if (f[0] == "R" && rng() % 2 == 0) {
        // Some shared refs are got four at a time, in one round trip.
        if (absl::StatusOr<ObjectRef> ref = RefFromHex(f[1]); ref.ok()) {
          batch.push_back({*ref, seed, size, line});
        }
        if (batch.size() == 4) get_batch();
        continue;
      }
      absl::StatusOr<shmtensor::View> v =
          f[0] == "N" ? c->Get(f[4])
                      : [&]() -> absl::StatusOr<shmtensor::View> {
        absl::StatusOr<ObjectRef> ref = RefFromHex(f[1]);
        if (!ref.ok()) return ref.status();
        return c->Get(*ref);
      }();
      if (!v.ok()) {
        // Gone, taken, or a resumed connection; a session that could not
        // be resumed gets a new client (its views are kept and checked).
        if (shmtensor::IsSessionEnded(v.status())) {
          Say("ENDED " + v.status().ToString());
          absl::StatusOr<Client> again = Client::Connect({.address = address});
          if (again.ok()) c = *std::move(again);
        }
        continue;
      }
      ++checked;
      if (v->size_bytes() != size ||
          !Check(seed, static_cast<const uint8_t*>(v->data()), size)) {
        ++bad;
        Say(absl::StrCat("MISMATCH ", line));
      }
      kept.push_back({*std::move(v), seed});
      if (kept.size() > 8) kept.erase(kept.begin());
      if (rng() % 80 == 0) {
        shmtensor::testing::BreakDaemonConnections(
            address, rng() % 2 ? shmtensor::testing::BreakMode::kShutdown
                               : shmtensor::testing::BreakMode::kGarbage);
      }
    }
    if (absl::Now() - last_recheck > absl::Milliseconds(50)) {
      recheck();
      last_recheck = absl::Now();
    }
    if (absl::Now() - last > absl::Milliseconds(500)) {
      Say(absl::StrCat("checked ", checked, " bad ", bad));
      last = absl::Now();
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

int Run(int argc, char** argv) {
  int i = 1;
  if (argc > 2 && std::string(argv[1]) == "--uid") {
    const int uid = std::atoi(argv[2]);
    if (setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0) {
      return Fail(absl::InternalError("setresuid failed"));
    }
    i = 3;
  }
  if (argc - i < 2) return 2;
  const std::string cmd = argv[i];
  const std::vector<std::string> a(argv + i + 1, argv + argc);
  if (cmd == "victim") return Victim(a[0], a.size() > 1 && a[1] == "break");
  if (cmd == "hijack" && a.size() == 3) {
    uint64_t session, max_lease;
    if (!absl::SimpleHexAtoi(a[1], &session) ||
        !absl::SimpleAtoi(a[2], &max_lease)) {
      return 2;
    }
    return Hijack(a[0], session, max_lease);
  }
  if (cmd == "resume" && a.size() == 2) {
    uint64_t session;
    if (!absl::SimpleHexAtoi(a[1], &session)) return 2;
    return Resume(a[0], session);
  }
  if (cmd == "leave" && a.size() == 3) {
    return Leave(a[0], std::strtoull(a[1].c_str(), nullptr, 10),
                 std::atoi(a[2].c_str()));
  }
  if (cmd == "fresh" && a.size() == 2) {
    return Fresh(a[0], std::strtoull(a[1].c_str(), nullptr, 10));
  }
  if (cmd == "squat" && a.size() == 2)
    return Squat(a[0], std::atoi(a[1].c_str()));
  if (cmd == "hog" && a.size() == 2) return Hog(a[0], std::atoi(a[1].c_str()));
  if (cmd == "producer" && a.size() == 3) {
    return Producer(a[0], a[1], std::atoi(a[2].c_str()));
  }
  if (cmd == "flood" && a.size() == 1) return Flood(a[0]);
  if (cmd == "forked" && a.size() == 1) return Forked(a[0]);
  if (cmd == "junk-layout" && a.size() == 1) return JunkLayout(a[0]);
  if (cmd == "consumer" && a.size() == 3) {
    return Consumer(a[0], a[1], std::atoi(a[2].c_str()));
  }
  return 2;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
