// Keeps a client process safe across fork().
//
// gRPC is not fork-safe by itself. EnableForkSupport() (called before the
// first channel of the process) turns on gRPC's own fork support
// (GRPC_ENABLE_FORK_SUPPORT and the grpc_prefork/postfork handlers), selects
// the poll() poller (an epoll instance is shared across fork), turns off
// Abseil's debug lock-order graph (its process-wide lock cannot be held
// across fork; see the .cc), and adds one step gRPC lacks: in the child, every
// inherited connection to a daemon socket is replaced by a socket whose peer
// is gone. The connection must go: a child that outlives its parent would
// otherwise keep it open, and the daemon could not see the parent die and
// reclaim its leases. Its descriptor number must stay taken: gRPC's
// endpoints of the parent's channels live on in the child and its pollers
// still read their numbers, so a pipe or socket the child opened later on
// such a number would lose bytes to gRPC (tested by ForkTest.
// ChildNeverReusesTheNumbersOfInheritedConnections). The parent's daemon
// sockets are found in the prepare handler (a scan of /proc/self/fd).
//
// Limit (gRPC's): when another thread of the process is running inside a
// gRPC call at the moment of fork() (a Create, Get or Seal in flight), gRPC's
// handlers cannot wait for it and do nothing, and the child may inherit one
// of gRPC's process-wide locks held and hang in its first call. Fork from a
// thread while no other thread is calling the daemon (PyTorch's DataLoader
// starts its workers before its own threads). ForkTest.
// ForkWhileAnotherThreadOpensRangesNeverHangsTheChild proves the client's
// own locks safe under a concurrent thread; with that thread making calls,
// the child may hang (docs/design.md, "Notes").
//
// Thread safety: thread-safe.
#ifndef SHMTENSOR_CLIENT_FORK_GUARD_H_
#define SHMTENSOR_CLIENT_FORK_GUARD_H_

#include <cstdint>
#include <string>

namespace shmtensor::internal {

// Idempotent; the first call registers the fork handlers.
void EnableForkSupport();

// Remembers a daemon's Unix socket path, so that a child closes its inherited
// connections to it. No-op for TCP addresses: a child then keeps its
// parent's connection open until the child exits, so the daemon reclaims a
// dead parent's leases only then. Fork-heavy clients should use the Unix
// socket (the default).
void RegisterDaemonAddress(const std::string& address);

// How many fork()s separate this process from the one that called
// EnableForkSupport() first: 0 there, incremented in each child by the
// handler EnableForkSupport() registers. A value taken in one process and
// compared in another says whether the object it belongs to was inherited,
// at the cost of an atomic load (getpid() is a system call, and client calls
// ask on every RPC and release). Children made without fork()'s handlers
// (vfork, a raw clone) must exec or _exit before touching a client.
uint64_t ForkGeneration();

// How many fork()s this process made (counted in the prepare handler, so a
// value read before a fork differs after it, in the parent and the child).
// A relaxed atomic load: cheap enough for every batch.
uint64_t ForksMade();

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_FORK_GUARD_H_
