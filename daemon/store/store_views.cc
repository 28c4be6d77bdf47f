#include "daemon/store/store_views.h"

#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"

namespace shmtensor::daemon {
namespace {

using Session = SessionTable::Session;
using Object = ObjectTable::Object;
using State = ObjectTable::State;

// By pool id: whether `viewer` may use the pool (all, for null).
std::vector<bool> VisiblePools(const StoreView& store,
                               const PeerCredentials* viewer) {
  std::vector<bool> visible(store.pools.size(), true);
  if (viewer == nullptr) return visible;
  for (size_t i = 0; i < store.pools.size(); ++i) {
    visible[i] = store.pools[i]->access().AccessOf(*viewer) !=
                 v1::POOL_ACCESS_UNSPECIFIED;
  }
  return visible;
}

v1::ObjectState StateOf(State state) {
  switch (state) {
    case State::kWriting:
      return v1::OBJECT_STATE_WRITING;
    case State::kSealed:
      return v1::OBJECT_STATE_SEALED;
    case State::kPendingTransfer:
      return v1::OBJECT_STATE_PENDING_TRANSFER;
    case State::kTaken:
      return v1::OBJECT_STATE_TAKEN;
    case State::kSharedWritable:
      return v1::OBJECT_STATE_SHARED_WRITABLE;
  }
  return v1::OBJECT_STATE_UNSPECIFIED;
}

}  // namespace

v1::DaemonStatus BuildStatus(const StoreView& store,
                             const PeerCredentials* viewer) {
  const absl::Time now = absl::Now();
  v1::DaemonStatus out;
  out.set_daemon_epoch(store.epoch);
  out.set_uptime_ms(absl::ToInt64Milliseconds(now - store.start_time));
  out.set_time_unix_ms(absl::ToUnixMillis(now));
  const std::vector<bool> visible = VisiblePools(store, viewer);
  for (size_t i = 0; i < store.pools.size(); ++i) {
    if (!visible[i]) continue;
    v1::PoolStatus* ps = out.add_pools();
    *ps->mutable_info() = store.pool_infos[i];
    // Monitoring answers anyone who can connect (and TCP callers): never
    // the handle that maps a CUDA pool.
    ps->mutable_info()->clear_cuda_ipc_handle();
    const Pool::Usage usage = store.pools[i]->usage();
    ps->set_used_bytes(usage.used_bytes);
    ps->set_free_bytes(usage.free_bytes);
    ps->set_largest_free_bytes(usage.largest_free_bytes);
    ps->set_high_water_bytes(usage.high_water_bytes);
    ps->set_objects(usage.objects);
    ps->set_leases(usage.leases);
    ps->set_cleared_bytes(usage.cleared_bytes);
  }
  out.set_sessions(store.sessions.size());
  out.set_objects(store.objects.live());
  out.set_named_objects(store.objects.named());
  out.set_leases(store.leases.size());
  out.set_pending_transfers(store.objects.pending_transfers());
  out.set_fork_holds(store.fork_holds);
  out.set_offers(store.offers);
  out.set_awaited_sessions(store.adopted.sessions);
  out.set_quarantined_bytes(store.adopted.quarantined_bytes);
  v1::Limits* limits = out.mutable_limits();
  limits->set_max_objects(store.limits.max_objects);
  limits->set_max_leases_per_client(store.limits.max_leases_per_client);
  limits->set_max_bytes_per_client(store.limits.max_bytes_per_client);
  limits->set_max_leases(store.limits.max_leases);
  limits->set_max_bytes_per_uid(store.limits.max_bytes_per_uid);
  limits->set_max_sessions_per_uid(store.limits.max_sessions_per_uid);
  limits->set_max_waiters(store.limits.max_waiters);
  limits->set_uid_share_percent(store.limits.uid_share_percent);
  limits->set_max_objects_per_uid(store.limits.max_objects_per_uid);
  limits->set_max_leases_per_uid(store.limits.max_leases_per_uid);
  limits->set_max_pins_per_uid(store.limits.max_pins_per_uid);
  limits->set_max_stock_bytes_per_uid(store.limits.max_stock_bytes_per_uid);
  limits->set_max_waiters_per_uid(store.limits.max_waiters_per_uid);
  // Each uid's use; another uid's is no business of an unprivileged caller.
  const bool all_uids =
      viewer == nullptr || viewer->uid == 0 || viewer->uid == geteuid();
  std::vector<std::pair<uid_t, const SessionTable::UidUsage*>> uids;
  for (const auto& [uid, usage] : store.sessions.uids()) {
    if (all_uids || uid == viewer->uid) uids.emplace_back(uid, &usage);
  }
  std::sort(uids.begin(), uids.end());
  for (const auto& [uid, usage] : uids) {
    v1::UidUsage* u = out.add_uids();
    u->set_uid(uid);
    u->set_sessions(usage->sessions);
    u->set_waiters(usage->waiters);
    u->set_objects(usage->objects);
    u->set_leases(usage->leases);
    u->set_pins(usage->pins);
    u->set_stock_bytes(usage->stock_bytes);
    u->set_bytes(usage->bytes);
  }
  out.set_refused_records(store.adopted.refused_records);
  out.set_serving(store.serving);
  out.set_waiters(store.sessions.waiters());
  out.set_detached_sessions(store.sessions.detached());
  return out;
}

v1::ListObjectsResponse BuildObjectList(const StoreView& store, uint32_t limit,
                                        uint64_t page_token,
                                        const PeerCredentials* viewer) {
  constexpr uint32_t kMaxListPage = ObjectStore::kMaxListPage;
  const absl::Time now = absl::Now();
  if (limit == 0 || limit > kMaxListPage) limit = kMaxListPage;
  v1::ListObjectsResponse out;
  const std::vector<bool> visible = VisiblePools(store, viewer);
  uint64_t total = 0;
  for (size_t i = 0; i < store.pools.size(); ++i) {
    if (visible[i]) total += store.pools[i]->usage().objects;
  }
  out.set_total(viewer == nullptr ? store.objects.live() : total);
  const absl::btree_map<uint64_t, uint32_t>& by_serial =
      store.objects.by_serial();
  auto it = by_serial.upper_bound(page_token);
  uint64_t scanned = 0;
  for (uint32_t n = 0; it != by_serial.end() && n < limit &&
                       scanned < uint64_t{4} * kMaxListPage;
       ++it, ++scanned) {
    const uint32_t slot = it->second;
    const Object& obj = store.objects.object(slot);
    if (!visible[obj.pool]) continue;
    ++n;
    v1::ObjectStatus* o = out.add_objects();
    *o->mutable_ref() = store.objects.MakeRef(slot);
    o->mutable_ref()->clear_nonce();  // Listed, not usable.
    o->set_name(obj.name);
    o->set_pool(store.pools[obj.pool]->name());
    o->set_offset(obj.offset);
    o->set_size_bytes(obj.size);
    o->set_capacity_bytes(obj.capacity);
    *o->mutable_layout() = obj.layout;
    o->set_state(StateOf(obj.state));
    o->set_leases(obj.leases);
    o->set_age_ms(absl::ToInt64Milliseconds(now - obj.created));
    const Session* creator = store.sessions.FindOrNull(obj.creator);
    o->set_creator_client_id(creator == nullptr ? 0 : creator->client_id);
    o->set_creator(store.sessions.ClientString(obj.creator));
  }
  if (it != by_serial.end() && scanned > 0) {
    out.set_next_page_token(std::prev(it)->first);
  }
  return out;
}

v1::ListClientsResponse BuildClientList(const StoreView& store,
                                        const PeerCredentials* viewer) {
  const absl::Time now = absl::Now();
  std::vector<const Session*> open;
  for (const auto& [id, s] : store.sessions.all()) {
    if (viewer == nullptr || s.peer.process.uid == viewer->uid) {
      open.push_back(&s);
    }
  }
  std::sort(open.begin(), open.end(), [](const Session* a, const Session* b) {
    return a->serial < b->serial;
  });
  v1::ListClientsResponse out;
  for (const Session* s : open) {
    v1::ClientStatus* c = out.add_clients();
    c->set_client_id(s->client_id);
    c->set_client_name(s->client_name);
    c->set_pid(s->pid);
    c->set_has_process(true);
    c->set_uid(s->peer.process.uid);
    c->set_connected(s->stream != 0);
    c->set_command_line(s->peer.command_line);
    c->set_leases(s->leases.size());
    c->set_bytes_held(s->bytes_held);
    c->set_stock_objects(s->stock_objects);
    c->set_stock_bytes(s->stock_bytes);
    c->set_has_release_ring(s->ring != nullptr);
    c->set_ring_messages(s->ring_messages);
    c->set_pending_transfers(s->pending_transfers.size());
    c->set_age_ms(absl::ToInt64Milliseconds(now - s->opened));
    c->set_peer(s->stream != 0 ? "unix:" : "");
    c->set_read_only(s->read_only);
    for (size_t i = 0; i < store.pools.size(); ++i) {
      if (s->access[i] == v1::POOL_ACCESS_UNSPECIFIED) continue;
      v1::PoolGrant* g = c->add_pools();
      g->set_pool_id(static_cast<uint32_t>(i));
      g->set_pool(store.pools[i]->name());
      g->set_access(s->access[i]);
    }
  }
  return out;
}

std::string DescribePoolPressure(const StoreView& store, uint32_t pool_id,
                                 uint64_t capacity) {
  const Pool& pool = *store.pools[pool_id];
  const Pool::Usage usage = pool.usage();
  absl::flat_hash_map<uint64_t, uint64_t> held;  // session -> bytes
  for (const auto& [id, lease] : store.leases.all()) {
    const Object& obj = store.objects.object(lease.slot);
    if (obj.pool == pool_id) held[lease.session] += obj.capacity;
  }
  for (const auto& [id, session] : store.sessions.all()) {
    for (uint32_t slot : session.pending_transfers) {
      const Object& obj = store.objects.object(slot);
      if (obj.pool == pool_id) held[id] += obj.capacity;
    }
  }
  std::vector<std::pair<uint64_t, uint64_t>> top(held.begin(), held.end());
  std::sort(top.begin(), top.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string holders;
  for (size_t i = 0; i < top.size() && i < 3; ++i) {
    const Session& s = store.sessions.all().at(top[i].first);
    absl::StrAppendFormat(&holders, "%s'%s' pid %d holds %d bytes",
                          i ? ", " : "", s.client_name, s.pid, top[i].second);
  }
  if (holders.empty()) holders = "no client holds leases (named objects only)";
  return absl::StrFormat(
      "pool '%s' is full: asked for %d bytes, %d of %d bytes free (largest "
      "free block %d); most held by: %s",
      pool.name(), capacity, usage.free_bytes, pool.size_bytes(),
      usage.largest_free_bytes, holders);
}

}  // namespace shmtensor::daemon
