#include "server/tenant_quota.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;

TenantQuota::Limits Limits() {
  TenantQuota::Limits limits;
  limits.total = 16;
  limits.per_tenant = 8;
  limits.per_job = 5;
  limits.reserve = 2;
  return limits;
}

TEST(TenantQuotaTest, AJobAndATenantHoldTheirSharesAndAllHoldTheLimit) {
  TenantQuota quota("max_things", "things", Limits());
  ASSERT_TRUE(quota.Take("a/", "a/1", 4).ok());
  absl::Status refused = quota.Take("a/", "a/1", 2);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("max_things_per_job: job 'a/1' holds 4 things, and 2 "
                                           "more would pass its limit of 5"));
  EXPECT_EQ(quota.held_by_job("a/1"), 4);  // a refusal takes nothing
  // A second job of the same tenant: the tenant's share, not twice the job's.
  ASSERT_TRUE(quota.Take("a/", "a/2", 4).ok());
  refused = quota.Take("a/", "a/2", 1);
  EXPECT_THAT(refused.message(), HasSubstr("max_things_per_tenant: tenant 'a/' (its jobs "
                                           "together) holds 8 things, and 1 more would pass its "
                                           "limit of 8"));
  ASSERT_TRUE(quota.Take("b", "b", 5).ok());
  ASSERT_TRUE(quota.Take("c", "c", 2).ok());  // c within its reserve: the last of the total
  ASSERT_TRUE(quota.Take("d", "d", 1).ok());
  refused = quota.Take("e", "e", 1);
  EXPECT_THAT(refused.message(),
              HasSubstr("max_things: all tenants hold 16 things, and 1 more would pass the "
                        "server's limit of 16"));
  quota.Give("a/", "a/1", 4);
  quota.Give("a/", "a/2", 4);
  quota.Give("b", "b", 5);
  quota.Give("c", "c", 2);
  quota.Give("d", "d", 1);
  EXPECT_EQ(quota.held(), 0);
  EXPECT_EQ(quota.held_by_tenant("a/"), 0);
  EXPECT_EQ(quota.held_by_job("b"), 0);
}

TEST(TenantQuotaTest, ATenantPastItsReserveLeavesTheLastOfTheLimitToOthers) {
  TenantQuota quota("max_things", "things", Limits());
  ASSERT_TRUE(quota.Take("a/", "a/1", 5).ok());
  ASSERT_TRUE(quota.Take("a/", "a/2", 3).ok());
  ASSERT_TRUE(quota.Take("b/", "b/1", 5).ok());
  // 13 held: b past its reserve may reach 14 (the total less the reserve), not 15.
  ASSERT_TRUE(quota.Take("b/", "b/2", 1).ok());
  const absl::Status refused = quota.Take("b/", "b/2", 1);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(),
              HasSubstr("tenant 'b/' would hold 7, past its reserve of 2, and the last 2 of the "
                        "server's 16 stay for tenants holding less"));
  // A tenant holding nothing still gets its reserve.
  EXPECT_TRUE(quota.Take("c/", "c/1", 2).ok());
  EXPECT_EQ(quota.held(), 16);
}

}  // namespace
}  // namespace knapformer
