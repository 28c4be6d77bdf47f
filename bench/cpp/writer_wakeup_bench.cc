// The session writer's wake-up (client/stream_writer.h), side by side with
// the policy it does not use: what a Kick costs the thread that queued a
// message, and how long the message waits before the writer thread writes
// it, with the CPUs idle and with every CPU busy.
//
//  - inherited: the writer as the client runs it (the process's policy,
//    SCHED_OTHER here);
//  - SCHED_BATCH: the same writer, started from a SCHED_BATCH thread (a
//    thread inherits its creator's policy), while the kicker stays
//    SCHED_OTHER. SCHED_BATCH's wake-up never preempts the running thread.
//
// Each round the kicker computes for 200 µs (a copy, during which the
// writer's CPU may idle), queues a message, kicks, and computes on until
// the writer has written it. "Busy" adds one spinning process per CPU.
//
// The bound, measured the same way in the same run: a bare futex (the
// least a wake-up of a sleeping thread costs): the waiter sleeps in
// FUTEX_WAIT on a word, the kicker bumps it and calls FUTEX_WAKE. The
// writer's figures are printed against it.
//
// Usage: writer_wakeup_bench [--quick]
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/stream_writer.h"

namespace {

using Clock = std::chrono::steady_clock;

double P(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

struct Result {
  double kick_p50, wait_p50, wait_p99;
};

// The kicker's side of `rounds` rounds (see the file comment): compute for
// 200 µs, mark a message pending, `kick`, and compute on until the waker's
// side counted it written. Returns the kicks' costs, in µs.
template <typename Kick>
std::vector<double> KickRounds(int rounds, std::atomic<bool>& pending,
                               std::atomic<int64_t>& kicked_at,
                               const std::atomic<int>& written, Kick kick) {
  std::vector<double> kicks;
  for (int i = 0; i < rounds; ++i) {
    const auto until = Clock::now() + std::chrono::microseconds(200);
    while (Clock::now() < until) {
    }
    const int before = written.load();
    pending = true;
    const auto t0 = Clock::now();
    kicked_at = t0.time_since_epoch().count();
    kick();
    kicks.push_back(
        std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    while (written.load() == before) {
    }
  }
  return kicks;
}

// `batch`: the writer thread is made by a SCHED_BATCH thread.
Result Run(bool batch, int rounds) {
  std::atomic<bool> pending{false};
  std::atomic<int64_t> kicked_at{0};
  std::atomic<int> written{0};
  std::vector<double> waits;  // Written on the writer thread only.
  waits.reserve(rounds);
  auto write_one = [&] {
    if (!pending.exchange(false)) return false;
    const int64_t now = Clock::now().time_since_epoch().count();
    waits.push_back(static_cast<double>(now - kicked_at.load()) / 1e3);
    written.fetch_add(1);
    return true;
  };
  std::unique_ptr<shmtensor::internal::StreamWriter> writer;
  std::thread maker([&] {
    if (batch) {
      const sched_param param{};
      if (pthread_setschedparam(pthread_self(), SCHED_BATCH, &param) != 0) {
        std::fprintf(stderr, "SCHED_BATCH refused\n");
        std::exit(1);
      }
    }
    writer = std::make_unique<shmtensor::internal::StreamWriter>(write_one);
  });
  maker.join();
  const std::vector<double> kicks =
      KickRounds(rounds, pending, kicked_at, written, [&] { writer->Kick(); });
  writer.reset();
  return {P(kicks, 0.5), P(waits, 0.5), P(waits, 0.99)};
}

// The bound: the same rounds with a bare futex for the wake-up.
Result RunFutex(int rounds) {
  std::atomic<uint32_t> word{0};
  std::atomic<bool> pending{false};
  std::atomic<bool> stop{false};
  std::atomic<int64_t> kicked_at{0};
  std::atomic<int> written{0};
  std::vector<double> waits;  // Written on the waiter thread only.
  waits.reserve(rounds);
  std::thread waiter([&] {
    while (!stop.load()) {
      const uint32_t seen = word.load();
      if (pending.exchange(false)) {
        const int64_t now = Clock::now().time_since_epoch().count();
        waits.push_back(static_cast<double>(now - kicked_at.load()) / 1e3);
        written.fetch_add(1);
        continue;
      }
      syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
    }
  });
  const std::vector<double> kicks =
      KickRounds(rounds, pending, kicked_at, written, [&] {
        word.fetch_add(1);
        syscall(SYS_futex, &word, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
      });
  stop = true;
  word.fetch_add(1);
  syscall(SYS_futex, &word, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
  waiter.join();
  return {P(kicks, 0.5), P(waits, 0.5), P(waits, 0.99)};
}

// One spinning process per CPU until Stop.
class Hogs {
 public:
  explicit Hogs(int n) {
    for (int i = 0; i < n; ++i) {
      const pid_t pid = fork();
      if (pid == 0) {
        for (volatile uint64_t x = 0;; x = x + 1) {
        }
      }
      if (pid > 0) pids_.push_back(pid);
    }
  }
  ~Hogs() {
    for (pid_t pid : pids_) kill(pid, SIGKILL);
    for (pid_t pid : pids_) waitpid(pid, nullptr, 0);
  }

 private:
  std::vector<pid_t> pids_;
};

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const int rounds = quick ? 300 : 2000;
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  std::printf(
      "the session writer's wake-up: %d rounds, %d CPUs; kick = the kicker's "
      "cost, wait = kick to written (p50 / p99), in us\n",
      rounds, cpus);
  std::printf("%-6s %-12s %8s %10s %10s\n", "CPUs", "writer", "kick",
              "wait p50", "wait p99");
  for (bool busy : {false, true}) {
    std::unique_ptr<Hogs> hogs;
    if (busy) hogs = std::make_unique<Hogs>(cpus);
    const Result bound = RunFutex(rounds);
    std::printf("%-6s %-12s %8.1f %10.1f %10.1f\n", busy ? "busy" : "idle",
                "futex bound", bound.kick_p50, bound.wait_p50, bound.wait_p99);
    Result r[2];
    for (int b = 0; b < 2; ++b) {
      r[b] = Run(b == 1, rounds);
      std::printf("%-6s %-12s %8.1f %10.1f %10.1f\n", busy ? "busy" : "idle",
                  b == 1 ? "SCHED_BATCH" : "inherited", r[b].kick_p50,
                  r[b].wait_p50, r[b].wait_p99);
    }
    std::printf("%-6s SCHED_BATCH / inherited: kick %.2f, wait p50 %.2f\n",
                busy ? "busy" : "idle", r[1].kick_p50 / r[0].kick_p50,
                r[1].wait_p50 / r[0].wait_p50);
    std::printf("%-6s inherited / futex bound: kick %.2f, wait p50 %.2f\n",
                busy ? "busy" : "idle", r[0].kick_p50 / bound.kick_p50,
                r[0].wait_p50 / bound.wait_p50);
  }
  return 0;
}
