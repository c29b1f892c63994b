// The /metrics page of a planner that has planned, failed and timed out steps:
// every series carries the right value, the page passes the real
// `promtool check metrics`, and an idle job's series go away.
#include <map>
#include <random>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/balancer.h"
#include "planner/calibration.h"
#include "server/planner_server.h"
#include "tests/server/service_test_util.h"

namespace knapformer {
namespace {

using ::knapformer::testing_util::AsyncPlan;
using ::knapformer::testing_util::HttpGet;
using ::knapformer::testing_util::LocalChannel;
using ::knapformer::testing_util::MakeGroupRequests;
using ::knapformer::testing_util::MakePlanGroupRequest;
using ::knapformer::testing_util::MakeRequest;
using ::knapformer::testing_util::PlanConcurrently;
using ::knapformer::testing_util::PlanResult;
using ::knapformer::testing_util::RandomLengths;
using ::knapformer::testing_util::RunWithInput;
using ::knapformer::testing_util::StepParams;
using ::testing::HasSubstr;
using ::testing::Not;

// "name{labels}" -> value for every sample line of an exposition page.
std::map<std::string, double> ParseSamples(const std::string& page) {
  std::map<std::string, double> samples;
  std::istringstream lines(page);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    double value = 0;
    if (space == std::string::npos) continue;
    const std::string text = line.substr(space + 1);
    if (text == "+Inf") {
      value = std::numeric_limits<double>::infinity();
    } else if (!absl::SimpleAtod(text, &value)) {
      continue;
    }
    samples[line.substr(0, space)] = value;
  }
  return samples;
}

class MetricsTest : public ::testing::Test {
 protected:
  // Gauges snapshotted at every scrape unless `gauge_interval` says otherwise.
  void StartServer(absl::Duration job_ttl,
                   absl::Duration gauge_interval = absl::ZeroDuration()) {
    PlannerServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.metrics_address = "127.0.0.1:0";
    options.service.solver_threads = 2;
    // 1 s: a step's 8 calls can arrive that far apart on a loaded machine
    // under a sanitizer; one test waits it out once.
    options.service.limits.rendezvous_timeout = absl::Seconds(1);
    options.service.limits.job_ttl = job_ttl;
    options.service.metrics_gauge_interval = gauge_interval;
    auto server = PlannerServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_NE(server_->metrics_port(), 0);
    stub_ = v1::Planner::NewStub(LocalChannel(server_->port()));
  }

  std::string Scrape() {
    auto page = HttpGet(server_->metrics_port(), "/metrics");
    EXPECT_TRUE(page.ok()) << page.status();
    return page.ok() ? *page : std::string();
  }

  // Plans `steps` steps of `job` (8 ranks); returns the last step's balance
  // and adds up the moved tokens.
  v1::Balance PlanSteps(const std::string& job, int steps, int64_t* moved_tokens) {
    v1::Balance last;
    for (int s = 0; s < steps; ++s) {
      StepParams params;
      params.job_id = job;
      params.step = s;
      params.token_bytes = 100;
      std::vector<PlanResult> results =
          PlanConcurrently(stub_.get(), MakeGroupRequests(params, RandomLengths(8, 10 + s)));
      for (const PlanResult& r : results) EXPECT_TRUE(r.status.ok()) << r.status.error_message();
      last = results[0].response.balance();
      *moved_tokens += last.moved_tokens();
    }
    return last;
  }

  std::unique_ptr<PlannerServer> server_;
  std::unique_ptr<v1::Planner::Stub> stub_;
};

TEST_F(MetricsTest, EverySeriesHasTheRightValueAndThePagePassesPromtool) {
  StartServer(absl::Hours(1));
  int64_t moved = 0;
  const v1::Balance last = PlanSteps("m1", 2, &moved);
  ASSERT_GT(moved, 0);
  // One malformed request and one step that times out (job m2, rank 1 of 2 missing).
  StepParams params;
  params.job_id = "m1";
  grpc::ClientContext context;
  v1::PlanResponse response;
  EXPECT_EQ(stub_->Plan(&context, MakeRequest(params, 8, 9, {1}), &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  params.job_id = "m2";
  params.topology = "g1n2";
  AsyncPlan lonely(stub_.get(), MakeRequest(params, 2, 0, {1}));
  ASSERT_TRUE(lonely.WaitFor(absl::Seconds(10)));
  EXPECT_EQ(lonely.status().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);

  const std::string page = Scrape();
  const std::map<std::string, double> samples = ParseSamples(page);
  auto value = [&](const std::string& key) {
    auto it = samples.find(key);
    EXPECT_NE(it, samples.end()) << key << " not on the page:\n" << page;
    return it == samples.end() ? -1.0 : it->second;
  };
  EXPECT_EQ(value("knapformer_planner_requests_total{code=\"OK\",job_id=\"m1\",method=\"Plan\"}"), 16);
  EXPECT_EQ(value("knapformer_planner_requests_total{code=\"INVALID_ARGUMENT\",job_id=\"m1\","
                  "method=\"Plan\"}"),
            1);
  EXPECT_EQ(value("knapformer_planner_requests_total{code=\"DEADLINE_EXCEEDED\",job_id=\"m2\","
                  "method=\"Plan\"}"),
            1);
  EXPECT_EQ(value("knapformer_planner_steps_total{job_id=\"m1\"}"), 2);
  EXPECT_EQ(value("knapformer_planner_rendezvous_timeouts_total{job_id=\"m2\"}"), 1);
  EXPECT_EQ(value("knapformer_planner_rendezvous_timeouts_total{job_id=\"m1\"}"), 0);
  EXPECT_EQ(value("knapformer_planner_moved_tokens_total{job_id=\"m1\"}"), moved);
  EXPECT_EQ(value("knapformer_planner_moved_bytes_total{job_id=\"m1\"}"), moved * 100);
  EXPECT_EQ(value("knapformer_planner_planning_duration_seconds_count{job_id=\"m1\"}"), 2);
  EXPECT_EQ(value("knapformer_planner_rendezvous_wait_seconds_count{job_id=\"m1\"}"), 2);
  // The page prints ratios with fewer digits than a double holds.
  EXPECT_NEAR(value("knapformer_planner_wir_after_ratio{group=\"\",job_id=\"m1\"}"),
              last.wir_after(), 1e-9 * last.wir_after());
  EXPECT_NEAR(value("knapformer_planner_max_over_mean_before_ratio{group=\"\",job_id=\"m1\"}"),
              last.max_over_mean_before(), 1e-9 * last.max_over_mean_before());
  EXPECT_NEAR(value("knapformer_planner_max_over_mean_after_ratio{group=\"\",job_id=\"m1\"}"),
              last.max_over_mean_after(), 1e-9 * last.max_over_mean_after());
  EXPECT_EQ(value("knapformer_planner_ranks_seen{group=\"\",job_id=\"m1\"}"), 8);
  // The layout g1n2+g2n1+g4n1 of the last step, and its predicted time.
  EXPECT_EQ(last.layout(), "g1n2+g2n1+g4n1");
  EXPECT_EQ(value("knapformer_planner_bag_gpus{gpus=\"1\",group=\"\",job_id=\"m1\"}"), 2);
  EXPECT_EQ(value("knapformer_planner_bag_gpus{gpus=\"2\",group=\"\",job_id=\"m1\"}"), 2);
  EXPECT_EQ(value("knapformer_planner_bag_gpus{gpus=\"4\",group=\"\",job_id=\"m1\"}"), 4);
  EXPECT_GT(last.predicted_step_seconds(), 0);
  EXPECT_NEAR(value("knapformer_planner_predicted_step_seconds{group=\"\",job_id=\"m1\"}"),
              last.predicted_step_seconds(), 1e-9 * last.predicted_step_seconds());
  EXPECT_EQ(value("knapformer_planner_ranks_seen{group=\"\",job_id=\"m2\"}"), 1);
  EXPECT_EQ(value("knapformer_planner_pending_steps{group=\"\",job_id=\"m1\"}"), 0);
  EXPECT_EQ(value("knapformer_planner_jobs"), 2);

  std::string output;
  EXPECT_EQ(RunWithInput("promtool check metrics", page, &output), 0) << output << "\n" << page;

  // The check can fail: a counter without the _total suffix is a lint error.
  output.clear();
  const std::string bad =
      "# HELP knapformer_bad_requests Requests.\n# TYPE knapformer_bad_requests counter\n"
      "knapformer_bad_requests 1\n";
  EXPECT_NE(RunWithInput("promtool check metrics", bad, &output), 0) << output;
}

// Group mode (one PlanGroup per step, the client's default): every rank of a
// planned step counts as seen; its first step's bytes, unknown to the
// client until its first route (token_bytes 0), are counted at the next
// step with the bytes that step reports; no rendezvous wait is observed.
TEST_F(MetricsTest, GroupModeCountsRanksAndTheFirstStepsBytes) {
  StartServer(absl::Hours(1));
  int64_t moved = 0;
  testing::internal::CaptureStderr();
  for (int step = 0; step < 3; ++step) {
    StepParams params;
    params.job_id = "group-mode";
    params.step = step;
    params.token_bytes = step == 0 ? 0 : 100;
    const RankLengths lengths = RandomLengths(8, 20 + step);
    v1::PlanGroupRequest request = MakePlanGroupRequest(params, lengths);
    grpc::ClientContext context;
    v1::PlanGroupResponse response;
    ASSERT_TRUE(stub_->PlanGroup(&context, request, &response).ok());
    moved += response.balance().moved_tokens();
    if (step == 0) {
      const std::map<std::string, double> samples = ParseSamples(Scrape());
      EXPECT_EQ(samples.at("knapformer_planner_moved_bytes_total{job_id=\"group-mode\"}"), 0);
      EXPECT_EQ(samples.at("knapformer_planner_ranks_seen{group=\"\",job_id=\"group-mode\"}"),
                8);
    }
  }
  ASSERT_GT(moved, 0);
  const std::map<std::string, double> samples = ParseSamples(Scrape());
  EXPECT_EQ(samples.at("knapformer_planner_moved_tokens_total{job_id=\"group-mode\"}"), moved);
  EXPECT_EQ(samples.at("knapformer_planner_moved_bytes_total{job_id=\"group-mode\"}"),
            moved * 100);
  EXPECT_EQ(samples.at("knapformer_planner_steps_total{job_id=\"group-mode\"}"), 3);
  EXPECT_EQ(samples.at(
                "knapformer_planner_rendezvous_wait_seconds_count{job_id=\"group-mode\"}"),
            0);

  // The job restarts: a new incarnation, logged as such (the first was
  // logged as a new job, once).
  StepParams params;
  params.job_id = "group-mode";
  v1::PlanGroupRequest request;
  *request.mutable_spec() = MakeRequest(params, 2, 0, {}).spec();
  request.mutable_spec()->set_topology("g1n2");
  request.mutable_spec()->set_incarnation(0xabc);
  request.add_ranks()->add_sequence_lengths(5);
  request.add_ranks()->add_sequence_lengths(7);
  grpc::ClientContext context;
  v1::PlanGroupResponse response;
  ASSERT_TRUE(stub_->PlanGroup(&context, request, &response).ok());
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_THAT(log, HasSubstr("new job 'group-mode': incarnation 0, 8 ranks, topology "
                             "g1n2+g2n1+g4n1, from step 0"));
  EXPECT_EQ(log.find("new job"), log.rfind("new job")) << log;
  EXPECT_THAT(log, HasSubstr("job 'group-mode': new incarnation abc, 2 ranks, topology g1n2, "
                             "from step 0 (a restart, or another run with this job id)"));
}

// Ranks report their compute time of the previous step; the service pairs it
// with the work that step's plan gave them, fits gamma per job, exports it,
// and plans with it when a step asks for use_fitted_gamma.
TEST_F(MetricsTest, GammaIsFittedFromStepTimingsAndUsedWhenAsked) {
  StartServer(absl::Hours(1));
  constexpr double kTrueGamma = 2.0, kSecondsPerUnit = 1e-12;
  std::mt19937_64 rng(5);
  std::normal_distribution<double> noise(0.0, 0.01);
  StepParams params;
  params.job_id = "fit";  // d_model 64, gamma 0.5 (what the spec claims)
  auto world = World::Create(*Topology::Parse(params.topology), 8);
  ASSERT_TRUE(world.ok());
  const CostModel spec_cost = *CostModel::Create(params.d_model, params.gamma);
  std::vector<WorkSample> previous_work;
  for (int s = 0; s < 30; ++s) {
    params.step = s;
    const RankLengths lengths = RandomLengths(8, 100 + s);
    std::vector<v1::PlanRequest> requests = MakeGroupRequests(params, lengths);
    for (int r = 0; r < 8 && s > 0; ++r) {
      const WorkSample& w = previous_work[r];
      const double seconds =
          kSecondsPerUnit * (w.linear + kTrueGamma * w.attention) * (1 + noise(rng));
      requests[r].mutable_previous()->set_step(s - 1);
      requests[r].mutable_previous()->set_compute_seconds(std::max(0.0, seconds));
    }
    for (const PlanResult& result : PlanConcurrently(stub_.get(), requests)) {
      ASSERT_TRUE(result.status.ok()) << result.status.error_message();
    }
    // The service's plan is the core's (same default options).
    auto plan = BalanceGreedy(*world, spec_cost, lengths);
    ASSERT_TRUE(plan.ok());
    previous_work = RankWork(*plan, params.d_model);
  }
  double fitted = 0;
  for (const auto& [name, value] : ParseSamples(Scrape())) {
    if (absl::StartsWith(name, "knapformer_planner_fitted_gamma{") &&
        absl::StrContains(name, "job_id=\"fit\"")) {
      fitted = value;
    }
  }
  EXPECT_NEAR(fitted, kTrueGamma, 0.05 * kTrueGamma);

  // A step that asks for it is planned with the fitted gamma: each rank's
  // workload before balancing is priced with it, not with the spec's 0.5.
  params.step = 30;
  v1::StepSpec spec;
  const RankLengths lengths = RandomLengths(8, 200);
  std::vector<v1::PlanRequest> requests = MakeGroupRequests(params, lengths);
  for (v1::PlanRequest& request : requests) request.mutable_spec()->set_use_fitted_gamma(true);
  std::vector<PlanResult> results = PlanConcurrently(stub_.get(), requests);
  const CostModel fitted_cost = *CostModel::Create(params.d_model, fitted);
  int busy_ranks = 0;
  for (int r = 0; r < 8; ++r) {
    ASSERT_TRUE(results[r].status.ok()) << results[r].status.error_message();
    double with_fit = 0, with_spec = 0;
    for (int64_t l : lengths[r]) {
      with_fit += fitted_cost.Workload(l);
      with_spec += spec_cost.Workload(l);
    }
    if (with_spec == 0) continue;
    ++busy_ranks;
    const double got = results[r].response.plan().workload_before();
    // The exported gauge has ~10 significant digits.
    EXPECT_NEAR(got, with_fit, 1e-6 * with_fit) << "rank " << r;
    EXPECT_GT(std::abs(got - with_spec), 1e-3 * with_spec) << "rank " << r;
  }
  EXPECT_GT(busy_ranks, 3);
}

TEST_F(MetricsTest, AnIdleJobsSeriesAndStateAreDropped) {
  StartServer(absl::Milliseconds(500));
  int64_t moved = 0;
  PlanSteps("short-lived", 1, &moved);
  EXPECT_THAT(Scrape(), HasSubstr("job_id=\"short-lived\""));
  const absl::Time limit = absl::Now() + absl::Seconds(10);
  std::string page = Scrape();
  while (page.find("short-lived") != std::string::npos && absl::Now() < limit) {
    absl::SleepFor(absl::Milliseconds(100));
    page = Scrape();
  }
  EXPECT_THAT(page, Not(HasSubstr("short-lived")));
  EXPECT_EQ(server_->service().rendezvous().jobs(), 0);
  EXPECT_EQ(server_->service().cost_fits().usage().jobs, 0);
}

// However often it is scraped, the metrics page reads the rendezvous (under
// its lock) at most once per gauge interval, and a later scrape shows what
// changed since.
TEST_F(MetricsTest, ScrapesShareOneSnapshotOfTheGaugesPerInterval) {
  StartServer(absl::Hours(1), absl::Seconds(1));
  int64_t moved = 0;
  PlanSteps("first", 1, &moved);
  const absl::Time start = absl::Now();
  EXPECT_THAT(Scrape(), HasSubstr("knapformer_planner_ranks_seen{group=\"\",job_id=\"first\"}"));
  const int64_t reads = server_->service().rendezvous().gauge_reads();
  PlanSteps("second", 1, &moved);
  std::string page;
  for (int i = 0; i < 50; ++i) page = Scrape();
  if (absl::Now() - start < absl::Milliseconds(900)) {
    EXPECT_EQ(server_->service().rendezvous().gauge_reads(), reads);
    // The gauges are the snapshot's (the counters are live).
    EXPECT_THAT(page, Not(HasSubstr("ranks_seen{group=\"\",job_id=\"second\"}")));
    EXPECT_THAT(page, HasSubstr("knapformer_planner_jobs 1\n"));
  }
  absl::SleepFor(absl::Milliseconds(1100));
  EXPECT_THAT(Scrape(), HasSubstr("knapformer_planner_ranks_seen{group=\"\",job_id=\"second\"}"));
  EXPECT_LE(server_->service().rendezvous().gauge_reads(), reads + 2);
}

}  // namespace
}  // namespace knapformer
