#include "client/client_core.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/fork_guard.h"
#include "shmtensor/errors.h"

namespace shmtensor::internal {

namespace {

// Every core made in this process (weakly), for KeepAliveUntilExit. Never
// destroyed (static destruction order would race with late users).
std::mutex& RegistryMu() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::vector<std::weak_ptr<ClientCore>>& Registry() {
  static auto* cores = new std::vector<std::weak_ptr<ClientCore>>;
  return *cores;
}

void Register(const std::shared_ptr<ClientCore>& core) {
  std::lock_guard<std::mutex> lock(RegistryMu());
  std::vector<std::weak_ptr<ClientCore>>& cores = Registry();
  // Drop the entries of cores already gone, so the list stays short.
  cores.erase(std::remove_if(cores.begin(), cores.end(),
                             [](const auto& w) { return w.expired(); }),
              cores.end());
  cores.push_back(core);
}

}  // namespace

void ClientCore::KeepAliveUntilExit() {
  std::lock_guard<std::mutex> lock(RegistryMu());
  static auto* kept = new std::vector<std::shared_ptr<ClientCore>>;
  for (const std::weak_ptr<ClientCore>& w : Registry()) {
    if (std::shared_ptr<ClientCore> core = w.lock()) {
      // Releases waiting for the GPU go out now, while the session is open
      // (after exit the daemon would drop those leases at once).
      if (!core->inherited()) core->FlushGpuReleases();
      kept->push_back(core);
    }
  }
}

absl::StatusOr<std::shared_ptr<ClientCore>> ClientCore::Connect(
    const std::string& address, const std::string& client_name,
    absl::Duration connect_timeout, WriteRevocation write_revocation) {
  EnableForkSupport();
  RegisterDaemonAddress(address);
  std::shared_ptr<ClientCore> core(new ClientCore());
  core->owner_pid_ = getpid();
  core->fork_generation_ = ForkGeneration();
  core->address_ = address;
  core->write_revocation_ = write_revocation;
  grpc::ChannelArguments args;
  // A local daemon: never wait long to reconnect, never wait for one to
  // appear longer than the caller's timeout.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // No keepalive: the daemon is on this host, its death closes the socket at
  // once, and a late ping answer must never cost the session.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, INT_MAX);
  // One connection per client: a session must not ride on a connection that
  // another client of this process left to a daemon that has since died.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  core->channel_ = grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), args);
  if (!core->channel_->WaitForConnected(
          absl::ToChronoTime(absl::Now() + connect_timeout))) {
    return absl::UnavailableError(absl::StrCat(
        "no shmtensord answers at ", address, " (waited ",
        absl::FormatDuration(connect_timeout),
        "); start it with deploy/run.sh or set SHMTENSOR_ADDRESS"));
  }
  core->stub_ = v1::ObjectStore::NewStub(core->channel_);
  core->session_ctx_ = std::make_unique<grpc::ClientContext>();
  core->session_ = core->stub_->Session(core->session_ctx_.get());
  v1::SessionRequest open;
  open.mutable_open()->set_client_name(client_name);
  open.mutable_open()->set_pid(getpid());
  v1::SessionEvent event;
  if (!core->session_->Write(open) || !core->session_->Read(&event) ||
      !event.has_opened()) {
    grpc::Status st = core->session_->Finish();
    core->session_.reset();
    return absl::UnavailableError(
        absl::StrCat("shmtensord at ", address,
                     " refused the session: ", st.error_message()));
  }
  core->session_id_ = event.opened().session_id();
  core->epoch_ = event.opened().daemon_epoch();
  for (const v1::PoolInfo& info : event.opened().pools()) {
    core->pools_.push_back(info);
    core->cuda_mappings_.push_back(nullptr);
    if (info.kind() != v1::MEMORY_KIND_HOST) {
      // A CUDA pool: mapped on first use (CudaMapping).
      core->mappings_.push_back(nullptr);
      continue;
    }
    absl::StatusOr<std::shared_ptr<PoolMapping>> m = PoolMapping::Get(info);
    if (!m.ok()) return m.status();
    core->mappings_.push_back(*std::move(m));
  }
  Register(core);
  return core;
}

ClientCore::~ClientCore() {
  if (inherited()) {
    // The parent's gRPC objects: never touch them in the child.
    session_.release();
    session_ctx_.release();
    stub_.release();
    new std::shared_ptr<grpc::Channel>(std::move(channel_));
    releaser_.release();  // Its thread is the parent's.
    return;
  }
  // Pending GPU releases go out while the session is open (else the
  // daemon would drop those leases at once, with the GPU maybe still on
  // them).
  releaser_.reset();
  if (session_ != nullptr) {
    session_->WritesDone();
    session_ctx_->TryCancel();
    session_->Finish();
  }
}

bool ClientCore::inherited() const {
  return ForkGeneration() != fork_generation_;
}

absl::Status ClientCore::CheckOwner() const {
  if (!inherited()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "this client was connected in process ", owner_pid_,
      " and inherited across fork(); connect a new client in process ",
      getpid()));
}

absl::StatusOr<const v1::PoolInfo*> ClientCore::Pool(uint32_t pool_id) const {
  if (pool_id >= pools_.size()) {
    return absl::InternalError(absl::StrCat(
        "daemon named pool ", pool_id, " but sent ", pools_.size(), " pools"));
  }
  return &pools_[pool_id];
}

absl::StatusOr<Device> ClientCore::PoolDevice(uint32_t pool_id) const {
  absl::StatusOr<const v1::PoolInfo*> info = Pool(pool_id);
  if (!info.ok()) return info.status();
  if ((*info)->kind() == v1::MEMORY_KIND_CUDA_DEVICE) {
    return Device::Cuda((*info)->cuda_device());
  }
  return Device::Host();
}

absl::StatusOr<PoolMapping*> ClientCore::Mapping(uint32_t pool_id) const {
  absl::StatusOr<const v1::PoolInfo*> info = Pool(pool_id);
  if (!info.ok()) return info.status();
  if (mappings_[pool_id] == nullptr) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "pool '%s' holds CUDA device memory (cuda:%d), not host memory",
        (*info)->name(), (*info)->cuda_device()));
  }
  return mappings_[pool_id].get();
}

absl::StatusOr<CudaPoolMapping*> ClientCore::CudaMapping(uint32_t pool_id) {
  absl::StatusOr<const v1::PoolInfo*> info = Pool(pool_id);
  if (!info.ok()) return info.status();
  std::lock_guard<std::mutex> lock(cuda_mu_);
  std::shared_ptr<CudaPoolMapping>& m = cuda_mappings_[pool_id];
  if (m == nullptr) {
    absl::StatusOr<std::shared_ptr<CudaPoolMapping>> opened =
        CudaPoolMapping::Get(**info);
    if (!opened.ok()) return opened.status();
    m = *std::move(opened);
  }
  return m.get();
}

absl::StatusOr<std::string> ClientCore::PoolOn(const Device& device) const {
  // Per Create: the search is a scan of a few pools; the list of them is
  // built only for the error.
  for (uint32_t id = 0; id < pools_.size(); ++id) {
    if (PoolDevice(id).value_or(Device::Host()) == device) {
      return pools_[id].name();
    }
  }
  std::vector<std::string> have;
  for (uint32_t id = 0; id < pools_.size(); ++id) {
    have.push_back(
        absl::StrCat(pools_[id].name(), " (",
                     DeviceName(PoolDevice(id).value_or(Device::Host())), ")"));
  }
  return absl::NotFoundError(absl::StrCat(
      "shmtensord at ", address_, " has no pool on ", DeviceName(device),
      "; its pools: ", absl::StrJoin(have, ", "),
      device.is_cuda() ? " (a CUDA pool the daemon could not create is listed "
                         "by `shmtensorctl status`)"
                       : ""));
}

void ClientCore::ReleaseAfter(cuda::Fence fence, uint64_t lease_id) {
  GpuReleaser* r;
  {
    std::lock_guard<std::mutex> lock(releaser_mu_);
    if (releaser_ == nullptr) {
      releaser_ = std::make_unique<GpuReleaser>(
          [this](uint64_t id) { ReleaseLease(id).IgnoreError(); });
    }
    r = releaser_.get();
  }
  r->ReleaseAfter(std::move(fence), lease_id);
}

void ClientCore::FlushGpuReleases() {
  GpuReleaser* r;
  {
    std::lock_guard<std::mutex> lock(releaser_mu_);
    r = releaser_.get();
  }
  if (r != nullptr) r->Flush();
}

absl::Status ClientCore::ReleaseLease(uint64_t lease_id) {
  if (absl::Status s = CheckOwner(); !s.ok()) return s;
  v1::SessionRequest req;
  req.mutable_release()->add_lease_ids(lease_id);
  std::lock_guard<std::mutex> lock(write_mu_);
  const uint64_t seq = releases_sent_ + 1;
  req.mutable_release()->set_seq(seq);
  if (!session_->Write(req)) {
    return absl::UnavailableError(absl::StrCat(
        "session stream to shmtensord at ", address_,
        " is closed; the daemon dropped lease ", lease_id, " with it"));
  }
  // Published only once written: a call that sends this seq as
  // releases_through must find the release ahead of it on the wire (or
  // carry its copy).
  std::lock_guard<std::mutex> releases_lock(releases_mu_);
  releases_sent_ = seq;
  unconfirmed_releases_.emplace_back(seq, lease_id);
  if (unconfirmed_releases_.size() > kMaxUnconfirmedReleases) {
    unconfirmed_releases_.pop_front();
  }
  return absl::OkStatus();
}

void ClientCore::ConfirmReleases(uint64_t through) {
  std::lock_guard<std::mutex> lock(releases_mu_);
  while (!unconfirmed_releases_.empty() &&
         unconfirmed_releases_.front().first <= through) {
    unconfirmed_releases_.pop_front();
  }
}

absl::Status ClientCore::FromGrpc(const grpc::ClientContext& ctx,
                                  const grpc::Status& status) const {
  if (status.ok()) return absl::OkStatus();
  std::string message = status.error_message();
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    message =
        absl::StrCat("shmtensord at ", address_, " unavailable: ", message);
  }
  absl::Status out(static_cast<absl::StatusCode>(status.error_code()), message);
  const auto& trailers = ctx.GetServerTrailingMetadata();
  auto it = trailers.find(std::string(kErrorReasonMetadata));
  if (it != trailers.end()) {
    out = WithReason(out,
                     absl::string_view(it->second.data(), it->second.size()));
  }
  return out;
}

}  // namespace shmtensor::internal
