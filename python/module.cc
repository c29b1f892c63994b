// knapformer._C: the C++ behind the `knapformer` Python package. Load it
// through `import knapformer`, which imports torch first (the module uses
// torch's pybind11 types).
#include "python/bindings.h"

#ifndef KNAPFORMER_BUILT_TORCH_VERSION
#define KNAPFORMER_BUILT_TORCH_VERSION "unknown"
#endif

PYBIND11_MODULE(_C, m) {
  m.doc() = "knapformer's C++ core (planner, planner service, SequenceBalancer)";
  knapformer::python::BindPlanner(m);
  knapformer::python::BindServer(m);
  knapformer::python::BindBalancer(m);
  knapformer::python::BindNccl(m);
  // torch.__version__ of the torch this module was built against; the
  // package refuses another major.minor on import (python/knapformer).
  m.attr("__torch_version__") = KNAPFORMER_BUILT_TORCH_VERSION;
}
