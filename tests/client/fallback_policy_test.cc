// Steps planned locally while a service is configured are counted, and rank
// 0 says so again as they add up (a mistyped or unreachable address must not
// go quiet after its first warning).
#include "client/fallback_policy.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(FallbackPolicyTest, RankZeroWarnsAtTheTenthLocalStepAndEveryHundredth) {
  FallbackPolicy policy("no-such-planner:50051", /*rank=*/0, /*group_mode=*/true);
  policy.set_local_reason("DNS resolution failed for no-such-planner:50051");
  testing::internal::CaptureStderr();
  for (uint64_t step = 0; step < 9; ++step) policy.CountLocalStep(step);
  const std::string quiet = testing::internal::GetCapturedStderr();
  EXPECT_EQ(Count(quiet, "planned locally so far"), 0) << quiet;

  testing::internal::CaptureStderr();
  for (uint64_t step = 9; step < 200; ++step) policy.CountLocalStep(step);
  const std::string warned = testing::internal::GetCapturedStderr();
  EXPECT_EQ(Count(warned, "planned locally so far"), 3) << warned;  // at 10, 100 and 200
  EXPECT_THAT(warned, HasSubstr("rank 0: 10 steps planned locally so far, step 9 included, "
                                "although the planner service at no-such-planner:50051 is "
                                "configured (last reason: DNS resolution failed"));
  EXPECT_EQ(policy.local_steps(), 200);
}

TEST(FallbackPolicyTest, OtherRanksCountButDoNotWarn) {
  FallbackPolicy policy("no-such-planner:50051", /*rank=*/3, /*group_mode=*/false);
  testing::internal::CaptureStderr();
  for (uint64_t step = 0; step < 100; ++step) policy.CountLocalStep(step);
  EXPECT_EQ(Count(testing::internal::GetCapturedStderr(), "planned locally so far"), 0);
  EXPECT_EQ(policy.local_steps(), 100);
}

}  // namespace
}  // namespace knapformer
