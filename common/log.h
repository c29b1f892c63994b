#ifndef KNAPFORMER_COMMON_LOG_H_
#define KNAPFORMER_COMMON_LOG_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace knapformer {

// The one-line stderr log of the service and the client library
// ("2026-11-22T10:00:00.123Z W message"), because Debian's abseil 20220623
// has no absl/log. Thread-safe.
enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// InvalidArgument unless one of debug, info, warning, error.
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name);
void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);
void Log(LogLevel level, absl::string_view message);

}  // namespace knapformer

#endif  // KNAPFORMER_COMMON_LOG_H_
