#include "common/log.h"

#include <atomic>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace knapformer {
namespace {

std::atomic<int> min_level{static_cast<int>(LogLevel::kInfo)};

}  // namespace

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "info") return LogLevel::kInfo;
  if (name == "warning") return LogLevel::kWarning;
  if (name == "error") return LogLevel::kError;
  return absl::InvalidArgumentError(absl::StrCat(
      "--log-level: must be one of debug, info, warning, error; got '", name, "'"));
}

void SetLogLevel(LogLevel level) { min_level.store(static_cast<int>(level)); }

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= min_level.load(); }

void Log(LogLevel level, absl::string_view message) {
  if (!LogEnabled(level)) return;
  static const char kLetters[] = "DIWE";
  const std::string line =
      absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()),
                   " ", std::string(1, kLetters[static_cast<int>(level)]), " ", message, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);  // one write: lines never interleave
}

}  // namespace knapformer
