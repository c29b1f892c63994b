#ifndef KNAPFORMER_COMMON_PEM_FILE_H_
#define KNAPFORMER_COMMON_PEM_FILE_H_

// PEM files (TLS certificates and keys), read the one way the planner
// service and its clients both check them.

#include <string>

#include "absl/status/statusor.h"

namespace knapformer {

// The text of the PEM file at `path`; InvalidArgument naming `field` (the
// flag or option that gave it) when it cannot be read or holds no PEM block.
absl::StatusOr<std::string> ReadPemFile(const std::string& field, const std::string& path);

}  // namespace knapformer

#endif  // KNAPFORMER_COMMON_PEM_FILE_H_
