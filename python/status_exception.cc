#include "python/status_exception.h"

#include <string>

#include <pybind11/pybind11.h>

#include "absl/strings/str_cat.h"

namespace knapformer {
namespace python {

void ThrowIfError(const absl::Status& status) {
  if (status.ok()) return;
  const std::string message(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      throw pybind11::value_error(message);
    default:
      throw std::runtime_error(absl::StrCat(absl::StatusCodeToString(status.code()), ": ", message));
  }
}

}  // namespace python
}  // namespace knapformer
