// The planner service with topology "auto": answers carry the layout the
// planner chose and its predicted step time, are exactly the planner core's
// BalanceAuto plan (PlanGroup and per-rank Plan alike), and ranks must agree
// on the machine that prices the choice.
#include <map>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "planner/auto_layout.h"
#include "planner/validate.h"
#include "proto/plan_proto.h"
#include "server/planner_server.h"
#include "tests/server/service_test_util.h"
#include "tests/server/test_server.h"

namespace knapformer {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::knapformer::testing_util::AsyncPlan;
using ::knapformer::testing_util::AwaitPendingSteps;
using ::knapformer::testing_util::LocalChannel;
using ::knapformer::testing_util::MakeGroupRequests;
using ::knapformer::testing_util::MakePlanGroupRequest;
using ::knapformer::testing_util::MakeRequest;
using ::knapformer::testing_util::PlanConcurrently;
using ::knapformer::testing_util::PlanResult;
using ::knapformer::testing_util::StartServer;
using ::knapformer::testing_util::StepParams;
using ::testing::HasSubstr;

// 16 ranks as 2 nodes of 8: node 0 holds short sequences only (single-GPU
// bags suit it), node 1 one very long sequence among short ones (it needs a
// multi-GPU bag), so that auto's choice differs between the replicas of
// group=8.
RankLengths TwoKindsOfNode() {
  RankLengths lengths(16);
  for (int r = 0; r < 8; ++r) lengths[r] = {1024, 1024, 512 + 64 * r};
  for (int r = 8; r < 16; ++r) lengths[r] = {256, 128};
  lengths[9].push_back(65536);
  return lengths;
}

StepParams AutoParams() {
  StepParams params;
  params.job_id = "auto-job";
  params.topology = "auto:group=8";
  params.d_model = 3072;
  params.gamma = 0.49;
  return params;
}

AutoPlan CoreAutoPlan(const StepParams& params, const RankLengths& lengths) {
  auto layout = AutoLayout::Parse(params.topology);
  EXPECT_TRUE(layout.ok());
  auto cost = CostModel::Create(params.d_model, params.gamma);
  EXPECT_TRUE(cost.ok());
  auto prices = CommPrices::Create(Machine(), *cost);
  EXPECT_TRUE(prices.ok());
  auto plan = BalanceAuto(*layout, static_cast<int64_t>(lengths.size()), *cost, *prices, lengths);
  EXPECT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(ValidatePlan(plan->plan, plan->world, lengths).ok());
  return *std::move(plan);
}

v1::PlanGroupRequest GroupRequest(const StepParams& params, const RankLengths& lengths) {
  v1::PlanGroupRequest request = MakePlanGroupRequest(params, lengths);
  request.set_include_rank_plans(true);
  return request;
}

TEST(AutoLayoutServiceTest, PlanGroupAnswersTheCoresChoiceAndNamesTheLayout) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  const StepParams params = AutoParams();
  const RankLengths lengths = TwoKindsOfNode();
  const AutoPlan expected = CoreAutoPlan(params, lengths);
  // The replicas chose differently: the layout names both.
  ASSERT_FALSE(expected.world.uniform()) << expected.world.spec();
  ASSERT_NE(expected.world.spec().find(';'), std::string::npos);

  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::PlanGroupResponse response;
  grpc::Status status = stub->PlanGroup(&context, GroupRequest(params, lengths), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.balance().layout(), expected.world.spec());
  ASSERT_EQ(response.chunks().src_rank_size(), static_cast<int>(expected.plan.chunks.size()));
  for (size_t i = 0; i < expected.plan.chunks.size(); ++i) {
    EXPECT_EQ(response.chunks().dst_rank(i), expected.plan.chunks[i].dst_rank);
    EXPECT_EQ(response.chunks().length(i), expected.plan.chunks[i].length);
  }
  EXPECT_DOUBLE_EQ(response.balance().predicted_step_seconds(),
                   expected.predicted.time / Machine().flops_per_second);
  std::map<int32_t, int32_t> gpus_by_size;
  for (int32_t b = 0; b < expected.world.num_replicas(); ++b) {
    for (const Bag& bag : expected.world.replica_topology(b).bags()) {
      gpus_by_size[bag.gpus] += bag.gpus;
    }
  }
  std::map<int32_t, int32_t> answered;
  for (const v1::BagSizeGpus& size : response.balance().gpus_by_bag_size()) {
    answered[size.bag_gpus()] = size.gpus();
  }
  EXPECT_EQ(answered, gpus_by_size);
  // Every rank's Ulysses bag is an aligned block of the layout.
  ASSERT_EQ(response.rank_plans_size(), 16);
  for (const v1::RankPlan& plan : response.rank_plans()) {
    const int32_t gpus = plan.ulysses().gpus();
    EXPECT_EQ(plan.ulysses().first_rank() % gpus, 0) << "rank " << plan.rank();
    EXPECT_EQ(plan.ulysses().first_rank() / 8, plan.rank() / 8) << "bag crosses a node";
  }

  // GetJob's group reports the layout too.
  v1::GetJobRequest get;
  get.set_job_id(params.job_id);
  v1::JobState state;
  grpc::ClientContext context2;
  ASSERT_TRUE(stub->GetJob(&context2, get, &state).ok());
  ASSERT_EQ(state.groups_size(), 1);
  EXPECT_EQ(state.groups(0).topology(), expected.world.spec());

  // The same step rank by rank: every rank gets the same layout and the
  // group answer's slice.
  StepParams per_rank = params;
  per_rank.step = 1;
  std::vector<PlanResult> results =
      PlanConcurrently(stub.get(), MakeGroupRequests(per_rank, lengths));
  for (const PlanResult& result : results) {
    ASSERT_TRUE(result.status.ok()) << result.status.error_message();
    EXPECT_EQ(result.response.balance().layout(), expected.world.spec());
    const int32_t rank = result.response.plan().rank();
    EXPECT_TRUE(MessageDifferencer::Equals(result.response.plan(), response.rank_plans(rank)))
        << "rank " << rank;
  }
}

TEST(AutoLayoutServiceTest, TheLayoutFollowsTheDataFromStepToStep) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  StepParams params = AutoParams();
  params.topology = "auto";
  RankLengths even(8, std::vector<int64_t>{1024, 1024});
  RankLengths skewed = even;
  skewed[3].push_back(131072);
  std::vector<std::string> layouts;
  for (const RankLengths* lengths : {&even, &skewed, &even}) {
    grpc::ClientContext context;
    v1::PlanGroupResponse response;
    ASSERT_TRUE(stub->PlanGroup(&context, GroupRequest(params, *lengths), &response).ok());
    layouts.push_back(response.balance().layout());
    ++params.step;
  }
  EXPECT_EQ(layouts[0], "g1n8");  // balanced already: no Ulysses traffic
  EXPECT_NE(layouts[1], "g1n8");  // one sequence outweighs the rest
  EXPECT_EQ(layouts[2], "g1n8");
}

TEST(AutoLayoutServiceTest, RanksMustAgreeOnTheMachine) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  StepParams params = AutoParams();
  params.topology = "auto";
  v1::PlanRequest rank0 = MakeRequest(params, 2, 0, {100});
  // Rank 0 leaves the machine unset; rank 1 with a slower network does not
  // agree, rank 1 giving the same defaults explicitly does.
  AsyncPlan first(stub.get(), rank0);
  v1::PlanRequest slower = MakeRequest(params, 2, 1, {200});
  slower.mutable_spec()->mutable_machine()->set_inter_node_bytes_per_second(25e9);
  slower.mutable_spec()->mutable_machine()->set_gpus_per_node(2);
  AwaitPendingSteps(*server, 1);
  ASSERT_FALSE(::testing::Test::HasFailure());
  grpc::Status status;
  v1::PlanResponse response;
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    status = stub->Plan(&context, slower, &response);
  }
  ASSERT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("spec.machine: rank 1 sent {"));
  EXPECT_THAT(status.error_message(),
              HasSubstr("inter_node_bytes_per_second: 25000000000 gpus_per_node: 2"));

  v1::PlanRequest agreeing = MakeRequest(params, 2, 1, {200});
  MachineToProto(Machine(), agreeing.mutable_spec()->mutable_machine());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  status = stub->Plan(&context, agreeing, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_TRUE(first.WaitFor(absl::Seconds(10)));
  ASSERT_TRUE(first.status().ok()) << first.status().error_message();
  EXPECT_EQ(first.response().balance().layout(), response.balance().layout());
}

TEST(AutoLayoutServiceTest, FixedTopologiesNameTheirSpecAndPredictTheirTime) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  StepParams params = AutoParams();
  params.topology = "g2n2+g1n4";  // canonical: g1n4+g2n2
  const RankLengths lengths = TwoKindsOfNode();
  grpc::ClientContext context;
  v1::PlanGroupResponse response;
  ASSERT_TRUE(stub->PlanGroup(&context, GroupRequest(params, lengths), &response).ok());
  EXPECT_EQ(response.balance().layout(), "g1n4+g2n2");
  ASSERT_EQ(response.balance().gpus_by_bag_size_size(), 2);
  EXPECT_EQ(response.balance().gpus_by_bag_size(0).bag_gpus(), 1);
  EXPECT_EQ(response.balance().gpus_by_bag_size(0).gpus(), 8);
  EXPECT_EQ(response.balance().gpus_by_bag_size(1).bag_gpus(), 2);
  EXPECT_EQ(response.balance().gpus_by_bag_size(1).gpus(), 8);
  EXPECT_GT(response.balance().predicted_step_seconds(), 0);
  // No communication prices under a cost model other than the transformer.
  params.step = 1;
  v1::PlanGroupRequest linear = GroupRequest(params, lengths);
  linear.mutable_spec()->set_cost_model(v1::COST_MODEL_LINEAR);
  grpc::ClientContext context2;
  ASSERT_TRUE(stub->PlanGroup(&context2, linear, &response).ok());
  EXPECT_EQ(response.balance().predicted_step_seconds(), 0);
  EXPECT_EQ(response.balance().layout(), "g1n4+g2n2");
}

}  // namespace
}  // namespace knapformer
