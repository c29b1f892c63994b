#ifndef KNAPFORMER_PYTHON_BINDINGS_H_
#define KNAPFORMER_PYTHON_BINDINGS_H_

// The parts of the knapformer._C extension module, one per file so that only
// the balancer's translation unit pays for torch's Python headers.

#include <pybind11/pybind11.h>

namespace knapformer {
namespace python {

void BindPlanner(pybind11::module_& m);   // planner_binding.cc
void BindServer(pybind11::module_& m);    // server_binding.cc
void BindBalancer(pybind11::module_& m);  // balancer_binding.cc
void BindNccl(pybind11::module_& m);      // nccl_binding.cc (raw NCCL, CUDA builds)

// Whether this thread holds the GIL of a running (not finalizing)
// interpreter, and so may let go of it to destroy something. Python 3.13
// made Py_IsFinalizing public and dropped _Py_IsFinalizing.
inline bool HoldsReleasableGil() {
#if PY_VERSION_HEX >= 0x030D0000
  const bool finalizing = Py_IsFinalizing();
#else
  const bool finalizing = _Py_IsFinalizing();
#endif
  return Py_IsInitialized() && !finalizing && PyGILState_Check();
}

}  // namespace python
}  // namespace knapformer

#endif  // KNAPFORMER_PYTHON_BINDINGS_H_
