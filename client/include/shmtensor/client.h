// shmtensor C++ client. Start here.
//
//   absl::StatusOr<shmtensor::Client> client = shmtensor::Client::Connect();
//   absl::StatusOr<shmtensor::Buffer> buf = client->Create(
//       {.dtype = shmtensor::DType::kFloat32, .shape = {64, 1024}});
//   buf->CopyFrom(src, buf->size_bytes());  // or Fill(), or data()
//   absl::StatusOr<shmtensor::SealedRef> ref = buf->Seal();
//   std::string wire = ref->ref().Serialize();       // to another process
//   ...
//   absl::StatusOr<shmtensor::View> view =
//   client->Get(*ObjectRef::Parse(wire));
//
// Every call returns absl::Status; codes are those of the wire contract
// (proto/shmtensor/v1/shmtensor.proto), reasons via shmtensor/errors.h.
// No call copies object bytes: buffers and views point into pools mapped once
// per process.
//
// CUDA pools (a daemon pool of kind "cuda"): Create with .device =
// Device::Cuda(n) gives a buffer in device memory; data() pointers are then
// device addresses (View::info().device says which). The ordering contract
// across processes (docs/pitfalls.md P12):
//  - Producer: Seal (and Put) first waits until the producer's GPU work is
//    done, on the stream given (all of this process's work on the device
//    when none is), so a consumer never reads before the writes landed.
//  - Consumer: when the last holder of a view (copies, ToTensor tensors,
//    Python exports) lets go, the release is sent only once the work queued
//    on the legacy default stream, and on every stream an export was
//    declared on (DLPack's stream argument, ToTensor's), is done; until then
//    the memory cannot be reused. Work on other streams must be ordered
//    before the last reference dies (as torch's record_stream requires).
// Device memory has no page protection: that a shared CUDA object is not
// written is the API's contract (read-only views), not enforced by the MMU.
#ifndef SHMTENSOR_CLIENT_INCLUDE_SHMTENSOR_CLIENT_H_
#define SHMTENSOR_CLIENT_INCLUDE_SHMTENSOR_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "shmtensor/device.h"
#include "shmtensor/dtype.h"
#include "shmtensor/object_ref.h"
#include "shmtensor/view.h"

namespace shmtensor {

namespace internal {
class ClientCore;
}  // namespace internal

struct ClientOptions {
  // A "unix:/path" address. Empty: DefaultAddress().
  std::string address;
  std::string client_name;  // Shown to operators; empty: "pid <pid>".
  absl::Duration connect_timeout = absl::Seconds(5);
  // How this client's writable buffers and taken views give up write access
  // when sealed, discarded or released (see WriteRevocation in view.h).
  // The default closes a range at once only where a raw pointer into it
  // was handed out; kImmediate always does; kDeferred only where no raw
  // pointer into a buffer can outlive it.
  WriteRevocation write_revocation = WriteRevocation::kWhenExposed;
  // The client sends nothing to a daemon that runs as another user than
  // this process's, root, this uid (when set) or $SHMTENSOR_DAEMON_UID:
  // Connect fails PERMISSION_DENIED naming who serves the socket.
  std::optional<uint32_t> daemon_uid;
  // A read-only session: the process receives only O_RDONLY descriptors of
  // this session's pools (no mapping of them can ever be made writable),
  // and create/put fail PERMISSION_DENIED. Sessions of a user the daemon
  // lets only read a pool (read_only_users, read_only_groups) are read-only
  // there whatever this says.
  bool read_only = false;
  // When the connection breaks (the daemon was taken over, reloaded, or
  // restarted by systemd after a crash), how long the client keeps trying
  // to resume its session with the daemon at the address (bounded
  // back-off) before the session ends. The call that found it broken fails
  // UNAVAILABLE either way. Unset: $SHMTENSOR_RESUME_TIMEOUT (seconds),
  // else 10 s. A daemon that stopped cleanly (its socket is gone) ends the
  // session within about half a second.
  std::optional<absl::Duration> resume_timeout;
  // Writable memory the client keeps granted ahead of its creates and puts
  // of unnamed host objects (its stock: docs/shm_layout.md, "Stock and
  // one-way seals"), so that they make no round trip: buffers of the sizes
  // this process keeps asking for, refilled in the background, given back
  // after 2 s unused. At most an eighth of a pool; a size past a quarter of
  // the budget has none; the daemon bounds it too
  // (limits.max_stock_bytes_per_client). 0: no stock (each such create or
  // put makes one round trip).
  uint64_t stock_bytes = uint64_t{64} << 20;
};

struct CreateOptions {
  // Bytes; 0 with a dtype means the layout's extent. Required (> 0) for an
  // untyped buffer.
  uint64_t size_bytes = 0;
  DType dtype = DType::kUnspecified;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides_bytes;  // Empty: C-contiguous.
  std::string name;  // Empty: unnamed. Visible to Get once sealed.
  // The pool by name. Empty: the first pool on `device`.
  std::string pool;
  // Where the object lives when no pool is named: host shared memory, or a
  // CUDA pool of that device (NOT_FOUND listing the daemon's pools if it has
  // none there).
  Device device = Device::Host();
  // How long to wait for memory when the pool is full (then
  // RESOURCE_EXHAUSTED).
  absl::Duration timeout = absl::ZeroDuration();
  // A shared-writable object: never sealed (Buffer::Seal fails); every
  // Get(ref) of it, in any process, gives a writable View, and it lives
  // while any of them (or this Buffer) holds it. For processes that order
  // their writes to it themselves; no name. See docs/shm_layout.md.
  bool shared_writable = false;
};

// One object of Client::PutMany: `data` as Put's, `options` as Create's.
struct PutItem {
  const void* data = nullptr;
  CreateOptions options;
};

struct PoolUsage {
  std::string name;
  uint64_t size_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t largest_free_bytes = 0;
  uint64_t objects = 0;
  // Huge page size backing the pool (2 MiB on x86-64), 0 for base pages.
  uint64_t huge_page_size = 0;
  // Bytes of used_bytes that sessions hold as stock (ClientOptions::
  // stock_bytes): granted ahead of their puts, not sealed yet.
  uint64_t stock_bytes = 0;
};

struct StoreStats {
  std::vector<PoolUsage> pools;
  uint64_t sessions = 0;
  uint64_t objects = 0;
  uint64_t named_objects = 0;
  uint64_t leases = 0;
  uint64_t pending_transfers = 0;
  // Fork holds this client took that still pin objects for its forked
  // children (they live).
  uint64_t fork_holds = 0;
  // Objects this client offered to another process (View::Offer) that no
  // one took yet.
  uint64_t offers = 0;
  // This client's stock (ClientOptions::stock_bytes): buffers and bytes.
  uint64_t stock_objects = 0;
  uint64_t stock_bytes = 0;
};

// A session with shmtensord. Copies share the session. The session ends when
// the last copy, buffer, view and SealedRef made through it are gone (or the
// process dies); the daemon then drops every lease it still holds. If the
// connection breaks while the process lives, the daemon keeps the session
// and the client resumes it on its next call (that one call fails
// UNAVAILABLE): no view's memory is reused meanwhile.
// Thread safety: thread-safe. After fork(), a child must Connect anew.
class Client {
 public:
  // Connects and opens a session. UNAVAILABLE when no daemon answers.
  static absl::StatusOr<Client> Connect(const ClientOptions& options = {});

  // For a runtime's exit hook (the Python package calls it from atexit):
  // keeps every client of this process still alive from being destroyed,
  // ever; their sessions end when the process exits. Destroying a client
  // hands its gRPC channel's teardown to gRPC's threads, which must not
  // overlap the process's static destructors. Thread-safe.
  static void KeepAliveUntilExit();
  // Releases and one-way seals (Buffer::Seal of an unnamed object, Put) are
  // written to the daemon by a thread of each client, microseconds after
  // the call that made them returned; a client's destruction and
  // KeepAliveUntilExit write what is left. For a process that ends without
  // either (os._exit after multiprocessing's finalizers, which the Python
  // package hooks): waits until every client of this process wrote what it
  // had queued, at most 2 s. Thread-safe.
  static void FlushAll();

  // Allocates a writable buffer (see CreateOptions).
  absl::StatusOr<Buffer> Create(const CreateOptions& options);

  // Copies `options`' bytes from `data` into a new object and seals it, in
  // one call (size from size_bytes, or from the layout). Host pool: `data` is
  // host memory, copied into this process's writable mapping of the pool
  // (no pointer is handed out, so the range stays open and faulted in for
  // the next object of its size, see WriteRevocation) and, unnamed, sealed
  // one way (Buffer::Seal): with the client's stock, a put makes no round
  // trip at all. CUDA pool: `data` is device (or host) memory, copied with
  // cudaMemcpyAsync on `stream` (after the work queued there, which is how a
  // producer's writes to `data` are ordered before the copy) and waited
  // for, then sealed with a Seal round trip. `exclusive` as in Buffer::Seal.
  absl::StatusOr<SealedRef> Put(const void* data, const CreateOptions& options,
                                bool exclusive = false,
                                CudaStream stream = kLegacyDefaultStream);
  // Put of every item, host pools only, in at most one round trip for all
  // the unnamed ones (none when the stock has their buffers) and one
  // stream message for their seals; a named item costs Put's two. All or
  // nothing: on an error no item is left (those made are discarded).
  absl::StatusOr<std::vector<SealedRef>> PutMany(
      const std::vector<PutItem>& items, bool exclusive = false);

  // Get of every ref in one round trip (Get(ref, writable) each; a ref of an
  // object this process holds a read lease of takes a share of it and asks
  // the daemon nothing). Each result stands alone. Objects not sealed yet
  // are waited for together (as Get).
  std::vector<absl::StatusOr<View>> GetMany(const std::vector<ObjectRef>& refs,
                                            bool writable = true);

  // A view of a sealed object. Read-only, or writable for the one consumer of
  // an exclusive transfer. A shared object this process holds a read lease
  // of already (a view, its own put's SealedRef) is a share of that lease:
  // no round trip, and the lease goes with its last holder. An object whose
  // one-way seal has not reached the daemon yet is waited for, up to 10 s
  // (DEADLINE_EXCEEDED after; NOT_FOUND with IsStaleReference at once
  // when its creator discards it or ends first). NOT_FOUND with
  // IsStaleReference for a ref whose object is gone; FAILED_PRECONDITION with
  // IsAlreadyTaken for a second take. `writable` = false takes an exclusive
  // transfer (the object is this client's alone) but maps it read-only, which
  // skips opening a writable range: cheaper when the consumer only reads.
  // Shared objects are always read-only.
  absl::StatusOr<View> Get(const ObjectRef& ref, bool writable = true);
  // The part of Get(ref) that never calls the daemon: a share of the read
  // lease this process holds on exactly `ref`, or nullopt (Get then asks
  // the daemon). Takes one short lock and never blocks on anything else, so
  // a binding may call it without giving up its interpreter's lock.
  std::optional<View> GetHeld(const ObjectRef& ref);

  // The receiving half of sending an object by reference: a read-only view
  // of the object another process offered (View::Offer) with `offer_token`.
  // The view's lease takes the daemon's pin over, so the object stays
  // whatever its sender did since, exit included (for up to the daemon's
  // limits.offer_grace_ms after the sender's session ended). A token that
  // pins nothing (taken already, expired) makes this Get(ref, false): it
  // works while something else holds the object, and fails as a stale ref
  // once nothing does, saying so.
  absl::StatusOr<View> Take(const ObjectRef& ref, uint64_t offer_token);

  // A read-only view of the object bound to `name`, waiting up to `timeout`
  // for one to be sealed (DEADLINE_EXCEEDED after; NOT_FOUND at once for a
  // zero timeout).
  absl::StatusOr<View> Get(std::string_view name,
                           absl::Duration timeout = absl::ZeroDuration());

  // Unbinds `name`; its memory follows when the last lease goes.
  absl::Status Delete(std::string_view name);

  absl::StatusOr<StoreStats> Stats();

  // True when the daemon has a pool on `device` (CreateOptions::device).
  bool HasPoolOn(const Device& device) const;
  // The name of the pool a Create on `device` without a pool name goes to,
  // as the daemon chose it for this session: the first pool there the
  // session may write, else one it may read; NOT_FOUND listing the
  // session's pools when there is none there.
  absl::StatusOr<std::string> PoolOn(const Device& device) const;

  // The session's secret id (requests carry it); do not show it to others.
  uint64_t session_id() const;
  // The public id operators see for this session (shmtensorctl clients).
  uint64_t client_id() const;
  // Random id of the daemon instance (see ObjectRef::daemon_epoch): two
  // clients with the same epoch share that daemon's pools.
  uint64_t daemon_epoch() const;
  const std::string& address() const;

 private:
  explicit Client(std::shared_ptr<internal::ClientCore> core)
      : core_(std::move(core)) {}
  absl::StatusOr<View> GetRef(const ObjectRef& ref, bool writable,
                              uint64_t offer_token);

  std::shared_ptr<internal::ClientCore> core_;
};

}  // namespace shmtensor

#endif  // SHMTENSOR_CLIENT_INCLUDE_SHMTENSOR_CLIENT_H_
