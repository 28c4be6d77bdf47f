// Object lifecycle through a real daemon: processes, refs, names, transfers.
#include <sys/wait.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "shmtensor/client.h"
#include "shmtensor/errors.h"
#include "shmtensor/torch.h"
#include "tests/ref_hex.h"
#include "tests/test_util.h"

namespace shmtensor {
namespace {

using testing::Subprocess;

class LifecycleTest : public testing::DaemonTest {
 protected:
  // Creates, fills with `byte` and seals an object of `bytes`.
  SealedRef Put(uint64_t bytes, uint8_t byte, std::string name = "",
                bool exclusive = false) {
    absl::StatusOr<Buffer> buf =
        client_->Create({.size_bytes = bytes, .name = name});
    EXPECT_TRUE(buf.ok()) << buf.status();
    std::memset(buf->data(), byte, bytes);
    absl::StatusOr<SealedRef> ref = buf->Seal(exclusive);
    EXPECT_TRUE(ref.ok()) << ref.status();
    return *ref;
  }
};

TEST_F(LifecycleTest, AnotherProcessReadsTheSealedBytes) {
  SealedRef ref = Put(1 << 20, 42, "shared");
  std::unique_ptr<Subprocess> child = Child({"get-name", "shared", "0", "42"});
  EXPECT_EQ(*child->ReadLine(), "waiting");
  EXPECT_EQ(*child->ReadLine(), "ok 1048576");
  const int status = child->Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST_F(LifecycleTest, ViewsShareOneMappingAndAreZeroCopy) {
  absl::StatusOr<Buffer> buf =
      client_->Create({.dtype = DType::kFloat32, .shape = {256, 1024}});
  ASSERT_TRUE(buf.ok()) << buf.status();
  ASSERT_EQ(buf->size_bytes(), 256u * 1024 * 4);
  auto* f = static_cast<float*>(buf->data());
  for (int i = 0; i < 256 * 1024; ++i) f[i] = static_cast<float>(i);
  SealedRef ref = *buf->Seal();
  View a = *client_->Get(ref.ref());
  View b = *client_->Get(ref.ref());
  EXPECT_EQ(a.data(), b.data());  // Same mapping, no copy.
  Client other = Connect();       // Another session of this process...
  View c = *other.Get(ref.ref());
  EXPECT_EQ(c.data(), a.data());  // ...shares the process's one mapping.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
  EXPECT_EQ(a.shape(), (std::vector<int64_t>{256, 1024}));
  EXPECT_EQ(a.strides_bytes(), (std::vector<int64_t>{4096, 4}));
  at::Tensor t = *ToTensor(a);
  EXPECT_EQ(t.data_ptr(), a.data());
  EXPECT_EQ(t.sizes(), at::IntArrayRef({256, 1024}));
  EXPECT_EQ(t[3][5].item<float>(), 3 * 1024 + 5);
}

TEST_F(LifecycleTest, TensorKeepsLeaseAfterViewIsGone) {
  SealedRef ref = Put(4096, 9);
  const uint64_t ref_used = Used();
  at::Tensor t;
  {
    View v = *client_->Get(ref.ref());
    absl::StatusOr<at::Tensor> made = ToTensor(v);
    ASSERT_FALSE(made.ok());  // Untyped bytes have no torch dtype.
  }
  absl::StatusOr<Buffer> typed =
      client_->Create({.dtype = DType::kInt32, .shape = {1024}});
  std::memset(typed->data(), 0, 4096);
  SealedRef tref = *typed->Seal();
  {
    View v = *client_->Get(tref.ref());
    t = *ToTensor(v);
  }
  tref.Reset();  // Only the tensor holds the object now.
  EXPECT_EQ(Used(), ref_used + 4096);
  EXPECT_EQ(t.sum().item<int64_t>(), 0);
  t = at::Tensor();
  EXPECT_EQ(Used(), ref_used);
  EXPECT_TRUE(IsStaleReference(client_->Get(tref.ref()).status()));
}

TEST_F(LifecycleTest, NamedGetWaitsForSealInAnotherProcess) {
  std::unique_ptr<Subprocess> child =
      Child({"get-name", "later", "20000", "5"});
  EXPECT_EQ(*child->ReadLine(), "waiting");
  absl::StatusOr<Buffer> buf =
      client_->Create({.size_bytes = 65536, .name = "later"});
  ASSERT_TRUE(buf.ok());
  std::memset(buf->data(), 5, 65536);
  absl::SleepFor(absl::Milliseconds(200));  // The child is waiting by now.
  ASSERT_TRUE(buf->Seal().ok());
  EXPECT_EQ(*child->ReadLine(), "ok 65536");
  EXPECT_EQ(WEXITSTATUS(child->Wait()), 0);
}

TEST_F(LifecycleTest, CallsWaitingForNamesHoldUpNoOtherCall) {
  // Many calls waiting at once (parked by the daemon, one thread for all)
  // must not stop the daemon serving everyone else. Were the waiters to hold
  // up other calls, the lifecycles below would stall until the waits timed
  // out, and the waiters would be seen to have returned.
  constexpr int kWaiters = 48;
  std::atomic<int> returned{0};
  std::vector<absl::Status> results(kWaiters);
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] {
      absl::StatusOr<View> v =
          client_->Get(absl::StrCat("later-", i), absl::Seconds(30));
      if (!v.ok()) {
        results[i] = v.status();
      } else if (static_cast<const uint8_t*>(v->data())[100] != i) {
        results[i] = absl::DataLossError("wrong bytes");
      }
      ++returned;
    });
  }
  absl::SleepFor(absl::Milliseconds(300));  // They are waiting by now.
  for (int k = 0; k < 40; ++k) {
    SealedRef ref = Put(65536, static_cast<uint8_t>(k));
    absl::StatusOr<View> v = client_->Get(ref.ref());
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(static_cast<const uint8_t*>(v->data())[7], k);
  }
  EXPECT_EQ(returned.load(), 0);
  for (int i = 0; i < kWaiters; ++i) {
    Put(65536, static_cast<uint8_t>(i), absl::StrCat("later-", i));
  }
  for (std::thread& t : waiters) t.join();
  for (int i = 0; i < kWaiters; ++i) EXPECT_TRUE(results[i].ok()) << results[i];
}

TEST_F(LifecycleTest, NamedGetTimesOutWithDeadlineExceeded) {
  absl::StatusOr<View> v = client_->Get("absent", absl::Milliseconds(100));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(v.status().message(), "absent"));
}

TEST_F(LifecycleTest, DeleteOfObjectInUseIsDeferred) {
  SealedRef ref = Put(1 << 20, 3, "deferred");
  ref.Reset();
  Client other = Connect();
  View v = *other.Get("deferred");
  ASSERT_TRUE(client_->Delete("deferred").ok());
  EXPECT_EQ(Used(), 1u << 20);  // Still held by the view.
  EXPECT_EQ(static_cast<const uint8_t*>(v.data())[12345], 3);
  EXPECT_EQ(client_->Get("deferred").status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(v.Release().ok());
  EXPECT_EQ(Used(), 0u);
}

TEST_F(LifecycleTest, StaleRefNeverReturnsTheNewObjectsBytes) {  // [P4]
  SealedRef old = Put(4096, 1);
  const ObjectRef stale = old.ref();
  old.Reset();  // Freed: the slot and the memory are free for reuse.
  SealedRef fresh = Put(4096, 2);
  EXPECT_EQ(fresh.ref().slot, stale.slot);  // Reused slot...
  absl::StatusOr<View> v = client_->Get(stale);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(IsStaleReference(v.status())) << v.status();
  EXPECT_TRUE(absl::StrContains(v.status().message(), "stale reference"));
}

TEST_F(LifecycleTest, RefRoundTripsThroughBytes) {
  SealedRef ref = Put(4096, 1);
  absl::StatusOr<ObjectRef> back = ObjectRef::Parse(ref.ref().Serialize());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, ref.ref());
  EXPECT_FALSE(ObjectRef::Parse("garbage").ok());
}

TEST_F(LifecycleTest, ExclusiveTransferToOneConsumerProcess) {
  SealedRef xfer = Put(1 << 20, 8, "", /*exclusive=*/true);
  EXPECT_FALSE(xfer.holds_lease());
  const std::string hex = testing::RefToHex(xfer.ref());
  std::unique_ptr<Subprocess> taker = Child({"take", hex, "8"});
  EXPECT_EQ(*taker->ReadLine(), "took");
  EXPECT_EQ(WEXITSTATUS(taker->Wait()), 0);
  // The taker's lease ended with its session: the object is gone.
  const absl::Time deadline = absl::Now() + absl::Seconds(1);
  while (Used() != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(Used(), 0u);
  std::unique_ptr<Subprocess> second = Child({"take", hex, "8"});
  EXPECT_NE(WEXITSTATUS(second->Wait()), 0);
}

TEST_F(LifecycleTest, SecondTakeFailsWhileFirstHoldsIt) {
  SealedRef xfer = Put(4096, 8, "", /*exclusive=*/true);
  Client consumer = Connect();
  absl::StatusOr<View> first = consumer.Get(xfer.ref());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->writable());
  static_cast<uint8_t*>(first->mutable_data())[0] = 1;  // Writable for it.
  absl::StatusOr<View> second = client_->Get(xfer.ref());
  EXPECT_TRUE(IsAlreadyTaken(second.status())) << second.status();
}

TEST_F(LifecycleTest, UnclaimedTransferReclaimedWhenCreatorEnds) {
  std::unique_ptr<Subprocess> child = Child({"exclusive-and-exit"});
  absl::StatusOr<std::string> line = child->ReadLine();
  ASSERT_TRUE(line.ok() && absl::StartsWith(*line, "sealed ")) << *line;
  EXPECT_EQ(WEXITSTATUS(child->Wait()), 0);
  absl::StatusOr<ObjectRef> ref = testing::RefFromHex(line->substr(7));
  const absl::Time deadline = absl::Now() + absl::Seconds(1);
  while (client_->Stats()->pending_transfers != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(client_->Stats()->pending_transfers, 0u);
  EXPECT_EQ(Used(), 0u);
  EXPECT_TRUE(IsStaleReference(client_->Get(*ref).status()));
}

// [P19] A view sent by reference: the daemon keeps the object for the
// receiver after the sender let go of everything and exited.
TEST_F(LifecycleTest, AnOfferedObjectWaitsForItsReceiverAfterTheSenderExits) {
  std::unique_ptr<Subprocess> child = Child({"offer-and-exit"});
  absl::StatusOr<std::string> line = child->ReadLine();
  ASSERT_TRUE(line.ok() && absl::StartsWith(*line, "offered ")) << *line;
  EXPECT_EQ(WEXITSTATUS(child->Wait()), 0);
  const std::vector<std::string> parts = absl::StrSplit(*line, ' ');
  ASSERT_EQ(parts.size(), 3u);
  absl::StatusOr<ObjectRef> ref = testing::RefFromHex(parts[1]);
  ASSERT_TRUE(ref.ok()) << ref.status();
  uint64_t token = 0;
  ASSERT_TRUE(absl::SimpleAtoi(parts[2], &token));
  EXPECT_EQ(Used(), 65536u);  // Pinned, though its session ended.
  absl::StatusOr<View> view = client_->Take(*ref, token);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_FALSE(view->writable());
  EXPECT_EQ(static_cast<const uint8_t*>(view->data())[65535], 0x6F);
  EXPECT_EQ(client_->Stats()->offers, 0u);
  // The token pins nothing now; while the view holds the object, a second
  // take is a get of the ref.
  absl::StatusOr<View> again = client_->Take(*ref, token);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(again->Release().ok());
  ASSERT_TRUE(view->Release().ok());
  EXPECT_EQ(Used(), 0u);
  absl::StatusOr<View> late = client_->Take(*ref, token);
  EXPECT_TRUE(IsStaleReference(late.status())) << late.status();
  EXPECT_TRUE(absl::StrContains(late.status().message(), "offer was taken"))
      << late.status();
}

TEST_F(LifecycleTest, OnlyReadOnlyViewsAreOffered) {
  absl::StatusOr<Buffer> buf = client_->Create({.size_bytes = 4096});
  ASSERT_TRUE(buf.ok()) << buf.status();
  absl::StatusOr<SealedRef> xfer = buf->Seal(true);
  ASSERT_TRUE(xfer.ok()) << xfer.status();
  absl::StatusOr<View> taken = client_->Get(xfer->ref());  // Writable.
  ASSERT_TRUE(taken.ok()) << taken.status();
  absl::StatusOr<uint64_t> offer = taken->Offer();
  EXPECT_EQ(offer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(offer.status().message(), "writable view"))
      << offer.status();
  EXPECT_EQ(View().Offer().status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(client_->Stats()->offers, 0u);
}

TEST_F(LifecycleTest, PutCopiesInAndSealsInOneCall) {
  std::vector<int32_t> src(1000);
  for (int i = 0; i < 1000; ++i) src[i] = i * 7;
  absl::StatusOr<SealedRef> ref = client_->Put(
      src.data(), {.dtype = DType::kInt32, .shape = {10, 100}, .name = "put"});
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_TRUE(ref->holds_lease());
  View v = *client_->Get("put");
  EXPECT_EQ(v.shape(), (std::vector<int64_t>{10, 100}));
  EXPECT_EQ(std::memcmp(v.data(), src.data(), 4000), 0);
  // A failed put leaves nothing behind.
  EXPECT_FALSE(
      client_->Put(src.data(), {.size_bytes = 4000, .name = "put"}).ok());
  EXPECT_EQ(Used(), 4096u);
}

TEST_F(LifecycleTest, ExclusiveTakeCanBeReadOnly) {
  std::vector<uint8_t> src(8192, 9);
  SealedRef xfer = *client_->Put(src.data(), {.size_bytes = 8192}, true);
  Client consumer = Connect();
  absl::StatusOr<View> v = consumer.Get(xfer.ref(), /*writable=*/false);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FALSE(v->writable());
  EXPECT_EQ(v->mutable_data(), nullptr);
  EXPECT_EQ(static_cast<const uint8_t*>(v->data())[8191], 9);
  EXPECT_TRUE(IsAlreadyTaken(client_->Get(xfer.ref()).status()));
}

TEST_F(LifecycleTest, SharedWritableObjectIsWrittenByAnotherProcess) {
  absl::StatusOr<Buffer> buf =
      client_->Create({.size_bytes = 1 << 20, .shared_writable = true});
  ASSERT_TRUE(buf.ok()) << buf.status();
  std::memset(buf->data(), 1, 1 << 20);
  std::unique_ptr<Subprocess> child =
      Child({"share-write", testing::RefToHex(buf->info().ref), "9"});
  ASSERT_EQ(*child->ReadLine(), "wrote");
  // The child's writes are in this process's buffer: the same memory.
  const auto* p = static_cast<const uint8_t*>(buf->data());
  EXPECT_EQ(p[0], 9);
  EXPECT_EQ(p[(1 << 20) - 1], 9);
  // Never sealed; the buffer stays as it was, writable.
  absl::StatusOr<SealedRef> sealed = buf->Seal();
  EXPECT_EQ(sealed.status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(buf->valid());
  std::memset(buf->data(), 3, 4096);
  // The child dies holding its view: its lease goes, the object stays.
  child->Signal(SIGKILL);
  child->Wait();
  absl::Time deadline = absl::Now() + absl::Seconds(1);
  while (client_->Stats()->leases > 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(client_->Stats()->leases, 1u);
  EXPECT_EQ(Used(), 1u << 20);
  EXPECT_EQ(p[4095], 3);
  EXPECT_EQ(p[4096], 9);
  *buf = Buffer();
  EXPECT_EQ(Used(), 0u);
}

TEST_F(LifecycleTest, TypedLayoutsRoundTrip) {  // [P3] [P7]
  absl::StatusOr<Buffer> strided = client_->Create(
      {.dtype = DType::kFloat64, .shape = {3, 4}, .strides_bytes = {8, 24}});
  ASSERT_TRUE(strided.ok()) << strided.status();
  EXPECT_EQ(strided->size_bytes(), 96u);
  View v = *client_->Get(strided->Seal()->ref());
  EXPECT_EQ(v.strides_bytes(), (std::vector<int64_t>{8, 24}));
  at::Tensor t = *ToTensor(v);
  EXPECT_EQ(t.strides(), at::IntArrayRef({1, 3}));
  EXPECT_FALSE(t.is_contiguous());

  absl::StatusOr<Buffer> empty =
      client_->Create({.dtype = DType::kInt16, .shape = {0, 7}});
  ASSERT_TRUE(empty.ok()) << empty.status();
  View e = *client_->Get(empty->Seal()->ref());
  EXPECT_EQ(e.shape(), (std::vector<int64_t>{0, 7}));
  EXPECT_EQ(ToTensor(e)->numel(), 0);

  absl::StatusOr<Buffer> scalar = client_->Create({.dtype = DType::kFloat64});
  *static_cast<double*>(scalar->data()) = 2.5;
  View s = *client_->Get(scalar->Seal()->ref());
  EXPECT_TRUE(s.shape().empty());
  EXPECT_EQ(ToTensor(s)->item<double>(), 2.5);
}

}  // namespace
}  // namespace shmtensor
