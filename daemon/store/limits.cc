#include "daemon/store/limits.h"

#include <algorithm>

#include "absl/numeric/int128.h"

namespace shmtensor::daemon {
namespace {

uint64_t Share(uint64_t table, uint64_t percent) {
  if (table == 0) return 0;  // An unbounded table: no share to take.
  const absl::uint128 part = absl::uint128(table) * percent / 100;
  return std::max<uint64_t>(1, absl::Uint128Low64(part));
}

// The per-uid limit `limit` (0: none asked for) under its share.
void Cap(uint64_t& limit, uint64_t share, bool zero_is_share) {
  if (share == 0) return;
  if (limit == 0 ? zero_is_share : limit > share) limit = share;
}

}  // namespace

StoreLimits ResolveUidShares(StoreLimits limits, const SharedTables& tables) {
  const uint64_t pct =
      std::clamp<uint64_t>(limits.uid_share_percent, uint64_t{1}, 100);
  limits.uid_share_percent = pct;
  Cap(limits.max_objects_per_uid,
      Share(limits.max_objects > 0 ? limits.max_objects : tables.objects, pct),
      true);
  Cap(limits.max_leases_per_uid,
      Share(limits.max_leases > 0 ? limits.max_leases : tables.leases, pct),
      true);
  Cap(limits.max_pins_per_uid, Share(tables.pins, pct), true);
  Cap(limits.max_stock_bytes_per_uid, Share(tables.host_pool_bytes, pct), true);
  Cap(limits.max_sessions_per_uid, Share(tables.sessions, pct), true);
  Cap(limits.max_waiters_per_uid, Share(limits.max_waiters, pct), true);
  return limits;
}

}  // namespace shmtensor::daemon
