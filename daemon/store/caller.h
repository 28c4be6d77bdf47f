// Who makes a data-plane call of the store, and what the call carries of
// its session's release protocol (docs/shm_layout.md, "Releases and one-way
// seals"). Every data-plane call of ObjectStore takes a Caller and admits
// it under the one lock the call takes anyway: the session is looked up
// once, checked against the caller's process, the releases the request
// carries are applied, and the releases it must follow are checked, before
// the call itself runs (ObjectStore::Admit).
//
// Thread safety: a value; `carried` and `skipped` must outlive the call.
#ifndef SHMTENSOR_DAEMON_STORE_CALLER_H_
#define SHMTENSOR_DAEMON_STORE_CALLER_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "daemon/os/peer.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "shmtensor/v1/shmtensor.pb.h"

namespace shmtensor::daemon {

struct Caller {
  // An in-process caller (tests, fuzzers, benchmarks) of session
  // `session_id`, carrying no releases. Implicit, so that a session id
  // reads as its own caller.
  Caller(uint64_t session_id) : session_id(session_id) {}  // NOLINT

  uint64_t session_id = 0;
  // The caller's process as the kernel names it (its connection's owner
  // key, peer.h). The gRPC service always sets it: a session then acts
  // only for the process that opened it, and any other process gets the
  // same SESSION_ENDED as for a session that is not open.
  std::optional<OwnerKey> owner;
  // The serial of the connection the call came on (Connection::serial; 0:
  // unchecked, an in-process caller). Older than the one the session's
  // stream last opened or resumed on: the call was made before that
  // resume's account of leases, or is a waiting call tried again after
  // it, and its answer goes to a connection the client has left. It is
  // refused UNAVAILABLE: a lease it granted would be one the client never
  // learns of, held until the session ends.
  uint64_t connection = 0;
  // Copies of the session's ReleaseLeases the request carries (its
  // `releases`), applied first, in order, up to the first gap (the stream
  // brings the rest); more than kDaemonMaxCarriedReleases fails
  // INVALID_ARGUMENT naming both counts. Not owned; null for none.
  const google::protobuf::RepeatedPtrField<v1::ReleaseLeases>* carried =
      nullptr;
  // The call runs only once the session applied every ReleaseLeases
  // through this seq (the request's `releases_through`; 0: none). Until
  // then it fails with a status IsAwaitingReleases says yes to, which no
  // client sees: the service parks the call and tries again when the store
  // changes. With `releases_last_try` (the wait's deadline passed) it fails
  // DEADLINE_EXCEEDED naming both seqs instead.
  uint64_t releases_through = 0;
  bool releases_last_try = false;
  // When not null, set to the NOT_FOUND naming the leases and seals of the
  // carried copies the session does not hold (skipped, for the caller's
  // log; the call goes on).
  absl::Status* skipped = nullptr;
};

// A call's "not yet: the session applied ReleaseLeases through `applied`
// only, and the call follows those through `seq`" (Caller::
// releases_through), and the test for it.
absl::Status AwaitingReleasesError(uint64_t seq, uint64_t applied);
bool IsAwaitingReleases(const absl::Status& status);

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_STORE_CALLER_H_
