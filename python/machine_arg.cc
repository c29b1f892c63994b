#include "python/machine_arg.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "python/status_exception.h"

namespace knapformer {
namespace python {

namespace py = pybind11;

namespace {

absl::Status WrongType(const std::string& key, const py::handle& value, const char* wanted) {
  return absl::InvalidArgumentError(absl::StrCat("machine.", key, ": needs ", wanted, ", got ",
                                                 std::string(py::repr(value))));
}

}  // namespace

Machine MachineFromDict(const py::dict& fields) {
  Machine machine;
  for (const auto& [key_handle, value] : fields) {
    if (!py::isinstance<py::str>(key_handle)) {
      ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
          "machine: keys are field names, got ", std::string(py::repr(key_handle)))));
    }
    const std::string key = key_handle.cast<std::string>();
    const MachineField member = FieldOfMachine(machine, key);
    const bool is_bool = py::isinstance<py::bool_>(value);
    if (member.rate != nullptr) {
      if (is_bool || !(py::isinstance<py::int_>(value) || py::isinstance<py::float_>(value))) {
        ThrowIfError(WrongType(key, value, "a number"));
      }
      *member.rate = value.cast<double>();
    } else if (member.count != nullptr) {
      if (is_bool || !py::isinstance<py::int_>(value)) ThrowIfError(WrongType(key, value, "an int"));
      int overflow = 0;
      const long long wide = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
      if (overflow != 0 || wide > INT32_MAX || wide < INT32_MIN) {
        ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
            "machine.", key, ": ", std::string(py::repr(value)), " is not a 32-bit integer")));
      }
      *member.count = static_cast<int32_t>(wide);
    } else {
      ThrowIfError(absl::InvalidArgumentError(
          absl::StrCat("machine.", key, ": unknown field (expected ", kMachineFieldNames, ")")));
    }
  }
  ThrowIfError(CheckMachine(machine, "machine"));
  return machine;
}

py::dict MachineToDict(const Machine& machine) {
  py::dict fields;
  fields["flops_per_second"] = machine.flops_per_second;
  fields["intra_node_bytes_per_second"] = machine.intra_node_bytes_per_second;
  fields["inter_node_bytes_per_second"] = machine.inter_node_bytes_per_second;
  fields["gpus_per_node"] = machine.gpus_per_node;
  fields["element_bytes"] = machine.element_bytes;
  fields["blocks_per_route"] = machine.blocks_per_route;
  return fields;
}

}  // namespace python
}  // namespace knapformer
