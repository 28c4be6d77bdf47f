#include "testing/cpp/blocking_store.h"

#include <algorithm>
#include <optional>

#include "absl/time/clock.h"

namespace shmtensor::daemon {
namespace {

// `attempt(last_try)` until it answers: see the header.
template <typename T, typename Attempt>
absl::StatusOr<T> Block(ObjectStore& store, uint64_t session_id,
                        absl::Time deadline, const CancelledFn& cancelled,
                        Attempt attempt) {
  std::optional<ObjectStore::WaitToken> token;
  absl::StatusOr<T> result = absl::UnknownError("unset");
  while (true) {
    const uint64_t seen = store.changes();
    auto r = attempt(absl::Now() >= deadline);
    if (!r.ok()) {
      result = r.status();
      break;
    }
    if (r->has_value()) {
      result = **std::move(r);
      break;
    }
    if (cancelled && cancelled()) {
      result = absl::CancelledError("the caller cancelled the call");
      break;
    }
    if (!token.has_value()) {
      absl::StatusOr<ObjectStore::WaitToken> t = store.BeginWait(session_id);
      if (!t.ok()) {
        result = t.status();
        break;
      }
      token = *t;
    }
    store.WaitForChange(
        seen, std::min(deadline, absl::Now() + absl::Milliseconds(100)));
  }
  if (token.has_value()) store.EndWait(*token);
  return result;
}

}  // namespace

absl::StatusOr<Handout> CreateBlocking(ObjectStore& store,
                                       const CreateArgs& args) {
  return Block<Handout>(
      store, args.caller.session_id, absl::Now() + args.timeout, args.cancelled,
      [&](bool last_try) { return store.TryCreate(args, last_try); });
}

absl::StatusOr<Handout> GetByNameBlocking(ObjectStore& store,
                                          uint64_t session_id,
                                          const std::string& name,
                                          absl::Duration timeout,
                                          const CancelledFn& cancelled) {
  return Block<Handout>(
      store, session_id, absl::Now() + timeout, cancelled, [&](bool last_try) {
        return store.TryGetByName(session_id, name, timeout, last_try);
      });
}

absl::Status AwaitReleasesBlocking(ObjectStore& store, uint64_t session_id,
                                   uint64_t seq, absl::Duration timeout,
                                   const CancelledFn& cancelled) {
  if (seq == 0) return absl::OkStatus();
  return Block<bool>(store, session_id, absl::Now() + timeout, cancelled,
                     [&](bool last_try) -> absl::StatusOr<std::optional<bool>> {
                       absl::StatusOr<bool> done =
                           store.TryAwaitReleases(session_id, seq, last_try);
                       if (!done.ok()) return done.status();
                       if (!*done) return std::nullopt;
                       return true;
                     })
      .status();
}

}  // namespace shmtensor::daemon
