#include "shmtensor/client.h"

#include <unistd.h>

#include <algorithm>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/client_core.h"
#include "client/lease.h"
#include "client/object_layout.h"
#include "client/ref_proto.h"
#include "client/stock.h"
#include "shmtensor/defaults.h"
#include "shmtensor/errors.h"

namespace shmtensor {
namespace {

// Margin on top of a server-side wait, so the daemon's own timeout answers
// first.
constexpr absl::Duration kWaitMargin = absl::Seconds(10);
// How long a Get of a ref waits for a one-way seal on its way.
constexpr absl::Duration kSealWait = absl::Seconds(10);

uint32_t ToMillis(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return 0;
  const int64_t ms =
      absl::ToInt64Milliseconds(absl::Ceil(d, absl::Milliseconds(1)));
  return ms > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(ms);
}

using internal::FromProto;
using internal::ToProto;

ObjectInfo MakeInfo(const internal::ClientCore& core, const v1::ObjectRef& ref,
                    const v1::Placement& placement, const v1::Layout& layout) {
  ObjectInfo info;
  info.ref = FromProto(ref);
  info.device = core.PoolDevice(placement.pool_id()).value_or(Device::Host());
  info.dtype = static_cast<DType>(layout.dtype());
  info.shape.assign(layout.shape().begin(), layout.shape().end());
  info.size_bytes = placement.size_bytes();
  if (layout.strides_bytes_size() > 0) {
    info.strides_bytes.assign(layout.strides_bytes().begin(),
                              layout.strides_bytes().end());
  } else {
    info.strides_bytes = internal::ContiguousStrides(info.dtype, info.shape);
  }
  return info;
}

// Builds the lease for a handout that a call on connection `generation`
// returned (ClientCore::HoldLease): for a host pool, opening the writable
// range if needed; for a CUDA pool, mapping the pool on first use.
// MakeLease for a lease held already (HoldLease: a stock buffer's).
absl::StatusOr<std::shared_ptr<internal::Lease>> MakeHeldLease(
    const std::shared_ptr<internal::ClientCore>& core, uint64_t lease_id,
    const v1::Placement& placement, bool writable);

absl::StatusOr<std::shared_ptr<internal::Lease>> MakeLease(
    const std::shared_ptr<internal::ClientCore>& core, uint64_t lease_id,
    const v1::Placement& placement, bool writable, uint64_t generation) {
  if (absl::Status s = core->HoldLease(lease_id, generation); !s.ok()) {
    return s;
  }
  return MakeHeldLease(core, lease_id, placement, writable);
}

absl::StatusOr<std::shared_ptr<internal::Lease>> MakeHeldLease(
    const std::shared_ptr<internal::ClientCore>& core, uint64_t lease_id,
    const v1::Placement& placement, bool writable) {
  const absl::StatusOr<Device> device = core->PoolDevice(placement.pool_id());
  absl::StatusOr<uint8_t*> data = absl::UnknownError("unset");
  if (!device.ok()) {
    data = device.status();
  } else if (device->is_cuda()) {
    absl::StatusOr<internal::CudaPoolMapping*> m =
        core->CudaMapping(placement.pool_id());
    data = m.ok() ? absl::StatusOr<uint8_t*>((*m)->base() + placement.offset())
                  : m.status();
  } else {
    absl::StatusOr<internal::PoolMapping*> m =
        core->Mapping(placement.pool_id());
    if (!m.ok()) {
      data = m.status();
    } else if (writable) {
      data = (*m)->Protect(placement.offset(), placement.capacity_bytes(),
                           internal::Access::kReadWrite);
    } else {
      data = const_cast<uint8_t*>((*m)->read_base()) + placement.offset();
    }
  }
  if (!data.ok()) {
    core->ReleaseLease(lease_id).IgnoreError();
    return data.status();
  }
  auto lease = std::make_shared<internal::Lease>(
      core, lease_id, placement,
      writable ? internal::Access::kReadWrite : internal::Access::kRead, *data,
      *device);
  lease->Register();  // A read-only host lease: lease_registry.h.
  return lease;
}

absl::StatusOr<View> ViewFromResponse(
    const std::shared_ptr<internal::ClientCore>& core,
    const v1::GetResponse& resp, bool want_writable, uint64_t generation) {
  const bool writable = resp.writable() && want_writable;
  absl::StatusOr<std::shared_ptr<internal::Lease>> lease =
      MakeLease(core, resp.lease_id(), resp.placement(), writable, generation);
  if (!lease.ok()) return lease.status();
  // Writable and not an exclusive take: a shared-writable object.
  if (writable && !resp.ref().exclusive()) (*lease)->MarkSharedWritable();
  ObjectInfo info =
      MakeInfo(*core, resp.ref(), resp.placement(), resp.layout());
  // A read lease of a sealed shared object: later Gets here share it.
  if (!resp.writable() && !resp.ref().exclusive()) core->AddShare(*lease, info);
  return View(std::move(info), *std::move(lease), writable);
}

v1::CreateRequest MakeCreateRequest(const internal::ClientCore& core,
                                    const CreateOptions& options,
                                    const std::string& pool) {
  v1::CreateRequest req;
  req.set_session_id(core.session_id());
  req.set_pool(pool);
  req.set_size_bytes(options.size_bytes);
  req.set_name(options.name);
  req.set_timeout_ms(ToMillis(options.timeout));
  req.set_shared_writable(options.shared_writable);
  v1::Layout* layout = req.mutable_layout();
  layout->set_dtype(static_cast<v1::DType>(options.dtype));
  for (int64_t d : options.shape) layout->add_shape(d);
  for (int64_t s : options.strides_bytes) layout->add_strides_bytes(s);
  return req;
}

}  // namespace

void Client::KeepAliveUntilExit() {
  internal::ClientCore::KeepAliveUntilExit();
}

void Client::FlushAll() { internal::ClientCore::FlushAll(); }

absl::StatusOr<Client> Client::Connect(const ClientOptions& options) {
  const std::string address =
      options.address.empty() ? DefaultAddress() : options.address;
  const std::string name = options.client_name.empty()
                               ? absl::StrCat("pid ", getpid())
                               : options.client_name;
  absl::StatusOr<std::shared_ptr<internal::ClientCore>> core =
      internal::ClientCore::Connect(
          address, name, options.connect_timeout, options.write_revocation,
          options.daemon_uid, options.read_only, options.resume_timeout,
          options.stock_bytes);
  if (!core.ok()) return core.status();
  return Client(*std::move(core));
}

namespace {

// A created object and its write lease (the lease's release discards the
// object until it is sealed).
struct Created {
  v1::CreateResponse resp;
  std::shared_ptr<internal::Lease> lease;
};

// The Create RPC shared by Create and Put; `writable` opens the range for
// writing through this process's mapping (Put writes with pwrite instead).
absl::StatusOr<Created> CreateObject(
    const std::shared_ptr<internal::ClientCore>& core,
    const CreateOptions& options, bool writable) {
  std::string pool = options.pool;
  if (pool.empty()) {
    absl::StatusOr<std::string> on = core->PoolOn(options.device);
    if (!on.ok()) return on.status();
    pool = *std::move(on);
  }
  Created c;
  uint64_t generation = 0;
  if (absl::Status s = core->CallAfterReleases(
          &v1::ObjectStore::Stub::Create,
          MakeCreateRequest(*core, options, pool), &c.resp,
          options.timeout + internal::kRpcDeadline, &generation);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::shared_ptr<internal::Lease>> lease = MakeLease(
      core, c.resp.lease_id(), c.resp.placement(), writable, generation);
  if (!lease.ok()) return lease.status();
  c.lease = *std::move(lease);
  // A named object's discard frees its name for other sessions, and a
  // shared-writable object is many sessions' (lease.h): their releases
  // go on the stream.
  if (!options.name.empty()) c.lease->MarkNamedCreate();
  if (options.shared_writable) c.lease->MarkSharedWritable();
  return c;
}

}  // namespace

// A buffer of an unnamed host object from the stock (stock.h), with no
// round trip when it has one; nullopt when the stock cannot serve it (the
// caller makes it with a Create).
std::optional<Buffer> StockBufferFor(
    const std::shared_ptr<internal::ClientCore>& core,
    const CreateOptions& options, bool make_on_miss = true) {
  internal::Stock* stock = core->stock();
  if (stock == nullptr || options.shared_writable || !options.name.empty() ||
      options.device.is_cuda()) {
    return std::nullopt;
  }
  const std::optional<uint64_t> bytes = internal::ObjectBytes(options);
  if (!bytes.has_value() || *bytes == 0) return std::nullopt;
  absl::StatusOr<std::string> pool_name =
      options.pool.empty() ? core->PoolOn(options.device)
                           : absl::StatusOr<std::string>(options.pool);
  if (!pool_name.ok()) return std::nullopt;
  const v1::PoolInfo* pool = core->PoolNamed(*pool_name);
  if (pool == nullptr || pool->kind() != v1::MEMORY_KIND_HOST ||
      pool->access() != v1::POOL_ACCESS_READ_WRITE) {
    return std::nullopt;
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::StatusOr<internal::StockBuffer> b =
        stock->Take(*pool, *bytes, make_on_miss);
    if (!b.ok()) return std::nullopt;
    v1::Placement placement = b->placement;
    placement.set_size_bytes(*bytes);
    absl::StatusOr<std::shared_ptr<internal::Lease>> lease =
        MakeHeldLease(core, b->lease_id, placement, true);
    if (!lease.ok()) return std::nullopt;
    if ((*lease)->lost()) continue;  // A resume refused it meanwhile.
    ObjectInfo info;
    info.ref = internal::FromProto(b->ref);
    info.device = Device::Host();
    info.dtype = options.dtype;
    info.shape = options.shape;
    info.size_bytes = *bytes;
    v1::Layout layout;
    layout.set_dtype(static_cast<v1::DType>(options.dtype));
    for (int64_t d : options.shape) layout.add_shape(d);
    for (int64_t st : options.strides_bytes) layout.add_strides_bytes(st);
    info.strides_bytes =
        MakeInfo(*core, b->ref, placement, layout).strides_bytes;
    return Buffer(std::move(info), *std::move(lease));
  }
  return std::nullopt;
}

absl::StatusOr<Buffer> Client::Create(const CreateOptions& options) {
  if (std::optional<Buffer> b = StockBufferFor(core_, options)) {
    return *std::move(b);
  }
  absl::StatusOr<Created> c = CreateObject(core_, options, true);
  if (!c.ok()) return c.status();
  return Buffer(
      MakeInfo(*core_, c->resp.ref(), c->resp.placement(), c->resp.layout()),
      std::move(c->lease), !options.name.empty());
}

absl::StatusOr<SealedRef> Client::Put(const void* data,
                                      const CreateOptions& options,
                                      bool exclusive, CudaStream stream) {
  if (options.shared_writable) {
    return absl::InvalidArgumentError(
        "Put seals the object, and a shared-writable one is never sealed: "
        "use Create");
  }
  if (!options.device.is_cuda()) {
    // Host: a mapped copy-in (the range stays open for the next object of
    // its size), sealed one way when unnamed.
    absl::StatusOr<Buffer> buf = Create(options);
    if (!buf.ok()) return buf.status();
    if (absl::Status s = buf->CopyFrom(data, buf->size_bytes()); !s.ok()) {
      return s;
    }
    return buf->Seal(exclusive);
  }
  // Until sealed nobody else sees the object, and if anything below fails
  // the lease's release discards it.
  absl::StatusOr<Created> c = CreateObject(core_, options, false);
  if (!c.ok()) return c.status();
  const v1::CreateResponse& created = c->resp;
  std::shared_ptr<internal::Lease>& lease = c->lease;
  // Device to device (or host to device), complete before the seal.
  if (absl::Status s = internal::cuda::CopyAndWait(
          lease->device().index, lease->data(), data,
          created.placement().size_bytes(), stream);
      !s.ok()) {
    return s;
  }
  v1::SealRequest seal;
  seal.set_session_id(core_->session_id());
  seal.set_lease_id(created.lease_id());
  seal.set_exclusive(exclusive);
  v1::SealResponse sealed;
  if (absl::Status s = core_->Call(&v1::ObjectStore::Stub::Seal, seal, &sealed);
      !s.ok()) {
    return s;
  }
  const ObjectRef ref = FromProto(sealed.ref());
  if (exclusive) {
    lease->Forget();
    return SealedRef(ref, nullptr);
  }
  return SealedRef(ref, std::move(lease));
}

absl::StatusOr<View> Client::Get(const ObjectRef& ref, bool writable) {
  return GetRef(ref, writable, 0);
}

absl::StatusOr<View> Client::Take(const ObjectRef& ref, uint64_t offer_token) {
  return GetRef(ref, false, offer_token);
}

std::optional<View> Client::GetHeld(const ObjectRef& ref) {
  // An exclusive ref is a transfer, taken from the daemon; a client
  // inherited across fork() holds nothing of this process's.
  if (ref.exclusive || core_->inherited()) return std::nullopt;
  ObjectInfo info;
  std::shared_ptr<internal::Lease> share = core_->FindShare(ref, &info);
  if (share == nullptr) return std::nullopt;
  return View(std::move(info), std::move(share), false);
}

absl::StatusOr<View> Client::GetRef(const ObjectRef& ref, bool writable,
                                    uint64_t offer_token) {
  if (absl::Status s = core_->CheckOwner(); !s.ok()) return s;
  // A take of an offer goes to the daemon (the offer's pin must end), never
  // a share.
  if (offer_token == 0) {
    if (std::optional<View> held = GetHeld(ref)) return *std::move(held);
  }
  v1::GetRequest req;
  req.set_session_id(core_->session_id());
  *req.mutable_ref() = ToProto(ref);
  req.set_offer_token(offer_token);
  req.set_timeout_ms(ToMillis(kSealWait));
  v1::GetResponse resp;
  uint64_t generation = 0;
  if (absl::Status s =
          core_->CallAfterReleases(&v1::ObjectStore::Stub::Get, std::move(req),
                                   &resp, internal::kRpcDeadline, &generation);
      !s.ok()) {
    return s;
  }
  return ViewFromResponse(core_, resp, writable, generation);
}

absl::StatusOr<std::vector<SealedRef>> Client::PutMany(
    const std::vector<PutItem>& items, bool exclusive) {
  if (absl::Status s = core_->CheckOwner(); !s.ok()) return s;
  // The stock is refilled once the batch took what it takes (stock.h).
  absl::Cleanup refill = [this] {
    if (internal::Stock* stock = core_->stock()) stock->WakeIfDue();
  };
  std::vector<Buffer> bufs(items.size());
  // The unnamed objects the stock cannot serve: made in one round trip.
  std::vector<size_t> missing;
  std::string missing_pool;
  absl::Duration wait = absl::ZeroDuration();
  for (size_t i = 0; i < items.size(); ++i) {
    const CreateOptions& o = items[i].options;
    if (o.device.is_cuda() || o.shared_writable) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "PutMany item %d: %s", i,
          o.shared_writable ? "a shared-writable object is never sealed"
                            : "host pools only (Put a CUDA object alone)"));
    }
    // Hits only: the misses are made together below.
    if (std::optional<Buffer> b =
            StockBufferFor(core_, o, /*make_on_miss=*/false)) {
      bufs[i] = *std::move(b);
      continue;
    }
    const std::optional<uint64_t> bytes = internal::ObjectBytes(o);
    absl::StatusOr<std::string> pool =
        o.pool.empty() ? core_->PoolOn(o.device)
                       : absl::StatusOr<std::string>(o.pool);
    if (o.name.empty() && bytes.has_value() && *bytes > 0 && pool.ok() &&
        (missing.empty() || *pool == missing_pool)) {
      missing.push_back(i);
      missing_pool = *pool;
      wait = std::max(wait, o.timeout);
      continue;
    }
    absl::StatusOr<Buffer> b = Create(o);  // Named, or words the error.
    if (!b.ok()) {
      return absl::Status(
          b.status().code(),
          absl::StrCat("PutMany item ", i, ": ", b.status().message()));
    }
    bufs[i] = *std::move(b);
  }
  if (!missing.empty()) {
    v1::CreateManyRequest req;
    req.set_session_id(core_->session_id());
    req.set_pool(missing_pool);
    req.set_timeout_ms(ToMillis(wait));
    for (size_t i : missing)
      req.add_sizes(*internal::ObjectBytes(items[i].options));
    v1::CreateManyResponse resp;
    uint64_t generation = 0;
    if (absl::Status s = core_->CallAfterReleases(
            &v1::ObjectStore::Stub::CreateMany, std::move(req), &resp,
            wait + internal::kRpcDeadline, &generation);
        !s.ok()) {
      return s;
    }
    // Every answer is held first, so that the leases of all go on an error.
    std::vector<absl::StatusOr<std::shared_ptr<internal::Lease>>> leases;
    for (const v1::CreateResponse& c : resp.created()) {
      leases.push_back(
          MakeLease(core_, c.lease_id(), c.placement(), true, generation));
    }
    if (static_cast<size_t>(resp.created_size()) < missing.size()) {
      return absl::Status(
          static_cast<absl::StatusCode>(resp.stopped_code()),
          absl::StrCat("PutMany item ", missing[resp.created_size()], ": ",
                       resp.stopped_message()));
    }
    for (size_t k = 0; k < missing.size(); ++k) {
      if (!leases[k].ok()) return leases[k].status();
      const CreateOptions& o = items[missing[k]].options;
      const v1::CreateResponse& c = resp.created(k);
      v1::Layout layout;
      layout.set_dtype(static_cast<v1::DType>(o.dtype));
      for (int64_t d : o.shape) layout.add_shape(d);
      for (int64_t st : o.strides_bytes) layout.add_strides_bytes(st);
      ObjectInfo info = MakeInfo(*core_, c.ref(), c.placement(), layout);
      bufs[missing[k]] = Buffer(std::move(info), *std::move(leases[k]));
    }
  }
  // Copy everything in, then seal the unnamed ones in one stream message.
  for (size_t i = 0; i < items.size(); ++i) {
    if (absl::Status s = bufs[i].CopyFrom(items[i].data, bufs[i].size_bytes());
        !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("PutMany item ", i, ": ", s.message()));
    }
  }
  std::vector<SealedRef> out(items.size());
  std::vector<v1::OneWaySeal> seals;
  std::vector<std::pair<size_t, std::shared_ptr<internal::Lease>>> one_way;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].options.name.empty()) {
      absl::StatusOr<SealedRef> r = bufs[i].Seal(exclusive);
      if (!r.ok()) return r.status();
      out[i] = *std::move(r);
      continue;
    }
    std::shared_ptr<internal::Lease> lease = bufs[i].lease();
    if (absl::Status s =
            lease->CloseForSeal(kLegacyDefaultStream, lease->revocation());
        !s.ok()) {
      return s;
    }
    seals.push_back(
        internal::OneWaySealOf(lease->id(), bufs[i].info(), exclusive));
    one_way.emplace_back(i, std::move(lease));
  }
  if (!seals.empty()) {
    if (absl::Status s = core_->SendSeals(std::move(seals)); !s.ok()) return s;
  }
  for (auto& [i, lease] : one_way) {
    ObjectInfo info = bufs[i].info();
    info.ref.exclusive = exclusive;
    bufs[i] = Buffer();  // The lease is the ref's now.
    if (exclusive) {
      lease->Forget();
      out[i] = SealedRef(info.ref, nullptr);
      continue;
    }
    lease->BecomeReadLease();
    core_->AddShare(lease, info);
    out[i] = SealedRef(info.ref, std::move(lease));
  }
  return out;
}

std::vector<absl::StatusOr<View>> Client::GetMany(
    const std::vector<ObjectRef>& refs, bool writable) {
  std::vector<absl::StatusOr<View>> out(refs.size(),
                                        absl::UnknownError("not got"));
  if (absl::Status s = core_->CheckOwner(); !s.ok()) {
    for (auto& v : out) v = s;
    return out;
  }
  v1::GetManyRequest req;
  req.set_session_id(core_->session_id());
  req.set_timeout_ms(ToMillis(kSealWait));
  std::vector<size_t> asked;
  for (size_t i = 0; i < refs.size(); ++i) {
    if (!refs[i].exclusive) {
      ObjectInfo info;
      if (std::shared_ptr<internal::Lease> share =
              core_->FindShare(refs[i], &info)) {
        out[i] = View(std::move(info), std::move(share), false);
        continue;
      }
    }
    *req.add_refs() = ToProto(refs[i]);
    asked.push_back(i);
  }
  if (asked.empty()) return out;
  v1::GetManyResponse resp;
  uint64_t generation = 0;
  absl::Status s = core_->CallAfterReleases(
      &v1::ObjectStore::Stub::GetMany, std::move(req), &resp,
      kSealWait + internal::kRpcDeadline, &generation);
  if (s.ok() && static_cast<size_t>(resp.results_size()) != asked.size()) {
    s = absl::InternalError(
        absl::StrFormat("GetMany asked for %d refs, the daemon answered %d",
                        asked.size(), resp.results_size()));
  }
  if (!s.ok()) {
    for (size_t i : asked) out[i] = s;
    return out;
  }
  for (size_t k = 0; k < asked.size(); ++k) {
    const v1::GetManyResult& r = resp.results(k);
    if (r.code() != 0) {
      absl::Status e(static_cast<absl::StatusCode>(r.code()), r.message());
      out[asked[k]] = r.reason().empty() ? e : WithReason(e, r.reason());
      continue;
    }
    out[asked[k]] = ViewFromResponse(core_, r.view(), writable, generation);
  }
  return out;
}

absl::StatusOr<View> Client::Get(std::string_view name,
                                 absl::Duration timeout) {
  v1::GetRequest req;
  req.set_session_id(core_->session_id());
  req.set_name(std::string(name));
  req.set_timeout_ms(ToMillis(timeout));
  v1::GetResponse resp;
  uint64_t generation = 0;
  if (absl::Status s =
          core_->CallAfterReleases(&v1::ObjectStore::Stub::Get, std::move(req),
                                   &resp, timeout + kWaitMargin, &generation);
      !s.ok()) {
    return s;
  }
  return ViewFromResponse(core_, resp, false, generation);
}

absl::Status Client::Delete(std::string_view name) {
  v1::DeleteRequest req;
  req.set_session_id(core_->session_id());
  req.set_name(std::string(name));
  v1::DeleteResponse resp;
  return core_->CallAfterReleases(&v1::ObjectStore::Stub::Delete,
                                  std::move(req), &resp);
}

absl::StatusOr<StoreStats> Client::Stats() {
  v1::StatsRequest req;
  req.set_session_id(core_->session_id());
  v1::StatsResponse resp;
  if (absl::Status s = core_->CallAfterReleases(&v1::ObjectStore::Stub::Stats,
                                                std::move(req), &resp);
      !s.ok()) {
    return s;
  }
  StoreStats out;
  for (const v1::PoolStats& p : resp.pools()) {
    out.pools.push_back({p.info().name(), p.info().size_bytes(), p.used_bytes(),
                         p.free_bytes(), p.largest_free_bytes(), p.objects(),
                         p.info().huge_page_size(), p.stock_bytes()});
  }
  out.sessions = resp.sessions();
  out.objects = resp.objects();
  out.named_objects = resp.named_objects();
  out.leases = resp.leases();
  out.pending_transfers = resp.pending_transfers();
  out.fork_holds = resp.fork_holds();
  out.offers = resp.offers();
  out.stock_objects = resp.stock_objects();
  out.stock_bytes = resp.stock_bytes();
  return out;
}

bool Client::HasPoolOn(const Device& device) const {
  return core_->PoolOn(device).ok();
}

absl::StatusOr<std::string> Client::PoolOn(const Device& device) const {
  return core_->PoolOn(device);
}

uint64_t Client::session_id() const { return core_->session_id(); }
uint64_t Client::client_id() const { return core_->client_id(); }
uint64_t Client::daemon_epoch() const { return core_->epoch(); }
const std::string& Client::address() const { return core_->address(); }

}  // namespace shmtensor
