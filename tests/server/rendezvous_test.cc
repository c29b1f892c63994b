#include "server/rendezvous.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "knapformer/v1/planner.pb.h"
#include "common/rank_ranges.h"
#include "server/request_check.h"
#include "server/service_limits.h"

namespace knapformer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

const absl::Time kT0 = absl::FromUnixSeconds(1000);

// A Plan call that only holds its request.
// A rank's call; its tenant is its job unless given (as under --auth none).
class FakeCall : public PendingCall {
 public:
  explicit FakeCall(v1::PlanRequest request, std::string tenant = "")
      : request_(std::move(request)),
        tenant_(tenant.empty() ? request_.spec().job_id() : std::move(tenant)) {}
  const v1::PlanRequest& request() const override { return request_; }
  const std::string& tenant() const override { return tenant_; }

 private:
  v1::PlanRequest request_;
  std::string tenant_;
};

v1::StepSpec Spec(uint64_t step, int32_t world_size = 4, const std::string& job_id = "job",
                  const std::string& group_id = "", const std::string& topology = "g1n4") {
  v1::StepSpec spec;
  spec.set_job_id(job_id);
  spec.set_group_id(group_id);
  spec.set_step(step);
  spec.set_world_size(world_size);
  spec.set_topology(topology);
  spec.set_d_model(1024);
  spec.set_gamma(0.49);
  return spec;
}

std::unique_ptr<FakeCall> Call(const v1::StepSpec& spec, int32_t rank,
                               const std::vector<int64_t>& lengths = {100, 200}) {
  v1::PlanRequest request;
  *request.mutable_spec() = spec;
  request.set_rank(rank);
  for (int64_t length : lengths) request.add_sequence_lengths(length);
  return std::make_unique<FakeCall>(std::move(request));
}

// Creates `spec`'s job and group as a PlanGroup request of `tenant` (its
// job unless given) does.
absl::Status Touch(Rendezvous& rendezvous, const v1::StepSpec& spec, absl::Time now,
                   const std::string& tenant = "") {
  return rendezvous.Touch(spec, tenant.empty() ? spec.job_id() : tenant, now);
}

// Checks the call's request as the service does, then arrives with it.
Rendezvous::Arrival Arrive(Rendezvous& rendezvous, PendingCall* call, absl::Time now) {
  auto checked = CheckPlanRequest(call->request(), ServiceLimits());
  if (!checked.ok()) {
    ADD_FAILURE() << "test request rejected: " << checked.status();
    return Rendezvous::Arrival{checked.status(), nullptr, {}};
  }
  return rendezvous.Arrive(call, *std::move(checked), now);
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

// Arrives with ranks 0..world_size-1 of `spec` at `now` and returns the calls;
// every arrival must be OK and the last one must complete the step.
std::vector<std::unique_ptr<FakeCall>> CompleteStep(Rendezvous& rendezvous,
                                                    const v1::StepSpec& spec, absl::Time now) {
  std::vector<std::unique_ptr<FakeCall>> calls;
  for (int32_t rank = 0; rank < spec.world_size(); ++rank) {
    calls.push_back(Call(spec, rank));
    auto arrival = Arrive(rendezvous, calls.back().get(), now);
    EXPECT_TRUE(arrival.status.ok()) << arrival.status;
    EXPECT_EQ(arrival.ready != nullptr, rank == spec.world_size() - 1) << "rank " << rank;
  }
  return calls;
}

TEST(RendezvousTest, CompletesOnTheLastArrivalWithCallsIndexedByRank) {
  Rendezvous rendezvous{ServiceLimits()};
  const v1::StepSpec spec = Spec(5);
  std::vector<std::unique_ptr<FakeCall>> calls;
  // Rank r holds r + 1 sequences: 10 in the step.
  for (int32_t rank = 0; rank < 4; ++rank) {
    calls.push_back(Call(spec, rank, std::vector<int64_t>(rank + 1, 10 * (rank + 1))));
  }

  const std::vector<int32_t> order = {2, 0, 3, 1};
  for (int i = 0; i < 3; ++i) {
    auto arrival = Arrive(rendezvous, calls[order[i]].get(), kT0 + absl::Seconds(i));
    ASSERT_TRUE(arrival.status.ok()) << arrival.status;
    EXPECT_EQ(arrival.ready, nullptr) << "arrival " << i;
    EXPECT_EQ(rendezvous.pending_steps(), 1);
  }
  auto last = Arrive(rendezvous, calls[order[3]].get(), kT0 + absl::Seconds(7));
  ASSERT_TRUE(last.status.ok()) << last.status;
  ASSERT_NE(last.ready, nullptr);
  EXPECT_EQ(rendezvous.pending_steps(), 0);

  const ReadyStep& ready = *last.ready;
  ASSERT_EQ(ready.calls.size(), 4u);
  for (int32_t rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(ready.calls[rank], calls[rank].get()) << "rank " << rank;
    EXPECT_EQ(ready.calls[rank]->request().rank(), rank);
  }
  EXPECT_EQ(ready.first_arrival, kT0);
  EXPECT_EQ(ready.last_arrival, kT0 + absl::Seconds(7));
  EXPECT_EQ(ready.sequences, 10);
  EXPECT_EQ(ready.spec.step(), 5u);
  EXPECT_EQ(ready.spec.job_id(), "job");
  EXPECT_EQ(ready.spec.world_size(), 4);
  EXPECT_EQ(ready.checked.world->world_size(), 4);
  EXPECT_EQ(ready.checked.world->topology().spec(), "g1n4");
  EXPECT_EQ(ready.checked.cost.d_model(), 1024);
  EXPECT_DOUBLE_EQ(ready.checked.cost.gamma(), 0.49);
  EXPECT_EQ(rendezvous.NextDeadline(), absl::InfiniteFuture());
}

TEST(RendezvousTest, SingleRankGroupCompletesAtOnce) {
  Rendezvous rendezvous{ServiceLimits()};
  auto call = Call(Spec(1, 1, "job", "", "g1n1"), 0);
  auto arrival = Arrive(rendezvous, call.get(), kT0);
  ASSERT_TRUE(arrival.status.ok()) << arrival.status;
  ASSERT_NE(arrival.ready, nullptr);
  EXPECT_THAT(arrival.ready->calls, ElementsAre(call.get()));
  EXPECT_EQ(arrival.ready->first_arrival, kT0);
  EXPECT_EQ(arrival.ready->last_arrival, kT0);
  EXPECT_EQ(rendezvous.pending_steps(), 0);
}

TEST(RendezvousTest, PipelinedStepsOfOneGroupCompleteIndependently) {
  Rendezvous rendezvous{ServiceLimits()};
  std::vector<std::unique_ptr<FakeCall>> step1, step2;
  for (int32_t rank = 0; rank < 2; ++rank) {
    step1.push_back(Call(Spec(1, 2, "job", "", "g1n2"), rank));
    step2.push_back(Call(Spec(2, 2, "job", "", "g1n2"), rank));
  }
  EXPECT_TRUE(Arrive(rendezvous, step1[0].get(), kT0).status.ok());
  EXPECT_TRUE(Arrive(rendezvous, step2[1].get(), kT0 + absl::Seconds(1)).status.ok());
  EXPECT_EQ(rendezvous.pending_steps(), 2);

  auto done2 = Arrive(rendezvous, step2[0].get(), kT0 + absl::Seconds(2));
  ASSERT_TRUE(done2.status.ok()) << done2.status;
  ASSERT_NE(done2.ready, nullptr);
  EXPECT_EQ(done2.ready->spec.step(), 2u);
  EXPECT_THAT(done2.ready->calls, ElementsAre(step2[0].get(), step2[1].get()));
  EXPECT_EQ(done2.ready->first_arrival, kT0 + absl::Seconds(1));
  EXPECT_EQ(rendezvous.pending_steps(), 1);

  auto done1 = Arrive(rendezvous, step1[1].get(), kT0 + absl::Seconds(3));
  ASSERT_TRUE(done1.status.ok()) << done1.status;
  ASSERT_NE(done1.ready, nullptr);
  EXPECT_EQ(done1.ready->spec.step(), 1u);
  EXPECT_THAT(done1.ready->calls, ElementsAre(step1[0].get(), step1[1].get()));
  EXPECT_EQ(done1.ready->first_arrival, kT0);
  EXPECT_EQ(rendezvous.pending_steps(), 0);
}

TEST(RendezvousTest, SameStepNumberInOtherGroupsAndJobsIsAnotherRendezvous) {
  Rendezvous rendezvous{ServiceLimits()};
  auto a = Call(Spec(1, 2, "job", "a", "g1n2"), 0);
  auto b = Call(Spec(1, 2, "job", "b", "g1n2"), 0);
  auto other = Call(Spec(1, 2, "other", "a", "g1n2"), 0);
  EXPECT_TRUE(Arrive(rendezvous, a.get(), kT0).status.ok());
  EXPECT_TRUE(Arrive(rendezvous, b.get(), kT0).status.ok());
  EXPECT_TRUE(Arrive(rendezvous, other.get(), kT0).status.ok());
  EXPECT_EQ(rendezvous.pending_steps(), 3);
  EXPECT_EQ(rendezvous.jobs(), 2);
}

TEST(RendezvousTest, SameRankTwiceWhilePendingIsAlreadyExists) {
  Rendezvous rendezvous{ServiceLimits()};
  const v1::StepSpec spec = Spec(3);
  auto first = Call(spec, 1);
  auto again = Call(spec, 1);
  ASSERT_TRUE(Arrive(rendezvous, first.get(), kT0).status.ok());
  auto arrival = Arrive(rendezvous, again.get(), kT0 + absl::Seconds(1));
  EXPECT_EQ(arrival.status.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(Message(arrival.status),
              HasSubstr("rank 1: already waiting in step 3 of job 'job' group ''"));
  EXPECT_EQ(arrival.ready, nullptr);

  // The first call is still the one waiting: the step completes with it.
  std::vector<std::unique_ptr<FakeCall>> others;
  std::unique_ptr<ReadyStep> ready;
  for (int32_t rank : {0, 2, 3}) {
    others.push_back(Call(spec, rank));
    auto a = Arrive(rendezvous, others.back().get(), kT0 + absl::Seconds(2));
    ASSERT_TRUE(a.status.ok()) << a.status;
    if (a.ready) ready = std::move(a.ready);
  }
  ASSERT_NE(ready, nullptr);
  EXPECT_EQ(ready->calls[1], first.get());
}

TEST(RendezvousTest, AskingForAnAnsweredStepIsAlreadyExists) {
  Rendezvous rendezvous{ServiceLimits()};
  auto calls = CompleteStep(rendezvous, Spec(9), kT0);
  auto late = Call(Spec(9), 2);
  auto arrival = Arrive(rendezvous, late.get(), kT0 + absl::Seconds(1));
  EXPECT_EQ(arrival.status.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(Message(arrival.status),
              HasSubstr("rank 2: step 9 of job 'job' group '' was already planned"));
  EXPECT_EQ(arrival.ready, nullptr);
  EXPECT_EQ(rendezvous.pending_steps(), 0);
}

TEST(RendezvousTest, ForgetsAnsweredStepsBeyondRememberedSteps) {
  ServiceLimits limits;
  limits.remembered_steps = 2;
  Rendezvous rendezvous{limits};
  const auto spec = [](uint64_t step) { return Spec(step, 1, "job", "", "g1n1"); };
  auto c1 = CompleteStep(rendezvous, spec(1), kT0);
  auto c2 = CompleteStep(rendezvous, spec(2), kT0);

  // Steps 1 and 2 are the two remembered.
  auto again1 = Call(spec(1), 0);
  EXPECT_EQ(Arrive(rendezvous, again1.get(), kT0).status.code(), absl::StatusCode::kAlreadyExists);

  auto c3 = CompleteStep(rendezvous, spec(3), kT0);
  // Step 1 fell out of the ring: asking again opens (here: completes) a new
  // rendezvous, while steps 2 and 3 are still refused.
  auto reopened = Call(spec(1), 0);
  auto arrival = Arrive(rendezvous, reopened.get(), kT0);
  ASSERT_TRUE(arrival.status.ok()) << arrival.status;
  ASSERT_NE(arrival.ready, nullptr);
  EXPECT_EQ(arrival.ready->spec.step(), 1u);

  auto again3 = Call(spec(3), 0);
  EXPECT_EQ(Arrive(rendezvous, again3.get(), kT0).status.code(), absl::StatusCode::kAlreadyExists);
  // Re-answering step 1 pushed step 2 out.
  auto again2 = Call(spec(2), 0);
  auto arrival2 = Arrive(rendezvous, again2.get(), kT0);
  EXPECT_TRUE(arrival2.status.ok()) << arrival2.status;
  EXPECT_NE(arrival2.ready, nullptr);
}

TEST(RendezvousTest, ForgottenStepOpensAPendingRendezvous) {
  ServiceLimits limits;
  limits.remembered_steps = 1;
  Rendezvous rendezvous{limits};
  auto c1 = CompleteStep(rendezvous, Spec(1, 2, "job", "", "g1n2"), kT0);
  auto c2 = CompleteStep(rendezvous, Spec(2, 2, "job", "", "g1n2"), kT0);
  auto late = Call(Spec(1, 2, "job", "", "g1n2"), 0);
  auto arrival = Arrive(rendezvous, late.get(), kT0);
  ASSERT_TRUE(arrival.status.ok()) << arrival.status;
  EXPECT_EQ(arrival.ready, nullptr);
  EXPECT_EQ(rendezvous.pending_steps(), 1);
}

struct MismatchCase {
  const char* name;
  v1::StepSpec spec;  // of rank 1, after rank 0 opened Spec(4) with world 8
  const char* message;
};

std::vector<MismatchCase> MismatchCases() {
  std::vector<MismatchCase> cases;
  {
    v1::StepSpec spec = Spec(4, 4, "job", "", "g1n4");
    cases.push_back({"world_size", spec,
                     "spec.world_size: rank 1 sent 4 but step 4 of job 'job' group '' was "
                     "opened with 8; every rank of a step must agree"});
  }
  {
    v1::StepSpec spec = Spec(4, 8, "job", "", "g2n2");
    cases.push_back({"topology", spec,
                     "spec.topology: rank 1 sent \"g2n2\" but step 4 of job 'job' group '' was "
                     "opened with \"g1n4\""});
  }
  {
    v1::StepSpec spec = Spec(4, 8);
    spec.set_d_model(2048);
    cases.push_back({"d_model", spec, "spec.d_model: rank 1 sent 2048 but step 4"});
  }
  {
    v1::StepSpec spec = Spec(4, 8);
    spec.set_gamma(0.5);
    cases.push_back({"gamma", spec, "spec.gamma: rank 1 sent 0.5 but step 4"});
  }
  {
    v1::StepSpec spec = Spec(4, 8);
    spec.set_use_fitted_gamma(true);
    cases.push_back({"use_fitted_gamma", spec,
                     "spec.use_fitted_gamma: rank 1 sent 1 but step 4"});
  }
  {
    v1::StepSpec spec = Spec(4, 8);
    spec.set_cost_model(v1::COST_MODEL_UNIFORM);
    cases.push_back({"cost_model", spec,
                     "spec.cost_model: rank 1 sent COST_MODEL_UNIFORM but step 4"});
  }
  {
    v1::StepSpec spec = Spec(4, 8);
    spec.set_locality(v1::LOCALITY_OFF);
    cases.push_back({"locality", spec,
                     "spec.locality: rank 1 sent LOCALITY_OFF but step 4 of job 'job' group '' "
                     "was opened with LOCALITY_PLANNER_DEFAULT"});
  }
  {
    v1::StepSpec spec = Spec(4, 8);
    spec.set_max_tokens_per_gpu(4096);
    cases.push_back({"max_tokens_per_gpu", spec,
                     "spec.max_tokens_per_gpu: rank 1 sent 4096 but step 4"});
  }
  return cases;
}

TEST(RendezvousTest, RanksMustAgreeOnTheMeasuredTable) {
  auto measured = [](std::vector<double> work) {
    v1::StepSpec spec = Spec(4, 8);
    spec.set_cost_model(v1::COST_MODEL_MEASURED);
    for (size_t i = 0; i < work.size(); ++i) {
      spec.mutable_measured_attention()->add_pairs(static_cast<double>(64 * (i + 1)));
      spec.mutable_measured_attention()->add_work(work[i]);
    }
    return spec;
  };
  Rendezvous rendezvous{ServiceLimits()};
  auto opener = Call(measured({10}), 0);
  ASSERT_TRUE(Arrive(rendezvous, opener.get(), kT0).status.ok());
  auto same = Call(measured({10}), 1);
  ASSERT_TRUE(Arrive(rendezvous, same.get(), kT0).status.ok());
  auto odd = Call(measured({10, 20}), 2);
  auto arrival = Arrive(rendezvous, odd.get(), kT0);
  EXPECT_EQ(arrival.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(arrival.status),
              HasSubstr("spec.measured_attention: rank 2 sent a table of 2 points but step 4 of "
                        "job 'job' group '' was opened with another (of 1 points)"));
}

TEST(RendezvousTest, MismatchedSpecIsFailedPreconditionAndNotAdded) {
  for (const MismatchCase& c : MismatchCases()) {
    SCOPED_TRACE(c.name);
    Rendezvous rendezvous{ServiceLimits()};
    const v1::StepSpec spec = Spec(4, 8);
    auto opener = Call(spec, 0);
    ASSERT_TRUE(Arrive(rendezvous, opener.get(), kT0).status.ok());

    auto odd = Call(c.spec, 1);
    auto arrival = Arrive(rendezvous, odd.get(), kT0 + absl::Seconds(1));
    EXPECT_EQ(arrival.status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(Message(arrival.status), HasSubstr(c.message));
    EXPECT_EQ(arrival.ready, nullptr);

    // Not added: the step still waits for rank 1, and Leave does not know it.
    EXPECT_FALSE(rendezvous.Leave(odd.get()));
    auto job = rendezvous.GetJob("job", kT0 + absl::Seconds(1));
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_EQ(job->groups_size(), 1);
    ASSERT_EQ(job->groups(0).pending_size(), 1);
    EXPECT_EQ(job->groups(0).pending(0).ranks_arrived(), 1);
    EXPECT_EQ(job->groups(0).pending(0).missing_ranks(), "1-7");
    EXPECT_EQ(job->groups(0).ranks_seen(), 1);

    auto good = Call(spec, 1);
    EXPECT_TRUE(Arrive(rendezvous, good.get(), kT0 + absl::Seconds(2)).status.ok());
  }
}

TEST(RendezvousTest, TopologiesAreComparedInCanonicalForm) {
  Rendezvous rendezvous{ServiceLimits()};
  auto r0 = Call(Spec(1, 4, "job", "", "g1n4"), 0);
  auto r1 = Call(Spec(1, 4, "job", "", "g1n2+g1n2"), 1);
  auto r2 = Call(Spec(1, 4, "job", "", "g1n1+g1n3"), 2);
  auto r3 = Call(Spec(1, 4, "job", "", "g1n4"), 3);
  EXPECT_TRUE(Arrive(rendezvous, r0.get(), kT0).status.ok());
  auto a1 = Arrive(rendezvous, r1.get(), kT0);
  EXPECT_TRUE(a1.status.ok()) << a1.status;
  auto a2 = Arrive(rendezvous, r2.get(), kT0);
  EXPECT_TRUE(a2.status.ok()) << a2.status;
  auto a3 = Arrive(rendezvous, r3.get(), kT0);
  ASSERT_TRUE(a3.status.ok()) << a3.status;
  ASSERT_NE(a3.ready, nullptr);
  // The ready step carries the first arrival's spec as sent.
  EXPECT_EQ(a3.ready->spec.topology(), "g1n4");
  EXPECT_EQ(a3.ready->checked.world->topology().spec(), "g1n4");
}

TEST(RendezvousTest, NonCanonicalFirstArrivalStillMatchesCanonicalLaterOnes) {
  Rendezvous rendezvous{ServiceLimits()};
  auto r0 = Call(Spec(1, 2, "job", "", "g1n1+g1n1"), 0);
  auto r1 = Call(Spec(1, 2, "job", "", "g1n2"), 1);
  EXPECT_TRUE(Arrive(rendezvous, r0.get(), kT0).status.ok());
  auto a1 = Arrive(rendezvous, r1.get(), kT0);
  ASSERT_TRUE(a1.status.ok()) << a1.status;
  ASSERT_NE(a1.ready, nullptr);
  EXPECT_EQ(a1.ready->spec.topology(), "g1n1+g1n1");
}

TEST(RendezvousTest, LeavingRankMayArriveAgainAndTheStepCompletesWithTheNewCall) {
  Rendezvous rendezvous{ServiceLimits()};
  const v1::StepSpec spec = Spec(2);
  auto r0 = Call(spec, 0);
  auto r1 = Call(spec, 1);
  auto r1_again = Call(spec, 1);
  auto r2 = Call(spec, 2);
  auto r3 = Call(spec, 3);
  ASSERT_TRUE(Arrive(rendezvous, r0.get(), kT0).status.ok());
  ASSERT_TRUE(Arrive(rendezvous, r1.get(), kT0).status.ok());
  ASSERT_TRUE(Arrive(rendezvous, r2.get(), kT0).status.ok());

  EXPECT_TRUE(rendezvous.Leave(r1.get()));
  EXPECT_FALSE(rendezvous.Leave(r1.get()));  // already handed back
  EXPECT_EQ(rendezvous.pending_steps(), 1);
  auto job = rendezvous.GetJob("job", kT0);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->groups(0).pending_size(), 1);
  EXPECT_EQ(job->groups(0).pending(0).ranks_arrived(), 2);
  EXPECT_EQ(job->groups(0).pending(0).missing_ranks(), "1,3");

  auto again = Arrive(rendezvous, r1_again.get(), kT0 + absl::Seconds(1));
  ASSERT_TRUE(again.status.ok()) << again.status;
  EXPECT_EQ(again.ready, nullptr);
  auto last = Arrive(rendezvous, r3.get(), kT0 + absl::Seconds(2));
  ASSERT_TRUE(last.status.ok()) << last.status;
  ASSERT_NE(last.ready, nullptr);
  EXPECT_THAT(last.ready->calls, ElementsAre(r0.get(), r1_again.get(), r2.get(), r3.get()));
  // The step keeps its first arrival time even though a rank left.
  EXPECT_EQ(last.ready->first_arrival, kT0);
}

TEST(RendezvousTest, LeaveAfterCompletionReturnsFalse) {
  Rendezvous rendezvous{ServiceLimits()};
  auto calls = CompleteStep(rendezvous, Spec(1), kT0);
  for (const auto& call : calls) EXPECT_FALSE(rendezvous.Leave(call.get()));
  EXPECT_EQ(rendezvous.pending_steps(), 0);
}

TEST(RendezvousTest, LeaveOfAnUnknownCallReturnsFalse) {
  Rendezvous rendezvous{ServiceLimits()};
  auto stranger = Call(Spec(1), 0);
  EXPECT_FALSE(rendezvous.Leave(stranger.get()));
  auto r0 = Call(Spec(1), 0);
  ASSERT_TRUE(Arrive(rendezvous, r0.get(), kT0).status.ok());
  // Same job, group, step and rank, but another call.
  EXPECT_FALSE(rendezvous.Leave(stranger.get()));
  EXPECT_EQ(rendezvous.pending_steps(), 1);
}

TEST(RendezvousTest, LeavingTheOnlyCallRemovesThePendingStep) {
  Rendezvous rendezvous{ServiceLimits()};
  auto r2 = Call(Spec(6), 2);
  ASSERT_TRUE(Arrive(rendezvous, r2.get(), kT0).status.ok());
  EXPECT_EQ(rendezvous.pending_steps(), 1);
  EXPECT_EQ(rendezvous.NextDeadline(), kT0 + ServiceLimits().rendezvous_timeout);

  EXPECT_TRUE(rendezvous.Leave(r2.get()));
  EXPECT_EQ(rendezvous.pending_steps(), 0);
  EXPECT_EQ(rendezvous.NextDeadline(), absl::InfiniteFuture());
  EXPECT_THAT(rendezvous.Expire(kT0 + absl::Hours(10)), IsEmpty());
  auto job = rendezvous.GetJob("job", kT0);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->groups_size(), 1);
  EXPECT_EQ(job->groups(0).pending_size(), 0);
  EXPECT_EQ(rendezvous.Gauges().at(0).pending_steps, 0);
  // With no pending step, the job can now be dropped once idle.
  EXPECT_THAT(rendezvous.DropIdleJobs(kT0 + ServiceLimits().job_ttl), ElementsAre("job"));
}

TEST(RendezvousTest, LeaveGivesBackTheStepsSequenceBudget) {
  ServiceLimits limits;
  limits.max_sequences_per_step = 5;
  Rendezvous rendezvous{limits};
  const v1::StepSpec spec = Spec(1, 2, "job", "", "g1n2");
  auto r0 = Call(spec, 0, {1, 2, 3});
  auto r0_again = Call(spec, 0, {1, 2, 3});
  auto r1 = Call(spec, 1, {4, 5});
  ASSERT_TRUE(Arrive(rendezvous, r0.get(), kT0).status.ok());
  ASSERT_TRUE(rendezvous.Leave(r0.get()));
  auto keep = Call(spec, 1, {9});  // keeps the step open while rank 0 is away
  ASSERT_TRUE(Arrive(rendezvous, keep.get(), kT0).status.ok());
  ASSERT_TRUE(rendezvous.Leave(keep.get()));
  ASSERT_TRUE(Arrive(rendezvous, r0_again.get(), kT0).status.ok());
  auto last = Arrive(rendezvous, r1.get(), kT0);
  ASSERT_TRUE(last.status.ok()) << last.status;  // 3 + 2 = 5 sequences, at the limit
  EXPECT_NE(last.ready, nullptr);
}

// Withdraws `spec`'s step for rank `rank`, refused for a negative length,
// as the service does.
std::optional<FailedCalls> Withdraw(Rendezvous& rendezvous, const v1::StepSpec& spec,
                                    int32_t rank, absl::Time now) {
  auto refused = Call(spec, rank, {-1});
  auto checked = CheckPlanRequestRank(refused->request(), ServiceLimits());
  EXPECT_TRUE(checked.ok()) << checked.status();
  const absl::Status input = CheckRankInput(refused->request(), ServiceLimits());
  EXPECT_FALSE(input.ok());
  return rendezvous.Withdraw(spec, *checked, rank, input, now);
}

// A rank refused for its own input withdraws its step: the ranks waiting in
// it are handed back at once, with Aborted naming the rank and why, and a
// rank that asks later is refused the same at once; the group's next step
// is a rendezvous as before.
TEST(RendezvousTest, AWithdrawnStepHandsBackItsRanksAndRefusesLaterOnes) {
  Rendezvous rendezvous{ServiceLimits()};
  const v1::StepSpec spec = Spec(3);
  auto r0 = Call(spec, 0);
  auto r1 = Call(spec, 1);
  ASSERT_TRUE(Arrive(rendezvous, r0.get(), kT0).status.ok());
  ASSERT_TRUE(Arrive(rendezvous, r1.get(), kT0).status.ok());
  std::optional<FailedCalls> withdrawn = Withdraw(rendezvous, spec, 2, kT0);
  ASSERT_TRUE(withdrawn.has_value());
  EXPECT_EQ(withdrawn->job_id, "job");
  EXPECT_THAT(withdrawn->calls, UnorderedElementsAre(r0.get(), r1.get()));
  EXPECT_EQ(withdrawn->status.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(Message(withdrawn->status),
            "step 3 of job 'job' group '': rank 2's request was refused, so the step cannot "
            "complete: sequence_lengths[0]: -1 is outside [0, 2147483648]");
  EXPECT_EQ(rendezvous.pending_steps(), 0);
  // Rank 3 comes late: refused at once, with the same status.
  auto r3 = Call(spec, 3);
  auto late = Arrive(rendezvous, r3.get(), kT0);
  EXPECT_EQ(late.status, withdrawn->status);
  EXPECT_EQ(rendezvous.pending_steps(), 0);
  // Withdrawn once: the same refusal again hands back nothing.
  EXPECT_FALSE(Withdraw(rendezvous, spec, 2, kT0).has_value());
  EXPECT_EQ(CompleteStep(rendezvous, Spec(4), kT0).size(), 4u);
}

// The refused rank may be the first to ask: the step is withdrawn before
// anyone waits in it.
TEST(RendezvousTest, AStepWithdrawnBeforeAnyRankAskedRefusesThemAll) {
  Rendezvous rendezvous{ServiceLimits()};
  const v1::StepSpec spec = Spec(0);
  std::optional<FailedCalls> withdrawn = Withdraw(rendezvous, spec, 1, kT0);
  ASSERT_TRUE(withdrawn.has_value());
  EXPECT_TRUE(withdrawn->calls.empty());
  EXPECT_EQ(rendezvous.jobs(), 0);  // a refused request holds no job
  for (int32_t rank : {0, 2, 3}) {
    auto call = Call(spec, rank);
    auto arrival = Arrive(rendezvous, call.get(), kT0);
    EXPECT_EQ(arrival.status.code(), absl::StatusCode::kAborted) << "rank " << rank;
    EXPECT_THAT(Message(arrival.status), HasSubstr("rank 1's request was refused"));
  }
  EXPECT_EQ(rendezvous.pending_steps(), 0);
}

// Only a rank the step waits for withdraws it: not one that differs from
// its spec (another run's, or a stranger's), not a rank already waiting in
// it (a second request for it), not a step already answered.
TEST(RendezvousTest, OnlyARankTheStepWaitsForWithdrawsIt) {
  Rendezvous rendezvous{ServiceLimits()};
  const v1::StepSpec spec = Spec(7);
  auto r0 = Call(spec, 0);
  ASSERT_TRUE(Arrive(rendezvous, r0.get(), kT0).status.ok());
  v1::StepSpec other = spec;
  other.set_gamma(0.25);
  EXPECT_FALSE(Withdraw(rendezvous, other, 1, kT0).has_value());
  EXPECT_FALSE(Withdraw(rendezvous, spec, 0, kT0).has_value());
  EXPECT_EQ(rendezvous.pending_steps(), 1);
  std::vector<std::unique_ptr<FakeCall>> rest;
  for (int32_t rank = 1; rank < 4; ++rank) {
    rest.push_back(Call(spec, rank));
    auto arrival = Arrive(rendezvous, rest.back().get(), kT0);
    ASSERT_TRUE(arrival.status.ok()) << arrival.status;
    EXPECT_EQ(arrival.ready != nullptr, rank == 3);
  }
  EXPECT_FALSE(Withdraw(rendezvous, spec, 2, kT0).has_value());  // answered
}

// The server remembers its last max_pending_steps withdrawn steps; an
// older one opens anew.
TEST(RendezvousTest, ForgetsWithdrawnStepsBeyondMaxPendingSteps) {
  ServiceLimits limits;
  limits.max_pending_steps = 2;
  Rendezvous rendezvous{limits};
  for (uint64_t step : {0, 1, 2}) ASSERT_TRUE(Withdraw(rendezvous, Spec(step), 0, kT0).has_value());
  auto forgotten = Call(Spec(0), 1);
  EXPECT_TRUE(Arrive(rendezvous, forgotten.get(), kT0).status.ok());
  auto remembered = Call(Spec(1), 1);
  EXPECT_EQ(Arrive(rendezvous, remembered.get(), kT0).status.code(), absl::StatusCode::kAborted);
}

TEST(RendezvousTest, ExpiresAtTheTimeoutNamingTheMissingRanks) {
  ServiceLimits limits;
  limits.rendezvous_timeout = absl::Seconds(30);
  Rendezvous rendezvous{limits};
  EXPECT_EQ(rendezvous.NextDeadline(), absl::InfiniteFuture());
  const v1::StepSpec spec = Spec(7, 8, "job", "grp");
  auto r0 = Call(spec, 0);
  auto r2 = Call(spec, 2);
  auto r6 = Call(spec, 6);
  ASSERT_TRUE(Arrive(rendezvous, r6.get(), kT0).status.ok());
  ASSERT_TRUE(Arrive(rendezvous, r0.get(), kT0 + absl::Seconds(5)).status.ok());
  ASSERT_TRUE(Arrive(rendezvous, r2.get(), kT0 + absl::Seconds(10)).status.ok());
  const absl::Time deadline = kT0 + absl::Seconds(30);
  EXPECT_EQ(rendezvous.NextDeadline(), deadline);

  EXPECT_THAT(rendezvous.Expire(deadline - absl::Nanoseconds(1)), IsEmpty());
  EXPECT_EQ(rendezvous.pending_steps(), 1);

  std::vector<FailedCalls> failed = rendezvous.Expire(deadline);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].job_id, "job");
  EXPECT_THAT(failed[0].calls, UnorderedElementsAre(r0.get(), r2.get(), r6.get()));
  EXPECT_EQ(failed[0].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(Message(failed[0].status), HasSubstr("step 7 of job 'job' group 'grp'"));
  EXPECT_THAT(Message(failed[0].status),
              HasSubstr("5 of 8 ranks did not ask within the rendezvous timeout of 30s"));
  EXPECT_THAT(Message(failed[0].status), HasSubstr("missing ranks: 1,3-5,7"));

  EXPECT_EQ(rendezvous.pending_steps(), 0);
  EXPECT_EQ(rendezvous.NextDeadline(), absl::InfiniteFuture());
  EXPECT_THAT(rendezvous.Expire(deadline + absl::Hours(1)), IsEmpty());
  EXPECT_FALSE(rendezvous.Leave(r0.get()));
}

TEST(RendezvousTest, ExpiresOnlyTheStepsWhoseDeadlinePassed) {
  ServiceLimits limits;
  limits.rendezvous_timeout = absl::Seconds(10);
  Rendezvous rendezvous{limits};
  auto early = Call(Spec(1, 4, "a"), 3);
  auto late = Call(Spec(2, 4, "b"), 0);
  ASSERT_TRUE(Arrive(rendezvous, late.get(), kT0 + absl::Seconds(4)).status.ok());
  ASSERT_TRUE(Arrive(rendezvous, early.get(), kT0).status.ok());
  EXPECT_EQ(rendezvous.NextDeadline(), kT0 + absl::Seconds(10));

  auto failed = rendezvous.Expire(kT0 + absl::Seconds(12));
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].job_id, "a");
  EXPECT_THAT(failed[0].calls, ElementsAre(early.get()));
  EXPECT_THAT(Message(failed[0].status), HasSubstr("missing ranks: 0-2"));
  EXPECT_EQ(rendezvous.pending_steps(), 1);
  EXPECT_EQ(rendezvous.NextDeadline(), kT0 + absl::Seconds(14));

  failed = rendezvous.Expire(kT0 + absl::Seconds(14));
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].job_id, "b");
  EXPECT_THAT(Message(failed[0].status), HasSubstr("3 of 4 ranks"));
  EXPECT_THAT(Message(failed[0].status), HasSubstr("missing ranks: 1-3"));
  EXPECT_EQ(rendezvous.NextDeadline(), absl::InfiniteFuture());
}

TEST(RendezvousTest, MaxPendingStepsRefusesNewStepsButNotRanksOfOpenOnes) {
  ServiceLimits limits;
  limits.max_pending_steps = 2;
  Rendezvous rendezvous{limits};
  auto s1 = Call(Spec(1), 0);
  auto s2 = Call(Spec(2, 4, "other"), 0);
  auto s3 = Call(Spec(3), 0);
  ASSERT_TRUE(Arrive(rendezvous, s1.get(), kT0).status.ok());
  ASSERT_TRUE(Arrive(rendezvous, s2.get(), kT0).status.ok());
  auto refused = Arrive(rendezvous, s3.get(), kT0);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(refused.status),
              HasSubstr("spec.step: 2 steps are already waiting for ranks, the server's limit"));
  EXPECT_THAT(Message(refused.status), HasSubstr("step 3 of job 'job' group '' was not opened"));
  EXPECT_EQ(rendezvous.pending_steps(), 2);
  EXPECT_FALSE(rendezvous.Leave(s3.get()));

  auto s1_r1 = Call(Spec(1), 1);
  auto more = Arrive(rendezvous, s1_r1.get(), kT0);
  EXPECT_TRUE(more.status.ok()) << more.status;
  EXPECT_EQ(rendezvous.pending_steps(), 2);

  // Once a step leaves, a new one may open.
  ASSERT_TRUE(rendezvous.Leave(s2.get()));
  EXPECT_TRUE(Arrive(rendezvous, s3.get(), kT0).status.ok());
  EXPECT_EQ(rendezvous.pending_steps(), 2);
}

TEST(RendezvousTest, AtTheGlobalLimitTheJobHoldingMostGivesUpItsOldestStep) {
  ServiceLimits limits;
  limits.max_pending_steps = 3;
  Rendezvous rendezvous{limits};
  std::vector<std::unique_ptr<FakeCall>> flood;
  for (uint64_t step = 1; step <= 3; ++step) {
    flood.push_back(Call(Spec(step, 4, "flood"), 0));
    ASSERT_TRUE(Arrive(rendezvous, flood.back().get(), kT0 + absl::Seconds(step)).status.ok());
  }
  // The good job's first step takes the flood's oldest (step 1).
  auto good1 = Call(Spec(1, 4, "good"), 0);
  Rendezvous::Arrival arrival = Arrive(rendezvous, good1.get(), kT0 + absl::Seconds(4));
  ASSERT_TRUE(arrival.status.ok()) << arrival.status;
  ASSERT_EQ(arrival.evicted.size(), 1u);
  EXPECT_EQ(arrival.evicted[0].job_id, "flood");
  EXPECT_THAT(arrival.evicted[0].calls, ElementsAre(flood[0].get()));
  EXPECT_EQ(arrival.evicted[0].status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(arrival.evicted[0].status),
              HasSubstr("step 1 of job 'flood' group '': given up to make room for step 1 of "
                        "job 'good' group ''; tenant 'flood' held 3 of the server's 3 pending "
                        "steps"));
  EXPECT_FALSE(rendezvous.Leave(flood[0].get())) << "the evicted call is out of the rendezvous";
  EXPECT_EQ(rendezvous.pending_steps(), 3);
  EXPECT_EQ(rendezvous.steps_evicted(), 1);
  // Now the flood holds 2 and the good job 1: fair enough, its next step is refused.
  auto good2 = Call(Spec(2, 4, "good"), 0);
  arrival = Arrive(rendezvous, good2.get(), kT0 + absl::Seconds(5));
  EXPECT_EQ(arrival.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(arrival.evicted.empty());
  // And the flood cannot take back its room from the good job.
  auto flood4 = Call(Spec(4, 4, "flood"), 0);
  arrival = Arrive(rendezvous, flood4.get(), kT0 + absl::Seconds(6));
  EXPECT_EQ(arrival.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(arrival.evicted.empty());
  EXPECT_EQ(rendezvous.steps_evicted(), 1);
}

TEST(RendezvousTest, MaxPendingStepsPerJobKeepsOneJobFromStarvingTheOthers) {
  ServiceLimits limits;
  limits.max_pending_steps = 100;
  limits.max_pending_steps_per_job = 2;
  Rendezvous rendezvous{limits};
  std::vector<std::unique_ptr<FakeCall>> flood;
  for (uint64_t step = 0; step < 5; ++step) {
    flood.push_back(Call(Spec(step, 4, "flooder"), 0));
    auto arrival = Arrive(rendezvous, flood.back().get(), kT0);
    if (step < 2) {
      EXPECT_TRUE(arrival.status.ok()) << arrival.status;
    } else {
      EXPECT_EQ(arrival.status.code(), absl::StatusCode::kResourceExhausted);
      EXPECT_THAT(Message(arrival.status),
                  HasSubstr("spec.step: job 'flooder' already has 2 steps waiting for ranks, "
                            "the server's limit per job"));
    }
  }
  // Another job still opens its steps, and the flooder's open ones still complete.
  auto other = Call(Spec(0, 4, "other"), 0);
  EXPECT_TRUE(Arrive(rendezvous, other.get(), kT0).status.ok());
  std::vector<std::unique_ptr<FakeCall>> rest;
  for (int32_t rank = 1; rank < 4; ++rank) {
    rest.push_back(Call(Spec(0, 4, "flooder"), rank));
    auto arrival = Arrive(rendezvous, rest.back().get(), kT0);
    EXPECT_TRUE(arrival.status.ok()) << arrival.status;
    EXPECT_EQ(arrival.ready != nullptr, rank == 3);
  }
  EXPECT_EQ(rendezvous.pending_steps(), 2);  // the flooder's step 1, the other job's step 0
}

v1::StepSpec Incarnation(v1::StepSpec spec, uint64_t incarnation) {
  spec.set_incarnation(incarnation);
  return spec;
}

TEST(RendezvousTest, AnotherIncarnationReplaysAnsweredStepsAsNewOnes) {
  Rendezvous rendezvous{ServiceLimits()};
  auto first = CompleteStep(rendezvous, Incarnation(Spec(7), 1), kT0);
  // The same incarnation again: answered.
  auto again = Call(Incarnation(Spec(7), 1), 0);
  EXPECT_EQ(Arrive(rendezvous, again.get(), kT0).status.code(),
            absl::StatusCode::kAlreadyExists);
  // A restarted run (incarnation 2) plans step 7 again.
  auto replay = CompleteStep(rendezvous, Incarnation(Spec(7), 2), kT0 + absl::Seconds(1));
  absl::StatusOr<v1::JobState> state = rendezvous.GetJob("job", kT0 + absl::Seconds(2));
  ASSERT_TRUE(state.ok());
  ASSERT_EQ(state->groups_size(), 1) << "the idle incarnation 1 was not replaced";
  EXPECT_EQ(state->groups(0).incarnation(), 2u);
  EXPECT_EQ(rendezvous.groups_replaced(), 1);
  // ... and incarnation 1 is gone with its memory: its step 7 would open anew.
  auto old = Call(Incarnation(Spec(7), 1), 0);
  auto reopened = Arrive(rendezvous, old.get(), kT0 + absl::Seconds(3));
  EXPECT_TRUE(reopened.status.ok()) << reopened.status;
}

TEST(RendezvousTest, IncarnationsOfAGroupNeverShareARendezvous) {
  Rendezvous rendezvous{ServiceLimits()};
  // A stranger's (incarnation 9) step 3 waits with another spec.
  v1::StepSpec stranger_spec = Incarnation(Spec(3), 9);
  stranger_spec.set_d_model(8);
  auto stranger = Call(stranger_spec, 0);
  ASSERT_TRUE(Arrive(rendezvous, stranger.get(), kT0).status.ok());
  // The run (incarnation 4) completes its own step 3 beside it.
  auto run = CompleteStep(rendezvous, Incarnation(Spec(3), 4), kT0 + absl::Seconds(1));
  // The stranger's pending step keeps its incarnation alive beside the run's.
  absl::StatusOr<v1::JobState> state = rendezvous.GetJob("job", kT0 + absl::Seconds(2));
  ASSERT_TRUE(state.ok());
  ASSERT_EQ(state->groups_size(), 2);
  EXPECT_EQ(state->groups(0).incarnation(), 4u);
  EXPECT_EQ(state->groups(0).pending_size(), 0);
  EXPECT_EQ(state->groups(1).incarnation(), 9u);
  EXPECT_EQ(state->groups(1).pending_size(), 1);
  EXPECT_EQ(rendezvous.groups_replaced(), 0);
  // Metrics see one series for the group: the most recently active (the run's).
  std::vector<GroupGauges> gauges = rendezvous.Gauges();
  ASSERT_EQ(gauges.size(), 1u);
  EXPECT_EQ(gauges[0].pending_steps, 0);
  EXPECT_EQ(gauges[0].ranks_seen, 4);
  // The stranger's step fails alone at its timeout, naming its incarnation.
  std::vector<FailedCalls> failed =
      rendezvous.Expire(kT0 + ServiceLimits().rendezvous_timeout + absl::Seconds(1));
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_THAT(Message(failed[0].status), HasSubstr("group '' incarnation 9"));
  EXPECT_THAT(failed[0].calls, ElementsAre(stranger.get()));
}

TEST(RendezvousTest, ARefusedFirstRequestLeavesNoJobOrGroupBehind) {
  ServiceLimits limits;
  limits.max_pending_steps = 1;
  Rendezvous rendezvous{limits};
  auto open = Call(Spec(1), 0);
  ASSERT_TRUE(Arrive(rendezvous, open.get(), kT0).status.ok());
  auto new_job = Call(Spec(1, 4, "newcomer"), 0);
  auto new_group = Call(Spec(1, 4, "job", "vae"), 0);
  EXPECT_EQ(Arrive(rendezvous, new_job.get(), kT0).status.code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Arrive(rendezvous, new_group.get(), kT0).status.code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(rendezvous.jobs(), 1);
  EXPECT_EQ(rendezvous.GetJob("newcomer", kT0).status().code(), absl::StatusCode::kNotFound);
  auto state = rendezvous.GetJob("job", kT0);
  ASSERT_TRUE(state.ok());
  ASSERT_EQ(state->groups_size(), 1);
  EXPECT_EQ(state->groups(0).group_id(), "");
}

// At max_jobs a new job evicts the least recently active job with nothing
// pending; only when every job has a step waiting is it refused.
TEST(RendezvousTest, AtMaxJobsTheLeastRecentlyActiveIdleJobMakesRoom) {
  ServiceLimits limits;
  limits.max_jobs = 2;
  limits.job_ttl = absl::Minutes(5);
  Rendezvous rendezvous{limits};
  ASSERT_TRUE(Touch(rendezvous, Spec(1, 4, "a"), kT0).ok());
  ASSERT_TRUE(Touch(rendezvous, Spec(1, 4, "b"), kT0 + absl::Seconds(1)).ok());
  ASSERT_TRUE(Touch(rendezvous, Spec(2, 4, "a"), kT0 + absl::Seconds(2)).ok());  // a is active

  // c evicts b, the least recently active; its step then waits for ranks.
  auto c = Call(Spec(1, 4, "c"), 0);
  ASSERT_TRUE(Arrive(rendezvous, c.get(), kT0 + absl::Seconds(3)).status.ok());
  EXPECT_EQ(rendezvous.jobs(), 2);
  EXPECT_EQ(rendezvous.jobs_evicted(), 1);
  EXPECT_EQ(rendezvous.GetJob("b", kT0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(rendezvous.GetJob("a", kT0).ok());

  // d evicts a (c has a pending step and is never evicted).
  auto d = Call(Spec(1, 4, "d"), 0);
  ASSERT_TRUE(Arrive(rendezvous, d.get(), kT0 + absl::Seconds(4)).status.ok());
  EXPECT_EQ(rendezvous.GetJob("a", kT0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(rendezvous.GetJob("c", kT0).ok());
  // The evicted ids are reported once, with the idle ones.
  EXPECT_THAT(rendezvous.DropIdleJobs(kT0 + absl::Seconds(5)),
              testing::UnorderedElementsAre("b", "a"));
  EXPECT_TRUE(rendezvous.DropIdleJobs(kT0 + absl::Seconds(6)).empty());

  // c and d both wait for ranks: e is refused, saying why.
  auto e = Call(Spec(1, 4, "e"), 0);
  auto refused = Arrive(rendezvous, e.get(), kT0 + absl::Seconds(7));
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(refused.status),
              HasSubstr("spec.job_id: the server already tracks 2 jobs, its limit, and none may "
                        "make room for tenant 'e'"));
  EXPECT_THAT(Message(refused.status), HasSubstr("after 5m"));
  absl::Status touched = Touch(rendezvous, Spec(1, 4, "e"), kT0 + absl::Seconds(7));
  EXPECT_EQ(touched.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(rendezvous.jobs(), 2);
  EXPECT_EQ(rendezvous.GetJob("e", kT0).status().code(), absl::StatusCode::kNotFound);

  // Known jobs still get new groups and steps.
  auto c2 = Call(Spec(2, 4, "c", "g2"), 0);
  EXPECT_TRUE(Arrive(rendezvous, c2.get(), kT0 + absl::Seconds(8)).status.ok());
}

// A job that is training (a step planned within the rendezvous timeout) is
// never pushed out for a new job id; one idle for longer is, after the
// jobs that never had a step planned.
TEST(RendezvousTest, AtMaxJobsAJobThatIsTrainingKeepsItsPlace) {
  ServiceLimits limits;
  limits.max_jobs = 2;
  limits.rendezvous_timeout = absl::Seconds(30);
  Rendezvous rendezvous{limits};
  auto trainer = CompleteStep(rendezvous, Spec(1, 4, "trainer"), kT0);
  rendezvous.RecordPlanned(Spec(1, 4, "trainer"), "g1n4", v1::Balance(), kT0);
  ASSERT_TRUE(Touch(rendezvous, Spec(1, 4, "never-planned"), kT0 + absl::Seconds(1)).ok());
  // The never-planned job goes first, though more recently active.
  ASSERT_TRUE(Touch(rendezvous, Spec(1, 4, "new-1"), kT0 + absl::Seconds(2)).ok());
  EXPECT_EQ(rendezvous.GetJob("never-planned", kT0).status().code(),
            absl::StatusCode::kNotFound);
  // new-1 waits for ranks: the trainer, idle for 10 s only, keeps its place.
  auto waiting = Call(Spec(1, 4, "new-1"), 0);
  ASSERT_TRUE(Arrive(rendezvous, waiting.get(), kT0 + absl::Seconds(3)).status.ok());
  absl::Status refused = Touch(rendezvous, Spec(1, 4, "new-2"), kT0 + absl::Seconds(10));
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(refused), HasSubstr("or planned one within the rendezvous timeout"));
  EXPECT_TRUE(rendezvous.GetJob("trainer", kT0).ok());
  // Idle for longer than the rendezvous timeout, it makes room.
  EXPECT_TRUE(Touch(rendezvous, Spec(1, 4, "new-2"), kT0 + absl::Seconds(31)).ok());
  EXPECT_EQ(rendezvous.GetJob("trainer", kT0).status().code(), absl::StatusCode::kNotFound);
}

// Room in the job table is shared per tenant: a tenant's burst of new job
// ids takes room from its own idle jobs first, never past its limit, and
// from another tenant's only while that one holds more jobs.
TEST(RendezvousTest, ATenantsNewJobsTakeRoomFromItsOwnIdleJobsFirst) {
  ServiceLimits limits;
  limits.max_jobs = 4;
  limits.max_jobs_per_tenant = 2;
  limits.job_ttl = absl::Minutes(5);
  Rendezvous rendezvous{limits};
  ASSERT_TRUE(Touch(rendezvous, Spec(1, 4, "b/1"), kT0, "b/").ok());
  ASSERT_TRUE(Touch(rendezvous, Spec(1, 4, "b/2"), kT0 + absl::Seconds(1), "b/").ok());
  ASSERT_TRUE(Touch(rendezvous, Spec(1, 4, "a/1"), kT0 + absl::Seconds(2), "a/").ok());
  ASSERT_TRUE(Touch(rendezvous, Spec(1, 4, "a/2"), kT0 + absl::Seconds(3), "a/").ok());
  // A burst of a's new ids: each takes the room of one of a's own (b's
  // jobs are older, and never planned either).
  for (int i = 3; i < 10; ++i) {
    ASSERT_TRUE(Touch(rendezvous, Spec(1, 4, absl::StrCat("a/", i)), kT0 + absl::Seconds(i + 1),
                      "a/")
                    .ok())
        << i;
  }
  EXPECT_EQ(rendezvous.jobs(), 4);
  EXPECT_TRUE(rendezvous.GetJob("b/1", kT0).ok());
  EXPECT_TRUE(rendezvous.GetJob("b/2", kT0).ok());
  EXPECT_TRUE(rendezvous.GetJob("a/9", kT0).ok());
  EXPECT_EQ(rendezvous.GetJob("a/1", kT0).status().code(), absl::StatusCode::kNotFound);
  // A new tenant takes the room of an idle job of one holding more: b's
  // oldest. Its job then waits for ranks (no longer room to give).
  ASSERT_TRUE(Touch(rendezvous, Spec(1, 4, "c/1"), kT0 + absl::Seconds(20), "c/").ok());
  EXPECT_EQ(rendezvous.GetJob("b/1", kT0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(rendezvous.GetJob("b/2", kT0).ok());
  auto c1 = std::make_unique<FakeCall>(Call(Spec(2, 4, "c/1"), 0)->request(), "c/");
  ASSERT_TRUE(Arrive(rendezvous, c1.get(), kT0 + absl::Seconds(21)).status.ok());
  // c's second id would leave b with fewer jobs than c: it takes a's.
  auto c2 = std::make_unique<FakeCall>(Call(Spec(2, 4, "c/2"), 0)->request(), "c/");
  ASSERT_TRUE(Arrive(rendezvous, c2.get(), kT0 + absl::Seconds(22)).status.ok());
  EXPECT_TRUE(rendezvous.GetJob("b/2", kT0).ok());
  EXPECT_EQ(rendezvous.GetJob("a/8", kT0).status().code(), absl::StatusCode::kNotFound);
  // A tenant at its limit whose jobs all wait for ranks is refused, naming it.
  const absl::Status refused = Touch(rendezvous, Spec(1, 4, "c/3"), kT0 + absl::Seconds(23), "c/");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(refused), HasSubstr("spec.job_id: tenant 'c/' already has 2 jobs, its "
                                          "limit (max_jobs_per_tenant)"));
}

// A burst of stray job ids, each leaving a step waiting: once their steps
// expire (the rendezvous timeout), a real job gets in, without waiting out
// the job TTL.
TEST(RendezvousTest, ABurstOfStrayJobsDoesNotLockNewJobsOutForTheTtl) {
  ServiceLimits limits;
  limits.max_jobs = 8;
  limits.job_ttl = absl::Hours(1);
  limits.rendezvous_timeout = absl::Seconds(30);
  Rendezvous rendezvous{limits};
  std::vector<std::unique_ptr<FakeCall>> strays;
  for (int j = 0; j < 60; ++j) {
    strays.push_back(Call(Spec(1, 4, absl::StrCat("stray-", j)), 0));
    Arrive(rendezvous, strays.back().get(), kT0);
  }
  EXPECT_EQ(rendezvous.jobs(), 8);
  auto real = Call(Spec(1, 4, "real"), 0);
  EXPECT_EQ(Arrive(rendezvous, real.get(), kT0).status.code(),
            absl::StatusCode::kResourceExhausted);
  rendezvous.Expire(kT0 + absl::Seconds(31));
  auto again = Call(Spec(1, 4, "real"), 0);
  EXPECT_TRUE(Arrive(rendezvous, again.get(), kT0 + absl::Seconds(31)).status.ok());
}

TEST(RendezvousTest, MaxGroupsPerJobRefusesNewGroups) {
  ServiceLimits limits;
  limits.max_groups_per_job = 2;
  Rendezvous rendezvous{limits};
  auto g0 = Call(Spec(1, 4, "job", "g0"), 0);
  auto g2 = Call(Spec(1, 4, "job", "g2"), 0);
  ASSERT_TRUE(Arrive(rendezvous, g0.get(), kT0).status.ok());
  ASSERT_TRUE(Touch(rendezvous, Spec(1, 4, "job", "g1"), kT0).ok());
  auto refused = Arrive(rendezvous, g2.get(), kT0);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(refused.status),
              HasSubstr("spec.group_id: job 'job' already has 2 groups, the server's limit"));
  absl::Status touched = Touch(rendezvous, Spec(1, 4, "job", "g3"), kT0);
  EXPECT_EQ(touched.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(rendezvous.pending_steps(), 1);
  auto job = rendezvous.GetJob("job", kT0);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->groups_size(), 2);
  EXPECT_EQ(job->groups(0).group_id(), "g0");
  EXPECT_EQ(job->groups(1).group_id(), "g1");

  // The limit is per job.
  auto other = Call(Spec(1, 4, "other", "g2"), 0);
  EXPECT_TRUE(Arrive(rendezvous, other.get(), kT0).status.ok());
  EXPECT_TRUE(Touch(rendezvous, Spec(1, 4, "job", "g1"), kT0).ok());  // existing group
}

TEST(RendezvousTest, JobRefusedForItsFirstGroupIsNotKept) {
  ServiceLimits limits;
  limits.max_groups_per_job = 0;
  Rendezvous rendezvous{limits};
  auto call = Call(Spec(1), 0);
  auto refused = Arrive(rendezvous, call.get(), kT0);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(refused.status), HasSubstr("already has 0 groups"));
  EXPECT_EQ(rendezvous.jobs(), 0);
  EXPECT_EQ(rendezvous.GetJob("job", kT0).status().code(), absl::StatusCode::kNotFound);
}

TEST(RendezvousTest, MaxSequencesPerStepIsSummedOverArrivals) {
  ServiceLimits limits;
  limits.max_sequences_per_step = 10;
  Rendezvous rendezvous{limits};
  const v1::StepSpec spec = Spec(1, 2, "job", "", "g1n2");
  auto r0 = Call(spec, 0, {1, 1, 1, 1, 1, 1});
  auto r1_big = Call(spec, 1, {1, 1, 1, 1, 1});
  auto r1 = Call(spec, 1, {1, 1, 1, 1});
  ASSERT_TRUE(Arrive(rendezvous, r0.get(), kT0).status.ok());
  auto refused = Arrive(rendezvous, r1_big.get(), kT0);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(refused.status),
              HasSubstr("sequence_lengths: rank 1 would bring step 1 of job 'job' group '' to "
                        "11 sequences, over the limit of 10 per step"));
  EXPECT_FALSE(rendezvous.Leave(r1_big.get()));

  auto last = Arrive(rendezvous, r1.get(), kT0);
  ASSERT_TRUE(last.status.ok()) << last.status;
  EXPECT_NE(last.ready, nullptr);
}

TEST(RendezvousTest, MaxSequencesPerStepRefusesAnOversizedFirstArrival) {
  ServiceLimits limits;
  limits.max_sequences_per_step = 3;
  Rendezvous rendezvous{limits};
  auto big = Call(Spec(1), 0, {1, 2, 3, 4});
  auto refused = Arrive(rendezvous, big.get(), kT0);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(refused.status),
              HasSubstr("sequence_lengths: 4 sequences exceed the limit of 3 per step"));
  EXPECT_EQ(rendezvous.pending_steps(), 0);
  EXPECT_EQ(rendezvous.NextDeadline(), absl::InfiniteFuture());
}

TEST(RendezvousTest, CloseReturnsEveryWaitingCallAndRefusesLaterOnes) {
  Rendezvous rendezvous{ServiceLimits()};
  auto a0 = Call(Spec(1), 0);
  auto a1 = Call(Spec(1), 1);
  auto b0 = Call(Spec(2), 3);
  auto c0 = Call(Spec(1, 4, "other", "grp"), 2);
  for (FakeCall* call : {a0.get(), a1.get(), b0.get(), c0.get()}) {
    ASSERT_TRUE(Arrive(rendezvous, call, kT0).status.ok());
  }
  auto done = CompleteStep(rendezvous, Spec(3), kT0);  // answered: not returned
  EXPECT_EQ(rendezvous.pending_steps(), 3);

  EXPECT_THAT(rendezvous.Close(), UnorderedElementsAre(a0.get(), a1.get(), b0.get(), c0.get()));
  EXPECT_EQ(rendezvous.pending_steps(), 0);
  EXPECT_EQ(rendezvous.NextDeadline(), absl::InfiniteFuture());
  EXPECT_THAT(rendezvous.Expire(kT0 + absl::Hours(1)), IsEmpty());
  EXPECT_FALSE(rendezvous.Leave(a0.get()));

  auto late = Call(Spec(1), 2);
  auto arrival = Arrive(rendezvous, late.get(), kT0);
  EXPECT_EQ(arrival.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Message(arrival.status), HasSubstr("shutting down"));
  EXPECT_EQ(arrival.ready, nullptr);
  absl::Status touched = Touch(rendezvous, Spec(1, 4, "new"), kT0);
  EXPECT_EQ(touched.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Message(touched), HasSubstr("shutting down"));
  EXPECT_THAT(rendezvous.Close(), IsEmpty());
}

TEST(RendezvousTest, DropIdleJobsForgetsOnlyIdleJobsWithoutPendingSteps) {
  ServiceLimits limits;
  limits.job_ttl = absl::Minutes(10);
  limits.rendezvous_timeout = absl::Hours(1);
  Rendezvous rendezvous{limits};
  ASSERT_TRUE(Touch(rendezvous, Spec(1, 4, "idle"), kT0).ok());
  auto busy = Call(Spec(1, 4, "busy"), 0);
  ASSERT_TRUE(Arrive(rendezvous, busy.get(), kT0).status.ok());
  ASSERT_TRUE(Touch(rendezvous, Spec(1, 4, "active"), kT0).ok());
  ASSERT_TRUE(Touch(rendezvous, Spec(1, 4, "active"), kT0 + absl::Minutes(5)).ok());
  EXPECT_EQ(rendezvous.jobs(), 3);

  EXPECT_THAT(rendezvous.DropIdleJobs(kT0 + absl::Minutes(10) - absl::Seconds(1)), IsEmpty());
  EXPECT_THAT(rendezvous.DropIdleJobs(kT0 + absl::Minutes(10)), ElementsAre("idle"));
  EXPECT_EQ(rendezvous.jobs(), 2);
  auto idle = rendezvous.GetJob("idle", kT0 + absl::Minutes(10));
  EXPECT_EQ(idle.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(idle.status()), HasSubstr("job_id: the server knows no job 'idle'"));
  EXPECT_THAT(Message(idle.status()), HasSubstr("idle longer than 10m"));
  EXPECT_TRUE(rendezvous.GetJob("busy", kT0 + absl::Minutes(10)).ok());

  // "active" was touched later; "busy" stays while its step is pending.
  EXPECT_THAT(rendezvous.DropIdleJobs(kT0 + absl::Minutes(15)), ElementsAre("active"));
  EXPECT_THAT(rendezvous.DropIdleJobs(kT0 + absl::Minutes(50)), IsEmpty());
  EXPECT_EQ(rendezvous.jobs(), 1);
  ASSERT_TRUE(rendezvous.Leave(busy.get()));
  EXPECT_THAT(rendezvous.DropIdleJobs(kT0 + absl::Minutes(50)), ElementsAre("busy"));
  EXPECT_EQ(rendezvous.jobs(), 0);

  // A dropped job's results are no longer recorded.
  rendezvous.RecordPlanned(Spec(1, 4, "busy"), "g1n4", v1::Balance(), kT0 + absl::Minutes(51));
  EXPECT_EQ(rendezvous.GetJob("busy", kT0).status().code(), absl::StatusCode::kNotFound);
}

v1::Balance SomeBalance() {
  v1::Balance balance;
  balance.set_wir_before(3.5);
  balance.set_wir_after(1.25);
  balance.set_max_over_mean_before(2.0);
  balance.set_max_over_mean_after(1.05);
  balance.set_total_tokens(12345);
  balance.set_moved_tokens(678);
  balance.set_moved_bytes(678 * 16);
  balance.set_plan_micros(42);
  return balance;
}

TEST(RendezvousTest, GetJobReportsPlannedAndPendingSteps) {
  Rendezvous rendezvous{ServiceLimits()};
  const v1::StepSpec spec = Spec(7, 4, "job", "", "g1n2+g1n2");
  std::vector<std::unique_ptr<FakeCall>> calls;
  std::unique_ptr<ReadyStep> ready;
  for (int32_t rank = 0; rank < 4; ++rank) {
    calls.push_back(Call(spec, rank));
    auto arrival = Arrive(rendezvous, calls.back().get(), kT0);
    ASSERT_TRUE(arrival.status.ok()) << arrival.status;
    if (arrival.ready) ready = std::move(arrival.ready);
  }
  ASSERT_NE(ready, nullptr);
  rendezvous.RecordPlanned(ready->spec, ready->checked.world->topology().spec(), SomeBalance(),
                           kT0 + absl::Seconds(1));

  const v1::StepSpec next = Spec(8, 4, "job", "", "g1n4");
  auto r1 = Call(next, 1);
  auto r3 = Call(next, 3);
  ASSERT_TRUE(Arrive(rendezvous, r3.get(), kT0 + absl::Seconds(10)).status.ok());
  ASSERT_TRUE(Arrive(rendezvous, r1.get(), kT0 + absl::Seconds(11)).status.ok());
  // Another group of the same job, only touched.
  ASSERT_TRUE(Touch(rendezvous, Spec(1, 8, "job", "aux"), kT0 + absl::Seconds(12)).ok());

  auto job = rendezvous.GetJob("job", kT0 + absl::Milliseconds(14500));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->job_id(), "job");
  EXPECT_DOUBLE_EQ(job->idle_seconds(), 2.5);
  ASSERT_EQ(job->groups_size(), 2);  // sorted by group_id: "" < "aux"

  const v1::GroupState& group = job->groups(0);
  EXPECT_EQ(group.group_id(), "");
  EXPECT_EQ(group.steps_planned(), 1u);
  EXPECT_EQ(group.last_step(), 7u);
  EXPECT_EQ(group.world_size(), 4);
  EXPECT_EQ(group.topology(), "g1n4");
  EXPECT_EQ(group.ranks_seen(), 4);
  EXPECT_DOUBLE_EQ(group.last_balance().wir_before(), 3.5);
  EXPECT_DOUBLE_EQ(group.last_balance().wir_after(), 1.25);
  EXPECT_DOUBLE_EQ(group.last_balance().max_over_mean_before(), 2.0);
  EXPECT_DOUBLE_EQ(group.last_balance().max_over_mean_after(), 1.05);
  EXPECT_EQ(group.last_balance().total_tokens(), 12345);
  EXPECT_EQ(group.last_balance().moved_tokens(), 678);
  EXPECT_EQ(group.last_balance().moved_bytes(), 678 * 16);
  EXPECT_EQ(group.last_balance().plan_micros(), 42);
  ASSERT_EQ(group.pending_size(), 1);
  EXPECT_EQ(group.pending(0).step(), 8u);
  EXPECT_EQ(group.pending(0).ranks_arrived(), 2);
  EXPECT_EQ(group.pending(0).world_size(), 4);
  EXPECT_EQ(group.pending(0).waiting_ms(), 4500);
  EXPECT_EQ(group.pending(0).missing_ranks(), "0,2");

  const v1::GroupState& aux = job->groups(1);
  EXPECT_EQ(aux.group_id(), "aux");
  EXPECT_EQ(aux.steps_planned(), 0u);
  EXPECT_EQ(aux.world_size(), 0);
  EXPECT_EQ(aux.ranks_seen(), 0);
  EXPECT_FALSE(aux.has_last_balance());
  EXPECT_EQ(aux.pending_size(), 0);

  // A second planned step accumulates.
  rendezvous.RecordPlanned(Spec(8, 4), "g1n4", SomeBalance(), kT0 + absl::Seconds(20));
  job = rendezvous.GetJob("job", kT0 + absl::Seconds(20));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->groups(0).steps_planned(), 2u);
  EXPECT_EQ(job->groups(0).last_step(), 8u);
  EXPECT_DOUBLE_EQ(job->idle_seconds(), 0.0);
}

TEST(RendezvousTest, GetJobOfAnUnknownJobIsNotFound) {
  Rendezvous rendezvous{ServiceLimits()};
  auto job = rendezvous.GetJob("nobody", kT0);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(job.status()), HasSubstr("the server knows no job 'nobody'"));
  ASSERT_TRUE(Touch(rendezvous, Spec(1, 4, "somebody"), kT0).ok());
  EXPECT_EQ(rendezvous.GetJob("nobody", kT0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(rendezvous.GetJob("somebody", kT0).ok());
}

TEST(RendezvousTest, RanksSeenCountsDistinctRanksOverSteps) {
  Rendezvous rendezvous{ServiceLimits()};
  std::vector<std::unique_ptr<FakeCall>> calls;
  for (auto [step, rank] :
       std::vector<std::pair<uint64_t, int32_t>>{{1, 0}, {1, 1}, {2, 1}, {2, 2}, {3, 0}}) {
    calls.push_back(Call(Spec(step, 8), rank));
    ASSERT_TRUE(Arrive(rendezvous, calls.back().get(), kT0).status.ok());
  }
  // Refused calls are not seen.
  auto refused = Call(Spec(1, 8), 1);
  ASSERT_EQ(Arrive(rendezvous, refused.get(), kT0).status.code(), absl::StatusCode::kAlreadyExists);
  auto mismatch = Call(Spec(1, 4), 3);
  ASSERT_EQ(Arrive(rendezvous, mismatch.get(), kT0).status.code(),
            absl::StatusCode::kFailedPrecondition);

  auto job = rendezvous.GetJob("job", kT0);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->groups(0).ranks_seen(), 3);
  EXPECT_EQ(job->groups(0).pending_size(), 3);
}

TEST(RendezvousTest, GaugesReportEachGroup) {
  Rendezvous rendezvous{ServiceLimits()};
  auto a1 = Call(Spec(1, 4, "a"), 0);
  auto a1b = Call(Spec(1, 4, "a"), 2);
  auto a2 = Call(Spec(2, 4, "a"), 2);
  auto b1 = Call(Spec(1, 4, "b", "x"), 3);
  for (FakeCall* call : {a1.get(), a1b.get(), a2.get(), b1.get()}) {
    ASSERT_TRUE(Arrive(rendezvous, call, kT0).status.ok());
  }
  ASSERT_TRUE(Touch(rendezvous, Spec(1, 4, "b", "y"), kT0).ok());
  rendezvous.RecordPlanned(Spec(0, 4, "b", "y"), "g1n4", SomeBalance(), kT0);

  std::vector<GroupGauges> gauges = rendezvous.Gauges();
  ASSERT_EQ(gauges.size(), 3u);
  EXPECT_EQ(gauges[0].job_id, "a");
  EXPECT_EQ(gauges[0].group_id, "");
  EXPECT_EQ(gauges[0].pending_steps, 2);
  EXPECT_EQ(gauges[0].ranks_seen, 2);
  EXPECT_FALSE(gauges[0].has_balance);
  EXPECT_EQ(gauges[1].job_id, "b");
  EXPECT_EQ(gauges[1].group_id, "x");
  EXPECT_EQ(gauges[1].pending_steps, 1);
  EXPECT_EQ(gauges[1].ranks_seen, 1);
  EXPECT_EQ(gauges[2].job_id, "b");
  EXPECT_EQ(gauges[2].group_id, "y");
  EXPECT_EQ(gauges[2].pending_steps, 0);
  // Planned without a rendezvous (PlanGroup: Touch, then RecordPlanned):
  // every rank of the planned step took part.
  EXPECT_EQ(gauges[2].ranks_seen, 4);
  EXPECT_TRUE(gauges[2].has_balance);
  EXPECT_DOUBLE_EQ(gauges[2].last_balance.wir_after(), 1.25);
  EXPECT_EQ(rendezvous.pending_steps(), 3);
  EXPECT_EQ(rendezvous.jobs(), 2);
}

std::string Describe(const LifetimeEvent& event) {
  switch (event.kind) {
    case LifetimeEvent::Kind::kGroupAdded:
      return absl::StrCat("+", event.job_id, "/", event.group_id, "/", event.incarnation);
    case LifetimeEvent::Kind::kGroupForgotten:
      return absl::StrCat("-", event.job_id, "/", event.group_id, "/", event.incarnation);
    case LifetimeEvent::Kind::kJobForgotten:
      return absl::StrCat("-", event.job_id);
  }
  return "?";
}

std::vector<std::string> TakeLifetime(Rendezvous& rendezvous) {
  std::vector<std::string> events;
  for (const LifetimeEvent& event : rendezvous.TakeLifetimeEvents()) {
    events.push_back(Describe(event));
  }
  return events;
}

// Every group incarnation the rendezvous starts remembering and every group
// and job it forgets is logged, in order, for the state kept beside it (the
// gamma fits); each call says whether the log holds events to take.
TEST(RendezvousTest, TheLifetimeLogNamesEveryGroupAddedAndEveryGroupAndJobForgotten) {
  ServiceLimits limits;
  limits.max_jobs = 2;
  limits.max_pending_steps_per_job = 1;
  limits.job_ttl = absl::Minutes(5);
  Rendezvous rendezvous{limits};
  ASSERT_TRUE(Touch(rendezvous, Spec(1, 4, "a"), kT0).ok());
  EXPECT_THAT(TakeLifetime(rendezvous), ElementsAre("+a//0"));
  ASSERT_TRUE(Touch(rendezvous, Spec(2, 4, "a"), kT0).ok());
  EXPECT_THAT(TakeLifetime(rendezvous), IsEmpty());

  // A new incarnation replaces the group.
  auto a7 = Call(Incarnation(Spec(1, 4, "a"), 7), 0);
  Rendezvous::Arrival arrival = Arrive(rendezvous, a7.get(), kT0 + absl::Seconds(1));
  ASSERT_TRUE(arrival.status.ok()) << arrival.status;
  EXPECT_THAT(TakeLifetime(rendezvous), ElementsAre("-a//0", "+a//7"));
  auto a7r1 = Call(Incarnation(Spec(1, 4, "a"), 7), 1);
  arrival = Arrive(rendezvous, a7r1.get(), kT0 + absl::Seconds(1));
  ASSERT_TRUE(arrival.status.ok()) << arrival.status;
  EXPECT_THAT(TakeLifetime(rendezvous), IsEmpty());

  // At max_jobs a new job evicts the idle one.
  ASSERT_TRUE(Touch(rendezvous, Spec(1, 4, "b", "g"), kT0 + absl::Seconds(2)).ok());
  EXPECT_THAT(TakeLifetime(rendezvous), ElementsAre("+b/g/0"));
  auto c = Call(Spec(1, 4, "c"), 0);
  arrival = Arrive(rendezvous, c.get(), kT0 + absl::Seconds(3));
  ASSERT_TRUE(arrival.status.ok()) << arrival.status;
  EXPECT_THAT(TakeLifetime(rendezvous), ElementsAre("-b", "+c//0"));

  // A refused request's group is added and forgotten at once; one refused
  // before anything changed logs nothing.
  auto c_vae = Call(Spec(1, 4, "c", "vae"), 0);
  arrival = Arrive(rendezvous, c_vae.get(), kT0 + absl::Seconds(4));
  EXPECT_EQ(arrival.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(TakeLifetime(rendezvous), ElementsAre("+c/vae/0", "-c/vae/0"));
  auto d = Call(Spec(1, 4, "d"), 0);
  arrival = Arrive(rendezvous, d.get(), kT0 + absl::Seconds(4));
  EXPECT_EQ(arrival.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Touch(rendezvous, Spec(1, 4, "d"), kT0).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(TakeLifetime(rendezvous), IsEmpty());

  // Idle jobs are dropped; the evicted one is reported by DropIdleJobs again
  // (for the log) but was logged once, when it went.
  ASSERT_EQ(rendezvous.Expire(kT0 + absl::Minutes(2)).size(), 2u);
  EXPECT_THAT(rendezvous.DropIdleJobs(kT0 + absl::Minutes(10)),
              UnorderedElementsAre("b", "a", "c"));
  EXPECT_THAT(TakeLifetime(rendezvous), ElementsAre("-a", "-c"));
  EXPECT_EQ(rendezvous.jobs(), 0);
}

std::vector<bool> Present(size_t n, const std::vector<size_t>& ranks) {
  std::vector<bool> present(n, false);
  for (size_t r : ranks) present[r] = true;
  return present;
}

TEST(MissingRankRangesTest, EmptyAndAllPresentGiveAnEmptyString) {
  EXPECT_EQ(MissingRankRanges({}), "");
  EXPECT_EQ(MissingRankRanges(std::vector<bool>(10, true)), "");
}

TEST(MissingRankRangesTest, AllMissingIsOneRange) {
  EXPECT_EQ(MissingRankRanges(std::vector<bool>(10, false)), "0-9");
  EXPECT_EQ(MissingRankRanges(std::vector<bool>(1, false)), "0");
}

TEST(MissingRankRangesTest, SinglesAndRanges) {
  EXPECT_EQ(MissingRankRanges(Present(8, {0, 2, 6})), "1,3-5,7");
  EXPECT_EQ(MissingRankRanges(Present(6, {1, 3, 5})), "0,2,4");
  EXPECT_EQ(MissingRankRanges(Present(6, {0, 1, 2, 3, 4})), "5");
  EXPECT_EQ(MissingRankRanges(Present(6, {1, 2, 3, 4, 5})), "0");
  EXPECT_EQ(MissingRankRanges(Present(7, {2, 3})), "0-1,4-6");
  EXPECT_EQ(MissingRankRanges(Present(12, {0, 5, 11})), "1-4,6-10");
}

TEST(MissingRankRangesTest, CutsAfterMaxCharsCountingTheRest) {
  // Every even rank of 16384 is missing: 8192 singles. The ranges written
  // are 0,2,..,8 (5 of 1 digit), 10,..,98 (45 of 2), then 3-digit ones until
  // the text reaches 1000 characters: 9 + 45*3 = 144, + 214*4 = 1000, i.e.
  // up to rank 526; 5 + 45 + 214 = 264 written, 8192 - 264 = 7928 more.
  std::vector<bool> present(16384);
  for (size_t r = 0; r < present.size(); ++r) present[r] = (r % 2 == 1);
  const std::string ranges = MissingRankRanges(present);
  EXPECT_THAT(ranges, ::testing::StartsWith("0,2,4,6,8,10,12,"));
  EXPECT_THAT(ranges, ::testing::EndsWith(",524,526 and 7928 more"));
  EXPECT_EQ(ranges.size(), 1000 + std::string(" and 7928 more").size());
}

TEST(MissingRankRangesTest, CutCountsRanksNotRanges) {
  // 0-9 and 20-29 written (9 characters >= 8), then 40-49 and 60-99 are cut:
  // 50 ranks in 2 ranges.
  std::vector<bool> present(100, false);
  for (size_t r = 10; r < 20; ++r) present[r] = true;
  for (size_t r = 30; r < 40; ++r) present[r] = true;
  for (size_t r = 50; r < 60; ++r) present[r] = true;
  EXPECT_EQ(MissingRankRanges(present, 8), "0-9,20-29 and 50 more");
  EXPECT_EQ(MissingRankRanges(present, 1000), "0-9,20-29,40-49,60-99");
}

TEST(MissingRankRangesTest, ExpiredStepOfAHugeGroupHasABoundedMessage) {
  ServiceLimits limits;
  limits.rendezvous_timeout = absl::Seconds(1);
  Rendezvous rendezvous{limits};
  auto r1 = Call(Spec(1, 16384, "job", "", "g1n1"), 1);
  ASSERT_TRUE(Arrive(rendezvous, r1.get(), kT0).status.ok());
  auto failed = rendezvous.Expire(kT0 + absl::Seconds(1));
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_THAT(Message(failed[0].status), HasSubstr("16383 of 16384 ranks"));
  EXPECT_THAT(Message(failed[0].status), HasSubstr("missing ranks: 0,2-16383"));
}

}  // namespace
}  // namespace knapformer
