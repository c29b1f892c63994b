// How many planner replicas a gRPC target names (per-rank mode refuses more
// than one).
#include "client/planner_target.h"

#include "gtest/gtest.h"

namespace knapformer {
namespace {

TEST(PlannerTargetTest, AddressListsCountTheirDistinctAddresses) {
  EXPECT_EQ(PlannerTargetReplicas("ipv4:127.0.0.1:5001,127.0.0.1:5002,127.0.0.1:5003"), 3);
  EXPECT_EQ(PlannerTargetReplicas("ipv4:127.0.0.1:5001,127.0.0.1:5001"), 1);
  EXPECT_EQ(PlannerTargetReplicas("ipv4:127.0.0.1:5001"), 1);
  EXPECT_EQ(PlannerTargetReplicas("ipv4:///127.0.0.1:5001,127.0.0.1:5002"), 2);
  EXPECT_EQ(PlannerTargetReplicas("ipv6:[::1]:5001,[::1]:5002"), 2);
}

TEST(PlannerTargetTest, OneHostIsOnePlannerHoweverItIsWritten) {
  EXPECT_EQ(PlannerTargetReplicas("127.0.0.1:50051"), 1);
  EXPECT_EQ(PlannerTargetReplicas("[::1]:50051"), 1);
  EXPECT_EQ(PlannerTargetReplicas("dns:///127.0.0.1:50051"), 1);
  EXPECT_EQ(PlannerTargetReplicas("dns://8.8.8.8/127.0.0.1:50051"), 1);
  // 127.0.0.1 and ::1 where both are configured: one machine.
  EXPECT_EQ(PlannerTargetReplicas("localhost:50051"), 1);
  EXPECT_EQ(PlannerTargetReplicas("dns:///localhost:50051"), 1);
  EXPECT_EQ(PlannerTargetReplicas("unix:/tmp/planner.sock"), 1);
  EXPECT_EQ(PlannerTargetReplicas("unix-abstract:planner"), 1);
}

TEST(PlannerTargetTest, ANameThatDoesNotResolveCountsOne) {
  // .invalid never resolves (RFC 2606); the channel will report it.
  EXPECT_EQ(PlannerTargetReplicas("planner.invalid:50051"), 1);
  EXPECT_EQ(PlannerTargetReplicas("dns:///planner.invalid:50051"), 1);
}

}  // namespace
}  // namespace knapformer
