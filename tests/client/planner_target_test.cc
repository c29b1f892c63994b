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
  EXPECT_EQ(PlannerTargetReplicas("dns:/127.0.0.1:50051"), 1);
  // Numeric addresses resolve without a query: one of each family is one
  // dual-stack planner, not two.
  EXPECT_EQ(PlannerTargetReplicas("192.0.2.7:50051"), 1);
  EXPECT_EQ(PlannerTargetReplicas("[2001:db8::7]:50051"), 1);
  // 127.0.0.1 and ::1 where both are configured: one machine.
  EXPECT_EQ(PlannerTargetReplicas("localhost:50051"), 1);
  EXPECT_EQ(PlannerTargetReplicas("dns:///localhost:50051"), 1);
  EXPECT_EQ(PlannerTargetReplicas("unix:/tmp/planner.sock"), 1);
  EXPECT_EQ(PlannerTargetReplicas("unix-abstract:planner"), 1);
}

TEST(PlannerTargetTest, ResolvedAddressesCountPerFamily) {
  EXPECT_EQ(PlannerAddressReplicas({"10.0.0.1", "10.0.0.2", "10.0.0.3"}), 3);
  EXPECT_EQ(PlannerAddressReplicas({"10.0.0.1", "2001:db8::1"}), 1);  // dual stack
  EXPECT_EQ(PlannerAddressReplicas({"10.0.0.1", "10.0.0.2", "2001:db8::1", "2001:db8::2"}), 2);
  EXPECT_EQ(PlannerAddressReplicas({"2001:db8::1", "2001:db8::2", "2001:db8::3"}), 3);
  EXPECT_EQ(PlannerAddressReplicas({"10.0.0.1", "10.0.0.1"}), 1);
  EXPECT_EQ(PlannerAddressReplicas({"127.0.0.1", "::1"}), 1);
  EXPECT_EQ(PlannerAddressReplicas({"127.0.0.1", "127.0.0.2"}), 1);  // all loopback
  EXPECT_EQ(PlannerAddressReplicas({"127.0.0.1", "10.0.0.1"}), 2);
  EXPECT_EQ(PlannerAddressReplicas({}), 1);
}

TEST(PlannerTargetTest, ANameThatDoesNotResolveCountsOne) {
  // .invalid never resolves (RFC 2606); the channel will report it.
  EXPECT_EQ(PlannerTargetReplicas("planner.invalid:50051"), 1);
  EXPECT_EQ(PlannerTargetReplicas("dns:///planner.invalid:50051"), 1);
}

}  // namespace
}  // namespace knapformer
