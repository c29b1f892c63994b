#ifndef KNAPFORMER_COMMON_PEM_FILE_H_
#define KNAPFORMER_COMMON_PEM_FILE_H_

// PEM files (TLS certificates and keys) that gRPC's file watcher reads and
// rereads: checked the one way the planner service and its clients both
// check them, for a clear error when they start.

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace knapformer {

// Ok when every named file can be read and holds a PEM block (an empty path
// is skipped); else InvalidArgument naming the first bad one's field (the
// flag or option that gave it) and path.
absl::Status CheckPemFiles(
    const std::vector<std::pair<std::string, std::string>>& fields_and_paths);

// The whole seconds, at least 1, that gRPC's FileWatcherCertificateProvider
// takes for `interval`.
unsigned int PemRefreshSeconds(absl::Duration interval);

}  // namespace knapformer

#endif  // KNAPFORMER_COMMON_PEM_FILE_H_
