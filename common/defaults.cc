#include "shmtensor/defaults.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace shmtensor {

std::string DefaultAddress() {
  if (const char* env = std::getenv(kAddressEnv); env != nullptr && *env) {
    return env;
  }
  if (const char* run = std::getenv("XDG_RUNTIME_DIR");
      run != nullptr && *run == '/') {
    return absl::StrCat("unix:", run, "/shmtensord.sock");
  }
  return absl::StrCat("unix:/tmp/shmtensor-", getuid(), "/shmtensord.sock");
}

}  // namespace shmtensor
