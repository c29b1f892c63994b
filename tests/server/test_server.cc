#include "tests/server/test_server.h"

#include <utility>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace knapformer {
namespace testing_util {

PlannerServerOptions TestOptions() {
  PlannerServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.service.solver_threads = 2;
  options.service.limits.rendezvous_timeout = absl::Seconds(20);
  return options;
}

std::unique_ptr<PlannerServer> StartServer(const PlannerServerOptions& options) {
  auto server = PlannerServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

void AwaitPendingSteps(PlannerServer& server, int32_t steps) {
  const absl::Time limit = absl::Now() + absl::Seconds(10);
  while (server.service().rendezvous().pending_steps() != steps && absl::Now() < limit) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_EQ(server.service().rendezvous().pending_steps(), steps);
}

}  // namespace testing_util
}  // namespace knapformer
