// The DLPack tensor structs (https://dmlc.github.io/dlpack, ABI v0.6), the
// exchange format behind __dlpack__ / torch.from_dlpack. Declared here
// because Debian ships no standalone dlpack header; the layout is frozen by
// the spec.
#ifndef SHMTENSOR_PYTHON_SRC_DLPACK_H_
#define SHMTENSOR_PYTHON_SRC_DLPACK_H_

#include <cstdint>

extern "C" {

enum DLDeviceType : int32_t { kDLCPU = 1, kDLCUDA = 2 };
struct DLDevice {
  DLDeviceType device_type;
  int32_t device_id;
};
enum DLDataTypeCode : uint8_t {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLBfloat = 4,
  kDLComplex = 5,
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // In elements; may be null for C-contiguous.
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

}  // extern "C"

#endif  // SHMTENSOR_PYTHON_SRC_DLPACK_H_
