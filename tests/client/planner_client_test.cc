// The planner client on 8 in-process ranks: local planning, the service,
// a service that is down or goes down mid-run (every rank falls back
// together), and refused input reported the same on every rank.
#include "client/planner_client.h"

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "client/rank_report.pb.h"
#include "knapformer/v1/planner.grpc.pb.h"
#include "planner/balancer.h"
#include "server/job_token.h"
#include "server/planner_server.h"
#include "tests/client/slow_connect_proxy.h"
#include "transport/agreement.h"
#include "transport/local_transport.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;
using ::testing::AllOf;

constexpr int kRanks = 8;

RankLengths Lengths(uint64_t step) {
  RankLengths lengths(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    for (uint64_t i = 0; i < (r + step) % 4; ++i) {
      lengths[r].push_back(static_cast<int64_t>(1 + (r * 37 + i * 101 + step * 13) % 500));
    }
  }
  lengths[static_cast<int>(step % kRanks)].push_back(1500);  // one long sequence
  return lengths;
}

v1::StepSpec Spec(uint64_t step) {
  v1::StepSpec spec;
  spec.set_job_id("client-test");
  spec.set_step(step);
  spec.set_world_size(kRanks);
  spec.set_topology("g1n2+g2n1+g4n1");
  spec.set_d_model(64);
  spec.set_gamma(0.5);
  return spec;
}

Plan CorePlan(const RankLengths& lengths) {
  auto world = World::Create(*Topology::Parse("g1n2+g2n1+g4n1"), kRanks);
  auto plan = BalanceGreedy(*world, *CostModel::Create(64, 0.5), lengths);
  EXPECT_TRUE(plan.ok());
  return *std::move(plan);
}

void ExpectSameSlice(const RankPlan& got, const RankPlan& want) {
  ASSERT_EQ(got.route.sends.size(), want.route.sends.size());
  for (size_t i = 0; i < got.route.sends.size(); ++i) {
    EXPECT_EQ(got.route.sends[i].peer, want.route.sends[i].peer);
    EXPECT_EQ(got.route.sends[i].seq_index, want.route.sends[i].seq_index);
    EXPECT_EQ(got.route.sends[i].offset, want.route.sends[i].offset);
    EXPECT_EQ(got.route.sends[i].length, want.route.sends[i].length);
  }
  ASSERT_EQ(got.route.recvs.size(), want.route.recvs.size());
  for (size_t i = 0; i < got.route.recvs.size(); ++i) {
    EXPECT_EQ(got.route.recvs[i].peer, want.route.recvs[i].peer);
    EXPECT_EQ(got.route.recvs[i].length, want.route.recvs[i].length);
  }
  EXPECT_EQ(got.compute_chunk_lengths, want.compute_chunk_lengths);
  EXPECT_EQ(got.ulysses.sequences.size(), want.ulysses.sequences.size());
  EXPECT_EQ(got.workload_after, want.workload_after);
}

// Runs `steps` steps on kRanks threads; results[step][rank].
std::vector<std::vector<absl::StatusOr<StepPlan>>> RunSteps(
    const PlannerClientOptions& options, uint64_t first_step, int steps,
    std::function<void(uint64_t)> before_step = nullptr,
    std::function<std::vector<int64_t>(uint64_t, int)> lengths_of = nullptr,
    int64_t max_tokens_per_gpu = 0) {
  auto transports = LocalTransport::CreateGroup(kRanks, absl::Seconds(30));
  std::vector<std::vector<absl::StatusOr<StepPlan>>> results(
      steps, std::vector<absl::StatusOr<StepPlan>>(kRanks, absl::UnknownError("not run")));
  for (int s = 0; s < steps; ++s) {
    if (before_step) before_step(first_step + s);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, r, s] {
        auto client = PlannerClient::Create(options, transports[r].get());
        ASSERT_TRUE(client.ok());
        const uint64_t step = first_step + s;
        const std::vector<int64_t> lengths =
            lengths_of ? lengths_of(step, r) : Lengths(step)[r];
        v1::StepSpec spec = Spec(step);
        spec.set_max_tokens_per_gpu(max_tokens_per_gpu);
        results[s][r] = (*client)->Plan(spec, lengths);
      });
    }
    for (std::thread& t : threads) t.join();
  }
  return results;
}

void ExpectCorePlans(const std::vector<std::vector<absl::StatusOr<StepPlan>>>& results,
                     uint64_t first_step, PlanSource source) {
  for (size_t s = 0; s < results.size(); ++s) {
    const Plan core = CorePlan(Lengths(first_step + s));
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_TRUE(results[s][r].ok()) << "step " << s << " rank " << r << ": "
                                      << results[s][r].status();
      EXPECT_EQ(results[s][r]->source, source) << "step " << s << " rank " << r;
      ExpectSameSlice(results[s][r]->plan, core.Slice(r));
      EXPECT_EQ(results[s][r]->moved_tokens, core.MovedTokens());
      // Every rank knows every rank's workloads, from either source.
      EXPECT_EQ(results[s][r]->workload_before, core.workload_before) << "step " << s;
      EXPECT_EQ(results[s][r]->workload_after, core.workload_after) << "step " << s;
    }
  }
}

// A planner server on 127.0.0.1 (a free port); null, with a failure, if it
// does not start.
std::unique_ptr<PlannerServer> StartServer(
    absl::Duration rendezvous_timeout = ServiceLimits().rendezvous_timeout,
    absl::Duration max_connection_age = PlannerServerOptions().max_connection_age) {
  PlannerServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.service.limits.rendezvous_timeout = rendezvous_timeout;
  options.max_connection_age = max_connection_age;
  auto server = PlannerServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// An address that can never reach a planner is a configuration error when
// the client is made, not a warning and a run planned locally.
TEST(PlannerClientTest, AnAddressThatCanNeverWorkIsRefusedWhenTheClientIsMade) {
  auto transports = LocalTransport::CreateGroup(1, absl::Seconds(5));
  for (const char* address : {"http://127.0.0.1:50051", "127.0.0.1"}) {
    PlannerClientOptions options;
    options.address = address;
    auto client = PlannerClient::Create(options, transports[0].get());
    ASSERT_FALSE(client.ok()) << address;
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(client.status().message()),
                HasSubstr(std::string("planner_address: '") + address + "'"));
  }
}

// An answer larger than max_answer_bytes is refused before it is parsed:
// the step is planned locally on every rank (the right plan), not taken.
TEST(PlannerClientTest, AnAnswerOverMaxAnswerBytesIsRefusedAndTheStepPlannedLocally) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  PlannerClientOptions options;
  options.address = server->address();
  options.max_answer_bytes = 1024;
  // 60 sequences a rank: a whole plan of several kilobytes.
  auto many = [](uint64_t, int r) {
    std::vector<int64_t> lengths;
    for (int i = 0; i < 60; ++i) lengths.push_back(1 + (r * 31 + i * 17) % 300);
    return lengths;
  };
  const auto results = RunSteps(options, 0, 1, nullptr, many);
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(results[0][r].ok()) << results[0][r].status();
    EXPECT_EQ(results[0][r]->source, PlanSource::kLocal) << "rank " << r;
    EXPECT_THAT(results[0][r]->local_reason, HasSubstr("1024")) << results[0][r]->local_reason;
  }
  auto transports = LocalTransport::CreateGroup(1, absl::Seconds(5));
  options.max_answer_bytes = 100;
  auto refused = PlannerClient::Create(options, transports[0].get());
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("max_answer_bytes: must be in 1024..2147483647, got 100"));
}

TEST(PlannerClientTest, WithoutAServiceEveryRankComputesTheCorePlan) {
  PlannerClientOptions options;
  ExpectCorePlans(RunSteps(options, 0, 3), 0, PlanSource::kLocal);
}

// log_steps: rank 0 (only) logs one line per step with its plan's source
// and figures; a local plan made while a service is configured says why.
TEST(PlannerClientTest, LogStepsLogsOneLinePerStepOnRankZero) {
  PlannerClientOptions options;
  options.log_steps = true;
  ::testing::internal::CaptureStderr();
  const auto results = RunSteps(options, 5, 2);
  const std::string logged = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(results[0][0].ok());
  const StepPlan& plan = *results[0][0];
  EXPECT_THAT(logged, HasSubstr(absl::StrFormat(
                          "step 5: local planner, %s, max/mean %.2f -> %.2f, moved %d of "
                          "%d tokens",
                          plan.layout, plan.max_over_mean_before, plan.max_over_mean_after,
                          plan.moved_tokens, plan.total_tokens)));
  EXPECT_EQ(plan.layout, "g1n2+g2n1+g4n1");
  EXPECT_THAT(logged, HasSubstr("step 6: local planner"));
  int step_lines = 0;  // rank 0's two, among the other ranks' other lines
  for (absl::string_view line : absl::StrSplit(logged, '\n')) {
    step_lines += absl::StrContains(line, " I step ") ? 1 : 0;
  }
  EXPECT_EQ(step_lines, 2) << logged;

  StepPlan local = plan;
  local.local_steps = 3;
  local.local_reason = "the planner service did not answer";
  EXPECT_THAT(StepLine(9, local),
              HasSubstr("(3 steps planned locally so far: the planner service did not answer)"));
}

class EveryMode : public ::testing::TestWithParam<PlannerMode> {};

INSTANTIATE_TEST_SUITE_P(PlannerClientTest, EveryMode,
                         ::testing::Values(PlannerMode::kGroup, PlannerMode::kPerRank),
                         [](const auto& info) {
                           return info.param == PlannerMode::kGroup ? "Group" : "PerRank";
                         });

TEST_P(EveryMode, WithAServiceEveryRankGetsItsSliceFromIt) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  PlannerClientOptions options;
  options.mode = GetParam();
  options.address = server->address();
  ExpectCorePlans(RunSteps(options, 0, 3), 0, PlanSource::kService);
}

constexpr char kTokenKey[] = "0123456789abcdef0123456789abcdef";

// A planner on 127.0.0.1 that checks job tokens signed with kTokenKey.
std::unique_ptr<PlannerServer> StartTokenServer() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string keys = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/planner_keys");
  std::ofstream(keys) << kTokenKey << "\n";
  PlannerServerOptions server_options;
  server_options.listen_address = "127.0.0.1:0";
  server_options.auth.mode = AuthMode::kToken;
  server_options.auth.key_file = keys;
  auto server = PlannerServer::Start(server_options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

std::string JobToken(const std::string& job) {
  return MintToken(kTokenKey, TokenKind::kJob, job, absl::Now() + absl::Hours(1), NewTokenId());
}

// A planner that checks job tokens: every call of the run carries its token
// (every rank's in per-rank mode), so every step comes from the service;
// another job's token gets the step planned locally, naming why.
TEST_P(EveryMode, AJobTokenIsSentWithEveryCall) {
  std::unique_ptr<PlannerServer> server = StartTokenServer();
  ASSERT_NE(server, nullptr);
  PlannerClientOptions options;
  options.mode = GetParam();
  options.address = server->address();
  options.token = JobToken("client-test");  // Spec's job
  ExpectCorePlans(RunSteps(options, 0, 3), 0, PlanSource::kService);

  options.token = JobToken("another-job");
  const auto results = RunSteps(options, 10, 1);
  ExpectCorePlans(results, 10, PlanSource::kLocal);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_THAT(results[0][r]->local_reason,
                HasSubstr("the token is for job 'another-job', not for job 'client-test'"))
        << r;
  }
}

// A token never leaves in clear over a network: without TLS it is refused
// for any address but loopback and unix sockets, unless a mesh encrypts.
TEST(PlannerClientTest, ATokenIsRefusedOverPlaintextOffThisMachine) {
  auto transports = LocalTransport::CreateGroup(1, absl::Seconds(5));
  PlannerClientOptions options;
  options.token = "kf2.job.1.2.3.4.j";
  for (const char* address : {"10.1.2.3:50051", "planner.ns.svc:50051", "dns:///planner:1"}) {
    options.address = address;
    auto client = PlannerClient::Create(options, transports[0].get());
    ASSERT_FALSE(client.ok()) << address;
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(client.status().message()),
                HasSubstr(absl::StrCat("planner_token: the token would cross the network in "
                                       "clear to '", address, "' (no TLS)")));
  }
  options.mesh_tls = true;  // named as such: a mesh encrypts for it
  EXPECT_TRUE(PlannerClient::Create(options, transports[0].get()).ok());
  options.mesh_tls = false;
  for (const char* address : {"127.0.0.1:50051", "[::1]:1", "unix:/run/planner.sock"}) {
    options.address = address;
    EXPECT_TRUE(PlannerClient::Create(options, transports[0].get()).ok()) << address;
  }
  options.address = "planner.ns.svc:50051";
  options.token.clear();  // no token: plaintext is the caller's choice
  EXPECT_TRUE(PlannerClient::Create(options, transports[0].get()).ok());
}

TEST(PlannerClientTest, UnusableCredentialsAreRefusedWhenTheClientIsMade) {
  auto transports = LocalTransport::CreateGroup(1, absl::Seconds(5));
  PlannerClientOptions options;
  options.address = "127.0.0.1:50051";
  options.tls.ca_file = "/no/such/ca.pem";
  auto client = PlannerClient::Create(options, transports[0].get());
  ASSERT_FALSE(client.ok());
  EXPECT_THAT(std::string(client.status().message()),
              HasSubstr("planner_tls_ca: cannot read '/no/such/ca.pem'"));
  options.tls = {"", "/etc/rank.pem", ""};
  client = PlannerClient::Create(options, transports[0].get());
  ASSERT_FALSE(client.ok());
  EXPECT_THAT(std::string(client.status().message()),
              HasSubstr("a client certificate needs its key"));
  options.tls = {};
  options.token = "kf1.ab cd";
  client = PlannerClient::Create(options, transports[0].get());
  ASSERT_FALSE(client.ok());
  EXPECT_THAT(std::string(client.status().message()),
              HasSubstr("planner_token: character 6 is not visible ASCII"));
}

TEST_P(EveryMode, AServiceThatIsDownOrGoesDownMidRunFallsBackOnEveryRank) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  PlannerClientOptions options;
  options.mode = GetParam();
  options.address = server->address();
  options.max_attempts = 2;
  options.initial_backoff = absl::Milliseconds(20);
  const absl::Time start = absl::Now();
  auto results = RunSteps(options, 10, 4, [&](uint64_t step) {
    if (step == 12) server->Shutdown();
  });
  ExpectCorePlans({results[0], results[1]}, 10, PlanSource::kService);
  ExpectCorePlans({results[2], results[3]}, 12, PlanSource::kLocal);
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
}

// A planner in front of the real one that hangs for a while: from the
// first Plan request of step `hang_step` on, for `hang_for`, every Plan and
// GetJob waits until its caller gives up (its deadline). It counts the Plan
// requests of each step and the probes.
class HangingProxy final : public v1::Planner::Service {
 public:
  HangingProxy(const std::string& target, uint64_t hang_step, absl::Duration hang_for,
               bool probes_hang = true)
      : real_(v1::Planner::NewStub(
            grpc::CreateChannel(target, grpc::InsecureChannelCredentials()))),
        hang_step_(hang_step),
        hang_for_(hang_for),
        probes_hang_(probes_hang) {}

  grpc::Status Plan(grpc::ServerContext* context, const v1::PlanRequest* request,
                    v1::PlanResponse* response) override {
    bool hang = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const uint64_t step = request->spec().step();
      ++plan_requests_[step];
      if (step >= hang_step_ && hang_until_ == absl::InfinitePast()) {
        hang_until_ = absl::Now() + hang_for_;
      }
      hang = absl::Now() < hang_until_;
    }
    if (hang) return Hang(context);
    grpc::ClientContext forward;
    forward.set_deadline(context->deadline());
    return real_->Plan(&forward, *request, response);
  }

  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::JobState* response) override {
    bool hang = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++probes_;
      hang = probes_hang_ && absl::Now() < hang_until_;
    }
    if (hang) return Hang(context);
    grpc::ClientContext forward;
    forward.set_deadline(context->deadline());
    return real_->GetJob(&forward, *request, response);
  }

  int PlanRequests(uint64_t step) {
    std::lock_guard<std::mutex> lock(mu_);
    return plan_requests_[step];
  }
  int probes() {
    std::lock_guard<std::mutex> lock(mu_);
    return probes_;
  }

 private:
  static grpc::Status Hang(grpc::ServerContext* context) {
    const absl::Time bound = absl::Now() + absl::Seconds(30);
    while (!context->IsCancelled() && absl::Now() < bound) absl::SleepFor(absl::Milliseconds(5));
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "hung");
  }

  std::unique_ptr<v1::Planner::Stub> real_;
  const uint64_t hang_step_;
  const absl::Duration hang_for_;
  const bool probes_hang_;
  std::mutex mu_;
  std::map<uint64_t, int> plan_requests_;
  absl::Time hang_until_ = absl::InfinitePast();
  int probes_ = 0;
};

// The per-step results of RunWithOneClientPerRank, [step index][rank].
struct PersistentRun {
  std::vector<std::vector<absl::StatusOr<StepPlan>>> results;
  std::vector<std::vector<absl::Duration>> took;  // each Plan call's wall time
  std::vector<uint64_t> incarnations;              // each rank's client's, at the end
};

// `steps` on kRanks threads, one client per rank for all of them (as a
// trainer has). `before_step(rank, step)` (optional) runs before each
// step's first call; `pause` after its Plan, as a step's compute would.
// With `plan_ahead`, as a trainer planning ahead: step 0 synchronously,
// then each step's lengths are prefetched right after the previous step's
// Plan, before its pause (so its first call is the Prefetch);
// `plan_lengths` (optional) gives the lengths a step's Plan is then called
// with (default: those prefetched).
PersistentRun RunWithOneClientPerRank(
    const PlannerClientOptions& options, const std::vector<uint64_t>& steps,
    absl::Duration pause = absl::ZeroDuration(),
    const std::function<void(int, uint64_t)>& before_step = nullptr, bool plan_ahead = false,
    const std::function<std::vector<int64_t>(uint64_t, int)>& plan_lengths = nullptr) {
  auto transports = LocalTransport::CreateGroup(kRanks, absl::Seconds(30));
  PersistentRun run;
  run.results.assign(steps.size(), std::vector<absl::StatusOr<StepPlan>>(
                                       kRanks, absl::UnknownError("not run")));
  run.took.assign(steps.size(), std::vector<absl::Duration>(kRanks));
  run.incarnations.assign(kRanks, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      auto client = PlannerClient::Create(options, transports[r].get());
      ASSERT_TRUE(client.ok()) << client.status();
      for (size_t i = 0; i < steps.size(); ++i) {
        if (before_step && (!plan_ahead || i == 0)) before_step(r, steps[i]);
        const std::vector<int64_t> lengths =
            plan_lengths ? plan_lengths(steps[i], r) : Lengths(steps[i])[r];
        const absl::Time start = absl::Now();
        run.results[i][r] = (*client)->Plan(Spec(steps[i]), lengths);
        run.took[i][r] = absl::Now() - start;
        if (plan_ahead && i + 1 < steps.size()) {
          if (before_step) before_step(r, steps[i + 1]);
          const absl::Status prefetched =
              (*client)->Prefetch(Spec(steps[i + 1]), Lengths(steps[i + 1])[r]);
          ASSERT_TRUE(prefetched.ok()) << prefetched;
        }
        absl::SleepFor(pause);
      }
      run.incarnations[r] = (*client)->incarnation();
    });
  }
  for (std::thread& t : threads) t.join();
  return run;
}

std::vector<uint64_t> StepsFrom(uint64_t first, int count) {
  std::vector<uint64_t> steps(count);
  std::iota(steps.begin(), steps.end(), first);
  return steps;
}

// `service` on a free port of 127.0.0.1; its address in `address`.
// The calls `server` refused with `code`, by method.
std::map<std::string, double> CallsRefused(PlannerServer& server, const std::string& code) {
  std::map<std::string, double> calls;
  for (const prometheus::MetricFamily& family : server.service().metrics().registry()->Collect()) {
    if (family.name != "knapformer_planner_requests_total") continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      std::map<std::string, std::string> labels;
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        labels[label.name] = label.value;
      }
      if (labels["code"] == code) calls[labels["method"]] += metric.counter.value;
    }
  }
  return calls;
}

// Another job's token is a configuration error, not an outage: the step it
// is refused at and every later one are planned locally, each naming the
// code, the job id sent and the credential, and the service is neither
// asked nor probed again in the run; under require_service every rank fails
// with that code.
TEST_P(EveryMode, AnotherJobsTokenIsAConfigurationErrorNotAnOutage) {
  std::unique_ptr<PlannerServer> server = StartTokenServer();
  ASSERT_NE(server, nullptr);
  PlannerClientOptions options;
  options.mode = GetParam();
  options.address = server->address();
  options.token = JobToken("another-job");
  const PersistentRun run = RunWithOneClientPerRank(options, StepsFrom(0, 6));
  ExpectCorePlans(run.results, 0, PlanSource::kLocal);
  for (size_t s = 0; s < run.results.size(); ++s) {
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_TRUE(run.results[s][r].ok()) << run.results[s][r].status();
      EXPECT_THAT(run.results[s][r]->local_reason,
                  AllOf(HasSubstr("refused the job's credentials (PERMISSION_DENIED: "),
                        HasSubstr("the token is for job 'another-job', not for job 'client-test'"),
                        HasSubstr("sent job id 'client-test' with a job token in plaintext")))
          << "step " << s << " rank " << r;
    }
  }
  // The calls of the first step (rank 0's, or each rank's in per-rank
  // mode), and none after: no retry, no probe.
  const bool group = GetParam() == PlannerMode::kGroup;
  EXPECT_EQ(CallsRefused(*server, "PERMISSION_DENIED"),
            (std::map<std::string, double>{{group ? "PlanGroup" : "Plan", group ? 1 : kRanks}}));

  options.require_service = true;
  const PersistentRun required = RunWithOneClientPerRank(options, StepsFrom(0, 1));
  for (int r = 0; r < kRanks; ++r) {
    const absl::Status& status = required.results[0][r].status();
    EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
    EXPECT_THAT(std::string(status.message()),
                AllOf(HasSubstr("refused the job's credentials"),
                      HasSubstr("require_planner is set, so no rank plans it locally")))
        << r;
  }
}

std::unique_ptr<grpc::Server> ServeOnFreePort(grpc::Service* service, std::string* address) {
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  *address = absl::StrCat("127.0.0.1:", port);
  return server;
}

// A service whose connections are slow to set up (a proxy holds each new
// one 600 ms before forwarding it: a loaded machine, a slow network) plans
// every step, also after it closes connections by age (1 s here) and the
// clients connect again mid-run. The channel once gave a connection attempt
// 200 ms: on CI's loaded machine a reconnection after the service's max
// connection age timed out and the step was planned locally.
TEST_P(EveryMode, AServiceSlowToConnectToPlansEveryStepAcrossReconnections) {
  auto server = StartServer(ServiceLimits().rendezvous_timeout, absl::Seconds(1));
  ASSERT_NE(server, nullptr);
  auto proxy = SlowConnectProxy::Start(server->port(), absl::Milliseconds(600));
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  PlannerClientOptions options;
  options.mode = GetParam();
  options.address = absl::StrCat("127.0.0.1:", (*proxy)->port());
  constexpr int kSteps = 12;
  const PersistentRun run =
      RunWithOneClientPerRank(options, StepsFrom(0, kSteps), absl::Milliseconds(250));
  for (int step = 0; step < kSteps; ++step) {
    for (int r = 0; r < kRanks; ++r) {
      const absl::StatusOr<StepPlan>& plan = run.results[step][r];
      ASSERT_TRUE(plan.ok()) << "step " << step << " rank " << r << ": " << plan.status();
      EXPECT_EQ(plan->source, PlanSource::kService) << "step " << step << " rank " << r;
      ExpectSameSlice(plan->plan, CorePlan(Lengths(step)).Slice(r));
    }
  }
  // The run outlived a connection: the clients did connect again.
  EXPECT_GE((*proxy)->connections(), 2);
}

// A service that hangs costs one step, at most the call deadline: the ranks
// fall back together, ask it nothing while it hangs (background probes
// only), and all go back to it at the same step once it answers again.
TEST(PlannerClientTest, AHungServiceCostsOneStepAndIsUsedAgainWhenItAnswers) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  // From step 3 on, for 3 s: one step's call deadline (1 s) and then some.
  HangingProxy proxy(server->address(), 3, absl::Seconds(3));
  PlannerClientOptions options;
  options.mode = PlannerMode::kPerRank;  // the service's rendezvous
  std::unique_ptr<grpc::Server> front = ServeOnFreePort(&proxy, &options.address);
  ASSERT_NE(front, nullptr);
  options.call_deadline = absl::Seconds(1);
  options.probe_interval = absl::Milliseconds(100);
  options.probe_deadline = absl::Milliseconds(300);
  constexpr int kSteps = 30;
  // 100 ms: the step's compute.
  const PersistentRun run =
      RunWithOneClientPerRank(options, StepsFrom(0, kSteps), absl::Milliseconds(100));
  front->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  std::vector<std::vector<PlanSource>> sources(kSteps, std::vector<PlanSource>(kRanks));
  for (int step = 0; step < kSteps; ++step) {
    for (int r = 0; r < kRanks; ++r) {
      const absl::StatusOr<StepPlan>& plan = run.results[step][r];
      ASSERT_TRUE(plan.ok()) << "step " << step << " rank " << r << ": " << plan.status();
      ExpectSameSlice(plan->plan, CorePlan(Lengths(step)).Slice(r));
      sources[step][r] = plan->source;
    }
  }
  const auto& took = run.took;

  int back_at = -1;
  for (int step = 0; step < kSteps; ++step) {
    for (int r = 1; r < kRanks; ++r) {
      EXPECT_EQ(sources[step][r], sources[step][0]) << "ranks disagree at step " << step;
    }
    const bool service = sources[step][0] == PlanSource::kService;
    if (step < 3) {
      EXPECT_TRUE(service) << "step " << step;
    } else if (step == 3) {
      EXPECT_FALSE(service) << "the hung step";
    }
    if (step > 3 && service && back_at < 0) back_at = step;
    // While it is down nobody asks it: a step's requests are all or none.
    if (step > 3) {
      EXPECT_EQ(proxy.PlanRequests(step), service ? kRanks : 0) << "step " << step;
    }
    for (int r = 0; r < kRanks; ++r) {
      if (step != 3) {
        EXPECT_LT(took[step][r], options.call_deadline) << "step " << step << " rank " << r;
      }
    }
  }
  // The service hangs for 3 s from step 3, then answers: the steps in
  // between are local, and then it is used again for good.
  EXPECT_GT(back_at, 3) << "never used the service again";
  for (int step = back_at; step < kSteps && back_at > 0; ++step) {
    EXPECT_EQ(sources[step][0], PlanSource::kService) << "step " << step;
  }
  EXPECT_GT(proxy.probes(), 0);
}

// Per-rank mode with a service: a rank that runs an exchange before its
// plan all-gathers a report saying so (as SequenceBalancer does); its peers
// meet it in the step's first all-gather (the run's incarnation at the
// first step, the outcomes later, after the service's rendezvous gives up
// on that rank) and every one names it, instead of misreading its bytes;
// the unplanned rank reads its peers' reports of Plan at that step (which
// it names in turn). The next step plans on every rank.
TEST(PlannerClientTest, InPerRankModeAPeerInAnExchangeWithoutAPlanIsNamedByEveryRank) {
  auto server = StartServer(/*rendezvous_timeout=*/absl::Seconds(1));
  ASSERT_NE(server, nullptr);
  PlannerClientOptions options;
  options.mode = PlannerMode::kPerRank;
  options.address = server->address();
  constexpr int kUnplanned = 1;
  for (const uint64_t unplanned_step : {uint64_t{0}, uint64_t{1}}) {
    SCOPED_TRACE("unplanned at step " + std::to_string(unplanned_step));
    auto transports = LocalTransport::CreateGroup(kRanks, absl::Seconds(30));
    const uint64_t last_step = unplanned_step + 1;
    std::vector<std::vector<absl::StatusOr<StepPlan>>> results(
        last_step + 1,
        std::vector<absl::StatusOr<StepPlan>>(kRanks, absl::UnknownError("not run")));
    std::vector<client::RankReport> peers_seen;
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, r] {
        auto client = PlannerClient::Create(options, transports[r].get());
        ASSERT_TRUE(client.ok()) << client.status();
        for (uint64_t step = 0; step <= last_step; ++step) {
          if (r == kUnplanned && step == unplanned_step) {
            client::RankReport report;
            report.set_call(client::RankReport::UNPLANNED_EXCHANGE);
            report.mutable_verdict()->set_code(
                static_cast<int>(absl::StatusCode::kFailedPrecondition));
            auto all = AllGatherMessages(*transports[r], report);
            ASSERT_TRUE(all.ok()) << all.status();
            peers_seen = *std::move(all);
            continue;
          }
          results[step][r] = (*client)->Plan(Spec(step), Lengths(step)[r]);
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < kRanks; ++r) {
      if (r == kUnplanned) continue;
      const absl::Status failed = results[unplanned_step][r].status();
      EXPECT_EQ(failed.code(), absl::StatusCode::kFailedPrecondition) << "rank " << r << failed;
      EXPECT_THAT(std::string(failed.message()),
                  HasSubstr("rank 1 is in an exchange (route, reverse_route, pre_attn or "
                            "post_attn) without a plan while rank 0 is in Plan"))
          << "rank " << r;
    }
    ASSERT_EQ(peers_seen.size(), static_cast<size_t>(kRanks));
    EXPECT_EQ(peers_seen[0].call(), client::RankReport::PLAN);
    EXPECT_EQ(peers_seen[0].spec().step(), unplanned_step);
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_TRUE(results[last_step][r].ok())
          << "rank " << r << ": " << results[last_step][r].status();
    }
  }
}

// A service whose answers at one step are well formed on each rank but do
// not agree across ranks: every answer of that step with two receive chunks
// of different lengths has those two lengths swapped (their total kept).
class TamperingProxy final : public v1::Planner::Service {
 public:
  TamperingProxy(const std::string& target, uint64_t tamper_step)
      : real_(v1::Planner::NewStub(
            grpc::CreateChannel(target, grpc::InsecureChannelCredentials()))),
        tamper_step_(tamper_step) {}

  grpc::Status Plan(grpc::ServerContext* context, const v1::PlanRequest* request,
                    v1::PlanResponse* response) override {
    grpc::ClientContext forward;
    forward.set_deadline(context->deadline());
    grpc::Status status = real_->Plan(&forward, *request, response);
    if (!status.ok() || request->spec().step() != tamper_step_) return status;
    auto* lengths = response->mutable_plan()->mutable_recvs()->mutable_length();
    for (int i = 0; i + 1 < lengths->size(); ++i) {
      if (lengths->Get(i) != lengths->Get(i + 1)) {
        lengths->SwapElements(i, i + 1);
        ++tampered_;
        break;
      }
    }
    return status;
  }
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::JobState* response) override {
    grpc::ClientContext forward;
    forward.set_deadline(context->deadline());
    return real_->GetJob(&forward, *request, response);
  }
  int tampered() const { return tampered_; }

 private:
  std::unique_ptr<v1::Planner::Stub> real_;
  const uint64_t tamper_step_;
  std::atomic<int> tampered_{0};
};

// Per-rank mode: the ranks' shares of a step's plan are confirmed by their
// peers in the step's outcome all-gather, so a service answer that is wrong
// but self-consistent on each rank is refused on every rank and the step is
// planned locally (the right plan); the steps before and after come from
// the service.
TEST(PlannerClientTest, InPerRankModeSharesThatDisagreeAreRefusedOnEveryRank) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  TamperingProxy proxy(server->address(), /*tamper_step=*/1);
  PlannerClientOptions options;
  options.mode = PlannerMode::kPerRank;
  std::unique_ptr<grpc::Server> front = ServeOnFreePort(&proxy, &options.address);
  ASSERT_NE(front, nullptr);
  const PersistentRun run = RunWithOneClientPerRank(options, StepsFrom(0, 3));
  front->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  ASSERT_GT(proxy.tampered(), 0) << "no answer at step 1 had two receive chunks to swap";
  for (int step = 0; step < 3; ++step) {
    for (int r = 0; r < kRanks; ++r) {
      const absl::StatusOr<StepPlan>& plan = run.results[step][r];
      ASSERT_TRUE(plan.ok()) << "step " << step << " rank " << r << ": " << plan.status();
      EXPECT_EQ(plan->source, step == 1 ? PlanSource::kLocal : PlanSource::kService)
          << "step " << step << " rank " << r;
      ExpectSameSlice(plan->plan, CorePlan(Lengths(step)).Slice(r));
      if (step == 1) {
        EXPECT_THAT(plan->local_reason, HasSubstr("answered step 1 with plans that disagree on "
                                                  "the route"));
      }
    }
  }
}

// A service that answers probes but never plans in time (overloaded): each
// return to it costs a step, so the local stretches between returns double;
// it costs a handful of steps, not every other one.
TEST(PlannerClientTest, AServiceThatAnswersProbesButNotStepsIsAskedLessAndLess) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  HangingProxy proxy(server->address(), 2, absl::Hours(1), /*probes_hang=*/false);
  PlannerClientOptions options;
  options.mode = PlannerMode::kPerRank;  // the service's rendezvous
  std::unique_ptr<grpc::Server> front = ServeOnFreePort(&proxy, &options.address);
  ASSERT_NE(front, nullptr);
  options.call_deadline = absl::Milliseconds(300);
  options.probe_interval = absl::Milliseconds(20);
  options.probe_deadline = absl::Milliseconds(200);
  constexpr int kSteps = 48;
  // 30 ms between steps: probes get answered between them.
  const PersistentRun run =
      RunWithOneClientPerRank(options, StepsFrom(0, kSteps), absl::Milliseconds(30));
  front->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  for (int step = 0; step < kSteps; ++step) {
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_TRUE(run.results[step][r].ok()) << run.results[step][r].status();
    }
  }
  std::vector<int> asked;  // steps that asked the (hanging) service
  for (int step = 2; step < kSteps; ++step) {
    if (proxy.PlanRequests(step) > 0) asked.push_back(step);
  }
  // Without the doubling it would be asked every other step (~23 times).
  EXPECT_LE(asked.size(), 7u) << testing::PrintToString(asked);
  EXPECT_GE(asked.size(), 3u) << "it should still be tried now and then: "
                              << testing::PrintToString(asked);
  // Each relapse doubles the local stretch: whatever the probes' timing
  // (which alone decides the first stretch, and can lengthen any), the
  // stretch after the k-th relapse is at least 2^(k-1) steps, and the last
  // is longer than the first.
  for (size_t i = 2; i < asked.size(); ++i) {
    EXPECT_GE(asked[i] - asked[i - 1], 1 << (i - 2))
        << "relapse " << i - 1 << " did not hold the doubled stretch: "
        << testing::PrintToString(asked);
  }
  if (asked.size() >= 3) {
    EXPECT_GT(asked.back() - asked[asked.size() - 2], asked[1] - asked[0])
        << testing::PrintToString(asked);
  }
}

// A service that stops and is started again on the same port: the ranks
// plan locally meanwhile, and all go back to it once it answers.
// With or without planning ahead, in either mode.
class ModeAndPlanAhead : public ::testing::TestWithParam<std::tuple<PlannerMode, bool>> {};

INSTANTIATE_TEST_SUITE_P(
    PlannerClientTest, ModeAndPlanAhead,
    ::testing::Combine(::testing::Values(PlannerMode::kGroup, PlannerMode::kPerRank),
                       ::testing::Bool()),
    [](const auto& info) {
      return absl::StrCat(std::get<0>(info.param) == PlannerMode::kGroup ? "Group" : "PerRank",
                          std::get<1>(info.param) ? "PlanningAhead" : "");
    });

TEST_P(ModeAndPlanAhead, ARestartedServiceIsUsedAgain) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  const std::string address = server->address();
  PlannerClientOptions options;
  options.mode = std::get<0>(GetParam());
  options.address = address;
  options.max_attempts = 1;
  options.probe_interval = absl::Milliseconds(100);
  options.probe_deadline = absl::Milliseconds(300);
  constexpr int kSteps = 40;
  std::unique_ptr<PlannerServer> restarted;
  // Rank 0 stops and restarts it between steps (the step's all-gather keeps
  // the other ranks from asking before it has).
  auto fault = [&](int rank, uint64_t step) {
    if (rank == 0 && step == 2) server->Shutdown();
    if (rank == 0 && step == 6) {
      PlannerServerOptions again;
      again.listen_address = address;
      auto started = PlannerServer::Start(again);
      ASSERT_TRUE(started.ok()) << started.status();
      restarted = *std::move(started);
    }
  };
  // Planning ahead, the fault comes while the previous step computes (before
  // the prefetch).
  const PersistentRun run = RunWithOneClientPerRank(
      options, StepsFrom(0, kSteps), absl::Milliseconds(100), fault, std::get<1>(GetParam()));
  std::vector<std::vector<PlanSource>> sources(kSteps, std::vector<PlanSource>(kRanks));
  for (int step = 0; step < kSteps; ++step) {
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_TRUE(run.results[step][r].ok()) << run.results[step][r].status();
      sources[step][r] = run.results[step][r]->source;
    }
  }
  EXPECT_EQ(sources[0][0], PlanSource::kService);
  EXPECT_EQ(sources[3][0], PlanSource::kLocal);
  EXPECT_EQ(sources[kSteps - 1][0], PlanSource::kService) << "never back to the restarted service";
  for (int step = 0; step < kSteps; ++step) {
    for (int r = 1; r < kRanks; ++r) EXPECT_EQ(sources[step][r], sources[step][0]) << step;
  }
}

TEST_P(ModeAndPlanAhead, PlannedAheadStepsGetTheSamePlansAsSynchronousOnes) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  for (const bool with_service : {true, false}) {
    PlannerClientOptions options;
    options.mode = std::get<0>(GetParam());
    if (with_service) options.address = server->address();
    const PersistentRun run = RunWithOneClientPerRank(
        options, StepsFrom(30, 6), absl::ZeroDuration(), nullptr, std::get<1>(GetParam()));
    ExpectCorePlans(run.results, 30, with_service ? PlanSource::kService : PlanSource::kLocal);
    for (size_t i = 0; i < run.results.size(); ++i) {
      for (int r = 0; r < kRanks; ++r) {
        ASSERT_TRUE(run.results[i][r].ok());
        EXPECT_EQ(run.results[i][r]->prefetched, std::get<1>(GetParam()) && i > 0)
            << "step " << i << " rank " << r;
        // Measured, and bounded by the run's own deadline.
        EXPECT_GT(run.results[i][r]->wait_seconds, 0) << "step " << i << " rank " << r;
        EXPECT_LT(run.results[i][r]->wait_seconds, 60) << "step " << i << " rank " << r;
        // Only a rank that asked the service waited for it: rank 0 in group
        // mode, every rank in per-rank mode, none without a service.
        const bool asked =
            with_service && (r == 0 || std::get<0>(GetParam()) == PlannerMode::kPerRank);
        EXPECT_EQ(run.results[i][r]->service_wait_seconds > 0, asked)
            << "step " << i << " rank " << r;
        EXPECT_LE(run.results[i][r]->service_wait_seconds, run.results[i][r]->wait_seconds);
      }
    }
  }
}

TEST_P(EveryMode, APlannedAheadStepCalledWithOtherLengthsFailsOnEveryRankNamingIt) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  for (const bool with_service : {true, false}) {
    PlannerClientOptions options;
    options.mode = GetParam();
    if (with_service) options.address = server->address();
    const PersistentRun run = RunWithOneClientPerRank(
        options, StepsFrom(40, 4), absl::ZeroDuration(), nullptr, /*plan_ahead=*/true,
        [](uint64_t step, int rank) {
          std::vector<int64_t> lengths = Lengths(step)[rank];
          if (step == 42 && rank == 5) lengths.push_back(77);  // not what it prefetched
          return lengths;
        });
    const std::string expected =
        absl::StrCat("rank 5: step 42: its lengths differ from those prefetched for it (",
                     Lengths(42)[5].size() + 1, " sequences, ", Lengths(42)[5].size(),
                     " prefetched)");
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_TRUE(run.results[1][r].ok()) << run.results[1][r].status();
      ASSERT_FALSE(run.results[2][r].ok()) << "rank " << r;
      EXPECT_EQ(run.results[2][r].status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(std::string(run.results[2][r].status().message()), HasSubstr(expected));
      // Nothing is left waiting: the next step is planned as usual.
      ASSERT_TRUE(run.results[3][r].ok()) << run.results[3][r].status();
      EXPECT_EQ(run.results[3][r]->source,
                with_service ? PlanSource::kService : PlanSource::kLocal);
    }
  }
}

// Runs `body` with a new client on every rank of an in-process group whose
// collectives give up after `timeout`, one thread per rank; returns each
// rank's status.
std::vector<absl::Status> OnEveryRank(
    const PlannerClientOptions& options, absl::Duration timeout,
    const std::function<absl::Status(PlannerClient& client, int rank)>& body) {
  auto transports = LocalTransport::CreateGroup(kRanks, timeout);
  std::vector<absl::Status> statuses(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      auto client = PlannerClient::Create(options, transports[r].get());
      EXPECT_TRUE(client.ok()) << "rank " << r << ": " << client.status();
      statuses[r] = client.ok() ? body(**client, r) : client.status();
    });
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

// Group mode: a rank that plans a step the others prefetched is in another
// collective; every rank gets the same error instead of a hang.
TEST(PlannerClientTest, RanksThatDoNotAllPlanAheadFailTogether) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  PlannerClientOptions options;
  options.address = server->address();
  const std::vector<absl::Status> statuses =
      OnEveryRank(options, absl::Seconds(10), [](PlannerClient& client, int r) {
        const absl::StatusOr<StepPlan> first = client.Plan(Spec(0), Lengths(0)[r]);
        EXPECT_TRUE(first.ok()) << "rank " << r << ": " << first.status();
        if (!first.ok()) return first.status();
        return r == 2 ? client.Plan(Spec(1), Lengths(1)[r]).status()
                      : client.Prefetch(Spec(1), Lengths(1)[r]);
      });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(statuses[r].code(), absl::StatusCode::kFailedPrecondition) << "rank " << r;
    EXPECT_THAT(std::string(statuses[r].message()),
                HasSubstr("rank 2 is in Plan while rank 0 is in Prefetch; every rank must "
                          "prefetch a step, or none"));
  }
}

// A run resumed from a checkpoint replays steps the service already
// answered: its ranks agree on a new incarnation, so the service plans the
// replayed steps as new ones (no ALREADY_EXISTS, no local fallback).
TEST(PlannerClientTest, ARestartedRunReplaysItsStepsFromTheService) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  PlannerClientOptions options;
  options.mode = PlannerMode::kPerRank;  // the service's rendezvous
  options.address = server->address();
  PersistentRun first = RunWithOneClientPerRank(options, {0, 1, 2, 3});
  ExpectCorePlans(first.results, 0, PlanSource::kService);
  // Crashed after step 3, resumed from the checkpoint of step 2.
  PersistentRun resumed = RunWithOneClientPerRank(options, {2, 3, 4, 5});
  ExpectCorePlans(resumed.results, 2, PlanSource::kService);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_NE(first.incarnations[r], 0u);
    EXPECT_EQ(first.incarnations[r], first.incarnations[0]) << "rank " << r;
    EXPECT_EQ(resumed.incarnations[r], resumed.incarnations[0]) << "rank " << r;
  }
  EXPECT_NE(resumed.incarnations[0], first.incarnations[0]);
  // The service keeps the new incarnation of the group only.
  auto stub = v1::Planner::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::GetJobRequest request;
  request.set_job_id("client-test");
  v1::JobState state;
  ASSERT_TRUE(stub->GetJob(&context, request, &state).ok());
  ASSERT_EQ(state.groups_size(), 1);
  EXPECT_EQ(state.groups(0).incarnation(), resumed.incarnations[0]);
  EXPECT_EQ(state.groups(0).steps_planned(), 4u);
}

// A run whose incarnation is fixed by the caller, replayed: the service
// holds those steps under that incarnation (ALREADY_EXISTS), so they are
// planned locally without an error, and the steps after them come from the
// service again.
TEST(PlannerClientTest, AReplayUnderTheSameIncarnationIsPlannedLocallyWithoutErrors) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  PlannerClientOptions options;
  options.mode = PlannerMode::kPerRank;  // the service's rendezvous
  options.address = server->address();
  options.incarnation = 0x5eed;
  ExpectCorePlans(RunWithOneClientPerRank(options, {0, 1, 2, 3}).results, 0,
                  PlanSource::kService);
  PersistentRun resumed = RunWithOneClientPerRank(options, {2, 3, 4, 5});
  EXPECT_EQ(resumed.incarnations[0], 0x5eedu);
  ExpectCorePlans({resumed.results[0], resumed.results[1]}, 2, PlanSource::kLocal);
  ExpectCorePlans({resumed.results[2], resumed.results[3]}, 4, PlanSource::kService);
}

// A stranger opens the run's step 5 first with another spec. Sent as other
// clients do (no incarnation, or another run's), it never meets the run;
// sent with the run's own incarnation (a copied request), step 5 is planned
// locally and step 6 comes from the service. Either way no rank of the run
// fails or waits for it.
void RunBesideAStranger(bool stranger_copies_the_incarnation) {
  auto server = StartServer(absl::Seconds(5));
  ASSERT_NE(server, nullptr);
  PlannerClientOptions options;
  options.mode = PlannerMode::kPerRank;  // the service's rendezvous
  options.address = server->address();
  options.incarnation = 77;
  auto stub = v1::Planner::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  std::atomic<bool> stranger_sent{false};
  std::thread stranger([&] {
    v1::PlanRequest request;
    *request.mutable_spec() = Spec(5);
    request.mutable_spec()->set_d_model(128);  // not the run's
    if (stranger_copies_the_incarnation) request.mutable_spec()->set_incarnation(77);
    request.set_rank(0);
    request.add_sequence_lengths(7);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::PlanResponse response;
    // Waits in the rendezvous for ranks that never come (its own business).
    stranger_sent = true;
    stub->Plan(&context, request, &response);
  });
  // Let the stranger's request reach the service first.
  while (!stranger_sent) absl::SleepFor(absl::Milliseconds(5));
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time start = absl::Now();
  auto results = RunWithOneClientPerRank(options, {4, 5, 6}).results;
  EXPECT_LT(absl::Now() - start, absl::Seconds(4)) << "the run waited on the stranger's step";
  ExpectCorePlans({results[0]}, 4, PlanSource::kService);
  ExpectCorePlans({results[1]}, 5,
                  stranger_copies_the_incarnation ? PlanSource::kLocal : PlanSource::kService);
  ExpectCorePlans({results[2]}, 6, PlanSource::kService);
  stranger.join();
}

TEST(PlannerClientTest, AStrangersRequestForTheSameStepNeverMeetsTheRun) {
  RunBesideAStranger(/*stranger_copies_the_incarnation=*/false);
}

TEST(PlannerClientTest, AStrangerWithTheRunsIncarnationCostsItOnlyALocalStep) {
  RunBesideAStranger(/*stranger_copies_the_incarnation=*/true);
}

// The run's own ranks disagreeing is still the run's error, on every rank.
TEST(PlannerClientTest, RanksThatDisagreeOnTheSpecStillFailTogether) {
  auto server = StartServer(absl::Seconds(5));
  ASSERT_NE(server, nullptr);
  PlannerClientOptions options;
  options.address = server->address();
  const std::vector<absl::Status> statuses =
      OnEveryRank(options, absl::Seconds(30), [](PlannerClient& client, int r) {
        v1::StepSpec spec = Spec(30);
        if (r == 5) spec.set_d_model(128);
        return client.Plan(spec, Lengths(30)[r]).status();
      });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(statuses[r].code(), absl::StatusCode::kFailedPrecondition) << statuses[r];
    EXPECT_THAT(std::string(statuses[r].message()),
                HasSubstr("step spec differs from rank 0's in d_model: d_model: 64 on rank 0, "
                          "d_model: 128 on rank 5"));
  }
}

// Every mode, with the service and without. In per-rank mode the refused
// rank's request withdraws the step at the service, so the others are not
// held for its rendezvous timeout (60 s here): the step fails promptly.
TEST(PlannerClientTest, RefusedInputIsTheSameErrorOnEveryRank) {
  auto server = StartServer(absl::Seconds(60));
  ASSERT_NE(server, nullptr);
  for (const PlannerMode mode : {PlannerMode::kGroup, PlannerMode::kPerRank})
  for (const bool with_service : {true, false}) {
    PlannerClientOptions options;
    options.mode = mode;
    if (with_service) options.address = server->address();
    const absl::Time start = absl::Now();
    auto results = RunSteps(options, 20, 1, nullptr, [](uint64_t step, int rank) {
      std::vector<int64_t> lengths = Lengths(step)[rank];
      if (rank == 3) lengths.push_back(-5);
      return lengths;
    });
    EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "with_service " << with_service;
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_FALSE(results[0][r].ok()) << "rank " << r;
      EXPECT_EQ(results[0][r].status().code(), absl::StatusCode::kInvalidArgument);
      if (with_service && mode == PlannerMode::kGroup) {
        // Rank 0 asked for the group; the service names rank 3's lengths.
        EXPECT_THAT(std::string(results[0][r].status().message()),
                    HasSubstr("rank 0's request was refused by the planner: "
                              "ranks[3].sequence_lengths["));
      } else if (with_service) {
        EXPECT_THAT(std::string(results[0][r].status().message()),
                    HasSubstr("rank 3's request was refused by the planner: sequence_lengths["));
      } else {
        EXPECT_THAT(std::string(results[0][r].status().message()), HasSubstr("-5"));
      }
    }
  }
}

// A token cap no placement can meet (a 1500-token sequence, 1000 per GPU):
// every rank gets the same error naming it, from the service or locally.
TEST(PlannerClientTest, AnImpossibleTokenCapIsTheSameErrorOnEveryRank) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  for (const bool with_service : {true, false}) {
    PlannerClientOptions options;
    if (with_service) options.address = server->address();
    auto results = RunSteps(options, 30, 1, nullptr, nullptr, /*max_tokens_per_gpu=*/300);
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_FALSE(results[0][r].ok()) << "rank " << r;
      EXPECT_EQ(results[0][r].status().code(), absl::StatusCode::kResourceExhausted);
      EXPECT_THAT(std::string(results[0][r].status().message()),
                  HasSubstr("(1500 tokens) fits in no bag under the cap of 300 tokens per GPU"));
    }
  }
  // A cap it can meet: every GPU within it.
  PlannerClientOptions options;
  auto results = RunSteps(options, 31, 1, nullptr, nullptr, /*max_tokens_per_gpu=*/2000);
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(results[0][r].ok()) << results[0][r].status();
    int64_t tokens = 0;
    for (int64_t l : results[0][r]->plan.compute_chunk_lengths) tokens += l;
    EXPECT_LE(tokens, 2000) << "rank " << r;
  }
}

TEST(PlannerClientTest, AWorldSizeThatIsNotTheTransportsIsInvalidArgument) {
  auto transports = LocalTransport::CreateGroup(2);
  auto client = PlannerClient::Create(PlannerClientOptions(), transports[0].get());
  ASSERT_TRUE(client.ok());
  auto plan = (*client)->Plan(Spec(0), {1, 2});
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("spec.world_size: 8 but the transport has 2 ranks"));
}

}  // namespace
}  // namespace knapformer
