#include "common/release_ring.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace shmtensor {
namespace {

using Take = ReleaseRingReader::Take;

// Ring memory as the daemon makes it: shared (so that a forked child
// writes the parent's), zeroed.
class Memory {
 public:
  Memory()
      : base_(mmap(nullptr, kReleaseRingBytes, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0)) {}
  ~Memory() { munmap(base_, kReleaseRingBytes); }
  char* base() const { return static_cast<char*>(base_); }

 private:
  void* base_;
};

// Every record drained, in order, all consumed.
std::vector<std::string> DrainAll(ReleaseRingReader& reader) {
  std::vector<std::string> out;
  EXPECT_TRUE(reader
                  .Drain([&](absl::string_view r) {
                    out.emplace_back(r);
                    return Take::kConsumed;
                  })
                  .ok());
  return out;
}

TEST(ReleaseRing, RecordsArriveInOrderAcrossTheWrap) {
  Memory m;
  ReleaseRingReader reader(m.base());
  absl::StatusOr<ReleaseRingWriter> writer =
      ReleaseRingWriter::Attach(m.base(), kReleaseRingBytes);
  ASSERT_TRUE(writer.ok()) << writer.status();
  int next = 0;
  for (int round = 0; round < 5; ++round) {
    std::vector<std::string> posted;
    for (int i = 0; i < 100; ++i) {
      posted.push_back(absl::StrCat("record ", next++));
      ASSERT_TRUE(writer->Post(posted.back()));
    }
    EXPECT_EQ(DrainAll(reader), posted);
  }
  EXPECT_EQ(reader.consumed(), 500u);
}

TEST(ReleaseRing, AFullRingRefusesAPostUntilTheDaemonReads) {
  Memory m;
  ReleaseRingReader reader(m.base());
  absl::StatusOr<ReleaseRingWriter> writer =
      ReleaseRingWriter::Attach(m.base(), kReleaseRingBytes);
  ASSERT_TRUE(writer.ok());
  for (uint32_t i = 0; i < kReleaseRingSlots; ++i) {
    ASSERT_TRUE(writer->Post("x")) << i;
  }
  // Full: the post would overwrite a record the daemon has not read.
  EXPECT_FALSE(writer->Post("y"));
  EXPECT_EQ(DrainAll(reader).size(), kReleaseRingSlots);
  EXPECT_TRUE(writer->Post("y"));
  EXPECT_EQ(DrainAll(reader), std::vector<std::string>{"y"});
}

TEST(ReleaseRing, ARecordOverASlotIsRefused) {
  Memory m;
  ReleaseRingReader reader(m.base());
  absl::StatusOr<ReleaseRingWriter> writer =
      ReleaseRingWriter::Attach(m.base(), kReleaseRingBytes);
  ASSERT_TRUE(writer.ok());
  EXPECT_FALSE(writer->Post(std::string(kReleaseRingMaxRecord + 1, 'a')));
  EXPECT_FALSE(writer->Post(""));
  EXPECT_TRUE(writer->Post(std::string(kReleaseRingMaxRecord, 'a')));
  EXPECT_EQ(DrainAll(reader),
            std::vector<std::string>{std::string(kReleaseRingMaxRecord, 'a')});
}

TEST(ReleaseRing, ARecordNotYetDueIsReadAgainNextTime) {
  Memory m;
  ReleaseRingReader reader(m.base());
  absl::StatusOr<ReleaseRingWriter> writer =
      ReleaseRingWriter::Attach(m.base(), kReleaseRingBytes);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(writer->Post("a"));
  ASSERT_TRUE(writer->Post("b"));
  std::vector<std::string> seen;
  ASSERT_TRUE(reader
                  .Drain([&](absl::string_view r) {
                    seen.emplace_back(r);
                    return r == "b" ? Take::kLater : Take::kConsumed;
                  })
                  .ok());
  EXPECT_EQ(seen, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(reader.consumed(), 1u);
  EXPECT_EQ(DrainAll(reader), std::vector<std::string>{"b"});
}

TEST(ReleaseRing, AppliedAndNudgeReachTheClient) {
  Memory m;
  ReleaseRingReader reader(m.base());
  absl::StatusOr<ReleaseRingWriter> writer =
      ReleaseRingWriter::Attach(m.base(), kReleaseRingBytes);
  ASSERT_TRUE(writer.ok());
  EXPECT_EQ(writer->applied(), 0u);
  reader.PublishApplied(42);
  EXPECT_EQ(writer->applied(), 42u);
  EXPECT_FALSE(writer->NudgeRequested());
  EXPECT_FALSE(reader.TakeNudge());
  reader.RequestNudge();
  EXPECT_TRUE(writer->NudgeRequested());
  EXPECT_TRUE(reader.TakeNudge());
  EXPECT_FALSE(writer->NudgeRequested());
}

TEST(ReleaseRing, AttachRefusesMemoryItDoesNotKnow) {
  Memory m;
  EXPECT_EQ(
      ReleaseRingWriter::Attach(m.base(), kReleaseRingBytes).status().code(),
      absl::StatusCode::kFailedPrecondition);  // No magic.
  ReleaseRingReader reader(m.base());
  EXPECT_EQ(ReleaseRingWriter::Attach(m.base(), kReleaseRingBytes - 1)
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  const uint32_t other_slots = 8;
  std::memcpy(m.base() + 8, &other_slots, sizeof(other_slots));
  absl::StatusOr<ReleaseRingWriter> w =
      ReleaseRingWriter::Attach(m.base(), kReleaseRingBytes);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("8 slots"), std::string::npos)
      << w.status();
}

// What a hostile client can write into the ring: the daemon reads no byte
// outside it, applies nothing, says so once, and reads the ring no more.
TEST(ReleaseRing, AHeadFarAheadBreaksTheRingOnce) {
  Memory m;
  ReleaseRingReader reader(m.base());
  const uint64_t head = uint64_t{1} << 40;
  std::memcpy(m.base() + 64, &head, sizeof(head));
  int taken = 0;
  auto take = [&](absl::string_view) {
    ++taken;
    return Take::kConsumed;
  };
  absl::Status s = reader.Drain(take);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("1099511627776"), std::string::npos) << s;
  EXPECT_TRUE(reader.broken());
  EXPECT_TRUE(reader.Drain(take).ok());
  EXPECT_EQ(taken, 0);
}

TEST(ReleaseRing, AHeadBehindTheDaemonBreaksTheRing) {
  Memory m;
  ReleaseRingReader reader(m.base());
  absl::StatusOr<ReleaseRingWriter> writer =
      ReleaseRingWriter::Attach(m.base(), kReleaseRingBytes);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(writer->Post("a"));
  ASSERT_EQ(DrainAll(reader).size(), 1u);
  const uint64_t head = 0;  // Moved back.
  std::memcpy(m.base() + 64, &head, sizeof(head));
  EXPECT_EQ(
      reader.Drain([](absl::string_view) { return Take::kConsumed; }).code(),
      absl::StatusCode::kDataLoss);
}

TEST(ReleaseRing, ALengthOverTheSlotBreaksTheRing) {
  for (uint32_t length : {0u, uint32_t{kReleaseRingMaxRecord} + 1, ~0u}) {
    Memory m;
    ReleaseRingReader reader(m.base());
    absl::StatusOr<ReleaseRingWriter> writer =
        ReleaseRingWriter::Attach(m.base(), kReleaseRingBytes);
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE(writer->Post("a"));
    std::memcpy(m.base() + kReleaseRingHeaderBytes, &length, sizeof(length));
    int taken = 0;
    absl::Status s = reader.Drain([&](absl::string_view) {
      ++taken;
      return Take::kConsumed;
    });
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << length;
    EXPECT_EQ(taken, 0);
    EXPECT_EQ(reader.consumed(), 0u);
  }
}

TEST(ReleaseRing, AMalformedRecordBreaksTheRing) {
  Memory m;
  ReleaseRingReader reader(m.base());
  absl::StatusOr<ReleaseRingWriter> writer =
      ReleaseRingWriter::Attach(m.base(), kReleaseRingBytes);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(writer->Post("good"));
  ASSERT_TRUE(writer->Post("bad"));
  ASSERT_TRUE(writer->Post("after"));
  std::vector<std::string> seen;
  absl::Status s = reader.Drain([&](absl::string_view r) {
    seen.emplace_back(r);
    return r == "bad" ? Take::kMalformed : Take::kConsumed;
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(seen, (std::vector<std::string>{"good", "bad"}));
  EXPECT_TRUE(reader.broken());
}

// A client process posting while the daemon drains: every record arrives
// whole and in order (the release/acquire pairs of head and consumed).
TEST(ReleaseRing, AnotherProcessPostsWhileTheDaemonDrains) {
  Memory m;
  ReleaseRingReader reader(m.base());
  constexpr int kRecords = 200000;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    absl::StatusOr<ReleaseRingWriter> writer =
        ReleaseRingWriter::Attach(m.base(), kReleaseRingBytes);
    if (!writer.ok()) _exit(2);
    for (int i = 0; i < kRecords;) {
      // Records of 1 to 200 bytes, each its number then padding.
      std::string r = absl::StrCat(i, ":");
      r.resize(r.size() + i % 190, static_cast<char>('a' + i % 26));
      if (writer->Post(r)) {
        ++i;
      } else {
        sched_yield();
      }
    }
    _exit(0);
  }
  int next = 0;
  bool ok = true;
  while (next < kRecords && ok) {
    ASSERT_TRUE(reader
                    .Drain([&](absl::string_view r) {
                      std::string want = absl::StrCat(next, ":");
                      want.resize(want.size() + next % 190,
                                  static_cast<char>('a' + next % 26));
                      if (r != want) ok = false;
                      ++next;
                      return Take::kConsumed;
                    })
                    .ok());
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_TRUE(ok) << "record " << next - 1 << " arrived changed";
  EXPECT_EQ(next, kRecords);
}

}  // namespace
}  // namespace shmtensor
