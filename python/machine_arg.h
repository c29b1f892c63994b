#ifndef KNAPFORMER_PYTHON_MACHINE_ARG_H_
#define KNAPFORMER_PYTHON_MACHINE_ARG_H_

#include <pybind11/pybind11.h>

#include "planner/machine.h"

namespace knapformer {
namespace python {

// The `machine=` argument of the Python API: a dict with any of Machine's
// fields by name (flops_per_second, intra_node_bytes_per_second,
// inter_node_bytes_per_second, gpus_per_node, element_bytes,
// blocks_per_route); a field left out keeps its default (an H100 node,
// planner/machine.h). Raises ValueError naming `machine.<key>` for an
// unknown key, a value of the wrong type or one CheckMachine refuses.
Machine MachineFromDict(const pybind11::dict& fields);

// All six fields by name.
pybind11::dict MachineToDict(const Machine& machine);

}  // namespace python
}  // namespace knapformer

#endif  // KNAPFORMER_PYTHON_MACHINE_ARG_H_
