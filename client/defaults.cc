#include "shmtensor/defaults.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace shmtensor {

std::string DefaultAddress() {
  if (const char* env = std::getenv(kAddressEnv); env != nullptr && *env) {
    return env;
  }
  return absl::StrCat("unix:/tmp/shmtensord-", getuid(), ".sock");
}

}  // namespace shmtensor
