// CUDA pools from the client's side: device selection (runs everywhere), and
// with a GPU, objects in device memory shared between real processes under
// the same lease rules as host pools, and the ordering contract of client.h
// (docs/pitfalls.md P12, P13). Without a usable GPU the GPU tests skip,
// saying why.
#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "shmtensor/client.h"
#include "shmtensor/device.h"
#include "tests/test_util.h"

#ifdef SHMTENSOR_WITH_CUDA
#include <cuda_runtime_api.h>

#include "client/cuda_pool_mapping.h"
#include "tests/ref_hex.h"
#endif

namespace shmtensor {
namespace {

using testing::DaemonProcess;
using testing::Subprocess;

TEST(DeviceTest, ParsesTorchSpellingsAndRejectsOthers) {
  EXPECT_EQ(*ParseDevice("cpu"), Device::Host());
  EXPECT_EQ(*ParseDevice("cuda"), Device::Cuda(0));
  EXPECT_EQ(*ParseDevice("cuda:3"), Device::Cuda(3));
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:x", "CUDA:0", ""}) {
    absl::StatusOr<Device> d = ParseDevice(bad);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(
        absl::StrContains(d.status().message(), absl::StrCat("'", bad, "'")))
        << d.status();
  }
  EXPECT_EQ(DeviceName(Device::Cuda(2)), "cuda:2");
  EXPECT_EQ(DeviceName(Device::Host()), "cpu");
}

TEST(CudaClientTest, NoPoolOnTheDeviceIsNotFoundListingThePools) {
  absl::StatusOr<std::unique_ptr<DaemonProcess>> d = DaemonProcess::Start();
  ASSERT_TRUE(d.ok()) << d.status();
  Client c = *Client::Connect({.address = (*d)->address()});
  EXPECT_TRUE(c.HasPoolOn(Device::Host()));
  EXPECT_FALSE(c.HasPoolOn(Device::Cuda(0)));
  absl::StatusOr<Buffer> b =
      c.Create({.size_bytes = 4096, .device = Device::Cuda(0)});
  EXPECT_EQ(b.status().code(), absl::StatusCode::kNotFound) << b.status();
  EXPECT_TRUE(absl::StrContains(b.status().message(), "no pool on cuda:0"))
      << b.status();
  EXPECT_TRUE(absl::StrContains(b.status().message(), "default (cpu)"))
      << b.status();
  // Host objects say where they are.
  absl::StatusOr<Buffer> h = c.Create({.size_bytes = 4096});
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->info().device, Device::Host());
}

#ifndef SHMTENSOR_WITH_CUDA

TEST(CudaClientTest, GpuTests) {
  GTEST_SKIP() << "built without CUDA (SHMTENSOR_WITH_CUDA=OFF)";
}

#else  // SHMTENSOR_WITH_CUDA

// Why the GPU tests cannot run here, or "" when they can.
std::string WhyNoGpu() {
  int n = 0;
  if (cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess) {
    return std::string("no usable CUDA device: ") + cudaGetErrorString(e);
  }
  return n > 0 ? "" : "no CUDA device";
}

// The helper process: $SHMTENSOR_CUDA_CHILD if set (testing/gpu/gpu_check.sh
// runs this test away from its build tree), else the build tree's.
std::string CudaChildPath() {
  const char* env = std::getenv("SHMTENSOR_CUDA_CHILD");
  return env != nullptr && *env != '\0' ? env : SHMTENSOR_CUDA_CHILD_PATH;
}

constexpr uint64_t kMiB = uint64_t{1} << 20;

// A daemon with a small host pool and a 2 GiB CUDA pool on device 0.
class CudaDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = WhyNoGpu(); !why.empty()) {
      GTEST_SKIP() << "GPU tests skipped: " << why;
    }
    const std::string path = ::testing::TempDir() + "/shmtensord_gpu.toml";
    std::ofstream(path) << "[[pool]]\nname = \"host\"\nsize = \"16MiB\"\n"
                        << "[[pool]]\nname = \"gpu0\"\nsize = \"2GiB\"\n"
                        << "kind = \"cuda\"\ndevice = 0\n";
    absl::StatusOr<std::unique_ptr<DaemonProcess>> d =
        DaemonProcess::Start({"--config", path});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    client_.emplace(*Client::Connect({.address = daemon_->address()}));
    ASSERT_TRUE(client_->HasPoolOn(Device::Cuda(0)));
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }

  std::unique_ptr<Subprocess> Child(const std::string& cmd,
                                    const ObjectRef& ref, int byte) {
    absl::StatusOr<std::unique_ptr<Subprocess>> p =
        Subprocess::Spawn({CudaChildPath(), cmd, daemon_->address(),
                           testing::RefToHex(ref), std::to_string(byte)});
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : nullptr;
  }

  uint64_t GpuUsed() {
    absl::StatusOr<StoreStats> s = client_->Stats();
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? s->pools[1].used_bytes : ~uint64_t{0};
  }

  absl::StatusOr<Buffer> CreateOnGpu(uint64_t bytes) {
    return client_->Create({.size_bytes = bytes, .device = Device::Cuda(0)});
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::optional<Client> client_;
};

TEST_F(CudaDaemonTest, ObjectsAreOffsetsIntoOneMappingOpenedOncePerProcess) {
  const uint64_t opens_before = internal::CudaPoolMapping::opens();
  std::vector<SealedRef> refs;
  std::vector<View> views;
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<Buffer> b = CreateOnGpu(kMiB);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->info().device, Device::Cuda(0));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 256, 0u);
    cudaPointerAttributes attr;
    ASSERT_EQ(cudaPointerGetAttributes(&attr, b->data()), cudaSuccess);
    EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
    EXPECT_EQ(attr.device, 0);
    ASSERT_EQ(cudaMemset(b->data(), i, kMiB), cudaSuccess);
    absl::StatusOr<SealedRef> r = b->Seal();
    ASSERT_TRUE(r.ok()) << r.status();
    absl::StatusOr<View> v = client_->Get(r->ref());
    ASSERT_TRUE(v.ok()) << v.status();
    refs.push_back(*std::move(r));
    views.push_back(*std::move(v));
  }
  // One cudaIpcOpenMemHandle for the pool, none per object (P13).
  EXPECT_EQ(internal::CudaPoolMapping::opens() - opens_before, 1u);
  uint8_t first = 0xff;
  ASSERT_EQ(cudaMemcpy(&first, views[7].data(), 1, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(first, 7);
  // Explicit releases wait for the GPU and the daemon (dropping would hand
  // the releases to the GpuReleaser and return at once).
  for (View& v : views) ASSERT_TRUE(v.Release().ok());
  for (SealedRef& r : refs) ASSERT_TRUE(r.Release().ok());
  EXPECT_EQ(GpuUsed(), 0u);
}

TEST_F(CudaDaemonTest, SealWaitsForTheProducersWorkThenAnotherProcessReads) {
  const uint64_t bytes = 512 * kMiB;
  absl::StatusOr<Buffer> b = CreateOnGpu(bytes);
  ASSERT_TRUE(b.ok()) << b.status();
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            cudaSuccess);
  // Queue enough work that it is still running when Seal is called.
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(cudaMemsetAsync(b->data(), i, bytes, stream), cudaSuccess);
  }
  ASSERT_EQ(cudaMemsetAsync(b->data(), 0x5a, bytes, stream), cudaSuccess);
  absl::StatusOr<SealedRef> ref = b->Seal();  // Default: the whole device.
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(cudaStreamQuery(stream), cudaSuccess)
      << "Seal returned before the producer's work was done";
  std::unique_ptr<Subprocess> child = Child("check", ref->ref(), 0x5a);
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(*child->ReadLine(), "ok " + std::to_string(bytes));
  EXPECT_EQ(child->Wait(), 0);

  // Sealing on a named stream waits for that stream.
  absl::StatusOr<Buffer> b2 = CreateOnGpu(bytes);
  ASSERT_TRUE(b2.ok()) << b2.status();
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(cudaMemsetAsync(b2->data(), 0x21, bytes, stream), cudaSuccess);
  }
  absl::StatusOr<SealedRef> ref2 =
      b2->Seal(false, reinterpret_cast<CudaStream>(stream));
  ASSERT_TRUE(ref2.ok()) << ref2.status();
  EXPECT_EQ(cudaStreamQuery(stream), cudaSuccess);
  cudaStreamDestroy(stream);
}

TEST_F(CudaDaemonTest, ExclusiveHandOffToOneProcessReclaimedWhenItIsKilled) {
  const uint64_t bytes = 64 * kMiB;
  absl::StatusOr<Buffer> b = CreateOnGpu(bytes);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(cudaMemset(b->data(), 7, bytes), cudaSuccess);
  absl::StatusOr<SealedRef> ref = b->Seal(/*exclusive=*/true);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_FALSE(ref->holds_lease());
  std::unique_ptr<Subprocess> taker = Child("take", ref->ref(), 7);
  ASSERT_NE(taker, nullptr);
  EXPECT_EQ(*taker->ReadLine(), "taken");
  std::unique_ptr<Subprocess> second = Child("take", ref->ref(), 7);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(*second->ReadLine(), "already-taken");
  EXPECT_EQ(WEXITSTATUS(second->Wait()), 4);
  EXPECT_EQ(GpuUsed(), bytes);
  taker->Signal(SIGKILL);
  taker->Wait();
  const absl::Time deadline = absl::Now() + absl::Seconds(1);
  while (GpuUsed() != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(GpuUsed(), 0u) << "the killed taker's object was not reclaimed";
}

TEST_F(CudaDaemonTest, PutCopiesDeviceToDevice) {
  const uint64_t bytes = 96 * kMiB;
  void* src = nullptr;
  ASSERT_EQ(cudaMalloc(&src, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(src, 0x33, bytes), cudaSuccess);
  absl::StatusOr<SealedRef> ref =
      client_->Put(src, {.size_bytes = bytes, .device = Device::Cuda(0)});
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_EQ(cudaMemset(src, 0, bytes), cudaSuccess);  // The copy is separate.
  std::unique_ptr<Subprocess> child = Child("check", ref->ref(), 0x33);
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(*child->ReadLine(), "ok " + std::to_string(bytes));
  EXPECT_EQ(child->Wait(), 0);
  cudaFree(src);
  ASSERT_TRUE(ref->Release().ok());
  EXPECT_EQ(GpuUsed(), 0u);
}

// Buffer::CopyFrom into device memory: from the host and from the device,
// complete when it returns; Fill refuses (the host cannot write there).
TEST_F(CudaDaemonTest, CopyFromFillsADeviceBuffer) {
  const uint64_t bytes = 4 * kMiB;
  absl::StatusOr<Buffer> buf =
      client_->Create({.size_bytes = bytes, .device = Device::Cuda(0)});
  ASSERT_TRUE(buf.ok()) << buf.status();
  const std::vector<uint8_t> host(bytes / 2, 0x44);
  ASSERT_TRUE(buf->CopyFrom(host.data(), host.size()).ok());
  void* src = nullptr;
  ASSERT_EQ(cudaMalloc(&src, bytes / 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(src, 0x44, bytes / 2), cudaSuccess);
  ASSERT_TRUE(buf->CopyFrom(src, bytes / 2, bytes / 2).ok());
  cudaFree(src);
  absl::Status fill = buf->Fill([](absl::Span<uint8_t>) {});
  EXPECT_EQ(fill.code(), absl::StatusCode::kFailedPrecondition) << fill;
  absl::StatusOr<SealedRef> ref = buf->Seal();
  ASSERT_TRUE(ref.ok()) << ref.status();
  std::unique_ptr<Subprocess> child = Child("check", ref->ref(), 0x44);
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(*child->ReadLine(), "ok " + std::to_string(bytes));
  EXPECT_EQ(child->Wait(), 0);
  ASSERT_TRUE(ref->Release().ok());
  EXPECT_EQ(GpuUsed(), 0u);
}

// P12: the memory of a view whose last reference died while the GPU still
// reads it is not handed out again until that work is done.
TEST_F(CudaDaemonTest, ReleaseWaitsForTheConsumersQueuedWork) {
  const uint64_t bytes = 512 * kMiB;
  absl::StatusOr<Buffer> b = CreateOnGpu(bytes);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(cudaMemset(b->data(), 0x11, bytes), cudaSuccess);
  const uintptr_t where = reinterpret_cast<uintptr_t>(b->data());
  absl::StatusOr<SealedRef> ref = b->Seal();
  ASSERT_TRUE(ref.ok()) << ref.status();
  absl::StatusOr<View> v = client_->Get(ref->ref());
  ASSERT_TRUE(v.ok()) << v.status();
  // From here the view alone keeps the object.
  ASSERT_TRUE(ref->Release().ok());
  void* scratch = nullptr;
  ASSERT_EQ(cudaMalloc(&scratch, bytes), cudaSuccess);
  // Reads queued on the legacy default stream, still running when the last
  // reference goes.
  for (int i = 0; i < 16; ++i) {
    ASSERT_EQ(
        cudaMemcpyAsync(scratch, v->data(), bytes, cudaMemcpyDeviceToDevice, 0),
        cudaSuccess);
  }
  v = View();  // The last reference: its release must wait for the reads.
  // Another producer asks for the same amount at once: it may only get the
  // same range once the reads are done.
  Client other = *Client::Connect({.address = daemon_->address()});
  absl::StatusOr<Buffer> b2 =
      other.Create({.size_bytes = bytes, .device = Device::Cuda(0)});
  ASSERT_TRUE(b2.ok()) << b2.status();
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(b2->data(), 0x22, bytes, stream), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> host(bytes);
  ASSERT_EQ(cudaMemcpy(host.data(), scratch, bytes, cudaMemcpyDeviceToHost),
            cudaSuccess);
  uint64_t clobbered = 0;
  for (uint8_t x : host) clobbered += x != 0x11;
  EXPECT_EQ(clobbered, 0u) << "the range was reused (new object at "
                           << (reinterpret_cast<uintptr_t>(b2->data()) == where
                                   ? "the same"
                                   : "another")
                           << " offset) while the consumer still read it";
  cudaStreamDestroy(stream);
  cudaFree(scratch);
}

#endif  // SHMTENSOR_WITH_CUDA

}  // namespace
}  // namespace shmtensor
