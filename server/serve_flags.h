#ifndef KNAPFORMER_SERVER_SERVE_FLAGS_H_
#define KNAPFORMER_SERVER_SERVE_FLAGS_H_

// `knapformer serve`'s flags, declared once for the planner process
// (tools/serve.h) and for the planner embedded in another process
// (server/embedded_planner.h).

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "server/planner_server.h"

namespace knapformer {

// `knapformer serve`'s usage text (--help): its flags and their defaults.
std::string ServeUsage();

struct ServeConfig {
  PlannerServerOptions server;
  LogLevel log_level = LogLevel::kInfo;
  absl::Duration shutdown_grace = absl::Seconds(5);
  // Written with "<grpc port> <metrics port>\n" once serving (and
  // " <health port>" before the newline with --health-listen).
  std::string port_file;
  // glibc malloc keeps freed memory for the next plan (common/malloc_policy.h).
  bool retain_freed_memory = true;
};

// InvalidArgument naming the flag for a bad value.
absl::StatusOr<ServeConfig> ParseServeArgs(const std::vector<std::string>& argv);

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_SERVE_FLAGS_H_
