// Test helper: one shmtensor client process, driven by the multi-process
// tests through its arguments and stdout. Each command prints what it did;
// commands that must fault (writes into sealed memory) print "WROTE" and exit
// 0 only if the write went through, which the tests treat as a failure.
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/lease.h"
#include "shmtensor/client.h"
#include "shmtensor/errors.h"
#include "shmtensor/torch.h"
#include "tests/ref_hex.h"

namespace {

using shmtensor::Client;
using shmtensor::ObjectRef;

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

int Fail(const absl::Status& s) {
  Say("error " + s.ToString());
  return 3;
}

using shmtensor::testing::RefFromHex;
using shmtensor::testing::RefToHex;

int Run(int argc, char** argv) {
  if (argc < 3) return 2;
  const std::string cmd = argv[1];
  // hold_put waits for SIGUSR1 in sigwait. Blocked here, before the client
  // starts its threads (which inherit the mask): a thread that did not
  // block it could take the signal first, and its default action ends the
  // process.
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  if (cmd == "hold_put") sigprocmask(SIG_BLOCK, &usr1, nullptr);
  absl::StatusOr<Client> client =
      Client::Connect({.address = argv[2], .client_name = "st_child"});
  if (!client.ok()) return Fail(client.status());

  if (cmd == "write-view" || cmd == "write-tensor") {
    absl::StatusOr<ObjectRef> ref = RefFromHex(argv[3]);
    if (!ref.ok()) return Fail(ref.status());
    absl::StatusOr<shmtensor::View> view = client->Get(*ref);
    if (!view.ok()) return Fail(view.status());
    Say(view->writable() ? "got writable" : "got read-only");
    if (cmd == "write-view") {
      std::memset(const_cast<void*>(view->data()), 0x66, view->size_bytes());
    } else {
      absl::StatusOr<at::Tensor> t = shmtensor::ToTensor(*view);
      if (!t.ok()) return Fail(t.status());
      t->fill_(1);
    }
    Say("WROTE");
    return 0;
  }
  if (cmd == "write-after-seal") {  // argv[3]: name, argv[4]: "exclusive"?
    const bool exclusive = argc > 4 && std::string(argv[4]) == "exclusive";
    absl::StatusOr<shmtensor::Buffer> buf =
        client->Create({.size_bytes = 8192, .name = exclusive ? "" : argv[3]});
    if (!buf.ok()) return Fail(buf.status());
    auto* p = static_cast<uint8_t*>(buf->data());
    std::memset(p, 7, 8192);
    absl::StatusOr<shmtensor::SealedRef> sealed = buf->Seal(exclusive);
    if (!sealed.ok()) return Fail(sealed.status());
    Say("sealed " + RefToHex(sealed->ref()));
    p[100] = 0x66;  // Must fault.
    Say("WROTE");
    return 0;
  }
  if (cmd == "stale-pointer-write") {  // argv[3]: name
    // A raw pointer kept from an earlier buffer, whose memory the next one
    // gets: that one is filled without exposing a pointer (CopyFrom), and
    // the default revocation must still close it at seal, because the old
    // pointer points in.
    absl::StatusOr<shmtensor::Buffer> old =
        client->Create({.size_bytes = 8192});
    if (!old.ok()) return Fail(old.status());
    auto* p = static_cast<uint8_t*>(old->data());
    std::memset(p, 1, 8192);
    absl::StatusOr<shmtensor::SealedRef> old_ref = old->Seal();
    if (!old_ref.ok()) return Fail(old_ref.status());
    // Waits for the daemon: the memory is free for the next Create.
    if (absl::Status s = old_ref->Release(); !s.ok()) return Fail(s);
    absl::StatusOr<shmtensor::Buffer> buf =
        client->Create({.size_bytes = 8192, .name = argv[3]});
    if (!buf.ok()) return Fail(buf.status());
    if (buf->lease()->data() != p) {
      Say("error: the new buffer did not reuse the old one's memory");
      return 3;
    }
    const std::vector<uint8_t> sevens(8192, 7);
    if (absl::Status s = buf->CopyFrom(sevens.data(), sevens.size()); !s.ok()) {
      return Fail(s);
    }
    absl::StatusOr<shmtensor::SealedRef> sealed = buf->Seal();
    if (!sealed.ok()) return Fail(sealed.status());
    Say("sealed " + RefToHex(sealed->ref()));
    p[100] = 0x66;  // Must fault.
    Say("WROTE");
    return 0;
  }
  if (cmd == "deferred-write-view") {  // argv[3]: name
    // A client that leaves sealed ranges open in its writable mapping
    // (WriteRevocation::kDeferred): its own view of what it sealed must
    // still be read-only.
    absl::StatusOr<Client> deferred = Client::Connect(
        {.address = argv[2],
         .client_name = "st_child deferred",
         .write_revocation = shmtensor::WriteRevocation::kDeferred});
    if (!deferred.ok()) return Fail(deferred.status());
    absl::StatusOr<shmtensor::Buffer> buf =
        deferred->Create({.size_bytes = 8192, .name = argv[3]});
    if (!buf.ok()) return Fail(buf.status());
    std::memset(buf->data(), 7, 8192);
    absl::StatusOr<shmtensor::SealedRef> sealed = buf->Seal();
    if (!sealed.ok()) return Fail(sealed.status());
    absl::StatusOr<shmtensor::View> view = deferred->Get(sealed->ref());
    if (!view.ok()) return Fail(view.status());
    Say("sealed " + RefToHex(sealed->ref()));
    std::memset(const_cast<void*>(view->data()), 0x66, 8192);  // Must fault.
    Say("WROTE");
    return 0;
  }
  if (cmd == "take") {  // argv[3]: ref hex, argv[4]: expected byte
    absl::StatusOr<ObjectRef> ref = RefFromHex(argv[3]);
    if (!ref.ok()) return Fail(ref.status());
    int expected = 0;
    if (!absl::SimpleAtoi(argv[4], &expected)) return 2;
    absl::StatusOr<shmtensor::View> view = client->Get(*ref);
    if (!view.ok()) {
      if (shmtensor::IsAlreadyTaken(view.status())) {
        Say("already-taken");
        return 4;
      }
      return Fail(view.status());
    }
    if (!view->writable()) {
      Say("not-writable");
      return 5;
    }
    auto* p = static_cast<uint8_t*>(view->mutable_data());
    for (uint64_t i = 0; i < view->size_bytes(); ++i) {
      if (p[i] != expected) {
        Say("bad-byte");
        return 6;
      }
    }
    std::memset(p, 0x55, view->size_bytes());  // The taker may write.
    Say("took");
    return 0;
  }
  if (cmd == "share-write") {  // argv[3]: ref hex, argv[4]: byte to write
    absl::StatusOr<ObjectRef> ref = RefFromHex(argv[3]);
    if (!ref.ok()) return Fail(ref.status());
    int byte = 0;
    if (!absl::SimpleAtoi(argv[4], &byte)) return 2;
    absl::StatusOr<shmtensor::View> view = client->Get(*ref);
    if (!view.ok()) return Fail(view.status());
    if (!view->writable()) {
      Say("not-writable");
      return 5;
    }
    std::memset(view->mutable_data(), byte, view->size_bytes());
    Say("wrote");
    while (true) pause();  // Holds the view until killed.
  }
  if (cmd == "get-name") {  // argv[3]: name, [4]: timeout ms, [5]: byte
    int timeout_ms = 0, expected = 0;
    if (!absl::SimpleAtoi(argv[4], &timeout_ms) ||
        !absl::SimpleAtoi(argv[5], &expected)) {
      return 2;
    }
    Say("waiting");
    absl::StatusOr<shmtensor::View> view =
        client->Get(argv[3], absl::Milliseconds(timeout_ms));
    if (!view.ok()) return Fail(view.status());
    const auto* p = static_cast<const uint8_t*>(view->data());
    for (uint64_t i = 0; i < view->size_bytes(); ++i) {
      if (p[i] != expected) {
        Say("bad-byte");
        return 6;
      }
    }
    Say("ok " + std::to_string(view->size_bytes()));
    return 0;
  }
  if (cmd == "hold") {  // Holds one of everything, then waits to be killed.
    constexpr uint64_t kMiB = 1 << 20;
    absl::StatusOr<shmtensor::Buffer> half =
        client->Create({.size_bytes = kMiB, .name = "half"});
    absl::StatusOr<shmtensor::Buffer> unsealed =
        client->Create({.size_bytes = kMiB});
    absl::StatusOr<shmtensor::Buffer> shared =
        client->Create({.size_bytes = kMiB});
    absl::StatusOr<shmtensor::Buffer> transfer =
        client->Create({.size_bytes = kMiB});
    if (!half.ok() || !unsealed.ok() || !shared.ok() || !transfer.ok()) {
      return Fail(absl::InternalError("create failed"));
    }
    std::memset(half->data(), 1, kMiB);  // Half-written, never sealed.
    absl::StatusOr<shmtensor::SealedRef> ref = shared->Seal();
    absl::StatusOr<shmtensor::SealedRef> xfer = transfer->Seal(true);
    if (!ref.ok() || !xfer.ok())
      return Fail(absl::InternalError("seal failed"));
    absl::StatusOr<shmtensor::View> view = client->Get(ref->ref());
    if (!view.ok()) return Fail(view.status());
    // The seals went one way, and the get was a share: a call that
    // observes the session's messages returns once the daemon applied
    // them, so all of the above is at the daemon when this says ready.
    if (absl::Status s = client->Stats().status(); !s.ok()) return Fail(s);
    Say("ready");
    while (true) pause();
  }
  if (cmd == "hold_put") {
    // Puts 1 MiB of 0x5a and holds a view of it; on SIGUSR1 (the daemon may
    // be gone by then) reads its last byte back through the view.
    std::vector<uint8_t> bytes(1 << 20, 0x5a);
    absl::StatusOr<shmtensor::SealedRef> ref =
        client->Put(bytes.data(), {.size_bytes = bytes.size()});
    if (!ref.ok()) return Fail(ref.status());
    absl::StatusOr<shmtensor::View> view = client->Get(ref->ref());
    if (!view.ok()) return Fail(view.status());
    Say("ready");
    int sig = 0;
    sigwait(&usr1, &sig);
    const auto* data = static_cast<const uint8_t*>(view->data());
    char line[32];
    std::snprintf(line, sizeof(line), "read 0x%02x", data[bytes.size() - 1]);
    Say(line);
    while (true) pause();
  }
  if (cmd == "fork-hold") {  // Holds a buffer, forks a sleeper, waits.
    absl::StatusOr<shmtensor::Buffer> buf =
        client->Create({.size_bytes = 1 << 20});
    if (!buf.ok()) return Fail(buf.status());
    const pid_t child = fork();
    if (child == 0) {
      // The grandchild keeps whatever fds it inherited until it is killed.
      while (true) pause();
    }
    Say("ready " + std::to_string(child));
    while (true) pause();
  }
  if (cmd == "put-exclusive") {  // argv[3]: bytes, argv[4]: byte value
    uint64_t bytes = 0;
    int value = 0;
    if (!absl::SimpleAtoi(argv[3], &bytes) ||
        !absl::SimpleAtoi(argv[4], &value)) {
      return 2;
    }
    const std::vector<uint8_t> data(bytes, static_cast<uint8_t>(value));
    absl::StatusOr<shmtensor::SealedRef> ref =
        client->Put(data.data(), {.size_bytes = bytes}, /*exclusive=*/true);
    if (!ref.ok()) return Fail(ref.status());
    // The transfer lives while its creator does: until the test kills it.
    Say("sealed " + RefToHex(ref->ref()));
    while (true) pause();
  }
  if (cmd == "exclusive-and-exit") {
    absl::StatusOr<shmtensor::Buffer> buf =
        client->Create({.size_bytes = 4096});
    if (!buf.ok()) return Fail(buf.status());
    absl::StatusOr<shmtensor::SealedRef> ref = buf->Seal(true);
    if (!ref.ok()) return Fail(ref.status());
    Say("sealed " + RefToHex(ref->ref()));
    return 0;
  }
  if (cmd == "unsealed") {
    // A 64 KiB buffer it never seals: its ref printed, then it waits to be
    // killed.
    absl::StatusOr<shmtensor::Buffer> buf =
        client->Create({.size_bytes = 65536});
    if (!buf.ok()) return Fail(buf.status());
    const std::vector<uint8_t> ones(65536, 0x11);
    if (absl::Status s = buf->CopyFrom(ones.data(), ones.size()); !s.ok()) {
      return Fail(s);
    }
    Say("ref " + RefToHex(buf->info().ref));
    while (true) pause();
  }
  if (cmd == "stock") {
    // Puts 64 KiB objects (object i of byte i) until it holds stock, keeps
    // the refs of the last three (printed), takes one more buffer and
    // leaves it unsealed, says how much stock it holds, then waits to be
    // killed.
    std::vector<shmtensor::SealedRef> refs;
    std::vector<uint8_t> bytes(65536);
    for (int i = 0; i < 24; ++i) {
      std::memset(bytes.data(), i, bytes.size());
      absl::StatusOr<shmtensor::SealedRef> ref =
          client->Put(bytes.data(), {.size_bytes = bytes.size()});
      if (!ref.ok()) return Fail(ref.status());
      refs.push_back(*std::move(ref));
      if (refs.size() > 3) refs.erase(refs.begin());
    }
    for (int i = 0; i < 3; ++i) {
      Say(absl::StrCat("ref ", RefToHex(refs[i].ref()), " ", 21 + i));
    }
    absl::StatusOr<shmtensor::Buffer> unsealed =
        client->Create({.size_bytes = 65536});
    if (!unsealed.ok()) return Fail(unsealed.status());
    absl::StatusOr<shmtensor::StoreStats> st = client->Stats();
    if (!st.ok()) return Fail(st.status());
    Say(absl::StrCat("stock ", st->stock_objects));
    while (true) pause();
  }
  if (cmd == "offer-and-exit") {
    // A 64 KiB object of 0x6F, offered from a view, then every handle
    // dropped and the process gone.
    absl::StatusOr<shmtensor::Buffer> buf =
        client->Create({.size_bytes = 65536});
    if (!buf.ok()) return Fail(buf.status());
    std::memset(buf->data(), 0x6F, 65536);
    absl::StatusOr<shmtensor::SealedRef> ref = buf->Seal();
    if (!ref.ok()) return Fail(ref.status());
    absl::StatusOr<shmtensor::View> view = client->Get(ref->ref());
    if (!view.ok()) return Fail(view.status());
    absl::StatusOr<uint64_t> token = view->Offer();
    if (!token.ok()) return Fail(token.status());
    Say(absl::StrCat("offered ", RefToHex(ref->ref()), " ", *token));
    return 0;
  }
  return 2;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
