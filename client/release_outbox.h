// The client's side of the release protocol (docs/shm_layout.md, "Releases
// and one-way seals"): a session's ReleaseLeases messages (lease releases
// and one-way seals), numbered, from the moment they are queued until the
// daemon confirms them applied.
#ifndef SHMTENSOR_CLIENT_RELEASE_OUTBOX_H_
#define SHMTENSOR_CLIENT_RELEASE_OUTBOX_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

#include "absl/functional/function_ref.h"
#include "common/release_protocol.h"
#include "shmtensor/v1/shmtensor.pb.h"

namespace shmtensor::internal {

// A message is published the moment Enqueue returns: from then on each of
// the ways it can reach the daemon accounts for it, and this class is
// where they meet:
//   - the session stream: the writer thread takes the oldest unwritten ones
//     (TakeUnwritten) and marks them written (Written);
//   - the release ring: a one-way seal is posted there as it is queued
//     (EnqueuePosted), and the daemon pulls it; the writer writes it on the
//     stream as well unless the ring's applied seq confirmed it first;
//   - copies carried by requests: every request is stamped with the last
//     seq queued and carries the oldest unconfirmed (Stamp); its success
//     confirms them (Confirm);
//   - a reconciling resume: its account counts them and presents their
//     seals (Account); the daemon's answer settles them (Settle);
//   - a resume of a daemon that does not reconcile: those it had not
//     applied go again on the new stream, first (Resend).
// A message leaves when confirmed or settled. Until somebody has seen the
// last message (a request counted it, the writer took it, a resume
// accounted for it) a new one joins it, up to kMaxJoined entries: the
// daemon applies a message's seals before its releases, so joining keeps
// the order they were made in.
//
// Thread-safe. Its lock is taken last: callers may hold ClientCore's
// write_mu_ and held_mu_ (Account under held_mu_ is what makes a resume's
// account name every lease or count its release, never neither).
class ReleaseOutbox {
 public:
  // Most releases and seals one message carries when they join it.
  static constexpr size_t kMaxJoined = 256;
  // Most queued messages the writer takes for one send.
  static constexpr size_t kMaxWrittenTogether = 64;

  ReleaseOutbox() = default;
  ReleaseOutbox(const ReleaseOutbox&) = delete;
  ReleaseOutbox& operator=(const ReleaseOutbox&) = delete;

  // Publishes `message`: joined into the last one, or given the next seq.
  void Enqueue(v1::ReleaseLeases message);
  // Publishes `message` under the next seq, joining nothing, and offers it
  // to `post` (the release ring: ClientCore::SendSeals) under this
  // outbox's lock, so that what is posted is posted in seq order. Returns
  // what `post` returned: true, it was posted (and is final: nothing joins
  // it); false, it waits for the writer as Enqueue's does. Either way it is
  // unconfirmed until confirmed, as every message. First confirms every
  // message through `applied` (the ring's word: Confirm), so that a session
  // that only posts keeps no more than the daemon has not applied.
  bool EnqueuePosted(v1::ReleaseLeases message, uint64_t applied,
                     absl::FunctionRef<bool(const v1::ReleaseLeases&)> post);

  // How many messages are queued and not yet written, settled or
  // confirmed.
  uint64_t Unwritten() const;
  // Whether a message is neither confirmed applied nor settled.
  bool HasUnconfirmed() const;

  // Stamps a request that can observe this session's releases: its
  // releases_through is the last seq queued (the daemon applies every
  // message through it before serving the request) and it carries copies of
  // the oldest kClientMaxCarriedReleases unconfirmed messages, so the
  // daemon need not wait for the stream to deliver them.
  template <typename Request>
  void Stamp(Request* req) {
    std::lock_guard<std::mutex> lock(mu_);
    req->set_releases_through(sent_);
    frozen_through_ = sent_;
    size_t n = 0;
    for (const v1::ReleaseLeases& message : unconfirmed_) {
      if (n++ == kClientMaxCarriedReleases) break;
      *req->add_releases() = message;
    }
  }

  // The daemon applied every message through `through` (a stamped request
  // succeeded): they leave.
  void Confirm(uint64_t through);

  // For the writer thread: the oldest messages not yet written (nor
  // settled, nor confirmed), up to kMaxWrittenTogether, as stream requests.
  // Empty when there are none.
  std::vector<v1::SessionRequest> TakeUnwritten();
  // How many leading messages of `batch` (from TakeUnwritten) a resume has
  // written or settled since: the writer skips them.
  size_t AlreadyWritten(const std::vector<v1::SessionRequest>& batch) const;
  // Every message through `seq` is written on the current stream.
  void Written(uint64_t seq);
  // The session ended: nothing queued will be written (the daemon dropped
  // every lease of the session).
  void Abandon();

  // A resume's account (OpenSession): releases_through, and the seals of
  // every unconfirmed message (pending_seals: the daemon applies those
  // still due).
  void Account(v1::OpenSession* account);
  // A reconciling resume settled every message through `through` (its
  // seals were presented, its released leases not); those queued since go
  // on the new stream.
  void Settle(uint64_t through);
  // A resume of a daemon that does not reconcile: writes, with `write`, in
  // order, every message past `applied` (SessionOpened.releases_applied).
  // False when a write failed; else they are all written.
  bool Resend(uint64_t applied,
              absl::FunctionRef<bool(const v1::SessionRequest&)> write);

 private:
  mutable std::mutex mu_;
  // Seq of the last message queued (published).
  uint64_t sent_ = 0;
  // Seq through which every message was written on the current stream,
  // settled by a resume, or confirmed applied.
  uint64_t written_through_ = 0;
  // Seq through which the messages are final (seen: see the class
  // comment); a new entry joins the last message only past it.
  uint64_t frozen_through_ = 0;
  // The messages not yet confirmed applied, oldest first: all of them,
  // since a resume may have to send again those the daemon had not
  // applied.
  std::deque<v1::ReleaseLeases> unconfirmed_;
};

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_RELEASE_OUTBOX_H_
