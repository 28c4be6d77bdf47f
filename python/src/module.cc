// shmtensor._core: the binding over the C++ client. The Python package
// (shmtensor/__init__.py) adds dtype handling, put(), tensor() and the
// exception classes on top; this module is not meant to be used alone.
//
// The lifecycle's types and calls are native CPython (py_client.h,
// py_objects.h); the rest is pybind11. Every call that may block on the
// daemon releases the GIL. Errors come out as shmtensor.Error subclasses
// (see shmtensor/errors.py), built from the absl::Status code and reason.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <ctime>
#include <optional>
#include <string>
#include <vector>

#include "python/src/batch_ring.h"
#include "python/src/exports.h"
#include "python/src/py_client.h"
#include "python/src/py_objects.h"
#include "python/src/py_support.h"
#include "shmtensor/client.h"
#include "shmtensor/defaults.h"
#include "shmtensor/dtype.h"

using namespace shmtensor;          // NOLINT: the module body only.
using namespace shmtensor::python;  // NOLINT

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
      "_cpp_lifecycles",
      [](py::handle client, int64_t nbytes, int count, bool timed) {
        Client& c = ClientOf(client);
        // Benchmark hook (bench/python/python_bench.py): `count` lifecycles of
        // the C++ client back to back, as a C++ program would run them, the
        // same steps as bench/python/python_bench.py's Python loop. Returns the
        // thread CPU time they took, in microseconds (0 when not `timed`:
        // reading that clock is a system call).
        py::gil_scoped_release release;
        timespec t0{}, t1{};
        if (timed) clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
        for (int i = 0; i < count; ++i) {
          Buffer buf = Check(
              c.Create({.dtype = DType::kFloat32, .shape = {nbytes / 4}}));
          static_cast<float*>(buf.data())[0] = 1.0f;
          SealedRef ref = Check(buf.Seal());
          View v = Check(c.Get(ref.ref()));
          if (static_cast<const float*>(v.data())[0] != 1.0f) {
            throw StatusError{absl::DataLossError("bytes differ")};
          }
        }  // The view, then the ref, release as they go out of scope.
        if (timed) clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
        return (t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3;
      },
      py::arg("client"), py::arg("nbytes"), py::arg("count"),
      py::arg("timed") = true);
  m.def(
      "_cpp_lifecycle",
      [](py::handle client, int64_t nbytes) {
        Client& c = ClientOf(client);
        // Benchmark hook (bench/python/python_bench.py): one lifecycle of the
        // C++ client in this process, to compare the binding's overhead
        // against. Returns (wall us, [thread CPU us of each step: nothing
        // (the timer's own cost), create, fill, seal, get, read, release
        // view, release ref]).
        std::vector<double> steps;
        absl::Duration wall;
        {
          py::gil_scoped_release release;
          auto cpu_us = [] {
            timespec ts;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
            return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
          };
          double t = cpu_us();
          auto step = [&] {
            const double now = cpu_us();
            steps.push_back(now - t);
            t = now;
          };
          const absl::Time t0 = absl::Now();
          step();  // Nothing: what timing a step costs.
          Buffer buf = Check(
              c.Create({.dtype = DType::kFloat32, .shape = {nbytes / 4}}));
          step();
          static_cast<float*>(buf.data())[0] = 1.0f;
          step();
          SealedRef ref = Check(buf.Seal());
          step();
          std::optional<View> v(Check(c.Get(ref.ref())));
          step();
          if (static_cast<const float*>(v->data())[0] != 1.0f) {
            throw StatusError{absl::DataLossError("bytes differ")};
          }
          step();
          v.reset();
          step();
          ref.Reset();
          step();
          wall = absl::Now() - t0;
        }
        return py::make_tuple(absl::ToDoubleMicroseconds(wall), steps);
      },
      py::arg("client"), py::arg("nbytes"));
  m.def(
      "_keep_clients_alive_until_exit",
      [] {
        py::gil_scoped_release release;
        Client::KeepAliveUntilExit();
      },
      "For atexit: see Client::KeepAliveUntilExit (shmtensor/client.h).");
  m.def(
      "_bind_package",
      [](py::handle ref_class, py::handle dtype_code, py::handle dtype_cache,
         py::handle device_name) {
        SetRefClass(ref_class);
        BindPackage(dtype_code, dtype_cache, device_name);
      },
      py::arg("ref_class"), py::arg("dtype_code"), py::arg("dtype_cache"),
      py::arg("device_name"),
      "For the package, once: the class seal() and put() return "
      "(shmtensor.ObjectRef) and the dtype and device helpers Client uses "
      "(see python/src/py_client.h).");
  m.def("default_address", &DefaultAddress,
        "The daemon address used when none is given ($SHMTENSOR_ADDRESS or "
        "$XDG_RUNTIME_DIR/shmtensord.sock, or "
        "unix:/tmp/shmtensor-<uid>/shmtensord.sock).");
  m.def(
      "parse_ref",
      [](const std::string& b) {
        ObjectRef r = Check(ObjectRef::Parse(b));
        return py::make_tuple(r.daemon_epoch, r.slot, r.generation,
                              r.exclusive);
      },
      "Fields (epoch, slot, generation, exclusive) of a serialised ref.");

  py::class_<BatchRing>(
      m, "BatchRing",
      "Slots for batches in one shared-writable object, handed from a "
      "producer process to a consumer with no daemon call per batch (see "
      "python/src/batch_ring.h).")
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
            return Check(BatchRing::Open(BufferOf(b).Source(), slots,
                                         slot_bytes, align, true));
          },
          py::arg("buffer"), py::arg("slots"), py::arg("slot_bytes"),
          py::arg("align"),
          "The producer's ring over a shared-writable buffer it just made "
          "(every slot free).")
      .def_static(
          "join",
          [](py::handle v, int slots, uint64_t slot_bytes, uint64_t align) {
            return Check(BatchRing::Open(ViewOf(v).Source(), slots, slot_bytes,
                                         align, false));
          },
          py::arg("view"), py::arg("slots"), py::arg("slot_bytes"),
          py::arg("align"),
          "The consumer's ring over a writable view of the producer's object.")
      .def_property_readonly("slots", &BatchRing::slots)
      .def_property_readonly("slot_bytes", &BatchRing::slot_bytes)
      .def_property_readonly("align", &BatchRing::align)
      .def("claim", &BatchRing::Claim,
           "A free slot, now being filled, or -1 when all are in use.")
      .def("generation", &BatchRing::Generation, py::arg("slot"))
      .def("target", &BatchRing::Target, py::arg("slot"), py::arg("nbytes"),
           "A DLPack capsule (uint8) over a claimed slot, to fill.")
      .def(
          "hand", [](BatchRing& r, int slot) { Check(r.Hand(slot)); },
          py::arg("slot"), "The claimed slot's batch is complete.")
      .def(
          "unclaim", [](BatchRing& r, int slot) { Check(r.Unclaim(slot)); },
          py::arg("slot"), "The claimed slot was not filled after all.")
      .def(
          "adopt",
          [](BatchRing& r, int slot, uint32_t generation, uint64_t nbytes) {
            return Check(r.Adopt(slot, generation, nbytes));
          },
          py::arg("slot"), py::arg("generation"), py::arg("nbytes"),
          "A DLPack capsule (uint8) over a handed slot; the slot is free "
          "again when the last tensor over it dies. Raises for a stale "
          "handle.");
}
