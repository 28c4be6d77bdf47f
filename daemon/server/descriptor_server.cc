#include "daemon/server/descriptor_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "daemon/server/log_limiter.h"
#include "daemon/server/unix_listener.h"
#include "shmtensor/v1/shmtensor.pb.h"
#include "spdlog/spdlog.h"

namespace shmtensor::daemon {

using SteadyClock = std::chrono::steady_clock;

struct DescriptorServer::Pending {
  int fd = -1;  // Owned: closed when the entry goes.
  PeerCredentials peer;
  SteadyClock::time_point deadline;  // Not the wall clock: it may step.
};

namespace {

// Sends `reply`, with `fds` attached when there are any (at most 253).
// Never blocks: the reply is the connection's first message and far below
// its buffer; or, with `wait`, waits that long for room (a take-over's
// later messages, which the successor reads as they come).
bool SendReply(int fd, const v1::DescriptorReply& reply,
               const std::vector<int>& fds,
               absl::Duration wait = absl::ZeroDuration()) {
  std::string bytes;
  reply.SerializeToString(&bytes);
  iovec iov{bytes.data(), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  if (wait > absl::ZeroDuration()) {
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(wait))) != 1) {
      return false;
    }
  }
  return sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) ==
         static_cast<ssize_t>(bytes.size());
}

// How long a predecessor waits for its successor's take_over_ready: the
// successor adopts a copy of the ledger, checks every record and binds what
// it serves on meanwhile (every client's call waits as long).
constexpr absl::Duration kTakeOverReadyWait = absl::Seconds(60);

// Whether the successor on `fd` says, within `wait`, that it is ready to
// serve (DescriptorRequest.take_over_ready): false when it hangs up, times
// out or sends anything else.
bool AwaitTakeOverReady(int fd, absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  while (true) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (n < 0 && errno != EINTR) return false;
    if (n <= 0) continue;
    char buf[256];
    const ssize_t got = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (got <= 0) return false;  // Hung up (or died).
    v1::DescriptorRequest said;
    return said.ParseFromArray(buf, static_cast<int>(got)) &&
           said.take_over_ready();
  }
}

v1::DescriptorReply Refusal(absl::StatusCode code, const std::string& why) {
  v1::DescriptorReply reply;
  reply.set_code(static_cast<int>(code));
  reply.set_message(why);
  return reply;
}

LogLimiter& RefusalLog() {
  static auto* limiter = new LogLimiter(10);
  return *limiter;
}

// At most 10 lines a second of everything a peer can cause.
void Warn(const std::string& what) {
  uint64_t suppressed = 0;
  if (!RefusalLog().Allow(&suppressed)) return;
  spdlog::warn("descriptor socket: {}{}", what,
               suppressed > 0
                   ? absl::StrFormat(" (%d such lines not logged before this)",
                                     suppressed)
                   : std::string());
}

void LogRefusal(const PeerCredentials& peer, const std::string& why) {
  uint64_t suppressed = 0;
  if (!RefusalLog().Allow(&suppressed)) return;
  spdlog::warn(
      "descriptor socket: refused pid {} uid {}: {}{}", peer.pid, peer.uid, why,
      suppressed > 0
          ? absl::StrFormat(" (%d refusals not logged before this)", suppressed)
          : std::string());
}

}  // namespace

absl::StatusOr<std::unique_ptr<DescriptorServer>> DescriptorServer::Bind(
    const std::string& path, mode_t mode, int gid, ObjectStore& store,
    DescriptorServerOptions options, UniqueFd adopted) {
  absl::StatusOr<UniqueFd> fd =
      adopted.valid()
          ? AdoptUnixSocket(std::move(adopted), path, SOCK_SEQPACKET)
          : BindUnixSocket(path, SOCK_SEQPACKET, mode, gid);
  if (!fd.ok()) return fd.status();
  UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) {
    return absl::InternalError(
        absl::StrFormat("eventfd: %s", std::strerror(errno)));
  }
  return std::unique_ptr<DescriptorServer>(
      new DescriptorServer(*std::move(fd), std::move(wake), store, options));
}

DescriptorServer::~DescriptorServer() {
  Stop();
  absl::MutexLock lock(&held_mu_);
  for (const Held& h : held_) close(h.fd);
}

void DescriptorServer::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void DescriptorServer::Stop() {
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  (void)!write(wake_fd_.get(), &one, sizeof(one));
  thread_.join();
}

DescriptorServer::Served DescriptorServer::Serve(const Pending& p,
                                                 uint64_t* hold_id) {
  char buf[kMaxDescriptorRequestBytes + 1];
  // No control buffer: descriptors the peer attached are closed by the
  // kernel, never installed here.
  const ssize_t n = recv(p.fd, buf, sizeof(buf), MSG_DONTWAIT | MSG_TRUNC);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return Served::kNotYet;
  if (n <= 0) {
    ++refused_;  // Hung up without a request.
    return Served::kDone;
  }
  auto refuse = [&](absl::StatusCode code, const std::string& why) {
    SendReply(p.fd, Refusal(code, why), {});
    LogRefusal(p.peer, why);
    ++refused_;
    return Served::kDone;
  };
  if (static_cast<size_t>(n) > kMaxDescriptorRequestBytes) {
    return refuse(absl::StatusCode::kInvalidArgument,
                  absl::StrFormat("request of %d bytes, at most %d", n,
                                  kMaxDescriptorRequestBytes));
  }
  v1::DescriptorRequest request;
  if (!request.ParseFromArray(buf, static_cast<int>(n))) {
    return refuse(absl::StatusCode::kInvalidArgument,
                  absl::StrFormat("%d bytes that are no DescriptorRequest", n));
  }
  if (request.has_take_over()) {
    // A successor daemon: the daemon's own user or root, by SO_PEERCRED.
    if (p.peer.uid != 0 && p.peer.uid != geteuid()) {
      return refuse(absl::StatusCode::kPermissionDenied,
                    absl::StrFormat("take-over refused: uid %d is neither "
                                    "root nor this daemon's uid %d",
                                    p.peer.uid, geteuid()));
    }
    if (!take_over_) {
      return refuse(absl::StatusCode::kUnimplemented,
                    "take-over refused: this daemon cannot be taken over");
    }
    absl::StatusOr<HandOver> handover = take_over_(request.take_over());
    if (!handover.ok()) {
      return refuse(handover.status().code(),
                    std::string(handover.status().message()));
    }
    // In messages of at most 253 descriptors, the first saying how many
    // more follow.
    const std::vector<NamedFd>& all = handover->fds;
    // A successor of an older version adopts in place and says nothing: it
    // gets the one-phase hand-over it knows (this daemon exits at once).
    const bool two_phase = request.take_over().says_ready();
    const size_t messages = std::max<size_t>(
        1, (all.size() + kMaxFdsPerMessage - 1) / kMaxFdsPerMessage);
    bool sent = true;
    for (size_t m = 0; m < messages && sent; ++m) {
      v1::DescriptorReply reply;
      reply.set_granted(true);
      if (m == 0) {
        reply.set_more_replies(static_cast<uint32_t>(messages - 1));
        reply.set_awaits_ready(two_phase);
      }
      std::vector<int> raw;
      for (size_t i = m * kMaxFdsPerMessage;
           i < std::min(all.size(), (m + 1) * kMaxFdsPerMessage); ++i) {
        reply.add_fd_names(all[i].name);
        raw.push_back(all[i].fd.get());
      }
      sent = SendReply(p.fd, reply, raw,
                       m == 0 ? absl::ZeroDuration() : absl::Seconds(5));
    }
    // Hands over only once the successor says it serves: one that dies
    // before that (its connection closes) leaves this daemon serving.
    if (!two_phase) {
      handover->finish(sent);
      return Served::kDone;
    }
    bool taken_over = sent && AwaitTakeOverReady(p.fd, kTakeOverReadyWait);
    if (taken_over) {
      // Gone only once the successor can know it (else it finds the lock
      // held, and exits).
      v1::DescriptorReply done;
      done.set_granted(true);
      done.set_taken_over(true);
      taken_over = SendReply(p.fd, done, {}, absl::Seconds(1));
    }
    handover->finish(taken_over);
    return Served::kDone;
  }
  // The process behind the connection, by the kernel's word (peer.h): a
  // process that got a dead client's pid is another owner.
  absl::StatusOr<UniqueFd> pidfd = OpenPeerPidfd(p.fd, p.peer.pid);
  absl::StatusOr<OwnerKey> who =
      IdentifyPeer(p.peer, pidfd.ok() ? pidfd->get() : -1, 0);
  if (!who.ok()) {
    return refuse(absl::StatusCode::kPermissionDenied,
                  std::string(who.status().message()));
  }
  if (request.fork_hold()) {
    absl::StatusOr<ForkHoldGrant> hold =
        store_.HoldForFork(request.session_id(), request.secret(), *who);
    if (!hold.ok()) {
      return refuse(hold.status().code(), std::string(hold.status().message()));
    }
    // Kept by systemd's descriptor store too, when there is one, so that a
    // restarted daemon still sees the children go; then marked granted in
    // the ledger, then told (a successor drops a hold never told).
    const std::string name =
        absl::StrFormat("%s%d", kHoldFdPrefix, hold->hold_id);
    (void)Notify(absl::StrCat("FDSTORE=1\nFDNAME=", name), {p.fd});
    store_.ForkHoldGranted(hold->hold_id);
    v1::DescriptorReply reply;
    reply.set_granted(true);
    reply.set_held_objects(hold->objects);
    if (!SendReply(p.fd, reply, {})) {
      // The client is gone or stopped reading: nobody will fork with it.
      store_.EndForkHold(hold->hold_id);
      (void)Notify(absl::StrCat("FDSTOREREMOVE=1\nFDNAME=", name));
      ++refused_;
      return Served::kDone;
    }
    *hold_id = hold->hold_id;
    return Served::kHeld;
  }
  if (request.release_ring_only()) {
    UniqueFd ring;
    if (absl::Status s = store_.GrantRing(request.session_id(),
                                          request.secret(), *who, &ring);
        !s.ok()) {
      return refuse(s.code(), std::string(s.message()));
    }
    v1::DescriptorReply reply;
    reply.set_granted(true);
    reply.set_release_ring(true);
    const int raw = ring.get();
    if (SendReply(p.fd, reply, {raw})) {
      ++granted_;
    } else {
      // The session keeps the ring; its client, which asks only when it
      // has none, seals on its stream.
      Warn(absl::StrFormat("could not send pid %d uid %d its release ring: %s",
                           p.peer.pid, p.peer.uid, std::strerror(errno)));
      ++refused_;
    }
    return Served::kDone;
  }
  UniqueFd ring;
  absl::StatusOr<std::vector<DescriptorGrant>> grants = store_.GrantDescriptors(
      request.session_id(), request.secret(), *who, &ring);
  if (!grants.ok()) {
    return refuse(grants.status().code(),
                  std::string(grants.status().message()));
  }
  v1::DescriptorReply reply;
  reply.set_granted(true);
  std::vector<UniqueFd> fds;
  for (const DescriptorGrant& g : *grants) {
    absl::StatusOr<UniqueFd> fd = store_.segment(g.pool_id).OpenDescriptor(
        g.access == v1::POOL_ACCESS_READ_WRITE);
    if (!fd.ok()) {
      spdlog::error("descriptor socket: pool {}: {}", g.pool_id,
                    std::string(fd.status().message()));
      return refuse(absl::StatusCode::kInternal,
                    "the daemon could not open a pool's descriptor");
    }
    reply.add_pool_ids(g.pool_id);
    reply.add_access(g.access);
    fds.push_back(*std::move(fd));
  }
  if (ring.valid()) {
    reply.set_release_ring(true);
    fds.push_back(std::move(ring));
  }
  std::vector<int> raw;
  for (const UniqueFd& fd : fds) raw.push_back(fd.get());
  if (SendReply(p.fd, reply, raw)) {
    ++granted_;
  } else {
    Warn(absl::StrFormat("could not send pid %d uid %d its descriptors: %s",
                         p.peer.pid, p.peer.uid, std::strerror(errno)));
    ++refused_;
  }
  return Served::kDone;  // `fds` close here; the message holds its own.
}

void DescriptorServer::Loop() {
  std::vector<Pending> pending;
  absl::flat_hash_map<uid_t, size_t> per_uid;
  auto drop = [&](size_t i) {
    if (pending[i].fd >= 0) close(pending[i].fd);
    if (--per_uid[pending[i].peer.uid] == 0) per_uid.erase(pending[i].peer.uid);
    pending[i] = pending.back();
    pending.pop_back();
  };
  // Kept for EMFILE: closed to accept one waiting connection and close it.
  UniqueFd reserve(open("/dev/null", O_RDONLY | O_CLOEXEC));
  std::vector<pollfd> polled;
  while (true) {
    SteadyClock::time_point next = SteadyClock::time_point::max();
    for (const Pending& p : pending) next = std::min(next, p.deadline);
    int timeout_ms = -1;
    if (next != SteadyClock::time_point::max()) {
      timeout_ms = static_cast<int>(std::clamp<int64_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(
              next - SteadyClock::now())
                  .count() +
              1,
          0, 60000));
    }
    polled.assign({{listen_fd_.get(), POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}});
    for (const Pending& p : pending) polled.push_back({p.fd, POLLIN, 0});
    const size_t first_held = polled.size();
    // No POLLIN: a hold's connection is never read, only watched for its
    // peer's end (POLLHUP, POLLERR come whatever is asked).
    std::vector<Held> held;
    {
      absl::MutexLock lock(&held_mu_);
      held = held_;
    }
    for (const Held& h : held) polled.push_back({h.fd, 0, 0});
    if (poll(polled.data(), polled.size(), timeout_ms) < 0 && errno != EINTR) {
      Warn(absl::StrFormat("poll: %s", std::strerror(errno)));
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    if (polled[1].revents != 0) break;  // Stop().
    // Holds whose children are gone.
    for (size_t i = first_held; i < polled.size(); ++i) {
      if (polled[i].revents == 0) continue;
      const Held& h = held[i - first_held];
      store_.EndForkHold(h.hold_id);
      (void)Notify(absl::StrFormat("FDSTOREREMOVE=1\nFDNAME=%s%d",
                                   kHoldFdPrefix, h.hold_id));
      absl::MutexLock lock(&held_mu_);
      for (size_t j = 0; j < held_.size(); ++j) {
        if (held_[j].hold_id != h.hold_id) continue;
        close(held_[j].fd);
        held_[j] = held_.back();
        held_.pop_back();
        break;
      }
    }
    // Answer (or forget) the connections that spoke or hung up, from the
    // back so that dropping one moves none not yet looked at.
    for (size_t i = first_held; i-- > 2;) {
      if (polled[i].revents == 0) continue;
      uint64_t hold_id = 0;
      switch (Serve(pending[i - 2], &hold_id)) {
        case Served::kNotYet:
          break;
        case Served::kDone:
          drop(i - 2);
          break;
        case Served::kHeld: {
          absl::MutexLock lock(&held_mu_);
          held_.push_back({pending[i - 2].fd, hold_id});
          pending[i - 2].fd = -1;  // Now held_'s.
          drop(i - 2);
          break;
        }
      }
    }
    const SteadyClock::time_point now = SteadyClock::now();
    for (size_t i = pending.size(); i-- > 0;) {
      if (pending[i].deadline > now) continue;
      LogRefusal(
          pending[i].peer,
          absl::StrFormat("sent no request within %s",
                          absl::FormatDuration(options_.request_timeout)));
      ++refused_;
      drop(i);
    }
    if (polled[0].revents == 0) continue;
    // Everything the backlog holds, so a burst is taken in one round.
    for (int accepted = 0; accepted < 1024; ++accepted) {
      const int fd = accept4(listen_fd_.get(), nullptr, nullptr,
                             SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE) {
          // Refuse one waiting client with the reserved descriptor rather
          // than leave the backlog full.
          Warn(absl::StrFormat("cannot accept: %s; refusing a connection",
                               std::strerror(errno)));
          if (reserve.valid()) {
            reserve = UniqueFd();
            close(accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
            reserve = UniqueFd(open("/dev/null", O_RDONLY | O_CLOEXEC));
            ++refused_;
          } else {
            absl::SleepFor(absl::Milliseconds(10));
          }
        } else if (errno == ENOBUFS || errno == ENOMEM) {
          Warn(absl::StrFormat("cannot accept: %s", std::strerror(errno)));
          absl::SleepFor(absl::Milliseconds(10));
        }
        break;
      }
      absl::StatusOr<PeerCredentials> peer = ReadPeerCredentials(fd);
      if (!peer.ok()) {
        close(fd);
        ++refused_;
        continue;
      }
      size_t& mine = per_uid[peer->uid];
      if (pending.size() >= options_.max_pending ||
          mine >= options_.max_pending_per_uid) {
        const size_t of_uid = mine;
        if (mine == 0) per_uid.erase(peer->uid);
        LogRefusal(*peer, absl::StrFormat("%d connections of this uid (%d in "
                                          "all) are waiting already",
                                          of_uid, pending.size()));
        close(fd);
        ++refused_;
        continue;
      }
      ++mine;
      pending.push_back({fd, *std::move(peer),
                         SteadyClock::now() + absl::ToChronoMilliseconds(
                                                  options_.request_timeout)});
    }
  }
  // Held connections stay open (a reload hands them on); the destructor
  // closes them.
  for (const Pending& p : pending) close(p.fd);
}

void DescriptorServer::AdoptHold(UniqueFd fd, uint64_t hold_id) {
  absl::MutexLock lock(&held_mu_);
  held_.push_back({fd.release(), hold_id});
}

std::vector<NamedFd> DescriptorServer::HoldFds() const {
  absl::MutexLock lock(&held_mu_);
  std::vector<NamedFd> out;
  for (const Held& h : held_) {
    UniqueFd fd(fcntl(h.fd, F_DUPFD_CLOEXEC, 3));
    if (!fd.valid()) continue;
    out.push_back(
        {absl::StrFormat("%s%d", kHoldFdPrefix, h.hold_id), std::move(fd)});
  }
  return out;
}

}  // namespace shmtensor::daemon
