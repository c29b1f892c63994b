#ifndef KNAPFORMER_TESTS_SERVER_TEST_SERVER_H_
#define KNAPFORMER_TESTS_SERVER_TEST_SERVER_H_

// An in-process planner server for tests (apart from service_test_util,
// which tests that talk to a `knapformer serve` process link without the
// server).

#include <cstdint>
#include <memory>

#include "server/planner_server.h"

namespace knapformer {
namespace testing_util {

// A server on a free port of 127.0.0.1 (no metrics), 2 solver threads, a
// 20 s rendezvous timeout.
PlannerServerOptions TestOptions();
// The started server, or null after a test failure naming the error.
std::unique_ptr<PlannerServer> StartServer(const PlannerServerOptions& options = TestOptions());
// Waits (bounded) until the server holds `steps` pending steps, so that an
// asynchronous call is known to have arrived before the test goes on; a
// test failure if it does not.
void AwaitPendingSteps(PlannerServer& server, int32_t steps);

}  // namespace testing_util
}  // namespace knapformer

#endif  // KNAPFORMER_TESTS_SERVER_TEST_SERVER_H_
