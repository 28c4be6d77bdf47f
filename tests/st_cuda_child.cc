// Test helper for tests/cuda_test.cc: one client process that uses CUDA
// objects, driven by arguments and stdout like st_child (which links libtorch;
// this one links only the client and cudart, so it runs wherever a GPU is).
//
//   st_cuda_child check ADDRESS REF_HEX BYTE   get, copy to host, check every
//                                              byte; prints "ok BYTES"
//   st_cuda_child take ADDRESS REF_HEX BYTE    take an exclusive hand-off,
//                                              check, overwrite with BYTE+1,
//                                              print "taken", then wait to be
//                                              killed
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "shmtensor/client.h"
#include "shmtensor/errors.h"
#include "tests/ref_hex.h"

namespace {

using shmtensor::testing::RefFromHex;

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

int Fail(const std::string& what) {
  Say("error " + what);
  return 3;
}

// Copies the view's device bytes to the host and checks each is `byte`.
bool AllBytesAre(const shmtensor::View& v, int byte) {
  std::vector<uint8_t> host(v.size_bytes());
  if (cudaMemcpy(host.data(), v.data(), host.size(), cudaMemcpyDeviceToHost) !=
      cudaSuccess) {
    return false;
  }
  for (uint8_t b : host) {
    if (b != byte) return false;
  }
  return true;
}

int Run(int argc, char** argv) {
  if (argc < 5) return 2;
  const std::string cmd = argv[1];
  int byte = 0;
  if (!absl::SimpleAtoi(argv[4], &byte)) return 2;
  absl::StatusOr<shmtensor::Client> client = shmtensor::Client::Connect(
      {.address = argv[2], .client_name = "st_cuda_child"});
  if (!client.ok()) return Fail(client.status().ToString());
  absl::StatusOr<shmtensor::ObjectRef> ref = RefFromHex(argv[3]);
  if (!ref.ok()) return Fail(ref.status().ToString());
  absl::StatusOr<shmtensor::View> view = client->Get(*ref);
  if (!view.ok()) {
    if (shmtensor::IsAlreadyTaken(view.status())) {
      Say("already-taken");
      return 4;
    }
    return Fail(view.status().ToString());
  }
  if (!view->info().device.is_cuda()) return Fail("not a CUDA object");
  if (!AllBytesAre(*view, byte)) return Fail("bad bytes");
  if (cmd == "check") {
    Say("ok " + std::to_string(view->size_bytes()));
    return 0;
  }
  if (cmd == "take") {
    if (!view->writable()) return Fail("not writable");
    if (cudaMemset(view->mutable_data(), byte + 1, view->size_bytes()) !=
            cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) {
      return Fail("cudaMemset");
    }
    Say("taken");
    pause();
    return 0;
  }
  return 2;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
