// The blocking form of the store's waiting calls, for tests, fuzzers and
// benchmarks that drive an ObjectStore in-process. The daemon never blocks
// a thread on them: the gRPC service parks its calls in WaitingCalls
// (daemon/server/waiting_calls.h) and retries the Try* form when the store
// changes. These loop the same way on the calling thread: the Try* call,
// then (counted as a waiter after its first "not yet", ObjectStore::
// BeginWait) a wait for the store to change, at most 100 ms, polling
// `cancelled`, and a last try at the deadline, which gives the timeout's
// error.
//
// Thread safety: as the store's (thread-safe).
#ifndef SHMTENSOR_TESTING_CPP_BLOCKING_STORE_H_
#define SHMTENSOR_TESTING_CPP_BLOCKING_STORE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/store/object_store.h"

namespace shmtensor::daemon {

// ObjectStore::TryCreate until it answers (args.timeout, args.cancelled).
absl::StatusOr<Handout> CreateBlocking(ObjectStore& store,
                                       const CreateArgs& args);

// ObjectStore::TryGetByName until the name is sealed or `timeout` passed
// (0: NOT_FOUND at once for a name not there).
absl::StatusOr<Handout> GetByNameBlocking(ObjectStore& store,
                                          uint64_t session_id,
                                          const std::string& name,
                                          absl::Duration timeout,
                                          const CancelledFn& cancelled = {});

// ObjectStore::TryAwaitReleases until the session applied every
// ReleaseLeases through `seq` (OK at once for seq 0); SESSION_ENDED if the
// session ends first, DEADLINE_EXCEEDED naming both seqs after `timeout`.
absl::Status AwaitReleasesBlocking(ObjectStore& store, uint64_t session_id,
                                   uint64_t seq, absl::Duration timeout,
                                   const CancelledFn& cancelled = {});

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_TESTING_CPP_BLOCKING_STORE_H_
