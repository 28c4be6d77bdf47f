#include "shmtensor/device.h"

#include <cctype>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace shmtensor {

std::string DeviceName(const Device& d) {
  return d.is_cuda() ? absl::StrCat("cuda:", d.index) : "cpu";
}

absl::StatusOr<Device> ParseDevice(const std::string& text) {
  if (text == "cpu") return Device::Host();
  if (text == "cuda") return Device::Cuda(0);
  int index = 0;
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 &&
      std::isdigit(static_cast<unsigned char>(text[5])) &&
      absl::SimpleAtoi(text.substr(5), &index) && index >= 0) {
    return Device::Cuda(index);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "device '", text, "' is not one of 'cpu', 'cuda', 'cuda:N'"));
}

}  // namespace shmtensor
