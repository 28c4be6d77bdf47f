// Reads a ref (hex, one line) from stdin, maps the object with no copy and
// checks its values (as producer.cc wrote them). Prints "ok <sum>".
#include <cstdio>
#include <iostream>
#include <string>

#include "shmtensor/client.h"

int main() {
  std::string hex;
  if (!std::getline(std::cin, hex) || hex.size() % 2 != 0) {
    std::cerr << "consumer: expected a ref in hex on stdin\n";
    return 1;
  }
  std::string bytes;
  for (size_t i = 0; i < hex.size(); i += 2) {
    bytes += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  }
  absl::StatusOr<shmtensor::ObjectRef> ref = shmtensor::ObjectRef::Parse(bytes);
  if (!ref.ok()) {
    std::cerr << "consumer: " << ref.status() << "\n";
    return 1;
  }
  absl::StatusOr<shmtensor::Client> client = shmtensor::Client::Connect();
  if (!client.ok()) {
    std::cerr << "consumer: " << client.status() << "\n";
    return 1;
  }
  absl::StatusOr<shmtensor::View> view = client->Get(*ref);
  if (!view.ok()) {
    std::cerr << "consumer: " << view.status() << "\n";
    return 1;
  }
  const auto* data = static_cast<const float*>(view->data());
  const size_t n = view->size_bytes() / sizeof(float);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    if (data[i] != static_cast<float>(i)) {
      std::cerr << "consumer: element " << i << " is " << data[i] << "\n";
      return 1;
    }
    sum += data[i];
  }
  std::printf("ok %zu floats, sum %.0f\n", n, sum);
  return 0;
}
