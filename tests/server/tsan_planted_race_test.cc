// The TSan lane's suppressions (tests/tsan_suppressions.txt) must still let
// a race in our own gRPC handlers be reported. This test plants one: a
// callback service whose GetJob increments a plain counter, called twice
// at once. It runs that in a child process (this binary again) under the
// lane's TSAN_OPTIONS and expects TSan's report naming the handler; a
// suppression that matches any stack with a gRPC frame (`race:libgrpc.so`)
// hides it, and this test then fails. Without TSan it skips.
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/tsan_handoff.h"  // KNAPFORMER_HAVE_TSAN
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "knapformer/v1/planner.grpc.pb.h"
#include "tests/server/service_test_util.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;

constexpr char kChildVariable[] = "KNAPFORMER_PLANTED_RACE_CHILD";

// The planted race: calls_ is read and written by every handler, unguarded.
class RacyPlanner final : public v1::Planner::CallbackService {
 public:
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* /*request*/,
                                   v1::JobState* /*response*/) override {
    const int64_t seen = calls_;
    absl::SleepFor(absl::Milliseconds(50));  // both calls in the handler at once
    calls_ = seen + 1;
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  int64_t calls_ = 0;
};

// In the child: two concurrent GetJob calls to a RacyPlanner.
TEST(PlantedRaceChild, TwoConcurrentCalls) {
  if (std::getenv(kChildVariable) == nullptr) GTEST_SKIP() << "run by PlantedRace only";
  RacyPlanner service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto call = [port] {
    auto stub = v1::Planner::NewStub(testing_util::LocalChannel(port));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::GetJobRequest request;
    v1::JobState state;
    EXPECT_TRUE(stub->GetJob(&context, request, &state).ok());
  };
  std::thread first(call), second(call);
  first.join();
  second.join();
  server->Shutdown();
}

TEST(PlantedRace, ARaceInAHandlerIsReported) {
#ifndef KNAPFORMER_HAVE_TSAN
  GTEST_SKIP() << "built without ThreadSanitizer (the TSan lane runs it)";
#else
  if (std::getenv(kChildVariable) != nullptr) GTEST_SKIP() << "the child runs the other test";
  const char* options = std::getenv("TSAN_OPTIONS");
  ASSERT_NE(options, nullptr) << "TSAN_OPTIONS with the lane's suppressions is not set";
  ASSERT_THAT(std::string(options), HasSubstr("suppressions=")) << options;
  std::string output;
  const int status = testing_util::RunWithInput(
      absl::StrCat(kChildVariable, "=1 /proc/", getpid(),
                   "/exe --gtest_filter=PlantedRaceChild.TwoConcurrentCalls"),
      "", &output);
  EXPECT_NE(status, 0) << "the child found no race:\n" << output;
  EXPECT_THAT(output, HasSubstr("WARNING: ThreadSanitizer: data race")) << output;
  EXPECT_THAT(output, HasSubstr("RacyPlanner::GetJob")) << output;
#endif
}

}  // namespace
}  // namespace knapformer
