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

}  // namespace python
}  // namespace knapformer

#endif  // KNAPFORMER_PYTHON_BINDINGS_H_
