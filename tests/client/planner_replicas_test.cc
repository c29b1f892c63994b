// The planner client against several planner replicas named by one target:
// group steps spread over them (round_robin), a replica that stops between
// steps costs no step (every step still comes from the service, exact), and
// per-rank mode refuses a target naming several replicas.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "client/planner_client.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "knapformer/v1/planner.grpc.pb.h"
#include "planner/balancer.h"
#include "planner/calibration.h"
#include "planner/measured_cost.h"
#include "server/planner_server.h"
#include "transport/local_transport.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;

constexpr int kRanks = 4;
constexpr char kJob[] = "replicas-test";

std::vector<int64_t> Lengths(uint64_t step, int rank) {
  std::vector<int64_t> lengths;
  for (uint64_t i = 0; i < 1 + (rank + step) % 3; ++i) {
    lengths.push_back(static_cast<int64_t>(1 + (rank * 37 + i * 101 + step * 13) % 400));
  }
  if (static_cast<int>(step % kRanks) == rank) lengths.push_back(1200);
  return lengths;
}

v1::StepSpec Spec(uint64_t step) {
  v1::StepSpec spec;
  spec.set_job_id(kJob);
  spec.set_step(step);
  spec.set_world_size(kRanks);
  spec.set_topology("g1n2+g2n1");
  spec.set_d_model(64);
  spec.set_gamma(0.5);
  return spec;
}

Plan CorePlan(uint64_t step) {
  RankLengths lengths(kRanks);
  for (int r = 0; r < kRanks; ++r) lengths[r] = Lengths(step, r);
  auto world = World::Create(*Topology::Parse("g1n2+g2n1"), kRanks);
  auto plan = BalanceGreedy(*world, *CostModel::Create(64, 0.5), lengths);
  EXPECT_TRUE(plan.ok());
  return *std::move(plan);
}

std::unique_ptr<PlannerServer> StartReplica() {
  PlannerServerOptions options;
  options.listen_address = "127.0.0.1:0";
  auto server = PlannerServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// Three replicas on 127.0.0.1, and group-mode client options naming all of
// them in one target; a step the replicas cannot plan fails
// (require_service) instead of being planned locally.
void StartReplicas(std::vector<std::unique_ptr<PlannerServer>>* replicas,
                   std::vector<std::string>* addresses, PlannerClientOptions* options) {
  for (int i = 0; i < 3; ++i) {
    replicas->push_back(StartReplica());
    ASSERT_NE(replicas->back(), nullptr);
    addresses->push_back(replicas->back()->address());
  }
  options->address = absl::StrCat("ipv4:", absl::StrJoin(*addresses, ","));
  options->require_service = true;
  options->call_deadline = absl::Seconds(10);
}

// The steps of kJob the replica at `address` planned (0 if it knows none).
uint64_t StepsPlanned(const std::string& address) {
  auto stub = v1::Planner::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::GetJobRequest request;
  request.set_job_id(kJob);
  v1::JobState state;
  if (!stub->GetJob(&context, request, &state).ok()) return 0;
  uint64_t planned = 0;
  for (const v1::GroupState& group : state.groups()) planned += group.steps_planned();
  return planned;
}

// round_robin picks only among the replicas it has connected to, which on a
// loaded machine may be one or two of the three for the first steps; once
// every replica has planned a step, the picks rotate over all of them.
bool EveryReplicaPlanned(const std::vector<std::string>& addresses) {
  for (const std::string& address : addresses) {
    if (StepsPlanned(address) == 0) return false;
  }
  return true;
}
// The steps a test plans at most while it waits for that.
constexpr int kMaxConnectingSteps = 200;

// The ranks' threads decide together, before each step, whether to plan it:
// the last to arrive calls `decide`, once per round (absl::Barrier is single
// use).
class StepRounds {
 public:
  explicit StepRounds(int ranks) : ranks_(ranks) {}

  bool Next(const std::function<bool()>& decide) {
    absl::MutexLock lock(&mu_);
    const uint64_t round = round_;
    if (++arrived_ == ranks_) {
      arrived_ = 0;
      decision_ = decide();
      ++round_;
      round_ended_.SignalAll();
    } else {
      while (round_ == round) round_ended_.Wait(&mu_);
    }
    // No later round can end before this thread arrives at it: the decision
    // is this round's.
    return decision_;
  }

 private:
  const int ranks_;
  absl::Mutex mu_;
  absl::CondVar round_ended_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t round_ ABSL_GUARDED_BY(mu_) = 0;
  bool decision_ ABSL_GUARDED_BY(mu_) = false;
};

TEST(PlannerReplicasTest, GroupStepsSpreadOverReplicasAndAStoppedOneCostsNoStep) {
  std::vector<std::unique_ptr<PlannerServer>> replicas;
  std::vector<std::string> addresses;
  PlannerClientOptions options;
  ASSERT_NO_FATAL_FAILURE(StartReplicas(&replicas, &addresses, &options));

  // The steps go on until every replica has planned one; then replica 0
  // stops (drains) before step `stopped_at`, and kStepsAfterStop more follow.
  constexpr int kStepsAfterStop = 4;
  int stopped_at = -1;
  uint64_t stopped_replica_steps = 0;
  StepRounds rounds(kRanks);
  auto transports = LocalTransport::CreateGroup(kRanks, absl::Seconds(30));
  std::vector<std::vector<absl::StatusOr<StepPlan>>> results(kRanks);  // by rank, then step
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      auto client = PlannerClient::Create(options, transports[r].get());
      ASSERT_TRUE(client.ok()) << client.status();
      for (int s = 0; rounds.Next([&] {
             if (stopped_at >= 0) return s < stopped_at + kStepsAfterStop;
             if (s == kMaxConnectingSteps || (s > 0 && EveryReplicaPlanned(addresses))) {
               stopped_replica_steps = StepsPlanned(addresses[0]);
               replicas[0]->Shutdown();
               stopped_at = s;
             }
             return true;
           });
           ++s) {
        results[r].push_back((*client)->Plan(Spec(s), Lengths(s, r)));
      }
    });
  }
  for (std::thread& t : threads) t.join();

  ASSERT_LT(stopped_at, kMaxConnectingSteps)
      << "round_robin sent none of " << kMaxConnectingSteps << " steps to some replica";
  const int steps = stopped_at + kStepsAfterStop;
  for (int r = 0; r < kRanks; ++r) ASSERT_EQ(results[r].size(), static_cast<size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    const Plan core = CorePlan(s);
    for (int r = 0; r < kRanks; ++r) {
      const absl::StatusOr<StepPlan>& result = results[r][s];
      ASSERT_TRUE(result.ok()) << "step " << s << " rank " << r << ": " << result.status();
      EXPECT_EQ(result->source, PlanSource::kService) << "step " << s;
      EXPECT_EQ(result->local_steps, 0) << "step " << s;
      EXPECT_EQ(result->workload_after, core.workload_after) << "step " << s;
      EXPECT_EQ(result->moved_tokens, core.MovedTokens()) << "step " << s;
    }
  }
  // Each step was planned once, by some replica; every replica planned
  // some, and the stopped one only steps before its stop.
  const uint64_t others = StepsPlanned(addresses[1]) + StepsPlanned(addresses[2]);
  EXPECT_EQ(stopped_replica_steps + others, static_cast<uint64_t>(steps));
  EXPECT_LE(stopped_replica_steps, static_cast<uint64_t>(stopped_at));
  EXPECT_GT(stopped_replica_steps, 0u);
}

// What a step's plan said of the fitted cost, on one rank.
struct FittedCostUsed {
  double gamma_used = 0;
  std::string gamma_note;
  std::optional<MeasuredAttention> fitted_table;
};

// kRanks in-process ranks plan steps through `options`, step s with
// spec_of(s) and Lengths(s, rank), every step from the service: until every
// replica at `addresses` has planned one, then `steps` more. With each
// request a rank sends its time of the step before: its work under
// `true_gamma`, at 1e-9 s per unit. What each step's plan said, by step and
// rank.
std::vector<std::vector<FittedCostUsed>> PlanTimedSteps(
    const PlannerClientOptions& options, const std::vector<std::string>& addresses, int steps,
    const std::function<v1::StepSpec(int)>& spec_of, double true_gamma) {
  auto transports = LocalTransport::CreateGroup(kRanks, absl::Seconds(30));
  std::vector<std::vector<FittedCostUsed>> used_by_rank(kRanks);
  int last = -1;  // the last step, once every replica has planned one
  StepRounds rounds(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      auto client = PlannerClient::Create(options, transports[r].get());
      ASSERT_TRUE(client.ok()) << client.status();
      v1::StepTiming previous;
      for (int s = 0; rounds.Next([&] {
             if (last < 0 && s > 0 &&
                 (s == kMaxConnectingSteps || EveryReplicaPlanned(addresses))) {
               last = s + steps - 1;
             }
             return last < 0 || s <= last;
           });
           ++s) {
        const v1::StepSpec spec = spec_of(s);
        auto step = (*client)->Plan(spec, Lengths(s, r), s > 0 ? &previous : nullptr);
        ASSERT_TRUE(step.ok()) << "step " << s << ": " << step.status();
        ASSERT_EQ(step->source, PlanSource::kService);
        ASSERT_NE(step->whole, nullptr);
        used_by_rank[r].push_back({step->gamma_used, step->gamma_note, step->fitted_table});
        const WorkSample work = RankWork(*step->whole, spec.d_model())[r];
        previous.set_step(s);
        previous.set_compute_seconds(1e-9 * (work.linear + true_gamma * work.attention));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LT(last + 1 - steps, kMaxConnectingSteps)
      << "round_robin sent none of " << kMaxConnectingSteps << " steps to some replica";
  std::vector<std::vector<FittedCostUsed>> used(last + 1, std::vector<FittedCostUsed>(kRanks));
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(used_by_rank[r].size(), used.size()) << "rank " << r;
    for (size_t s = 0; s < used.size() && s < used_by_rank[r].size(); ++s) {
      used[s][r] = used_by_rank[r][s];
    }
  }
  return used;
}

// Each step's timing goes out with the next step's request, to the next
// replica, which did not plan the timed step: the client sends the step's
// work with it, so every replica fits gamma (here 2, the spec says 0.5)
// from the ranks' timings.
TEST(PlannerReplicasTest, EveryReplicaFitsGammaFromTimingsOfStepsOthersPlanned) {
  std::vector<std::unique_ptr<PlannerServer>> replicas;
  std::vector<std::string> addresses;
  PlannerClientOptions options;
  ASSERT_NO_FATAL_FAILURE(StartReplicas(&replicas, &addresses, &options));
  constexpr int kSteps = 24;
  constexpr double kTrueGamma = 2.0;
  const auto used = PlanTimedSteps(options, addresses, kSteps, [](int s) {
    v1::StepSpec spec = Spec(s);
    spec.set_use_fitted_gamma(true);
    return spec;
  }, kTrueGamma);
  // The last three steps went to three replicas (round_robin); each planned
  // with the fitted gamma.
  const int steps = static_cast<int>(used.size());
  for (int s = steps - 3; s < steps; ++s) {
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_NEAR(used[s][r].gamma_used, kTrueGamma, 1e-3) << "step " << s << " rank " << r;
      EXPECT_FALSE(used[s][r].fitted_table.has_value());
    }
  }
}

// The measured model under use_fitted_gamma, over replicas: rank 0 sends
// each timing with its rank's attention by grid point in the plan it ran,
// so every replica fits the job's attention table from every step, and
// plans with it. The ranks' times follow gamma 2's line; the spec's table
// is gamma 0.5's.
TEST(PlannerReplicasTest, EveryReplicaFitsAMeasuredJobsTableFromTheRanksTimings) {
  std::vector<std::unique_ptr<PlannerServer>> replicas;
  std::vector<std::string> addresses;
  PlannerClientOptions options;
  ASSERT_NO_FATAL_FAILURE(StartReplicas(&replicas, &addresses, &options));
  constexpr int kSteps = 48;
  constexpr double kTrueGamma = 2.0;
  const auto used = PlanTimedSteps(options, addresses, kSteps, [](int s) {
    v1::StepSpec spec = Spec(s);
    spec.set_use_fitted_gamma(true);
    spec.set_cost_model(v1::COST_MODEL_MEASURED);
    for (double pairs : {1.0, 1e7}) {
      spec.mutable_measured_attention()->add_pairs(pairs);
      spec.mutable_measured_attention()->add_work(0.5 * 4 * 64 * pairs);
    }
    return spec;
  }, kTrueGamma);
  EXPECT_THAT(used[0][0].gamma_note, HasSubstr("no timed steps of this job for its table yet"));
  EXPECT_FALSE(used[0][0].fitted_table.has_value());
  // The last steps were planned with the fitted table, which every rank got.
  const int steps = static_cast<int>(used.size());
  for (int s = steps - 3; s < steps; ++s) {
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_EQ(used[s][r].gamma_note, "") << "step " << s << " rank " << r;
      ASSERT_TRUE(used[s][r].fitted_table.has_value()) << "step " << s << " rank " << r;
      const double want = kTrueGamma * 4 * 64 * 1200.0 * 1200.0;
      EXPECT_NEAR(used[s][r].fitted_table->Work(1200.0 * 1200.0), want, 1e-2 * want);
    }
  }
  for (const auto& replica : replicas) {
    std::optional<MeasuredAttention> table =
        replica->service().cost_fits().FittedTable(kJob);
    ASSERT_TRUE(table.has_value()) << replica->address();
    // At lengths the steps had (up to 400, and 1200), as gamma 2 prices them.
    for (double l : {100.0, 200.0, 300.0, 1200.0}) {
      const double want = kTrueGamma * 4 * 64 * l * l;
      EXPECT_NEAR(table->Work(l * l), want, 1e-2 * want) << "length " << l;
    }
  }
}

// gRPC's dns:/// syntax, as trainers name a headless Service: "localhost"
// may resolve to ::1 as well as 127.0.0.1, where nothing listens; the
// steps go to the address that answers.
TEST(PlannerReplicasTest, ADnsTargetIsPlannedByTheAddressesThatAnswer) {
  std::unique_ptr<PlannerServer> replica = StartReplica();
  ASSERT_NE(replica, nullptr);
  PlannerClientOptions options;
  options.address = absl::StrCat("dns:///localhost:", replica->port());
  options.require_service = true;
  options.call_deadline = absl::Seconds(10);
  auto transports = LocalTransport::CreateGroup(kRanks, absl::Seconds(30));
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      auto client = PlannerClient::Create(options, transports[r].get());
      ASSERT_TRUE(client.ok()) << client.status();
      for (int s = 0; s < 6; ++s) {
        auto step = (*client)->Plan(Spec(s), Lengths(s, r));
        ASSERT_TRUE(step.ok()) << "step " << s << ": " << step.status();
        EXPECT_EQ(step->source, PlanSource::kService);
        EXPECT_EQ(step->workload_after, CorePlan(s).workload_after);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(StepsPlanned(replica->address()), 6u);
}

TEST(PlannerReplicasTest, PerRankModeRefusesATargetNamingSeveralReplicas) {
  auto transports = LocalTransport::CreateGroup(1, absl::Seconds(5));
  PlannerClientOptions options;
  options.mode = PlannerMode::kPerRank;
  options.address = "ipv4:127.0.0.1:50001,127.0.0.1:50002";
  auto refused = PlannerClient::Create(options, transports[0].get());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("names 2 planner replicas"));
  EXPECT_THAT(refused.status().message(), HasSubstr("per-rank mode"));

  options.address = "ipv4:127.0.0.1:50001";
  EXPECT_TRUE(PlannerClient::Create(options, transports[0].get()).ok());
  options.address = "ipv4:127.0.0.1:50001,127.0.0.1:50002";
  options.mode = PlannerMode::kGroup;
  EXPECT_TRUE(PlannerClient::Create(options, transports[0].get()).ok());
}

}  // namespace
}  // namespace knapformer
