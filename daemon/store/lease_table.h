// The leases the store has issued: which session holds which object, and
// whether to write it. Ids count up from 1 and are never reused, so an id
// tells a lease released from one never issued.
//
// Thread safety: not thread-safe; the owner (ObjectStore) serializes access.
#ifndef SHMTENSOR_DAEMON_STORE_LEASE_TABLE_H_
#define SHMTENSOR_DAEMON_STORE_LEASE_TABLE_H_

#include <cstddef>
#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace shmtensor::daemon {

class LeaseTable {
 public:
  struct Lease {
    uint64_t session = 0;  // The session holding it.
    uint32_t slot = 0;     // The object's slot (object_table.h).
    bool write = false;
  };

  // Issues a lease of `session_id` on the object in `slot`; returns its id.
  uint64_t Add(uint64_t session_id, uint32_t slot, bool write);
  // Lease `lease_id`, which session `session_id` (open: the caller checked)
  // must hold: FAILED_PRECONDITION for a lease already released, NOT_FOUND
  // for one never issued, PERMISSION_DENIED for another session's. The
  // pointer lives until the next Add or Remove.
  absl::StatusOr<Lease*> Lookup(uint64_t session_id, uint64_t lease_id);
  // Removes lease `lease_id` (held now) and returns it.
  Lease Remove(uint64_t lease_id);

  // A successor's table: lease `id` as its predecessor issued it; ids from
  // `next` on are issued later.
  void Restore(uint64_t id, const Lease& lease) { leases_[id] = lease; }
  void SetNextId(uint64_t next) { next_id_ = next; }
  // Lease `id` (held) now belongs to session `session_id` (a resumed
  // session's id replacing the one it was adopted under).
  void SetSession(uint64_t id, uint64_t session_id) {
    leases_.at(id).session = session_id;
  }
  uint64_t next_id() const { return next_id_; }

  size_t size() const { return leases_.size(); }
  // Every lease held, by id.
  const absl::flat_hash_map<uint64_t, Lease>& all() const { return leases_; }

 private:
  absl::flat_hash_map<uint64_t, Lease> leases_;
  uint64_t next_id_ = 1;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_STORE_LEASE_TABLE_H_
