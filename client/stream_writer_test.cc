#include "client/stream_writer.h"

#include <unistd.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace shmtensor::internal {
namespace {

// A queue of numbered messages as ClientCore keeps its releases: the
// writer takes them oldest first from its own thread.
class Queue {
 public:
  void Push(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    queued_.push_back(n);
  }
  bool WriteOne() {
    std::lock_guard<std::mutex> lock(mu_);
    if (next_ == queued_.size()) return false;
    written_.push_back(queued_[next_++]);
    threads_.push_back(std::this_thread::get_id());
    return true;
  }
  std::vector<int> written() {
    std::lock_guard<std::mutex> lock(mu_);
    return written_;
  }
  std::vector<std::thread::id> threads() {
    std::lock_guard<std::mutex> lock(mu_);
    return threads_;
  }

 private:
  std::mutex mu_;
  std::vector<int> queued_, written_;
  std::vector<std::thread::id> threads_;
  size_t next_ = 0;
};

TEST(StreamWriterTest, WritesEveryKickedMessageInOrderOnItsOwnThread) {
  Queue q;
  StreamWriter w([&] { return q.WriteOne(); });
  for (int i = 0; i < 1000; ++i) {
    q.Push(i);
    w.Kick();
    if (i % 97 == 0) absl::SleepFor(absl::Microseconds(200));  // It sleeps.
  }
  ASSERT_TRUE(w.Flush(absl::Now() + absl::Seconds(10)));
  std::vector<int> written = q.written();
  ASSERT_EQ(written.size(), 1000u);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(written[i], i);
  for (std::thread::id id : q.threads()) {
    EXPECT_NE(id, std::this_thread::get_id());
  }
}

// A message posted elsewhere kicks nobody: the thread finds it by its poll,
// while the owner says one is pending, and only then.
TEST(StreamWriterTest, AMessageNobodyKickedForIsWrittenByThePoll) {
  Queue q;
  std::atomic<int> pending_calls{0};
  std::atomic<bool> pending{false};
  StreamWriter w([&] { return q.WriteOne(); },
                 [&] {
                   ++pending_calls;
                   return pending.load();
                 },
                 absl::Milliseconds(20));
  q.Push(7);  // Posted, no kick; the owner does not say so yet.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (pending_calls.load() < 3 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_GE(pending_calls.load(), 3);
  EXPECT_TRUE(q.written().empty());  // It looked, and was told nothing.
  pending = true;
  while (q.written().empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(q.written(), std::vector<int>{7});
  // Without a poll, nothing but a kick writes.
  Queue unpolled;
  StreamWriter plain([&] { return unpolled.WriteOne(); });
  unpolled.Push(1);
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_TRUE(unpolled.written().empty());
  plain.Kick();
  ASSERT_TRUE(plain.Flush(absl::Now() + absl::Seconds(10)));
  EXPECT_EQ(unpolled.written(), std::vector<int>{1});
}

TEST(StreamWriterTest, FlushWaitsForAWriteInProgressAndSaysSoOnItsDeadline) {
  absl::Notification entered, go;
  std::atomic<int> writes{0};
  StreamWriter w([&] {
    if (writes.fetch_add(1) > 0) return false;
    entered.Notify();
    go.WaitForNotification();  // A write gRPC holds.
    return true;
  });
  w.Kick();
  entered.WaitForNotification();
  EXPECT_FALSE(w.Flush(absl::Now() + absl::Milliseconds(50)));
  go.Notify();
  EXPECT_TRUE(w.Flush(absl::Now() + absl::Seconds(10)));
}

TEST(StreamWriterTest, StopWritesWhatWasKickedBefore) {
  Queue q;
  {
    absl::Notification go;
    StreamWriter w([&] {
      go.WaitForNotification();
      return q.WriteOne();
    });
    for (int i = 0; i < 50; ++i) {
      q.Push(i);
      w.Kick();
    }
    std::thread release([&] {
      absl::SleepFor(absl::Milliseconds(20));
      go.Notify();
    });
    w.Stop();  // Returns once all 50 went.
    EXPECT_EQ(q.written().size(), 50u);
    release.join();
    // After Stop a kick writes nothing, and a flush says so at once.
    q.Push(50);
    w.Kick();
    EXPECT_FALSE(w.Flush(absl::InfiniteFuture()));
    EXPECT_EQ(q.written().size(), 50u);
  }
}

// A fork's prepare handler waits for the write on its way and holds the
// next back until the fork is done (no gRPC call across fork()).
TEST(StreamWriterTest, PauseForForkWaitsForTheWriteOnItsWayAndHoldsTheNext) {
  Queue q;
  absl::Notification entered, go;
  std::atomic<bool> in_write{false};
  std::atomic<int> calls{0};
  StreamWriter w([&] {
    in_write = true;
    if (calls.fetch_add(1) == 0) {
      entered.Notify();
      go.WaitForNotification();
    }
    const bool wrote = q.WriteOne();
    in_write = false;
    return wrote;
  });
  q.Push(0);
  w.Kick();
  entered.WaitForNotification();
  std::thread release([&] {
    absl::SleepFor(absl::Milliseconds(30));
    go.Notify();
  });
  w.PauseForFork();  // Returns only after the write in progress ended.
  EXPECT_FALSE(in_write.load());
  EXPECT_EQ(q.written().size(), 1u);
  q.Push(1);
  w.Kick();
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(q.written().size(), 1u) << "a write during the fork";
  w.ResumeAfterFork();
  EXPECT_TRUE(w.Flush(absl::Now() + absl::Seconds(10)));
  EXPECT_EQ(q.written().size(), 2u);
  release.join();
}

}  // namespace
}  // namespace shmtensor::internal
