// The thread that writes a session's one-way messages (releases and seals,
// ReleaseLeases on the session stream), so that the thread that released or
// sealed does not wait for gRPC's write (what the hand-off costs instead:
// docs/performance.md, "The fast path").
//
// The writer owns no messages: `write_one`, called on its thread only,
// writes the oldest message its owner queued and not yet written, and says
// whether it wrote one. The owner queues a message (and publishes it: see
// ClientCore::Enqueue) and then calls Kick(). A Kick while the thread is
// writing costs no system call.
//
// The thread keeps the scheduling policy it inherits: what it writes (a
// seal another process waits for, a release whose memory a creator waits
// for) goes out as soon as the scheduler runs a woken thread. SCHED_BATCH
// would spare the kicker the woken thread's preemption, but holds every
// message back by a scheduler tick whenever the CPUs are busy
// (docs/performance.md, "Releases that wake nobody").
//
// Messages its owner posted elsewhere (the release ring) kick nobody, and
// a message written into a connection whose daemon then died unread is
// known to nobody. So while it sleeps the thread runs `on_poll` every
// `poll` (inside the fork gate, as a write): the owner looks at what it
// has not seen applied, resumes a broken connection, and answers true to
// have the thread drain as for a kick. So a posted message reaches the
// daemon within about `poll` even when nobody asks for it, and a daemon
// SIGKILLed before it read the messages is found without a call of the
// process.
//
// Fork: `write_one` makes a gRPC call, which must not be in flight across
// fork() (fork_guard.h): PauseForFork waits for the write on its way
// (bounded) and holds the next back until ResumeAfterFork.
//
// Thread safety: thread-safe. Destruction stops the thread after it wrote
// every message kicked before (Stop).
#ifndef SHMTENSOR_CLIENT_STREAM_WRITER_H_
#define SHMTENSOR_CLIENT_STREAM_WRITER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "absl/functional/any_invocable.h"
#include "absl/time/time.h"
#include "client/fork_gate.h"

namespace shmtensor::internal {

class StreamWriter {
 public:
  explicit StreamWriter(absl::AnyInvocable<bool()> write_one,
                        absl::AnyInvocable<bool()> on_poll = nullptr,
                        absl::Duration poll = absl::InfiniteDuration());
  ~StreamWriter();

  StreamWriter(const StreamWriter&) = delete;
  StreamWriter& operator=(const StreamWriter&) = delete;

  // A message was queued: the thread writes it (and any queued after it).
  void Kick();
  // Waits until every message kicked before this call was written (or
  // `write_one` found none left: the owner dropped them), or until
  // `deadline`. False on the deadline. Never call it from `write_one`.
  bool Flush(absl::Time deadline);
  // Flushes (bounded by a few seconds: a daemon that stopped reading the
  // stream cannot hold a process's exit for ever) and joins the thread.
  // Idempotent; Kick after it does nothing.
  void Stop();

  // fork() handlers (see the file comment).
  void PauseForFork();
  void ResumeAfterFork();

 private:
  void Run();

  absl::AnyInvocable<bool()> write_one_;
  absl::AnyInvocable<bool()> on_poll_;  // Null: no poll.
  const absl::Duration poll_;
  std::mutex mu_;
  std::condition_variable wake_;        // The thread waits here.
  std::condition_variable written_cv_;  // Flush waits here.
  // Kicks so far, and how many of them the thread has written through
  // (counted at the start of a drain that then found nothing left).
  std::atomic<uint64_t> kicked_{0};
  uint64_t written_ = 0;   // Guarded by mu_.
  bool sleeping_ = false;  // Guarded by mu_.
  bool stopping_ = false;  // Guarded by mu_.
  bool running_ = true;    // Guarded by mu_: false once the thread ends.
  ForkGate fork_gate_;     // Around each write.
  std::thread thread_;
};

}  // namespace shmtensor::internal

#endif  // SHMTENSOR_CLIENT_STREAM_WRITER_H_
