// consumer.cc with libtorch: the object as a tensor over the pool's bytes
// (no copy). Prints "ok <shape> sum <sum>".
#include <torch/torch.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "shmtensor/client.h"
#include "shmtensor/torch.h"

int main() {
  std::string hex, bytes;
  if (!std::getline(std::cin, hex)) return 1;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    bytes += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  }
  absl::StatusOr<shmtensor::ObjectRef> ref = shmtensor::ObjectRef::Parse(bytes);
  absl::StatusOr<shmtensor::Client> client = shmtensor::Client::Connect();
  if (!ref.ok() || !client.ok()) {
    std::cerr << "tensor_consumer: " << ref.status() << " " << client.status()
              << "\n";
    return 1;
  }
  absl::StatusOr<shmtensor::View> view = client->Get(*ref);
  if (!view.ok()) {
    std::cerr << "tensor_consumer: " << view.status() << "\n";
    return 1;
  }
  absl::StatusOr<at::Tensor> t = shmtensor::ToTensor(*view);
  if (!t.ok()) {
    std::cerr << "tensor_consumer: " << t.status() << "\n";
    return 1;
  }
  if (!t->equal(torch::arange(64 * 1024, torch::kFloat32).view({64, 1024}))) {
    std::cerr << "tensor_consumer: values differ\n";
    return 1;
  }
  std::printf("ok [%lld, %lld] sum %.0f\n", static_cast<long long>(t->size(0)),
              static_cast<long long>(t->size(1)),
              t->sum(at::kDouble).item<double>());
  return 0;
}
