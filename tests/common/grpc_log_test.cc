// gRPC's own log lines through the project's log: its format and its level.
#include "common/grpc_log.h"

#include <grpc/support/log.h>

#include <string>

#include "common/log.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knapformer {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Logged(gpr_log_severity severity, const char* message) {
  testing::internal::CaptureStderr();
  gpr_log(__FILE__, __LINE__, severity, "%s", message);
  return testing::internal::GetCapturedStderr();
}

TEST(GrpcLogTest, GrpcErrorsAreWarningsInTheLogsFormatAndItsLevelSilencesThem) {
  gpr_log_verbosity_init();  // as grpc_init does: GRPC_VERBOSITY, errors only by default
  RouteGrpcLogsToLog();
  RouteGrpcLogsToLog();  // once for the process
  SetLogLevel(LogLevel::kInfo);
  EXPECT_THAT(Logged(GPR_LOG_SEVERITY_ERROR, "Handshake failed"),
              ContainsRegex("^[0-9T:.-]+Z W grpc: Handshake failed \\(grpc_log_test.cc:[0-9]+\\)\n$"));
  SetLogLevel(LogLevel::kError);
  EXPECT_EQ(Logged(GPR_LOG_SEVERITY_ERROR, "Handshake failed"), "");
  // Info lines (printed only under GRPC_VERBOSITY=info) are debug lines.
  gpr_set_log_verbosity(GPR_LOG_SEVERITY_DEBUG);
  SetLogLevel(LogLevel::kInfo);
  EXPECT_THAT(Logged(GPR_LOG_SEVERITY_INFO, "subchannel connecting"), Not(HasSubstr("grpc:")));
  SetLogLevel(LogLevel::kDebug);
  EXPECT_THAT(Logged(GPR_LOG_SEVERITY_INFO, "subchannel connecting"),
              HasSubstr(" D grpc: subchannel connecting ("));
  SetLogLevel(LogLevel::kInfo);
}

}  // namespace
}  // namespace knapformer
