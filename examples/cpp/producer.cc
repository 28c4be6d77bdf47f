// Puts a 64 x 1024 float32 array into shmtensord's pool and writes its ref
// (hex, one line) to stdout; keeps the object alive until stdin closes
// (the consumer has its own view by then). README.md's C++ snippet.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "shmtensor/client.h"

int main() {
  absl::StatusOr<shmtensor::Client> client = shmtensor::Client::Connect();
  if (!client.ok()) {
    std::cerr << "producer: " << client.status() << "\n";
    return 1;
  }
  std::vector<float> src(64 * 1024);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  absl::StatusOr<shmtensor::Buffer> buf = client->Create(
      {.dtype = shmtensor::DType::kFloat32, .shape = {64, 1024}});
  if (!buf.ok()) {
    std::cerr << "producer: " << buf.status() << "\n";
    return 1;
  }
  if (absl::Status s = buf->CopyFrom(src.data(), buf->size_bytes()); !s.ok()) {
    std::cerr << "producer: " << s << "\n";
    return 1;
  }
  absl::StatusOr<shmtensor::SealedRef> ref = buf->Seal();  // Keeps it alive.
  if (!ref.ok()) {
    std::cerr << "producer: " << ref.status() << "\n";
    return 1;
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : ref->ref().Serialize()) {
    hex += kHex[c >> 4];
    hex += kHex[c & 15];
  }
  std::printf("%s\n", hex.c_str());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}
