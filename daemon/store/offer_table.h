// Offers [P19]: pins on sealed objects that a session hands to another
// process by reference (a torch.multiprocessing queue, a Process argument,
// any message the receiver reads later). The sender offers a read lease it
// holds (ObjectStore::Offer) and sends the ref with the offer's token; the
// receiver's Get presenting the token takes the pin over with a lease of its
// own. Until then the object is pinned whatever the sender does, its exit
// included, so the receiver never finds it gone because the sender let go
// first.
//
// An offer ends when it is taken, or `grace` after its session ended (a
// message nobody reads must not pin memory for ever); while the session
// lives its offers are bounded in number instead (max per session). The
// table only keeps the records: the store moves the pins and the bytes
// charged (ObjectTable::Object::holds, SessionTable::ChargeUid).
//
// Thread safety: not thread-safe; the owner (ObjectStore) serializes access.
#ifndef SHMTENSOR_DAEMON_STORE_OFFER_TABLE_H_
#define SHMTENSOR_DAEMON_STORE_OFFER_TABLE_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"

namespace shmtensor::daemon {

class OfferTable {
 public:
  struct Offer {
    uint32_t slot = 0;  // The object pinned, and its generation then.
    uint32_t generation = 0;
    uint64_t session_id = 0;  // The offering session.
    uid_t uid = 0;            // Its uid, charged `bytes` until the offer ends.
    uint64_t bytes = 0;
    // InfiniteFuture while the offering session is open.
    absl::Time expires = absl::InfiniteFuture();
    uint64_t token = 0;  // Set by Add.
  };

  // Offers of session `session_id` still open (not taken, session open).
  size_t CountOf(uint64_t session_id) const;
  // Records `offer` under `token` (nonzero, not in use: Contains).
  void Add(uint64_t token, const Offer& offer);
  bool Contains(uint64_t token) const { return offers_.contains(token); }
  // The offer `token` when it pins `slot` at `generation`, else null; valid
  // until the table changes.
  const Offer* Find(uint64_t token, uint32_t slot, uint32_t generation) const;
  // Removes and returns the offer `token` when it pins `slot` at
  // `generation`; nullopt (nothing removed) otherwise: a token of another
  // object takes nothing.
  std::optional<Offer> Take(uint64_t token, uint32_t slot, uint32_t generation);
  // Session `session_id` ended at `now`: its offers expire at `now + grace`.
  // Returns their tokens.
  std::vector<uint64_t> SessionEnded(uint64_t session_id, absl::Time now,
                                     absl::Duration grace);
  // The offers of session `old_id` are session `new_id`'s (a resumed
  // session's id replacing the one it was adopted under).
  void Rekey(uint64_t old_id, uint64_t new_id);
  // Records `offer` as a predecessor left it: open (expires infinite) or
  // expiring.
  void Restore(uint64_t token, const Offer& offer);
  // Removes and returns the offers expired at `now`.
  std::vector<Offer> Expire(absl::Time now);

  size_t size() const { return offers_.size(); }

 private:
  absl::flat_hash_map<uint64_t, Offer> offers_;  // By token.
  // Tokens of the open sessions' offers.
  absl::flat_hash_map<uint64_t, absl::flat_hash_set<uint64_t>> by_session_;
  // (expiry, token) of the offers whose session ended.
  std::set<std::pair<absl::Time, uint64_t>> expiring_;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_STORE_OFFER_TABLE_H_
