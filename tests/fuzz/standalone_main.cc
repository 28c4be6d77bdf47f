// Runs a libFuzzer target without libFuzzer: `N` programs made from a fixed
// seed (random bytes, of random lengths up to 4 KiB), then any files named on
// the command line (a corpus, or a crash to reproduce). For the suite, where
// the build is GCC's; deploy/fuzz.sh runs the real fuzzer for longer.
//
//   store_fuzz_standalone [--runs N] [--seed S] [FILE...]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  long runs = 20000;
  unsigned seed = 1;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) {
      runs = std::atol(argv[++i]);
    } else if (!std::strcmp(argv[i], "--seed") && i + 1 < argc) {
      seed = static_cast<unsigned>(std::atol(argv[++i]));
    } else {
      files.push_back(argv[i]);
    }
  }
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()),
                           bytes.size());
  }
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> buf;
  for (long r = 0; r < runs; ++r) {
    buf.resize(rng() % 4096);
    for (uint8_t& b : buf) b = static_cast<uint8_t>(rng());
    LLVMFuzzerTestOneInput(buf.data(), buf.size());
  }
  std::printf("%ld programs and %zu files ran; every invariant held\n", runs,
              files.size());
  return 0;
}
