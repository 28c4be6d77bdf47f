// shmtensor._core._bench: the C++ client driven from Python, for
// bench/python/python_bench.py to measure the binding against. Compiled
// into the build tree's binding only when the benchmarks are built
// (SHMTENSOR_BUILD_BENCH; a pip-built package never has it). In _core, not
// a module of its own: a second copy of the client would register the
// generated protos with libprotobuf a second time, which aborts.
//
// CppClient(address) is a C++ Client of its own in this process (a session
// beside the Python client's, on the same daemon). Its calls release the
// GIL while they run.
#include "bench/python/hooks.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <ctime>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "shmtensor/client.h"

namespace py = pybind11;
using shmtensor::Buffer;
using shmtensor::Client;
using shmtensor::DType;
using shmtensor::SealedRef;
using shmtensor::View;

namespace {

template <typename T>
T Check(absl::StatusOr<T> v) {
  if (!v.ok()) throw std::runtime_error(v.status().ToString());
  return *std::move(v);
}

double ThreadCpuUs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

void CheckFirstFloat(const View& v) {
  if (static_cast<const float*>(v.data())[0] != 1.0f) {
    throw std::runtime_error("bytes differ");
  }
}

class CppClient {
 public:
  explicit CppClient(const std::string& address)
      : client_(Check(Client::Connect(
            {.address = address, .client_name = "bench-hooks"}))) {}

  // `count` lifecycles back to back, as a C++ program would run them, the
  // same steps as python_bench.py's Python loop. Returns the thread CPU
  // time they took, in microseconds (0 when not `timed`: reading that
  // clock is a system call).
  double Lifecycles(int64_t nbytes, int count, bool timed) {
    py::gil_scoped_release release;
    const double t0 = timed ? ThreadCpuUs() : 0;
    for (int i = 0; i < count; ++i) {
      Buffer buf = Check(
          client_.Create({.dtype = DType::kFloat32, .shape = {nbytes / 4}}));
      static_cast<float*>(buf.data())[0] = 1.0f;
      SealedRef ref = Check(buf.Seal());
      CheckFirstFloat(Check(client_.Get(ref.ref())));
    }  // The view, then the ref, release as they go out of scope.
    return timed ? ThreadCpuUs() - t0 : 0;
  }

  // Wall microseconds of `count` Gets of an object this client holds a
  // view of (each a share of its lease), one by one: a list.
  static constexpr int kHeldBlock = 1000;
  // Per get, in µs, for each of `count` blocks of kHeldBlock gets of an
  // object this client holds a view of.
  std::vector<double> GetsOfHeld(int64_t nbytes, int count) {
    py::gil_scoped_release release;
    std::vector<uint8_t> src(nbytes, 1);
    SealedRef ref = Check(
        client_.Put(src.data(), {.size_bytes = static_cast<uint64_t>(nbytes)}));
    View first = Check(client_.Get(ref.ref()));
    // Blocks of kHeldBlock gets, each view dropped at once, as the Python
    // side times them: the timer's cost spread over the block.
    std::vector<double> out;
    out.reserve(count);
    for (int i = 0; i < count; ++i) {
      const absl::Time t0 = absl::Now();
      for (int k = 0; k < kHeldBlock; ++k) {
        View v = Check(client_.Get(ref.ref()));
      }
      out.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0) / kHeldBlock);
    }
    return out;
  }

  // One lifecycle. Returns (wall us, [thread CPU us of each step: nothing
  // (the timer's own cost), create, fill, seal, get, read, release view,
  // release ref]).
  py::tuple Lifecycle(int64_t nbytes) {
    std::vector<double> steps;
    absl::Duration wall;
    {
      py::gil_scoped_release release;
      double t = ThreadCpuUs();
      auto step = [&] {
        const double now = ThreadCpuUs();
        steps.push_back(now - t);
        t = now;
      };
      const absl::Time t0 = absl::Now();
      step();
      Buffer buf = Check(
          client_.Create({.dtype = DType::kFloat32, .shape = {nbytes / 4}}));
      step();
      static_cast<float*>(buf.data())[0] = 1.0f;
      step();
      SealedRef ref = Check(buf.Seal());
      step();
      std::optional<View> v(Check(client_.Get(ref.ref())));
      step();
      CheckFirstFloat(*v);
      step();
      v.reset();
      step();
      ref.Reset();
      step();
      wall = absl::Now() - t0;
    }
    return py::make_tuple(absl::ToDoubleMicroseconds(wall), steps);
  }

 private:
  Client client_;
};

}  // namespace

namespace shmtensor::python {

void AddBenchHooks(py::module_& m) {
  m.doc() = "The C++ client, for bench/python/python_bench.py.";
  py::class_<CppClient>(m, "CppClient")
      .def(py::init<const std::string&>(), py::arg("address"))
      .def("lifecycles", &CppClient::Lifecycles, py::arg("nbytes"),
           py::arg("count"), py::arg("timed") = true)
      .def("lifecycle", &CppClient::Lifecycle, py::arg("nbytes"))
      .def("gets_of_held", &CppClient::GetsOfHeld, py::arg("nbytes"),
           py::arg("count"));
}

}  // namespace shmtensor::python
