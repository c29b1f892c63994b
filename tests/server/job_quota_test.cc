#include "server/job_quota.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;

TEST(JobQuotaTest, EachJobHoldsItsShareAndAllHoldTheLimit) {
  JobQuota quota("max_things", "things", /*limit=*/10, /*per_job_limit=*/4);
  ASSERT_TRUE(quota.Take("a", 3).ok());
  absl::Status refused = quota.Take("a", 2);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("max_things_per_job: this job holds 3 things, and 2 "
                                           "more would pass its limit of 4"));
  EXPECT_EQ(quota.held_by("a"), 3);  // a refusal takes nothing
  ASSERT_TRUE(quota.Take("b", 4).ok());
  ASSERT_TRUE(quota.Take("c", 3).ok());
  refused = quota.Take("d", 1);
  EXPECT_THAT(refused.message(),
              HasSubstr("max_things: all jobs hold 10 things, and 1 more would pass the "
                        "server's limit of 10"));
  quota.Give("b", 4);
  EXPECT_TRUE(quota.Take("d", 1).ok());
  EXPECT_EQ(quota.held(), 7);
  quota.Give("a", 3);
  quota.Give("c", 3);
  quota.Give("d", 1);
  EXPECT_EQ(quota.held(), 0);
  EXPECT_EQ(quota.held_by("a"), 0);
}

}  // namespace
}  // namespace knapformer
