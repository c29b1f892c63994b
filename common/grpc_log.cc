#include "common/grpc_log.h"

#include <grpc/support/log.h>

#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/log.h"

namespace knapformer {
namespace {

void ToLog(gpr_log_func_args* args) {
  const LogLevel level =
      args->severity == GPR_LOG_SEVERITY_ERROR ? LogLevel::kWarning : LogLevel::kDebug;
  if (!LogEnabled(level)) return;
  absl::string_view file = args->file != nullptr ? args->file : "";
  if (const size_t slash = file.rfind('/'); slash != absl::string_view::npos) {
    file.remove_prefix(slash + 1);
  }
  Log(level, absl::StrCat("grpc: ", args->message != nullptr ? args->message : "", " (", file,
                          ":", args->line, ")"));
}

}  // namespace

void RouteGrpcLogsToLog() {
  static std::once_flag once;
  std::call_once(once, [] { gpr_set_log_function(&ToLog); });
}

}  // namespace knapformer
