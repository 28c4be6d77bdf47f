// shmtensor._core: the binding over the C++ client. It converts arguments
// by the C++ rules (py_args.h) and calls the client; it never calls into
// the package. The Python package (shmtensor/__init__.py) adds put(),
// numpy() and tensor() and the exception classes on top; this module is not
// meant to be used alone.
//
// The lifecycle's types (Client, Buffer, View, ObjectRef) are native CPython
// (py_client.h, py_objects.h); the module's functions and BatchRing are
// pybind11. Every call that may block on the
// daemon releases the GIL. Errors come out as shmtensor.Error subclasses
// (see shmtensor/errors.py), built from the absl::Status code and reason.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <ctime>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/batch_ring.h"
#include "client/lease_address.h"
#include "client/object_layout.h"
#include "client/offer.h"
#include "client/pool_mapping.h"
#ifdef SHMTENSOR_BENCH_HOOKS
#include "bench/python/hooks.h"
#endif
#include "python/src/exports.h"
#include "python/src/py_args.h"
#include "python/src/py_client.h"
#include "python/src/py_objects.h"
#include "python/src/py_ref.h"
#include "python/src/py_support.h"
#include "shmtensor/client.h"
#include "shmtensor/defaults.h"
#include "shmtensor/dtype.h"
#include "shmtensor/errors.h"

using namespace shmtensor;          // NOLINT: the module body only.
using namespace shmtensor::python;  // NOLINT

namespace {

// The binding's batch ring: the ring and a share of the lease that keeps
// its object mapped (every tensor over a slot holds another).
struct PyBatchRing {
  std::unique_ptr<BatchRing> ring;
  std::shared_ptr<internal::Lease> lease;
};

PyBatchRing OpenRing(const ExportSource& src, int slots, uint64_t slot_bytes,
                     uint64_t align, bool create) {
  if (!src.writable || src.info->device.is_cuda()) {
    throw StatusError{absl::InvalidArgumentError(
        "a batch ring needs a writable view of a shared-writable host "
        "object")};
  }
  return PyBatchRing{Check(BatchRing::Open(src.data, src.info->size_bytes,
                                           slots, slot_bytes, align, create)),
                     src.lease};
}

// A uint8 [nbytes] tensor's description, for MakeDLPack.
ObjectInfo BytesInfo(uint64_t nbytes) {
  ObjectInfo info;
  info.dtype = DType::kUInt8;
  info.shape = {static_cast<int64_t>(nbytes)};
  info.strides_bytes = {1};
  info.size_bytes = nbytes;
  info.device = Device::Host();
  return info;
}

// A slot's batch as the caller describes it: uint8 [nbytes] when `dtype` is
// None, else a C-contiguous tensor of `dtype` and `shape`, which must span
// exactly `nbytes` > 0 (a handle that says otherwise is refused, naming
// both, never given a view past its batch; an empty batch goes as bytes). As
// for every export, a bool tensor's capsule carries uint8 (torch.from_dlpack of
// torch 1.13 has no bool): the caller views it as bool.
ObjectInfo SlotInfo(uint64_t nbytes, py::handle dtype, py::handle shape) {
  if (dtype.is_none()) return BytesInfo(nbytes);
  ObjectInfo info;
  info.dtype = DTypeArg(dtype.ptr());
  try {
    info.shape = shape.cast<std::vector<int64_t>>();
  } catch (const py::cast_error&) {
    throw StatusError{absl::InvalidArgumentError(
        absl::StrCat("a batch's shape is a sequence of ints, not a ",
                     Py_TYPE(shape.ptr())->tp_name))};
  }
  info.size_bytes = nbytes;
  info.device = Device::Host();
  // Refused here, before a slot is adopted: MakeDLPack would refuse it
  // after, with the slot adopted by a tensor that never was.
  if (const DTypeInfo* row = FindDType(info.dtype);
      row == nullptr || !row->torch) {
    throw StatusError{absl::InvalidArgumentError(absl::StrCat(
        "a batch ring hands over torch tensors, and torch 1.13 has no ",
        DTypeName(info.dtype)))};
  }
  // Checked to span exactly nbytes > 0: then no dimension is 0, and every
  // stride is at most that extent (ContiguousStrides' bound).
  CreateOptions layout;
  layout.dtype = info.dtype;
  layout.shape = info.shape;
  const std::optional<uint64_t> extent = internal::ObjectBytes(layout);
  if (nbytes == 0 || extent != nbytes) {
    std::string dims;
    for (size_t i = 0; i < info.shape.size() && i < 8; ++i) {
      absl::StrAppend(&dims, i ? ", " : "", info.shape[i]);
    }
    if (info.shape.size() > 8) absl::StrAppend(&dims, ", ...");
    throw StatusError{absl::InvalidArgumentError(absl::StrFormat(
        "a batch of %d bytes is not a %s tensor of shape (%s) (%d "
        "dimensions)",
        nbytes, DTypeName(info.dtype), dims, info.shape.size()))};
  }
  info.strides_bytes = internal::ContiguousStrides(info.dtype, info.shape);
  return info;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "shmtensor C++ client binding (use the shmtensor package).";

  // StatusError -> shmtensor.errors.from_status(code, reason, message).
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      RaiseStatus(e.status);
    }
  });

  AddObjectTypes(m);
  AddClientType(m);
#ifdef SHMTENSOR_BENCH_HOOKS
  py::module_ bench = m.def_submodule("_bench");
  AddBenchHooks(bench);
#endif

  // The dtype table (shmtensor/dtype.h), the package's one source of dtype
  // codes (shmtensor/_dtypes.py): (code, name, item size, kind, NumPy
  // dtype string or None, whether torch has it), in code order.
  m.def("_dtype_table", [] {
    py::list rows;
    for (const DTypeInfo* d = DTypesBegin(); d != DTypesEnd(); ++d) {
      rows.append(py::make_tuple(
          static_cast<int>(d->dtype), d->name, d->item_size,
          std::string(1, d->kind),
          d->numpy == nullptr ? py::object(py::none()) : py::str(d->numpy),
          d->torch));
    }
    return py::tuple(rows);
  });

  m.def(
      "_keep_clients_alive_until_exit",
      [] {
        py::gil_scoped_release release;
        Client::KeepAliveUntilExit();
      },
      "For atexit: see Client::KeepAliveUntilExit (shmtensor/client.h).");
  m.def(
      "_flush_clients",
      [] {
        py::gil_scoped_release release;
        Client::FlushAll();
      },
      "For multiprocessing's exit: see Client::FlushAll (shmtensor/client.h).");
  // The error reasons (shmtensor/errors.h), checked against the package's
  // exceptions (test_errors.py): (value, wire name), in value order.
  m.def("_error_reasons", [] {
    py::list rows;
    for (const ErrorReasonInfo* r = ErrorReasonsBegin(); r != ErrorReasonsEnd();
         ++r) {
      rows.append(py::make_tuple(static_cast<int>(r->reason), r->name));
    }
    return py::tuple(rows);
  });
  // The conversions every method applies to its arguments (py_args.h), for
  // the package's put(), which reads dtypes and devices off arrays and
  // tensors.
  m.def(
      "_dtype_code",
      [](py::handle dtype) { return static_cast<int>(DTypeArg(dtype.ptr())); },
      "_dtype_code(dtype): the wire code of a dtype in any spelling.");
  m.def(
      "_array_source",
      [](py::handle array) {
        return py::reinterpret_steal<py::object>(ArraySource(array.ptr()));
      },
      "_array_source(array): (address, shape, dtype code, nbytes) of a "
      "C-contiguous numpy.ndarray, None for another.");
  m.def(
      "_device_name",
      [](py::handle device) { return DeviceName(DeviceArg(device.ptr())); },
      "_device_name(device): 'cpu' or 'cuda:N' for a device in any "
      "spelling.");
  // For tests (and a curious user): what the lease of a Buffer or View
  // knows of the pointers into it that left the package (lease_address.h).
  m.def(
      "_exports_of",
      [](py::handle obj) {
        const std::shared_ptr<internal::Lease>* lease = nullptr;
        try {
          lease = &BufferOf(obj).get().lease();
        } catch (const py::type_error&) {
          lease = &ViewOf(obj).get().lease();
        }
        return py::make_tuple(internal::LiveExports(**lease),
                              internal::LeaseEscaped(**lease));
      },
      "_exports_of(buffer_or_view): (counted exports alive, whether a raw "
      "address escaped) of its lease.");
  // For tests: how many Python Views share the C++ View behind `view`
  // (python/src/shared_view.h): (open, not deallocated).
  m.def(
      "_shares_of",
      [](py::handle view) {
        const SharedView& s = ViewOf(view).shared();
        return py::make_tuple(s.open(), s.holders());
      },
      "_shares_of(view): (open, alive) Python Views of the C++ View behind "
      "`view`, which a get through the same client shares.");
  m.def(
      "_bind_object_classes",
      [](py::handle buffer_class, py::handle view_class) {
        BindObjectClasses(buffer_class, view_class);
      },
      py::arg("buffer_class"), py::arg("view_class"),
      "For the package, once: the subclasses of Buffer and View that "
      "create() and get() make (python/src/py_objects.h). Optional: without "
      "it they make the native types.");
  m.def(
      "_in_pool",
      [](uintptr_t address) {
        return internal::PoolMapping::Contains(
            reinterpret_cast<const void*>(address));
      },
      py::arg("address"),
      "True when `address` lies in this process's mapping of a shmtensord "
      "pool (host pools; for torch's sharing, shmtensor/_torch_sharing.py).");
  m.def(
      "_offer_at",
      [](uintptr_t address, uint64_t nbytes) -> py::object {
        absl::StatusOr<internal::LeaseOffer> offer;
        {
          py::gil_scoped_release release;
          offer = internal::OfferReadLeaseAt(
              reinterpret_cast<const void*>(address), nbytes);
        }
        if (absl::IsNotFound(offer.status())) return py::none();
        Check(offer.status());
        return py::make_tuple(py::bytes(offer->ref.Serialize()), offer->token,
                              reinterpret_cast<uintptr_t>(offer->data),
                              offer->size_bytes, offer->daemon_address);
      },
      py::arg("address"), py::arg("nbytes"),
      "[P19] Offers the object whose bytes hold the `nbytes` at `address` (a "
      "live read-only view's, in this process) to another process: "
      "(ref_bytes, token, object_address, object_nbytes, daemon_address), or "
      "None when no read-only view holds them (see client/offer.h).");
  m.def(
      "_take",
      [](py::handle client, py::handle ref, uint64_t token) {
        const ObjectRef* parsed = ParsedRefOf(ref.ptr());
        if (parsed == nullptr)
          throw py::type_error("_take() needs an ObjectRef");
        Client& c = ClientOf(client);
        const ObjectRef r = *parsed;
        std::optional<absl::StatusOr<View>> v;
        {
          py::gil_scoped_release release;
          v = c.Take(r, token);
        }
        return NewView(Check(*std::move(v)));
      },
      py::arg("client"), py::arg("ref"), py::arg("token"),
      "[P19] The view of an object another process offered (Client::Take).");
  m.def(
      "_bytes_of",
      [](py::handle view, uint64_t offset, std::optional<uint64_t> nbytes) {
        const ExportSource src = ViewOf(view).Source();
        const uint64_t size = src.info->size_bytes;
        if (src.info->device.is_cuda()) {
          throw py::type_error("_bytes_of() of a CUDA view");
        }
        const uint64_t n = nbytes.value_or(offset <= size ? size - offset : 0);
        if (offset > size || n > size - offset) {
          throw py::value_error(absl::StrFormat(
              "_bytes_of(): bytes [%d, %d) are not within the object's %d",
              offset, offset + n, size));
        }
        const ObjectInfo info = BytesInfo(n);
        return MakeDLPack({&info,
                           static_cast<uint8_t*>(src.data) + offset,
                           src.lease,
                           src.writable,
                           {}});
      },
      py::arg("view"), py::arg("offset") = 0, py::arg("nbytes") = py::none(),
      "A DLPack capsule (uint8, one dimension) over `nbytes` bytes (default: "
      "the rest) of a host view's object from byte `offset`; it keeps the "
      "object alive while it lives.");
  m.def("default_address", &DefaultAddress,
        "The daemon address used when none is given ($SHMTENSOR_ADDRESS or "
        "$XDG_RUNTIME_DIR/shmtensord.sock, or "
        "unix:/tmp/shmtensor-<uid>/shmtensord.sock).");
  py::class_<PyBatchRing>(
      m, "BatchRing",
      "Slots for batches in one shared-writable object, handed from a "
      "producer process to a consumer with no daemon call per batch (see "
      "client/batch_ring.h).")
      .def_static(
          "bytes",
          [](int slots, uint64_t slot_bytes, uint64_t align) {
            return Check(BatchRing::Bytes(slots, slot_bytes, align));
          },
          py::arg("slots"), py::arg("slot_bytes"), py::arg("align"),
          "Bytes a ring's object needs.")
      .def_static(
          "create",
          [](py::handle b, int slots, uint64_t slot_bytes, uint64_t align) {
            return OpenRing(BufferOf(b).Source(), slots, slot_bytes, align,
                            true);
          },
          py::arg("buffer"), py::arg("slots"), py::arg("slot_bytes"),
          py::arg("align"),
          "The producer's ring over a shared-writable buffer it just made "
          "(every slot free).")
      .def_static(
          "join",
          [](py::handle v, int slots, uint64_t slot_bytes, uint64_t align) {
            return OpenRing(ViewOf(v).Source(), slots, slot_bytes, align,
                            false);
          },
          py::arg("view"), py::arg("slots"), py::arg("slot_bytes"),
          py::arg("align"),
          "The consumer's ring over a writable view of the producer's object.")
      .def_property_readonly(
          "slots", [](const PyBatchRing& r) { return r.ring->slots(); })
      .def_property_readonly(
          "slot_bytes",
          [](const PyBatchRing& r) { return r.ring->slot_bytes(); })
      .def_property_readonly(
          "align", [](const PyBatchRing& r) { return r.ring->align(); })
      .def(
          "claim", [](PyBatchRing& r) { return r.ring->Claim(); },
          "A free slot, now being filled, or -1 when all are in use.")
      .def(
          "generation",
          [](const PyBatchRing& r, int slot) {
            return r.ring->Generation(slot);
          },
          py::arg("slot"))
      .def(
          "target",
          [](PyBatchRing& r, int slot, uint64_t nbytes, py::handle dtype,
             py::handle shape) {
            absl::StatusOr<uint8_t*> data = r.ring->Target(slot, nbytes);
            if (!data.ok())
              throw py::value_error(std::string(data.status().message()));
            const ObjectInfo info = SlotInfo(nbytes, dtype, shape);
            return MakeDLPack({&info, *data, r.lease, true, {}});
          },
          py::arg("slot"), py::arg("nbytes"), py::arg("dtype") = py::none(),
          py::arg("shape") = py::none(),
          "A DLPack capsule over a claimed slot's first `nbytes` bytes, to "
          "fill: uint8, or a C-contiguous tensor of `dtype` and `shape` "
          "spanning exactly `nbytes` (ValueError otherwise; bool comes as "
          "uint8, to view as bool).")
      .def(
          "hand", [](PyBatchRing& r, int slot) { Check(r.ring->Hand(slot)); },
          py::arg("slot"), "The claimed slot's batch is complete.")
      .def(
          "unclaim",
          [](PyBatchRing& r, int slot) { Check(r.ring->Unclaim(slot)); },
          py::arg("slot"), "The claimed slot was not filled after all.")
      .def(
          "adopt",
          [](PyBatchRing& r, int slot, uint32_t generation, uint64_t nbytes,
             py::handle dtype, py::handle shape) {
            // Described before the slot is adopted: a refused description
            // leaves the slot handed (the handle's next use may still work).
            const ObjectInfo info = SlotInfo(nbytes, dtype, shape);
            BatchRing::Adopted a =
                Check(r.ring->Adopt(slot, generation, nbytes));
            // The lease share in the capsule keeps the slot (and the header
            // its release writes) mapped until the last tensor dies.
            return MakeDLPack(
                {&info, a.data, r.lease, true, std::move(a.release)});
          },
          py::arg("slot"), py::arg("generation"), py::arg("nbytes"),
          py::arg("dtype") = py::none(), py::arg("shape") = py::none(),
          "A DLPack capsule over a handed slot's first `nbytes` bytes (uint8, "
          "or `dtype` and `shape` as for target); the slot is free again "
          "when the last tensor over it dies. Raises for a stale handle, and "
          "ValueError for a description that does not span `nbytes`.");
}
