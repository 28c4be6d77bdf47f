// What the fuzzers share (store_fuzzer.cc, ledger_fuzzer.cc): the program's
// bytes read as requests, and the one way a broken invariant ends a run.
#ifndef SHMTENSOR_TESTS_FUZZ_FUZZ_INPUT_H_
#define SHMTENSOR_TESTS_FUZZ_FUZZ_INPUT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace shmtensor::fuzz {

// Reads the program's bytes; past the end, zeros.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return at_ >= size_; }
  uint8_t Byte() { return at_ < size_ ? data_[at_++] : 0; }
  uint64_t U64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | Byte();
    return v;
  }
  // Up to `n` bytes: fewer at the end of the program.
  std::string Bytes(size_t n) {
    n = std::min(n, size_ - std::min(size_, at_));
    std::string s(reinterpret_cast<const char*>(data_ + at_), n);
    at_ += n;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

// Ends the run as a crash the fuzzer keeps, naming what broke.
[[noreturn]] inline void Broken(const char* what) {
  std::fprintf(stderr, "invariant broken: %s\n", what);
  std::abort();
}

}  // namespace shmtensor::fuzz

#endif  // SHMTENSOR_TESTS_FUZZ_FUZZ_INPUT_H_
