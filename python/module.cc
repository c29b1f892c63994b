// knapformer._C: the C++ behind the `knapformer` Python package. Load it
// through `import knapformer`, which imports torch first (the module uses
// torch's pybind11 types).
#include "python/bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "knapformer's C++ core (planner, planner service, SequenceBalancer)";
  knapformer::python::BindPlanner(m);
  knapformer::python::BindServer(m);
  knapformer::python::BindBalancer(m);
}
