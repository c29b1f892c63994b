#ifndef KNAPFORMER_PYTHON_STATUS_EXCEPTION_H_
#define KNAPFORMER_PYTHON_STATUS_EXCEPTION_H_

// How a C++ error reaches Python: InvalidArgument and OutOfRange (the
// caller's input) raise ValueError with the status message, every other code
// RuntimeError with the code's name in front ("RESOURCE_EXHAUSTED: ...").

#include <utility>

#include "absl/status/statusor.h"

namespace knapformer {
namespace python {

// Throws the pybind11 exception for `status` unless it is OK.
void ThrowIfError(const absl::Status& status);

template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  ThrowIfError(value.status());
  return *std::move(value);
}

}  // namespace python
}  // namespace knapformer

#endif  // KNAPFORMER_PYTHON_STATUS_EXCEPTION_H_
