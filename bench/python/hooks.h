// The benchmark hooks compiled into the build tree's binding
// (bench/python/hooks.cc).
#ifndef SHMTENSOR_BENCH_PYTHON_HOOKS_H_
#define SHMTENSOR_BENCH_PYTHON_HOOKS_H_

#include <pybind11/pybind11.h>

namespace shmtensor::python {

// Adds CppClient to `m` (shmtensor._core._bench).
void AddBenchHooks(pybind11::module_& m);

}  // namespace shmtensor::python

#endif  // SHMTENSOR_BENCH_PYTHON_HOOKS_H_
