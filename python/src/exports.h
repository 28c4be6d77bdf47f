// Zero-copy exports of shmtensor memory to NumPy, DLPack (torch) and the
// buffer protocol.
//
// Every export owns a counted export of the object's lease
// (internal::LeaseExport, client/lease_address.h), so the object stays
// alive, and its memory unreused, exactly as long as any array or tensor
// made from it lives, even after the Buffer or View it came from is gone;
// and the lease knows it lives, so a seal closes the range at once
// (Lease::ClosesAtOnce): nothing written through an export lands after the
// seal.
//
// Thread safety: call with the GIL held; the exports' destructors may run on
// any thread and release the GIL while they drop the lease.
#ifndef SHMTENSOR_PYTHON_SRC_EXPORTS_H_
#define SHMTENSOR_PYTHON_SRC_EXPORTS_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <functional>
#include <memory>

#include "shmtensor/view.h"

namespace shmtensor::python {

namespace py = pybind11;

// What an export needs: the object's description, where its bytes are, and
// the lease that keeps them.
struct ExportSource {
  const ObjectInfo* info;
  void* data;
  std::shared_ptr<internal::Lease> lease;
  bool writable;
  // DLPack only: called once the consumer is done with the tensor, before
  // its lease share goes (may be empty; must not need the GIL).
  std::function<void()> on_release;
};

// An ndarray over the bytes, with the dtype, shape and byte strides of the
// object; read-only unless `writable`. TypeError for a dtype NumPy lacks
// (bfloat16).
py::array MakeArray(const ExportSource& src);

// A "dltensor" capsule (DLPack) over the bytes, for torch.from_dlpack.
// TypeError for a dtype torch 1.13 lacks (uint16, uint32, uint64).
py::capsule MakeDLPack(const ExportSource& src);

// The buffer protocol (PEP 3118) over the bytes: fills `out` for a consumer
// that asked with `flags` (numpy.asarray, memoryview), read-only unless
// `src.writable`. `out->obj` becomes a new object that owns a share of the
// lease and the shape, strides and format `out` points to, so the consumer
// keeps the object alive, not the exporter; its release needs no
// bf_releasebuffer. Returns 0, or -1 with BufferError set: a CUDA object, a
// dtype with no PEP 3118 format (bfloat16), a writable request of read-only
// bytes, strides the consumer cannot take. (NumPy then falls back to
// __array__, whose error says precisely what is wrong.)
int FillBuffer(const ExportSource& src, Py_buffer* out, int flags);

}  // namespace shmtensor::python

#endif  // SHMTENSOR_PYTHON_SRC_EXPORTS_H_
