// The planner service in-process over 127.0.0.1: concurrent ranks of several
// jobs, groups and steps get exactly the planner core's slices; every error
// status; the rendezvous timeout; cancellation; shutdown and restart; health,
// GetJob, PlanGroup and TLS.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <tuple>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "planner/balancer.h"
#include "planner/measured_cost.h"
#include "planner/validate.h"
#include "proto/plan_proto.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "server/job_token.h"
#include "server/planner_server.h"
#include "server/request_scan.h"
#include "tests/server/service_test_util.h"
#include "tests/server/test_server.h"

namespace knapformer {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::knapformer::testing_util::AsyncPlan;
using ::knapformer::testing_util::AwaitPendingSteps;
using ::knapformer::testing_util::IdleClientWithHealthWatch;
using ::knapformer::testing_util::LocalChannel;
using ::knapformer::testing_util::MakeGroupRequests;
using ::knapformer::testing_util::MakePlanGroupRequest;
using ::knapformer::testing_util::MakeRequest;
using ::knapformer::testing_util::PlanConcurrently;
using ::knapformer::testing_util::PlanResult;
using ::knapformer::testing_util::RandomLengths;
using ::knapformer::testing_util::StartServer;
using ::knapformer::testing_util::StepParams;
using ::knapformer::testing_util::TestOptions;
using ::testing::HasSubstr;

// The plan the core computes for the same input.
Plan CorePlan(const StepParams& params, const RankLengths& lengths,
              const BalancerOptions& options = BalancerOptions()) {
  auto topology = Topology::Parse(params.topology);
  EXPECT_TRUE(topology.ok());
  auto world = World::Create(*topology, static_cast<int64_t>(lengths.size()));
  EXPECT_TRUE(world.ok());
  auto cost = CostModel::Create(params.d_model, params.gamma);
  EXPECT_TRUE(cost.ok());
  auto plan = BalanceGreedy(*world, *cost, lengths, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(ValidatePlan(*plan, *world, lengths).ok());
  EXPECT_TRUE(ValidateSlices(*plan, lengths).ok());
  return *std::move(plan);
}

v1::RankPlan ExpectedSlice(const Plan& plan, int32_t rank) {
  v1::RankPlan proto;
  RankPlanToProto(plan.Slice(rank), &proto);
  return proto;
}

// Every send in the answers is the matching receive of its peer (a check of
// the wire data that does not rely on the core's own Slice).
void ExpectRoutesAgree(const std::vector<v1::RankPlan>& plans) {
  using Item = std::tuple<int32_t, int32_t, int32_t, int64_t, int64_t>;  // src dst seq off len
  std::vector<Item> sent, received;
  for (const v1::RankPlan& p : plans) {
    for (int i = 0; i < p.sends().peer_size(); ++i) {
      sent.emplace_back(p.rank(), p.sends().peer(i), p.sends().seq_index(i), p.sends().offset(i),
                        p.sends().length(i));
    }
    for (int i = 0; i < p.recvs().peer_size(); ++i) {
      received.emplace_back(p.recvs().peer(i), p.rank(), p.recvs().seq_index(i),
                            p.recvs().offset(i), p.recvs().length(i));
    }
  }
  std::sort(sent.begin(), sent.end());
  std::sort(received.begin(), received.end());
  EXPECT_EQ(sent, received);
}

// Steps are solved on the gRPC thread that completes them when small
// (ServiceOptions::inline_solve_max_sequences), else on the service's pool:
// the answers must not depend on which. Every step in these tests is small.
class WhereSolvedTest : public ::testing::TestWithParam<bool> {
 protected:
  static PlannerServerOptions Options() {
    PlannerServerOptions options = TestOptions();
    if (!GetParam()) options.service.inline_solve_max_sequences = 0;
    return options;
  }
};

INSTANTIATE_TEST_SUITE_P(ServiceTest, WhereSolvedTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "OnGrpcThread" : "OnThePool";
                         });

TEST_P(WhereSolvedTest, ConcurrentJobsGroupsAndPipelinedStepsGetTheCoresSlices) {
  auto server = StartServer(Options());
  ASSERT_NE(server, nullptr);
  std::vector<std::unique_ptr<v1::Planner::Stub>> stubs;
  for (int c = 0; c < 4; ++c) stubs.push_back(v1::Planner::NewStub(LocalChannel(server->port(), c)));

  struct Case {
    StepParams params;
    RankLengths lengths;
  };
  std::vector<Case> cases;
  uint64_t seed = 1;
  for (const std::string job : {"job-a", "job-b", "job-c"}) {
    for (int group = 0; group < 2; ++group) {
      for (uint64_t step = 0; step < 3; ++step) {  // all steps in flight at once
        Case c;
        c.params.job_id = job;
        c.params.group_id = group == 0 ? "" : "vae";
        c.params.step = step;
        c.params.topology = group == 0 ? "g1n2+g2n1+g4n1" : "g2n2+g4n1";
        c.params.token_bytes = 128;
        c.lengths = RandomLengths(group == 0 ? 8 : 16, seed++);
        cases.push_back(std::move(c));
      }
    }
  }
  // Every rank of every case, shuffled, over the four connections.
  struct Sent {
    size_t case_index;
    std::unique_ptr<AsyncPlan> call;
  };
  std::vector<std::pair<size_t, v1::PlanRequest>> requests;
  for (size_t i = 0; i < cases.size(); ++i) {
    for (v1::PlanRequest& r : MakeGroupRequests(cases[i].params, cases[i].lengths)) {
      requests.emplace_back(i, std::move(r));
    }
  }
  std::shuffle(requests.begin(), requests.end(), std::mt19937(7));
  std::vector<Sent> sent;
  for (size_t i = 0; i < requests.size(); ++i) {
    sent.push_back({requests[i].first,
                    std::make_unique<AsyncPlan>(stubs[i % stubs.size()].get(), requests[i].second)});
  }

  std::map<size_t, std::vector<v1::RankPlan>> answers;
  for (Sent& s : sent) {
    ASSERT_TRUE(s.call->WaitFor(absl::Seconds(30)));
    ASSERT_TRUE(s.call->status().ok()) << s.call->status().error_message();
    const Case& c = cases[s.case_index];
    const v1::PlanResponse& response = s.call->response();
    EXPECT_EQ(response.job_id(), c.params.job_id);
    EXPECT_EQ(response.group_id(), c.params.group_id);
    EXPECT_EQ(response.step(), c.params.step);
    answers[s.case_index].push_back(response.plan());
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    const Plan expected = CorePlan(cases[i].params, cases[i].lengths);
    ASSERT_EQ(answers[i].size(), cases[i].lengths.size());
    for (const v1::RankPlan& got : answers[i]) {
      EXPECT_TRUE(MessageDifferencer::Equals(got, ExpectedSlice(expected, got.rank())))
          << "case " << i << " rank " << got.rank() << "\n" << got.DebugString();
    }
    ExpectRoutesAgree(answers[i]);
  }
  // Balance figures: the same for every rank of a step and equal to the core's.
  // One answer is enough: every rank of a step gets the same Balance object.
  const Sent& first = sent.front();
  const Case& c = cases[first.case_index];
  const v1::Balance& balance = first.call->response().balance();
  const v1::Balance core = BalanceToProto(CorePlan(c.params, c.lengths), 128, 0);
  EXPECT_EQ(balance.moved_tokens(), core.moved_tokens());
  EXPECT_EQ(balance.moved_bytes(), core.moved_tokens() * 128);
  EXPECT_EQ(balance.total_tokens(), core.total_tokens());
  EXPECT_DOUBLE_EQ(balance.max_over_mean_after(), core.max_over_mean_after());
  EXPECT_LE(balance.max_over_mean_after(), balance.max_over_mean_before() + 1e-12);
}

TEST_P(WhereSolvedTest, PlanGroupMatchesTheCoreAndThePerRankPlans) {
  auto server = StartServer(Options());
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  StepParams params;
  params.job_id = "group-job";
  params.step = 3;
  const RankLengths lengths = RandomLengths(16, 42);
  const Plan expected = CorePlan(params, lengths);

  v1::PlanGroupRequest request = MakePlanGroupRequest(params, lengths);
  request.set_include_rank_plans(true);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::PlanGroupResponse response;
  grpc::Status status = stub->PlanGroup(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.step(), 3u);
  ASSERT_EQ(response.chunks().src_rank_size(), static_cast<int>(expected.chunks.size()));
  for (size_t i = 0; i < expected.chunks.size(); ++i) {
    const Chunk& c = expected.chunks[i];
    EXPECT_EQ(response.chunks().src_rank(i), c.src_rank);
    EXPECT_EQ(response.chunks().seq_index(i), c.seq_index);
    EXPECT_EQ(response.chunks().offset(i), c.offset);
    EXPECT_EQ(response.chunks().length(i), c.length);
    EXPECT_EQ(response.chunks().dst_rank(i), c.dst_rank);
  }
  ASSERT_EQ(response.workload_after_size(), 16);
  for (int r = 0; r < 16; ++r) {
    EXPECT_EQ(response.workload_before(r), expected.workload_before[r]);
    EXPECT_EQ(response.workload_after(r), expected.workload_after[r]);
  }
  ASSERT_EQ(response.rank_plans_size(), 16);
  // Answered, the plan's chunk table waits for the next plan.
  const int64_t table_bytes = static_cast<int64_t>(expected.chunks.size() * sizeof(Chunk));
  EXPECT_GE(server->service().chunk_tables().kept_bytes(), table_bytes);

  // The same step asked rank by rank (as another step number) gives the same slices.
  params.step = 4;
  std::vector<PlanResult> results = PlanConcurrently(stub.get(), MakeGroupRequests(params, lengths));
  for (const PlanResult& result : results) {
    ASSERT_TRUE(result.status.ok()) << result.status.error_message();
    const int32_t rank = result.response.plan().rank();
    EXPECT_TRUE(MessageDifferencer::Equals(result.response.plan(), response.rank_plans(rank)));
  }
  // That plan took the table and gives it back once its last answer is
  // sent, which may be just after the ranks have theirs.
  const absl::Time given_back_by = absl::Now() + absl::Seconds(10);
  while (server->service().chunk_tables().kept_bytes() < table_bytes &&
         absl::Now() < given_back_by) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_GE(server->service().chunk_tables().kept_bytes(), table_bytes);

  // Wrong number of ranks.
  request.mutable_ranks()->RemoveLast();
  grpc::ClientContext context2;
  status = stub->PlanGroup(&context2, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("ranks: 15 entries, but world_size is 16"));
}

// The default limits take a group of the largest clusters, 65,536 ranks in
// one replica of 8-GPU bags, planned as the core plans it, and refuse a
// larger one by its count before parsing it.
TEST(ServiceTest, ADefaultServerPlansAGroupOf65536Ranks) {
  constexpr int32_t kRanks = 65536;
  ASSERT_EQ(ServiceLimits().max_world_size, kRanks);
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  // The answer is about 11 MB, over gRPC's default 4 MiB receive limit: the
  // client's own limit (PlannerClientOptions::max_answer_bytes, 256 MiB).
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  auto stub = v1::Planner::NewStub(grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", server->port()), grpc::InsecureChannelCredentials(), args));
  StepParams params;
  params.job_id = "largest-cluster";
  params.topology = absl::StrCat("g8n", kRanks / 8);
  const RankLengths lengths = RandomLengths(kRanks, 65, /*max_sequences=*/4);
  const Plan expected = CorePlan(params, lengths);

  v1::PlanGroupRequest request = MakePlanGroupRequest(params, lengths);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  v1::PlanGroupResponse response;
  grpc::Status status = stub->PlanGroup(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.chunks().src_rank_size(), static_cast<int>(expected.chunks.size()));
  ASSERT_EQ(response.workload_after_size(), kRanks);
  int32_t differing = 0;
  for (int32_t r = 0; r < kRanks; ++r) {
    if (response.workload_after(r) != expected.workload_after[r]) ++differing;
  }
  EXPECT_EQ(differing, 0);

  // 8 more ranks: refused by the request's count, before it is parsed.
  const int32_t over = kRanks + 8;
  request.mutable_spec()->set_world_size(over);
  request.mutable_spec()->set_topology(absl::StrCat("g8n", over / 8));
  for (int32_t r = kRanks; r < over; ++r) request.add_ranks();
  grpc::ClientContext over_context;
  over_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  status = stub->PlanGroup(&over_context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("ranks: 65544 entries exceed the limit of 65536"));
}

// PlanGroupRequest.rank_speeds: the plan balances time, as the core does
// with the same speeds; the answer, GetJob and the metrics page carry
// them; bad speeds are INVALID_ARGUMENT naming them.
TEST(ServiceTest, PlanGroupPlansByTheRanksSpeeds) {
  PlannerServerOptions options = TestOptions();
  options.metrics_address = "127.0.0.1:0";
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  StepParams params;
  params.job_id = "speed-job";
  params.topology = "g1n8";
  RankLengths lengths(8);
  for (int32_t r = 0; r < 8; ++r) {
    for (int i = 0; i < 16; ++i) lengths[r].push_back(500 + 37 * ((r * 5 + i * 3) % 17));
  }
  const std::vector<double> speeds = {1, 1, 1, 0.5, 1, 1, 1, 1};
  BalancerOptions core_options;
  core_options.rank_speeds = speeds;
  const Plan expected = CorePlan(params, lengths, core_options);

  v1::PlanGroupRequest request = MakePlanGroupRequest(params, lengths);
  request.mutable_rank_speeds()->Add(speeds.begin(), speeds.end());
  v1::PlanGroupResponse response;
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    const grpc::Status status = stub->PlanGroup(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  ASSERT_EQ(response.workload_after_size(), 8);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(response.workload_after(r), expected.workload_after[r]);
  EXPECT_NEAR(response.workload_after(3), response.workload_after(0) / 2,
              0.1 * response.workload_after(0));
  const v1::Balance& balance = response.balance();
  ASSERT_EQ(balance.rank_speeds_size(), 8);
  EXPECT_DOUBLE_EQ(balance.rank_speeds(3), 0.5 / (7.5 / 8));
  EXPECT_LT(balance.max_over_mean_after(), 1.03);    // by time, against the ideal
  EXPECT_GT(balance.max_over_mean_before(), 1.5);    // rank 3's own share at half speed

  {
    v1::GetJobRequest get;
    get.set_job_id("speed-job");
    v1::JobState state;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    ASSERT_TRUE(stub->GetJob(&context, get, &state).ok());
    ASSERT_EQ(state.groups_size(), 1);
    EXPECT_EQ(state.groups(0).last_balance().rank_speeds_size(), 8);
  }
  auto page = testing_util::HttpGet(server->metrics_port(), "/metrics");
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_THAT(*page,
              HasSubstr("knapformer_rank_speed{group=\"\",job_id=\"speed-job\",rank=\"3\"} 0.5"));
  EXPECT_THAT(*page, ::testing::Not(HasSubstr("rank=\"2\"")));

  for (const auto& [bad, message] :
       std::vector<std::pair<std::vector<double>, std::string>>{
           {{1, 1, 1}, "rank_speeds: 3 speeds for a world of 8 ranks"},
           {{1, 0, 1, 1, 1, 1, 1, 1}, "rank_speeds[1] is 0: a speed must be finite and > 0"}}) {
    request.clear_rank_speeds();
    request.mutable_rank_speeds()->Add(bad.begin(), bad.end());
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    const grpc::Status status = stub->PlanGroup(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr(message));
  }
}

// StepSpec.locality overrides the service's --locality setting, either way.
TEST(ServiceTest, TheSpecsLocalityOverridesTheServersSetting) {
  for (bool server_locality : {true, false}) {
    PlannerServerOptions options = TestOptions();
    options.service.balancer.locality = server_locality;
    auto server = StartServer(options);
    ASSERT_NE(server, nullptr);
    auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
    StepParams params;
    params.job_id = "locality-job";
    const RankLengths lengths = RandomLengths(16, 7);
    int64_t moved[3] = {0, 0, 0};
    for (v1::Locality locality : {v1::LOCALITY_PLANNER_DEFAULT, v1::LOCALITY_ON, v1::LOCALITY_OFF}) {
      SCOPED_TRACE(absl::StrCat("server locality ", server_locality, ", spec ",
                                v1::Locality_Name(locality)));
      v1::PlanGroupRequest request = MakePlanGroupRequest(params, lengths);
      request.mutable_spec()->set_step(params.step++);
      request.mutable_spec()->set_locality(locality);
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
      v1::PlanGroupResponse response;
      grpc::Status status = stub->PlanGroup(&context, request, &response);
      ASSERT_TRUE(status.ok()) << status.error_message();
      BalancerOptions core;
      core.locality = locality == v1::LOCALITY_PLANNER_DEFAULT ? server_locality
                                                               : locality == v1::LOCALITY_ON;
      const Plan expected = CorePlan(params, lengths, core);
      ASSERT_EQ(response.chunks().src_rank_size(), static_cast<int>(expected.chunks.size()));
      for (size_t i = 0; i < expected.chunks.size(); ++i) {
        EXPECT_EQ(response.chunks().dst_rank(i), expected.chunks[i].dst_rank) << "chunk " << i;
        EXPECT_EQ(response.chunks().length(i), expected.chunks[i].length) << "chunk " << i;
      }
      moved[locality] = response.balance().moved_tokens();
    }
    // The data is such that locality matters, so the test can tell them apart.
    EXPECT_LT(moved[v1::LOCALITY_ON], moved[v1::LOCALITY_OFF]);
    EXPECT_EQ(moved[v1::LOCALITY_PLANNER_DEFAULT],
              moved[server_locality ? v1::LOCALITY_ON : v1::LOCALITY_OFF]);
  }
}

// A blocking Plan call.
grpc::Status PlanOnce(v1::Planner::Stub* stub, const v1::PlanRequest& request,
                      v1::PlanResponse* response = nullptr,
                      absl::Duration deadline = absl::Seconds(10)) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  v1::PlanResponse ignored;
  return stub->Plan(&context, request, response != nullptr ? response : &ignored);
}

TEST(ServiceTest, MalformedRequestsAreInvalidArgumentNamingTheField) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  StepParams params;
  struct Bad {
    v1::PlanRequest request;
    std::string message;
  };
  std::vector<Bad> bad;
  bad.push_back({MakeRequest(params, 8, 8, {5}), "rank: 8 is outside [0, world_size = 8)"});
  bad.push_back({MakeRequest(params, 8, 0, {5, -1}), "sequence_lengths[1]: -1 is outside"});
  bad.push_back({MakeRequest(params, 6, 0, {5}), "spec.world_size: 6 is not a multiple"});
  StepParams bad_topology = params;
  bad_topology.topology = "g2x4";
  bad.push_back({MakeRequest(bad_topology, 8, 0, {5}), "spec.topology: "});
  StepParams no_job = params;
  no_job.job_id = "";
  bad.push_back({MakeRequest(no_job, 8, 0, {5}), "spec.job_id: must not be empty"});
  StepParams bad_d = params;
  bad_d.d_model = 0;
  bad.push_back({MakeRequest(bad_d, 8, 0, {5}), "spec.d_model: must be in [1, 65536], got 0"});
  for (const Bad& b : bad) {
    grpc::Status status = PlanOnce(stub.get(), b.request);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << b.message;
    EXPECT_THAT(status.error_message(), HasSubstr(b.message));
  }
}

// A step where one rank gives masks and another none fails on every rank
// with InvalidArgument naming the rank; a rank's own bad mask is refused
// at once, naming the sequence and the field; and a masked step's answer
// names each rank the masks of the sequences it attends.
TEST(ServiceTest, MasksOnSomeRanksOnlyFailTheStepOnEveryRank) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  StepParams params;
  params.topology = "g1n2";
  v1::PlanRequest masked = MakeRequest(params, 2, 0, {10, 20});
  masked.add_attention_masks()->set_kind(v1::AttentionMask::CAUSAL);
  masked.add_attention_masks();
  AsyncPlan rank0(stub.get(), masked);
  AwaitPendingSteps(*server, 1);
  grpc::Status status = PlanOnce(stub.get(), MakeRequest(params, 2, 1, {30}));
  ASSERT_TRUE(rank0.WaitFor(absl::Seconds(10)));
  for (const grpc::Status& s : {status, rank0.status()}) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(),
                HasSubstr("rank 1: attention_masks: none for 1 sequences, while rank 0: "
                          "attention_masks gives masks"));
  }

  v1::PlanRequest bad = MakeRequest(params, 2, 1, {30});
  v1::AttentionMask* spans = bad.add_attention_masks();
  spans->set_kind(v1::AttentionMask::SPANS);
  spans->add_span_lengths(20);
  EXPECT_THAT(PlanOnce(stub.get(), bad).error_message(),
              HasSubstr("attention_masks[0].spans: lengths add up to 20, the sequence has 30"));

  params.step = 1;
  masked = MakeRequest(params, 2, 0, {10, 20});
  masked.add_attention_masks()->set_kind(v1::AttentionMask::CAUSAL);
  masked.add_attention_masks()->set_kind(v1::AttentionMask::WINDOW);
  masked.mutable_attention_masks(1)->set_window(4);
  AsyncPlan again(stub.get(), masked);
  AwaitPendingSteps(*server, 1);
  v1::PlanRequest second = MakeRequest(params, 2, 1, {30});
  second.add_attention_masks();  // full
  v1::PlanResponse response;
  status = PlanOnce(stub.get(), second, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_TRUE(again.WaitFor(absl::Seconds(10)));
  ASSERT_TRUE(again.status().ok());
  // Each rank attends whole sequences in a one-GPU bag: its masks are
  // those of the sequences it receives, in order.
  for (const v1::PlanResponse* answer :
       std::vector<const v1::PlanResponse*>{&response, &again.response()}) {
    const v1::RankPlan& plan = answer->plan();
    ASSERT_EQ(plan.attention_masks_size(), plan.recvs().peer_size());
    for (int k = 0; k < plan.attention_masks_size(); ++k) {
      const v1::PlanRequest& source = plan.recvs().peer(k) == 0 ? masked : second;
      EXPECT_TRUE(MessageDifferencer::Equals(plan.attention_masks(k),
                                             source.attention_masks(plan.recvs().seq_index(k))));
    }
  }
}

TEST(ServiceTest, RanksThatDisagreeGetFailedPreconditionAndTheStepStillCompletes) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  StepParams params;
  params.topology = "g1n2";
  AsyncPlan rank0(stub.get(), MakeRequest(params, 2, 0, {10, 20}));
  AwaitPendingSteps(*server, 1);
  StepParams other = params;
  other.topology = "g2n1";
  grpc::Status status = PlanOnce(stub.get(), MakeRequest(other, 2, 1, {30}));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(),
              HasSubstr("spec.topology: rank 1 sent \"g2n1\" but step 0 of job 'job' group '' "
                        "was opened with \"g1n2\""));
  other = params;
  other.d_model = 65;
  status = PlanOnce(stub.get(), MakeRequest(other, 2, 1, {30}));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("spec.d_model: rank 1 sent 65"));
  EXPECT_FALSE(rank0.WaitFor(absl::Milliseconds(50)));  // still waiting

  v1::PlanResponse response;
  status = PlanOnce(stub.get(), MakeRequest(params, 2, 1, {30}), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_TRUE(rank0.WaitFor(absl::Seconds(10)));
  EXPECT_TRUE(rank0.status().ok());
  const Plan expected = CorePlan(params, {{10, 20}, {30}});
  EXPECT_TRUE(MessageDifferencer::Equals(response.plan(), ExpectedSlice(expected, 1)));
  EXPECT_TRUE(MessageDifferencer::Equals(rank0.response().plan(), ExpectedSlice(expected, 0)));
}

TEST(ServiceTest, TheSameRankTwiceIsAlreadyExistsWhilePendingAndAfterwards) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  StepParams params;
  params.topology = "g1n2";
  AsyncPlan first(stub.get(), MakeRequest(params, 2, 0, {10}));
  AwaitPendingSteps(*server, 1);
  grpc::Status status = PlanOnce(stub.get(), MakeRequest(params, 2, 0, {10}));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(status.error_message(), HasSubstr("rank 0: already waiting in step 0"));
  ASSERT_TRUE(PlanOnce(stub.get(), MakeRequest(params, 2, 1, {10})).ok());
  ASSERT_TRUE(first.WaitFor(absl::Seconds(10)));
  EXPECT_TRUE(first.status().ok());
  status = PlanOnce(stub.get(), MakeRequest(params, 2, 1, {10}));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(status.error_message(), HasSubstr("was already planned"));
}

TEST(ServiceTest, AnIncompleteGroupTimesOutNamingTheMissingRanks) {
  PlannerServerOptions options = TestOptions();
  options.service.limits.rendezvous_timeout = absl::Seconds(1);  // the 3 calls arrive within it
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  StepParams params;
  params.job_id = "slow";
  std::vector<std::unique_ptr<AsyncPlan>> calls;
  const absl::Time start = absl::Now();
  for (int32_t rank : {0, 1, 5}) {
    calls.push_back(std::make_unique<AsyncPlan>(stub.get(), MakeRequest(params, 8, rank, {7})));
  }
  for (auto& call : calls) {
    ASSERT_TRUE(call->WaitFor(absl::Seconds(10)));
    EXPECT_EQ(call->status().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    EXPECT_THAT(call->status().error_message(),
                HasSubstr("5 of 8 ranks did not ask within the rendezvous timeout of 1s; "
                          "missing ranks: 2-4,6-7"));
  }
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(990));
  EXPECT_LT(took, absl::Seconds(5));
  // The step is gone: the same ranks can start it again.
  EXPECT_EQ(server->service().rendezvous().pending_steps(), 0);
}

// A rank whose request is refused for its own input (here a negative
// length, as the client sends when its own check refused the step) withdraws
// the step: the rank waiting in it is answered at once with ABORTED naming
// the rank and why, not at the rendezvous timeout (60 s), and so is a rank
// that asks later; the next step is planned as usual.
TEST(ServiceTest, ARankRefusedForItsInputWithdrawsTheStepAtOnce) {
  PlannerServerOptions options = TestOptions();
  options.service.limits.rendezvous_timeout = absl::Seconds(60);
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  StepParams params;
  params.job_id = "withdrawn";
  params.topology = "g1n2+g2n1";
  const absl::Time start = absl::Now();
  AsyncPlan waiting(stub.get(), MakeRequest(params, 4, 0, {10}));
  AwaitPendingSteps(*server, 1);
  const grpc::Status refused = PlanOnce(stub.get(), MakeRequest(params, 4, 1, {-1}));
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("sequence_lengths[0]: -1 is outside"));
  ASSERT_TRUE(waiting.WaitFor(absl::Seconds(10)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  const std::string withdrawn =
      "step 0 of job 'withdrawn' group '': rank 1's request was refused, so the step cannot "
      "complete: sequence_lengths[0]: -1 is outside";
  EXPECT_EQ(waiting.status().error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(waiting.status().error_message(), HasSubstr(withdrawn));
  const grpc::Status late = PlanOnce(stub.get(), MakeRequest(params, 4, 2, {30}));
  EXPECT_EQ(late.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(late.error_message(), HasSubstr(withdrawn));
  EXPECT_EQ(server->service().rendezvous().pending_steps(), 0);
  params.step = 1;
  for (const PlanResult& r :
       PlanConcurrently(stub.get(), MakeGroupRequests(params, {{10}, {20}, {30}, {40}}))) {
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  }
}

TEST(ServiceTest, ACancelledRankLeavesTheRendezvous) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  StepParams params;
  params.topology = "g1n2";
  // Rank 0 gives up (its deadline) before rank 1 comes.
  grpc::Status status = PlanOnce(stub.get(), MakeRequest(params, 2, 0, {999}), nullptr,
                                 absl::Milliseconds(100));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  const absl::Time limit = absl::Now() + absl::Seconds(5);
  while (server->service().rendezvous().pending_steps() != 0 && absl::Now() < limit) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(server->service().rendezvous().pending_steps(), 0);
  // Both ranks ask again; the plan uses the new lengths, not the cancelled call's.
  std::vector<PlanResult> results =
      PlanConcurrently(stub.get(), MakeGroupRequests(params, {{10, 20}, {30}}));
  const Plan expected = CorePlan(params, {{10, 20}, {30}});
  for (const PlanResult& result : results) {
    ASSERT_TRUE(result.status.ok()) << result.status.error_message();
    EXPECT_TRUE(MessageDifferencer::Equals(result.response.plan(),
                                           ExpectedSlice(expected, result.response.plan().rank())));
  }
}

TEST(ServiceTest, LimitsAreResourceExhausted) {
  PlannerServerOptions options = TestOptions();
  options.service.limits.max_pending_steps = 1;
  options.service.limits.max_message_bytes = 4096;
  options.service.limits.max_sequences_per_rank = 100;
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  StepParams params;
  params.topology = "g1n2";
  AsyncPlan waiting(stub.get(), MakeRequest(params, 2, 0, {1}));
  AwaitPendingSteps(*server, 1);
  params.step = 1;
  grpc::Status status = PlanOnce(stub.get(), MakeRequest(params, 2, 0, {1}));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("1 steps are already waiting for ranks"));

  status = PlanOnce(stub.get(), MakeRequest(params, 2, 0, std::vector<int64_t>(101, 5)));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(),
              HasSubstr("sequence_lengths: 101 sequences exceed the limit of 100 per rank"));

  status = PlanOnce(stub.get(),
                    MakeRequest(params, 2, 0, std::vector<int64_t>(2000, int64_t{1} << 30)));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("4096"));

  // The pending step still completes.
  params.step = 0;
  ASSERT_TRUE(PlanOnce(stub.get(), MakeRequest(params, 2, 1, {1})).ok());
  ASSERT_TRUE(waiting.WaitFor(absl::Seconds(10)));
  EXPECT_TRUE(waiting.status().ok());
}

// A PlanGroup request of `job`'s step `step` on 2 ranks of g1n2.
v1::PlanGroupRequest GroupRequest(const std::string& job, uint64_t step) {
  StepParams params;
  params.job_id = job;
  params.topology = "g1n2";
  params.step = step;
  v1::PlanGroupRequest request;
  *request.mutable_spec() = MakeRequest(params, 2, 0, {}).spec();
  for (int r = 0; r < 2; ++r) request.add_ranks()->add_sequence_lengths(10 + r);
  return request;
}

// One PlanGroup call in the background, waited for by its destructor.
class AsyncPlanGroup {
 public:
  AsyncPlanGroup(v1::Planner::Stub* stub, v1::PlanGroupRequest request,
                 absl::Duration deadline = absl::Seconds(30), const std::string& token = "")
      : request_(std::move(request)) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    if (!token.empty()) context_.AddMetadata("authorization", "Bearer " + token);
    stub->async()->PlanGroup(&context_, &request_, &response_, [this](grpc::Status status) {
      status_ = std::move(status);
      finished_at_ = absl::Now();
      done_.Notify();
    });
  }
  ~AsyncPlanGroup() {
    context_.TryCancel();
    done_.WaitForNotificationWithTimeout(absl::Seconds(30));
  }
  // Its status, or UNKNOWN "no answer" when none came within 30 s.
  grpc::Status Wait() {
    if (!done_.WaitForNotificationWithTimeout(absl::Seconds(30))) {
      return grpc::Status(grpc::StatusCode::UNKNOWN, "no answer");
    }
    return status_;
  }
  // What it said so far, for a failure message.
  std::string Said() const {
    return done_.HasBeenNotified() ? status_.error_message() : "no answer";
  }
  // REQUIRES: Wait() returned its status.
  const v1::PlanGroupResponse& response() const { return response_; }
  absl::Time finished_at() const { return finished_at_; }

 private:
  v1::PlanGroupRequest request_;
  v1::PlanGroupResponse response_;
  grpc::ClientContext context_;
  absl::Notification done_;
  grpc::Status status_;
  absl::Time finished_at_ = absl::InfiniteFuture();
};

grpc::Status PlanGroupOnce(v1::Planner::Stub* stub, const v1::PlanGroupRequest& request,
                           const std::string& token = "") {
  v1::PlanGroupResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  return stub->PlanGroup(&context, request, &response);
}

// Waits (at most 10 s) until `server` holds a request of `job`: its call
// has arrived and been admitted, and the rest of its handler (counting it,
// queueing its step) runs on that thread at once. A fixed sleep instead
// fails where a loaded machine delivers the call later.
void AwaitRequestOf(PlannerServer* server, const std::string& job) {
  for (const absl::Time limit = absl::Now() + absl::Seconds(10);
       server->service().request_memory().held_by_job(job) == 0 && absl::Now() < limit;) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_GT(server->service().request_memory().held_by_job(job), 0) << job << " never arrived";
  absl::SleepFor(absl::Milliseconds(20));
}

// Bounded before the solver: PlanGroup calls in flight per job and in all,
// and the steps waiting for a solver thread, each RESOURCE_EXHAUSTED naming
// its limit at once; the calls in flight still complete, and a job flooding
// the server leaves room for another.
TEST(ServiceTest, CallsInFlightAndTheSolverQueueAreBounded) {
  PlannerServerOptions options = TestOptions();
  options.service.solver_threads = 1;
  options.service.limits.max_plan_group_calls_per_job = 1;
  options.service.limits.max_plan_group_calls = 2;
  options.service.limits.max_queued_solves = 2;
  // Every answer waits on the pool's timer: each call stays in flight (and
  // its step queued) that long.
  options.service.answer_delay = [] { return absl::Milliseconds(1500); };
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));

  AsyncPlanGroup first(stub.get(), GroupRequest("flood", 0));
  AwaitRequestOf(server.get(), "flood");
  grpc::Status status = PlanGroupOnce(stub.get(), GroupRequest("flood", 1));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(),
              HasSubstr("max_plan_group_calls_per_job: job 'flood' holds 1 PlanGroup calls in "
                        "flight, and 1 more would pass its limit of 1"));
  AsyncPlanGroup other(stub.get(), GroupRequest("other", 0));  // another job fits
  AwaitRequestOf(server.get(), "other");
  status = PlanGroupOnce(stub.get(), GroupRequest("third", 0));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("max_plan_group_calls: all tenants hold 2 PlanGroup calls"));
  EXPECT_TRUE(first.Wait().ok()) << first.Wait().error_message();
  EXPECT_TRUE(other.Wait().ok()) << other.Wait().error_message();

  // The solver queue: two steps wait, a third is refused; per-rank steps too
  // (every rank of the refused step gets the error).
  AsyncPlanGroup a(stub.get(), GroupRequest("a", 0));
  AsyncPlanGroup b(stub.get(), GroupRequest("b", 0));
  AwaitRequestOf(server.get(), "a");
  AwaitRequestOf(server.get(), "b");
  StepParams params;
  params.job_id = "per-rank";
  params.topology = "g1n2";
  for (const PlanResult& result :
       PlanConcurrently(stub.get(), MakeGroupRequests(params, {{3}, {4}}))) {
    EXPECT_EQ(result.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(result.status.error_message(),
                HasSubstr("max_queued_solves: 2 steps already wait for a solver thread"));
  }
  EXPECT_TRUE(a.Wait().ok());
  EXPECT_TRUE(b.Wait().ok());
  // Nothing is left counted: the limits hold again from zero.
  EXPECT_TRUE(PlanGroupOnce(stub.get(), GroupRequest("flood", 1)).ok());
}

// Memory before parsing: each request is charged its estimated parsed size
// (request_scan.h) from its arrival until gRPC is done with it, per job and
// in all; a request past either share is refused naming the limit, and
// what was charged is given back.
TEST(ServiceTest, RequestMemoryIsChargedBeforeParsingAndGivenBack) {
  PlannerServerOptions options = TestOptions();
  options.service.limits.max_request_memory = 250 << 10;
  options.service.limits.max_request_memory_per_job = 200 << 10;
  options.service.answer_delay = [] { return absl::Milliseconds(1500); };
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  auto large = [](const std::string& job, uint64_t step) {
    v1::PlanGroupRequest request = GroupRequest(job, step);
    for (int i = 0; i < 4096; ++i) request.mutable_ranks(0)->add_sequence_lengths(10);
    return request;  // ~150 KiB parsed, as estimated
  };
  AsyncPlanGroup first(stub.get(), large("big", 0));
  AwaitRequestOf(server.get(), "big");
  const int64_t charged = server->service().request_memory().held();
  EXPECT_GT(charged, 100 << 10);
  EXPECT_LT(charged, 200 << 10);
  grpc::Status status = PlanGroupOnce(stub.get(), large("big", 1));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(),
              HasSubstr(absl::StrCat("max_request_memory_per_job: job 'big' holds ", charged,
                                     " bytes of requests")));
  status = PlanGroupOnce(stub.get(), large("other", 0));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(),
              HasSubstr("max_request_memory: all tenants hold " + std::to_string(charged)));
  EXPECT_TRUE(PlanGroupOnce(stub.get(), GroupRequest("small", 0)).ok());  // room for it
  EXPECT_TRUE(first.Wait().ok()) << first.Said();
  for (int i = 0; i < 100 && server->service().request_memory().held() != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(server->service().request_memory().held(), 0);
  EXPECT_TRUE(PlanGroupOnce(stub.get(), large("other", 0)).ok());
}

// Shares are per tenant (the token's scope), not per job id: one tenant's
// two job ids hold the tenant's share of request memory and of PlanGroup
// calls between them, and another tenant's request still gets in (with
// shares per job id alone, the two ids held the whole server).
TEST(ServiceTest, ATenantsJobIdsShareItsShareAndLeaveRoomForAnotherTenant) {
  const std::string keys = testing_util::TempPath("tenant_keys");
  const std::string key = "0123456789abcdef0123456789abcdef-tenants";
  std::ofstream(keys) << key << "\n";
  auto token = [&](const std::string& prefix) {
    return MintToken(key, TokenKind::kPrefix, prefix, absl::Now() + absl::Hours(1),
                     NewTokenId());
  };
  auto large = [](const std::string& job, uint64_t step) {
    v1::PlanGroupRequest request = GroupRequest(job, step);
    for (int i = 0; i < 4096; ++i) request.mutable_ranks(0)->add_sequence_lengths(10);
    return request;
  };
  // What one large request is charged, as the service will estimate it.
  const std::string wire = large("team-a/1", 0).SerializeAsString();
  google::protobuf::io::ArrayInputStream input(wire.data(), static_cast<int>(wire.size()));
  absl::StatusOr<RequestShape> shape =
      RequestScanner(ServiceLimits()).Scan(v1::PlanGroupRequest::descriptor(), &input);
  ASSERT_TRUE(shape.ok()) << shape.status();
  const int64_t charge = EstimatedParsedBytes(*shape);

  PlannerServerOptions options = TestOptions();
  options.auth.mode = AuthMode::kToken;
  options.auth.key_file = keys;
  // Room for two requests in all and one per job: per job alone, a
  // tenant's two ids would take it all.
  options.service.limits.max_request_memory = 2 * charge + charge / 2;
  options.service.limits.max_request_memory_per_tenant = charge + charge / 2;
  options.service.limits.max_request_memory_per_job = charge + charge / 2;
  options.service.limits.max_plan_group_calls_per_tenant = 2;
  options.service.answer_delay = [] { return absl::Milliseconds(1500); };
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  const std::string a = token("team-a/"), b = token("team-b/");

  AsyncPlanGroup first(stub.get(), large("team-a/1", 0), absl::Seconds(30), a);
  AwaitRequestOf(server.get(), "team-a/1");
  EXPECT_EQ(server->service().request_memory().held_by_tenant("team-a/"), charge);
  grpc::Status status = PlanGroupOnce(stub.get(), large("team-a/2", 0), a);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(),
              HasSubstr(absl::StrCat("max_request_memory_per_tenant: tenant 'team-a/' (its jobs "
                                     "together) holds ", charge, " bytes of requests")));
  // Another tenant's large request gets in.
  EXPECT_TRUE(PlanGroupOnce(stub.get(), large("team-b/1", 0), b).ok());
  EXPECT_TRUE(first.Wait().ok()) << first.Said();
  // Calls in flight: the tenant's two, over its two ids; the third refused.
  AsyncPlanGroup one(stub.get(), GroupRequest("team-a/1", 1), absl::Seconds(30), a);
  AsyncPlanGroup two(stub.get(), GroupRequest("team-a/2", 1), absl::Seconds(30), a);
  AwaitRequestOf(server.get(), "team-a/1");
  AwaitRequestOf(server.get(), "team-a/2");
  status = PlanGroupOnce(stub.get(), GroupRequest("team-a/3", 0), a);
  EXPECT_THAT(status.error_message(),
              HasSubstr("max_plan_group_calls_per_tenant: tenant 'team-a/' (its jobs together) "
                        "holds 2 PlanGroup calls in flight"));
  EXPECT_TRUE(PlanGroupOnce(stub.get(), GroupRequest("team-b/2", 0), b).ok());
  EXPECT_TRUE(one.Wait().ok()) << one.Said();
  EXPECT_TRUE(two.Wait().ok()) << two.Said();
}

// Steps planned so far in `job`'s only group.
uint64_t StepsPlanned(v1::Planner::Stub* stub, const std::string& job) {
  v1::GetJobRequest request;
  request.set_job_id(job);
  v1::JobState state;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  const grpc::Status status = stub->GetJob(&context, request, &state);
  EXPECT_TRUE(status.ok()) << job << ": " << status.error_message();
  EXPECT_EQ(state.groups_size(), 1) << job;
  return state.groups_size() == 1 ? state.groups(0).steps_planned() : 0;
}

// The solve deadline: a step that waited for a solver past max_solve_wait
// (here held back by the injected delay) is refused, every rank of it with
// DEADLINE_EXCEEDED naming the limit, and not solved.
TEST(ServiceTest, AStepThatWaitedPastTheSolveDeadlineIsNotSolved) {
  PlannerServerOptions options = TestOptions();
  options.service.limits.max_solve_wait = absl::Milliseconds(100);
  options.service.answer_delay = [] { return absl::Milliseconds(300); };
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  const grpc::Status status = PlanGroupOnce(stub.get(), GroupRequest("late-group", 0));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(status.error_message(),
              HasSubstr("max_solve_wait: the step waited 3"));  // 300 ms and more
  EXPECT_THAT(status.error_message(), HasSubstr("past the limit of 100ms; not solved"));
  StepParams params;
  params.job_id = "late-ranks";
  params.topology = "g1n2";
  for (const PlanResult& result :
       PlanConcurrently(stub.get(), MakeGroupRequests(params, {{3}, {4}}))) {
    EXPECT_EQ(result.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    EXPECT_THAT(result.status.error_message(), HasSubstr("max_solve_wait"));
  }
  EXPECT_EQ(StepsPlanned(stub.get(), "late-group"), 0u);
  EXPECT_EQ(StepsPlanned(stub.get(), "late-ranks"), 0u);
}

// Jobs take the solver round-robin: with one solver thread and eight steps
// of a flooding job waiting, a quiet job's step is solved second, not
// ninth. Every step becomes due at the same instant (the injected delay
// counts down to it), so the queue holds all nine when the solver starts.
TEST(ServiceTest, WaitingStepsTakeTheSolverRoundRobinBetweenJobs) {
  PlannerServerOptions options = TestOptions();
  options.service.solver_threads = 1;
  const absl::Time due = absl::Now() + absl::Seconds(2);
  options.service.answer_delay = [due] { return due - absl::Now(); };
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  std::vector<std::unique_ptr<AsyncPlanGroup>> flood;
  for (uint64_t step = 0; step < 8; ++step) {
    flood.push_back(std::make_unique<AsyncPlanGroup>(stub.get(), GroupRequest("flood", step)));
  }
  AsyncPlanGroup quiet(stub.get(), GroupRequest("quiet", 0));
  ASSERT_TRUE(quiet.Wait().ok()) << quiet.Said();
  ASSERT_LT(absl::Now(), due + absl::Seconds(1)) << "the calls did not all arrive before " << due;
  int flood_before_quiet = 0;
  for (auto& call : flood) {
    ASSERT_TRUE(call->Wait().ok()) << call->Said();
    if (call->finished_at() < quiet.finished_at()) ++flood_before_quiet;
  }
  // Solved second; answers travel in parallel, so allow one more ahead.
  EXPECT_LE(flood_before_quiet, 2);
}

// A PlanGroup whose caller gives up while its step waits for a solver is
// not solved: the job has no planned step afterwards.
TEST(ServiceTest, APlanGroupWhoseCallerHasGoneIsNotSolved) {
  PlannerServerOptions options = TestOptions();
  options.service.answer_delay = [] { return absl::Milliseconds(600); };
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  {
    AsyncPlanGroup gone(stub.get(), GroupRequest("gone", 0), absl::Milliseconds(150));
    EXPECT_EQ(gone.Wait().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  absl::SleepFor(absl::Milliseconds(900));  // past the answer delay: the task ran
  v1::GetJobRequest request;
  request.set_job_id("gone");
  v1::JobState state;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->GetJob(&context, request, &state).ok());
  ASSERT_EQ(state.groups_size(), 1);
  EXPECT_EQ(state.groups(0).steps_planned(), 0u);
  // The next call of the job is solved.
  EXPECT_TRUE(PlanGroupOnce(stub.get(), GroupRequest("gone", 1)).ok());
}

// Per-rank: when one rank gives up while its complete step waits for a
// solver, the step is not solved (that rank plans locally, and so, by the
// step's agreement, do the others); the ranks still waiting are told which
// rank gave up.
TEST(ServiceTest, APerRankStepWithARankGoneIsNotSolved) {
  PlannerServerOptions options = TestOptions();
  options.service.answer_delay = [] { return absl::Seconds(2); };
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  StepParams params;
  params.job_id = "rank-gone";
  params.topology = "g1n2";
  {
    // The rank that stays is sent first, so the step is complete when the
    // other arrives, well inside its deadline even on a loaded machine (a
    // rank gone before the step completes just leaves the rendezvous).
    AsyncPlan waiting(stub.get(), MakeRequest(params, 2, 1, {4}));
    AsyncPlan gone(stub.get(), MakeRequest(params, 2, 0, {3}), absl::Milliseconds(500));
    ASSERT_TRUE(gone.WaitFor(absl::Seconds(10)));
    EXPECT_EQ(gone.status().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    ASSERT_TRUE(waiting.WaitFor(absl::Seconds(10)));
    EXPECT_EQ(waiting.status().error_code(), grpc::StatusCode::ABORTED);
    EXPECT_THAT(waiting.status().error_message(),
                HasSubstr("rank 0 gave up (cancelled, or past its deadline) before a solver "
                          "took step 0; not solved"));
  }
  EXPECT_EQ(StepsPlanned(stub.get(), "rank-gone"), 0u);
  params.step = 1;  // the next step is solved
  for (const PlanResult& result :
       PlanConcurrently(stub.get(), MakeGroupRequests(params, {{3}, {4}}))) {
    EXPECT_TRUE(result.status.ok()) << result.status.error_message();
  }
}

// The fault-injection hook (serve --answer-delay-file) holds back step
// answers and GetJob by its delay, read per call, without holding a solver
// thread: with one solver thread, a second job's step is answered while the
// first one's answer waits.
TEST(ServiceTest, AnswerDelayHoldsBackAnswersWithoutBlockingTheSolver) {
  PlannerServerOptions options = TestOptions();
  options.service.solver_threads = 1;
  auto delay_ms = std::make_shared<std::atomic<int>>(1000);
  options.service.answer_delay = [delay_ms] { return absl::Milliseconds(delay_ms->load()); };
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  StepParams params;
  params.topology = "g1n2";
  const absl::Time start = absl::Now();
  std::vector<PlanResult> slow = PlanConcurrently(stub.get(), MakeGroupRequests(params, {{3}, {4}}));
  const absl::Duration slow_took = absl::Now() - start;
  for (const PlanResult& result : slow) EXPECT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_GE(slow_took, absl::Milliseconds(1000));

  v1::GetJobRequest request;
  request.set_job_id("job");
  v1::JobState state;
  {
    grpc::ClientContext context;
    const absl::Time asked = absl::Now();
    ASSERT_TRUE(stub->GetJob(&context, request, &state).ok());
    EXPECT_GE(absl::Now() - asked, absl::Milliseconds(1000));
    EXPECT_EQ(state.groups(0).steps_planned(), 1u);
  }
  // Two jobs at once on one solver thread: both wait the delay once, not twice.
  params.step = 1;
  StepParams other = params;
  other.job_id = "other";
  std::vector<v1::PlanRequest> both = MakeGroupRequests(params, {{3}, {4}});
  for (v1::PlanRequest& r : MakeGroupRequests(other, {{5}, {6}})) both.push_back(r);
  const absl::Time together = absl::Now();
  for (const PlanResult& result : PlanConcurrently(stub.get(), both)) {
    EXPECT_TRUE(result.status.ok()) << result.status.error_message();
  }
  EXPECT_LT(absl::Now() - together, absl::Milliseconds(1900));
  // The delay is read per call: at 0 the next answer is prompt.
  delay_ms->store(0);
  grpc::ClientContext context;
  const absl::Time asked = absl::Now();
  ASSERT_TRUE(stub->GetJob(&context, request, &state).ok());
  EXPECT_LT(absl::Now() - asked, absl::Milliseconds(500));
}

TEST(ServiceTest, ShutdownFailsWaitingRanksWithUnavailableAndARestartServesAgain) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  auto channel = LocalChannel(port);
  auto stub = v1::Planner::NewStub(channel);
  StepParams params;
  params.topology = "g1n2";
  AsyncPlan waiting(stub.get(), MakeRequest(params, 2, 0, {1}));
  AwaitPendingSteps(*server, 1);
  const absl::Time start = absl::Now();
  server->Shutdown(absl::Seconds(2));
  ASSERT_TRUE(waiting.WaitFor(absl::Seconds(5)));
  EXPECT_EQ(waiting.status().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(waiting.status().error_message(), HasSubstr("shutting down"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  server.reset();

  // A new server on the same port; the old channel reconnects.
  PlannerServerOptions options = TestOptions();
  options.listen_address = absl::StrCat("127.0.0.1:", port);
  auto restarted = StartServer(options);
  ASSERT_NE(restarted, nullptr);
  EXPECT_EQ(restarted->port(), port);
  std::vector<PlanResult> results = PlanConcurrently(stub.get(), MakeGroupRequests(params, {{1}, {2}}));
  for (const PlanResult& result : results) {
    EXPECT_TRUE(result.status.ok()) << result.status.error_message();
  }
}

// Issue 37: a stop with nothing in flight is prompt whatever is connected.
// An idle channel, and a health Watch stream (as load balancers and probes
// hold), held the stop for the whole grace (5 s); the metrics endpoint's
// own stop took 2 s.
TEST(ServiceTest, ShutdownIsPromptWithAnIdleChannelAHealthWatchAndMetrics) {
  PlannerServerOptions options = TestOptions();
  options.metrics_address = "127.0.0.1:0";
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  const int metrics_port = server->metrics_port();
  ASSERT_GT(metrics_port, 0);
  IdleClientWithHealthWatch client(server->port());
  ASSERT_EQ(client.error(), "");
  EXPECT_EQ(client.first_status(), grpc::health::v1::HealthCheckResponse::SERVING);

  const absl::Time start = absl::Now();
  server->Shutdown(absl::Seconds(5));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_FALSE(client.FinishWatch().ok());  // ended by the stop, not by its deadline
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_FALSE(testing_util::HttpGet(metrics_port, "/metrics").ok());  // the endpoint is gone
}

// A step being answered when the stop begins is answered (within the
// grace), and the stop waits for it; a step asked for once the planner is
// draining is refused with UNAVAILABLE, by the planner (not by gRPC: its
// message says so).
TEST(ServiceTest, ShutdownAnswersTheStepInFlightAndRefusesNewOnes) {
  PlannerServerOptions options = TestOptions();
  auto scheduled = std::make_shared<absl::Notification>();
  auto notified = std::make_shared<std::atomic<bool>>(false);
  options.service.answer_delay = [scheduled, notified] {
    if (!notified->exchange(true)) scheduled->Notify();
    return absl::Milliseconds(1500);
  };
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  // On every way out, a failed assertion too, its destructor ends the call.
  AsyncPlanGroup in_flight(stub.get(), GroupRequest("in-flight", 0));
  ASSERT_TRUE(scheduled->WaitForNotificationWithTimeout(absl::Seconds(10))) << in_flight.Said();

  const absl::Time start = absl::Now();
  absl::Duration took;
  std::thread stopper([&] {
    server->Shutdown(absl::Seconds(5));
    took = absl::Now() - start;
  });
  absl::Cleanup stopped = [&] { stopper.join(); };
  for (const absl::Time limit = absl::Now() + absl::Seconds(10);
       !server->service().rendezvous().closed() && absl::Now() < limit;) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(server->service().rendezvous().closed());
  const grpc::Status late = PlanGroupOnce(stub.get(), GroupRequest("in-flight", 1));
  EXPECT_EQ(late.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(late.error_message(), HasSubstr("shutting down"));
  const grpc::Status answered = in_flight.Wait();
  ASSERT_TRUE(answered.ok()) << answered.error_message();
  EXPECT_EQ(in_flight.response().step(), 0u);
  std::move(stopped).Invoke();
  EXPECT_GE(took, absl::Milliseconds(500));  // it waited for the 1.5 s answer
  EXPECT_LT(took, absl::Seconds(4));
}

// The rendezvous timeout is 1 s, not less: a rank's call may start that
// late after its peers' on a loaded machine under a sanitizer (at 200 ms,
// one of the 800 calls in CI's ASan lane once did).
TEST(ServiceTest, ManyStepsTimeoutsAndCancellationsLeaveNothingBehind) {
  PlannerServerOptions options = TestOptions();
  options.service.limits.rendezvous_timeout = absl::Seconds(1);
  options.service.limits.remembered_steps = 8;
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  StepParams params;
  params.job_id = "soak";
  params.topology = "g1n2+g2n1";
  int ok = 0;
  for (uint64_t step = 0; step < 200; ++step) {
    params.step = step;
    for (const PlanResult& r :
         PlanConcurrently(stub.get(), MakeGroupRequests(params, RandomLengths(4, step)))) {
      ok += r.status.ok() ? 1 : 0;
    }
  }
  EXPECT_EQ(ok, 800);
  // Abandoned steps: cancelled ranks and steps that time out.
  for (uint64_t step = 200; step < 204; ++step) {
    params.step = step;
    AsyncPlan cancelled(stub.get(), MakeRequest(params, 4, 0, {1}));
    cancelled.Cancel();
    AsyncPlan timed_out(stub.get(), MakeRequest(params, 4, 1, {1}));
    ASSERT_TRUE(cancelled.WaitFor(absl::Seconds(5)));
    ASSERT_TRUE(timed_out.WaitFor(absl::Seconds(5)));
    EXPECT_EQ(cancelled.status().error_code(), grpc::StatusCode::CANCELLED);
    EXPECT_EQ(timed_out.status().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  EXPECT_EQ(server->service().rendezvous().pending_steps(), 0);
  v1::GetJobRequest request;
  request.set_job_id("soak");
  v1::JobState state;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->GetJob(&context, request, &state).ok());
  ASSERT_EQ(state.groups_size(), 1);
  EXPECT_EQ(state.groups(0).steps_planned(), 200u);
  EXPECT_EQ(state.groups(0).pending_size(), 0);
  // Only the last 8 answered steps are remembered: 199 is refused, 0 opens anew.
  params.step = 199;
  EXPECT_EQ(PlanOnce(stub.get(), MakeRequest(params, 4, 0, {1})).error_code(),
            grpc::StatusCode::ALREADY_EXISTS);
  params.step = 0;
  AsyncPlan reopened(stub.get(), MakeRequest(params, 4, 0, {1}));
  ASSERT_TRUE(reopened.WaitFor(absl::Seconds(5)));
  EXPECT_EQ(reopened.status().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
}

TEST(ServiceTest, ASecondServerOnTheSamePortFailsToStart) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  PlannerServerOptions options = TestOptions();
  options.listen_address = absl::StrCat("127.0.0.1:", server->port());
  auto second = PlannerServer::Start(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("--listen: cannot serve on"));
}

// A connection older than max_connection_age is closed (GOAWAY), so that
// a client of replicas resolves their name again; the channel reconnects
// for its next call.
TEST(ServiceTest, OldConnectionsAreClosedSoClientsResolveAgain) {
  PlannerServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.max_connection_age = absl::Milliseconds(300);
  auto server = PlannerServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Planner::NewStub(channel);
  auto get_job = [&] {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::GetJobRequest request;
    request.set_job_id("nobody");
    v1::JobState state;
    return stub->GetJob(&context, request, &state).error_code();
  };
  EXPECT_EQ(get_job(), grpc::StatusCode::NOT_FOUND);
  ASSERT_EQ(channel->GetState(false), GRPC_CHANNEL_READY);
  // Closed within the age (and gRPC's 10% jitter), not held open.
  EXPECT_TRUE(channel->WaitForStateChange(
      GRPC_CHANNEL_READY, std::chrono::system_clock::now() + std::chrono::seconds(3)));
  EXPECT_NE(channel->GetState(false), GRPC_CHANNEL_READY);
  EXPECT_EQ(get_job(), grpc::StatusCode::NOT_FOUND);
  (*server)->Shutdown();
}

TEST(ServiceTest, GetJobReportsPlannedAndPendingSteps) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  StepParams params;
  params.job_id = "state";
  params.step = 5;
  std::vector<PlanResult> results =
      PlanConcurrently(stub.get(), MakeGroupRequests(params, RandomLengths(8, 3)));
  for (const PlanResult& result : results) ASSERT_TRUE(result.status.ok());
  params.step = 6;
  AsyncPlan waiting(stub.get(), MakeRequest(params, 8, 3, {4}));
  AwaitPendingSteps(*server, 1);

  v1::GetJobRequest request;
  request.set_job_id("state");
  v1::JobState state;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->GetJob(&context, request, &state).ok());
  ASSERT_EQ(state.groups_size(), 1);
  const v1::GroupState& group = state.groups(0);
  EXPECT_EQ(group.steps_planned(), 1u);
  EXPECT_EQ(group.last_step(), 5u);
  EXPECT_EQ(group.world_size(), 8);
  EXPECT_EQ(group.topology(), "g1n2+g2n1+g4n1");
  EXPECT_EQ(group.ranks_seen(), 8);
  EXPECT_EQ(group.last_balance().max_over_mean_after(),
            results[0].response.balance().max_over_mean_after());
  ASSERT_EQ(group.pending_size(), 1);
  EXPECT_EQ(group.pending(0).step(), 6u);
  EXPECT_EQ(group.pending(0).ranks_arrived(), 1);
  EXPECT_EQ(group.pending(0).missing_ranks(), "0-2,4-7");

  request.set_job_id("nope");
  grpc::ClientContext context2;
  grpc::Status status = stub->GetJob(&context2, request, &state);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("no job 'nope'"));
}

// The online gamma fit through the service: the note says why a step asking
// for the fitted gamma was priced with the spec's; a new incarnation of the
// group keeps the job's fit, and a job the planner forgot (here evicted for
// another, at max_jobs) comes back without one.
TEST(ServiceTest, TheFittedGammaLivesAndDiesWithItsJob) {
  PlannerServerOptions options = TestOptions();
  options.service.limits.min_timing_samples = 4;
  options.service.limits.max_jobs = 1;
  options.service.limits.rendezvous_timeout = absl::Milliseconds(100);
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  // Rank r's timing of `step`, carrying its work, at gamma 2 and 1e-12 s per
  // unit; compute_seconds 0 (no timing) unless `timed`.
  auto timing = [](uint64_t step, int r, bool timed) {
    v1::StepTiming t;
    t.set_step(step);
    if (!timed) return t;
    const double linear = 1e9 * (r + 1), attention = 1e8 * (r + 1) * (r + 1);
    t.set_linear_work(linear);
    t.set_attention_work(attention);
    t.set_compute_seconds(1e-12 * (linear + 2.0 * attention));
    return t;
  };
  // Plans a step of `job` (8 ranks, spec gamma 0.5) asking for the fitted
  // gamma, with the first `timed_ranks` ranks' timings of the step before.
  auto plan = [&](const std::string& job, uint64_t incarnation, uint64_t step,
                  int timed_ranks) {
    StepParams params;
    params.job_id = job;
    params.step = step;
    v1::PlanGroupRequest request = MakePlanGroupRequest(params, RandomLengths(8, step + 1));
    request.mutable_spec()->set_incarnation(incarnation);
    request.mutable_spec()->set_use_fitted_gamma(true);
    for (int r = 0; r < 8 && timed_ranks > 0; ++r) {
      *request.add_previous() = timing(step - 1, r, r < timed_ranks);
    }
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::PlanGroupResponse response;
    grpc::Status status = stub->PlanGroup(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.balance();
  };
  const std::string no_timings =
      "no timings of this job yet (record_compute_seconds on every rank)";

  v1::Balance balance = plan("fit", 0, 0, 0);
  EXPECT_EQ(balance.gamma_note(), no_timings);
  EXPECT_EQ(balance.gamma_used(), 0.5);
  balance = plan("fit", 0, 1, 2);
  EXPECT_EQ(balance.gamma_note(),
            "2 timing samples, the fit needs 4 (every rank's record_compute_seconds, one per "
            "step)");
  EXPECT_EQ(balance.gamma_used(), 0.5);
  balance = plan("fit", 0, 2, 8);
  EXPECT_EQ(balance.gamma_note(), "");
  EXPECT_NEAR(balance.gamma_used(), 2.0, 1e-6);

  // A restart (a new incarnation replaces the group): the job keeps its fit.
  balance = plan("fit", 5, 0, 0);
  EXPECT_EQ(balance.gamma_note(), "");
  EXPECT_NEAR(balance.gamma_used(), 2.0, 1e-6);

  // Evicted for another job, and back: it starts over.
  absl::SleepFor(absl::Milliseconds(150));  // past the rendezvous timeout: evictable
  balance = plan("other", 0, 0, 0);
  EXPECT_EQ(balance.gamma_note(), no_timings);
  absl::SleepFor(absl::Milliseconds(150));
  balance = plan("fit", 5, 3, 0);
  EXPECT_EQ(balance.gamma_note(), no_timings);
  EXPECT_EQ(balance.gamma_used(), 0.5);
  EXPECT_EQ(server->service().rendezvous().jobs(), 1);
  EXPECT_EQ(server->service().cost_fits().usage().jobs, 1);
  EXPECT_EQ(server->service().cost_fits().usage().samples, 0);
}

// The measured model under use_fitted_gamma: the service fits the job's
// attention table from its timed steps and plans with it. One rank, so the
// test knows the work of every plan: the rank's own sequences; its times
// are the transformer model's at gamma 2, so the table fitted is that line,
// not the one the spec starts from (gamma 0.5's).
TEST(ServiceTest, AMeasuredJobIsPlannedWithTheTableFittedFromItsSteps) {
  PlannerServerOptions options = TestOptions();
  options.service.limits.min_timing_samples = 4;
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(LocalChannel(server->port()));
  constexpr double kD = 64;
  auto plan = [&](uint64_t step, const std::vector<int64_t>* timed_lengths) {
    StepParams params;
    params.job_id = "measured";
    params.step = step;
    params.topology = "g1n1";
    v1::PlanGroupRequest request;
    *request.mutable_spec() = MakeRequest(params, 1, 0, {}).spec();
    request.mutable_spec()->set_cost_model(v1::COST_MODEL_MEASURED);
    request.mutable_spec()->set_use_fitted_gamma(true);
    for (double pairs : {1.0, 1e8}) {
      request.mutable_spec()->mutable_measured_attention()->add_pairs(pairs);
      request.mutable_spec()->mutable_measured_attention()->add_work(0.5 * 4 * kD * pairs);
    }
    const std::vector<int64_t> lengths = RandomLengths(1, step + 1)[0];
    request.add_ranks()->mutable_sequence_lengths()->Add(lengths.begin(), lengths.end());
    if (timed_lengths != nullptr) {
      double linear = 0, attention = 0;
      for (int64_t l : *timed_lengths) {
        linear += 24.0 * l * kD * kD;
        attention += 4.0 * l * l * kD;
      }
      v1::StepTiming* timing = request.add_previous();
      timing->set_step(step - 1);
      timing->set_compute_seconds(1e-12 * (linear + 2.0 * attention));
    }
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::PlanGroupResponse response;
    grpc::Status status = stub->PlanGroup(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return std::make_pair(lengths, response.balance());
  };
  auto [lengths, balance] = plan(0, nullptr);
  EXPECT_THAT(balance.gamma_note(), HasSubstr("no timed steps of this job for its table yet"));
  for (uint64_t step = 1; step < 60; ++step) std::tie(lengths, balance) = plan(step, &lengths);
  EXPECT_EQ(balance.gamma_note(), "");
  std::optional<MeasuredAttention> table = server->service().cost_fits().FittedTable("measured");
  ASSERT_TRUE(table.has_value());
  EXPECT_GE(table->pairs().size(), 8u);  // lengths up to 4096: points up to 4^12
  // At lengths that carry a step's time (the shortest weigh a millionth of
  // it), as gamma 2 prices them.
  for (double l : {512.0, 1024.0, 2048.0, 3000.0}) {
    const double want = 2.0 * 4 * kD * l * l;
    EXPECT_NEAR(table->Work(l * l), want, 1e-2 * want) << "length " << l;
  }
}

// Reflection is tested against the `knapformer serve` process
// (serve_process_test): its client stubs cannot share a binary with the server.
TEST(ServiceTest, HealthIsServing) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto channel = LocalChannel(server->port());
  auto health = grpc::health::v1::Health::NewStub(channel);
  for (const std::string service : {"", "knapformer.v1.Planner"}) {
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    grpc::health::v1::HealthCheckResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    ASSERT_TRUE(health->Check(&context, request, &response).ok()) << service;
    EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING) << service;
  }
  {
    grpc::health::v1::HealthCheckRequest request;
    request.set_service("no.such.Service");
    grpc::health::v1::HealthCheckResponse response;
    grpc::ClientContext context;
    EXPECT_EQ(health->Check(&context, request, &response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }

}

// TLS and mutual TLS with throwaway certificates from openssl.
class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_util::TempPath("tls");
    std::string log;
    ASSERT_TRUE(testing_util::MakeTlsFiles(dir_, {{"client", ""}}, &log))
        << "openssl failed (scripts/setup.sh installs it): " << log;
  }

  std::string Read(const std::string& name) {
    return testing_util::ReadFile(absl::StrCat(dir_, "/", name));
  }

  // A one-rank step over `credentials`.
  grpc::Status PlanOver(int port, std::shared_ptr<grpc::ChannelCredentials> credentials) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    auto channel =
        grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port), credentials, args);
    auto stub = v1::Planner::NewStub(channel);
    StepParams params;
    params.topology = "g1n1";
    params.step = step_++;
    return PlanOnce(stub.get(), MakeRequest(params, 1, 0, {3}), nullptr, absl::Seconds(5));
  }

  std::string dir_;
  uint64_t step_ = 0;
};

TEST_F(TlsTest, MutualTlsAcceptsOnlyClientsWithACertificateFromTheCa) {
  PlannerServerOptions options = TestOptions();
  options.tls.cert_file = dir_ + "/server.pem";
  options.tls.key_file = dir_ + "/server.key";
  options.tls.client_ca_file = dir_ + "/ca.pem";
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);

  grpc::SslCredentialsOptions with_cert;
  with_cert.pem_root_certs = Read("ca.pem");
  with_cert.pem_private_key = Read("client.key");
  with_cert.pem_cert_chain = Read("client.pem");
  grpc::Status status = PlanOver(server->port(), grpc::SslCredentials(with_cert));
  EXPECT_TRUE(status.ok()) << status.error_message();

  grpc::SslCredentialsOptions without_cert;
  without_cert.pem_root_certs = Read("ca.pem");
  EXPECT_EQ(PlanOver(server->port(), grpc::SslCredentials(without_cert)).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(PlanOver(server->port(), grpc::InsecureChannelCredentials()).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, TlsWithoutClientCaServesAnyTlsClient) {
  PlannerServerOptions options = TestOptions();
  options.tls.cert_file = dir_ + "/server.pem";
  options.tls.key_file = dir_ + "/server.key";
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  grpc::SslCredentialsOptions tls;
  tls.pem_root_certs = Read("ca.pem");
  grpc::Status status = PlanOver(server->port(), grpc::SslCredentials(tls));
  EXPECT_TRUE(status.ok()) << status.error_message();
}

// The kubelet's gRPC probes cannot speak TLS: --health-listen answers them
// in plaintext, and nothing but health is served there.
TEST_F(TlsTest, AHealthOnlyListenerAnswersProbesInPlaintext) {
  PlannerServerOptions options = TestOptions();
  options.tls.cert_file = dir_ + "/server.pem";
  options.tls.key_file = dir_ + "/server.key";
  options.health_address = "127.0.0.1:0";
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  ASSERT_NE(server->health_port(), 0);
  auto health = grpc::health::v1::Health::NewStub(LocalChannel(server->health_port()));
  for (const std::string& name : {std::string(), std::string("knapformer.v1.Planner")}) {
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(name);
    grpc::health::v1::HealthCheckResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    ASSERT_TRUE(health->Check(&context, request, &response).ok()) << "'" << name << "'";
    EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  EXPECT_EQ(PlanOver(server->health_port(), grpc::InsecureChannelCredentials()).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  // Health and nothing else: not reflection either.
  EXPECT_EQ(testing_util::ReflectionCode(LocalChannel(server->health_port())), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(PlanOver(server->port(), grpc::InsecureChannelCredentials()).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, IncompleteOrUnreadableTlsFilesAreInvalidArgument) {
  PlannerServerOptions options = TestOptions();
  options.tls.cert_file = dir_ + "/server.pem";
  auto server = PlannerServer::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("--tls-cert and --tls-key"));
  options.tls.key_file = dir_ + "/missing.key";
  server = PlannerServer::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("--tls-key: cannot read"));
  options.tls.key_file = dir_ + "/server.ext";
  server = PlannerServer::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("is not a PEM file"));
}

}  // namespace
}  // namespace knapformer
