// How many planner replicas a gRPC target names (per-rank mode refuses more
// than one), and which targets can never reach a planner.
#include "client/planner_target.h"

#include "gmock/gmock.h"
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

TEST(PlannerTargetTest, EveryFormGrpcResolvesIsAccepted) {
  for (const char* target :
       {"127.0.0.1:50051", "localhost:50051", "planner.ns.svc.cluster.local:50051",
        "[::1]:50051", "dns:///planner:50051", "dns://8.8.8.8/planner:50051", "dns:/planner:1",
        "ipv4:127.0.0.1:5001,127.0.0.1:5002", "ipv4:///127.0.0.1:5001", "ipv6:[::1]:5001",
        "unix:/tmp/planner.sock", "unix-abstract:planner",
        // Resolves later, or never: the client plans locally meanwhile.
        "no-such-planner:50051", "planner.invalid:65535"}) {
    EXPECT_TRUE(CheckPlannerTarget(target).ok()) << target << ": " << CheckPlannerTarget(target);
  }
}

TEST(PlannerTargetTest, ATargetThatCanNeverWorkNamesWhyAndTheFormsExpected) {
  const std::pair<const char*, const char*> refused[] = {
      {"http://127.0.0.1:50051", "is a URL of scheme 'http', which gRPC does not resolve"},
      {"https://planner:443", "is a URL of scheme 'https'"},
      {"grpc://planner:50051", "is a URL of scheme 'grpc'"},
      {"127.0.0.1", "has no port (gRPC would try 443)"},
      {"planner", "has no port"},
      {"dns:///planner", "has no port"},
      {"planner:", "has port '', not a number in 1..65535"},
      {"planner:0", "has port '0'"},
      {"planner:65536", "has port '65536'"},
      {"planner:50051x", "has port '50051x'"},
      {"planner:+80", "has port '+80'"},
      {":50051", "has no host"},
      {"::1:50051", "is an IPv6 address without brackets"},
      {"[::1]", "has no port"},
      {"[::1:50051", "has no ']' after its '['"},
      {"ipv4:", "lists no address"},
      {"ipv4:127.0.0.1", "has no port"},
      {"unix:", "names no socket"},
      {"", "is empty"},
  };
  for (const auto& [target, why] : refused) {
    const absl::Status status = CheckPlannerTarget(target);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << target;
    EXPECT_THAT(std::string(status.message()),
                ::testing::HasSubstr(std::string("planner_address: '") + target + "' " + why))
        << target;
    EXPECT_THAT(std::string(status.message()),
                ::testing::HasSubstr("a planner address is host:port (e.g. 127.0.0.1:50051"))
        << target;
  }
}

// Where a token may go without TLS: loopback and unix sockets only, by
// what the target says (a name is not resolved: what it resolves to can
// change).
TEST(PlannerTargetTest, OnlyLoopbackAndUnixSocketsAreLocal) {
  for (const char* local :
       {"127.0.0.1:50051", "127.8.9.10:1", "localhost:50051", "LOCALHOST:1", "[::1]:50051",
        "[::ffff:127.0.0.1]:1", "dns:///localhost:50051", "dns:///127.0.0.1:1",
        "ipv4:127.0.0.1:1,127.0.0.2:2", "ipv6:[::1]:1", "unix:/run/planner.sock",
        "unix-abstract:planner"}) {
    EXPECT_TRUE(PlannerTargetIsLocal(local)) << local;
  }
  for (const char* remote :
       {"10.0.0.1:50051", "0.0.0.0:50051", "planner.ns.svc:50051", "dns:///planner:1",
        "ipv4:127.0.0.1:1,10.0.0.2:2", "[::]:1", "[2001:db8::1]:1", "xds:///planner",
        "localhost.example.com:1"}) {
    EXPECT_FALSE(PlannerTargetIsLocal(remote)) << remote;
  }
}

}  // namespace
}  // namespace knapformer
