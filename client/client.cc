#include "shmtensor/client.h"

#include <unistd.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/client_core.h"
#include "client/lease.h"
#include "client/ref_proto.h"
#include "shmtensor/defaults.h"

namespace shmtensor {
namespace {

// Margin on top of a server-side wait, so the daemon's own timeout answers
// first.
constexpr absl::Duration kWaitMargin = absl::Seconds(10);

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
    info.strides_bytes.resize(info.shape.size());
    int64_t stride = ItemSize(info.dtype);
    for (size_t i = info.shape.size(); i-- > 0;) {
      info.strides_bytes[i] = stride;
      stride *= info.shape[i] > 0 ? info.shape[i] : 1;
    }
  }
  return info;
}

// Builds the lease for a handout that a call on connection `generation`
// returned (ClientCore::HoldLease): for a host pool, opening the writable
// range if needed; for a CUDA pool, mapping the pool on first use.
absl::StatusOr<std::shared_ptr<internal::Lease>> MakeLease(
    const std::shared_ptr<internal::ClientCore>& core, uint64_t lease_id,
    const v1::Placement& placement, bool writable, uint64_t generation) {
  if (absl::Status s = core->HoldLease(lease_id, generation); !s.ok()) {
    return s;
  }
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
  return View(MakeInfo(*core, resp.ref(), resp.placement(), resp.layout()),
              *std::move(lease), writable);
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

absl::StatusOr<Client> Client::Connect(const ClientOptions& options) {
  const std::string address =
      options.address.empty() ? DefaultAddress() : options.address;
  const std::string name = options.client_name.empty()
                               ? absl::StrCat("pid ", getpid())
                               : options.client_name;
  absl::StatusOr<std::shared_ptr<internal::ClientCore>> core =
      internal::ClientCore::Connect(
          address, name, options.connect_timeout, options.write_revocation,
          options.daemon_uid, options.read_only, options.resume_timeout);
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
  if (options.shared_writable) c.lease->MarkSharedWritable();
  return c;
}

}  // namespace

absl::StatusOr<Buffer> Client::Create(const CreateOptions& options) {
  absl::StatusOr<Created> c = CreateObject(core_, options, true);
  if (!c.ok()) return c.status();
  return Buffer(
      MakeInfo(*core_, c->resp.ref(), c->resp.placement(), c->resp.layout()),
      std::move(c->lease));
}

absl::StatusOr<SealedRef> Client::Put(const void* data,
                                      const CreateOptions& options,
                                      bool exclusive, CudaStream stream) {
  if (options.shared_writable) {
    return absl::InvalidArgumentError(
        "Put seals the object, and a shared-writable one is never sealed: "
        "use Create");
  }
  // Read-only here: until sealed nobody else sees the object, and if anything
  // below fails the lease's release discards it.
  absl::StatusOr<Created> c = CreateObject(core_, options, false);
  if (!c.ok()) return c.status();
  const v1::CreateResponse& created = c->resp;
  std::shared_ptr<internal::Lease>& lease = c->lease;
  if (lease->device().is_cuda()) {
    // Device to device (or host to device), complete before the seal.
    if (absl::Status s = internal::cuda::CopyAndWait(
            lease->device().index, lease->data(), data,
            created.placement().size_bytes(), stream);
        !s.ok()) {
      return s;
    }
  } else {
    absl::StatusOr<internal::PoolMapping*> m =
        core_->Mapping(created.placement().pool_id());
    if (!m.ok()) return m.status();
    if (absl::Status s = (*m)->Write(created.placement().offset(), data,
                                     created.placement().size_bytes());
        !s.ok()) {
      return s;
    }
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

absl::StatusOr<View> Client::GetRef(const ObjectRef& ref, bool writable,
                                    uint64_t offer_token) {
  v1::GetRequest req;
  req.set_session_id(core_->session_id());
  *req.mutable_ref() = ToProto(ref);
  req.set_offer_token(offer_token);
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
                         p.info().huge_page_size()});
  }
  out.sessions = resp.sessions();
  out.objects = resp.objects();
  out.named_objects = resp.named_objects();
  out.leases = resp.leases();
  out.pending_transfers = resp.pending_transfers();
  out.fork_holds = resp.fork_holds();
  out.offers = resp.offers();
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
