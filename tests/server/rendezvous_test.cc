#include "server/rendezvous.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "knapformer/v1/planner.pb.h"
#include "server/rank_ranges.h"
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
class FakeCall : public PendingCall {
 public:
  explicit FakeCall(v1::PlanRequest request) : request_(std::move(request)) {}
  const v1::PlanRequest& request() const override { return request_; }

 private:
  v1::PlanRequest request_;
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

// Checks the call's request as the service does, then arrives with it.
Rendezvous::Arrival Arrive(Rendezvous& rendezvous, PendingCall* call, absl::Time now) {
  auto checked = CheckPlanRequest(call->request(), ServiceLimits());
  if (!checked.ok()) {
    ADD_FAILURE() << "test request rejected: " << checked.status();
    return Rendezvous::Arrival{checked.status(), nullptr};
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
  for (int32_t rank = 0; rank < 4; ++rank) calls.push_back(Call(spec, rank, {10 * (rank + 1)}));

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
  EXPECT_EQ(ready.spec.step(), 5u);
  EXPECT_EQ(ready.spec.job_id(), "job");
  EXPECT_EQ(ready.spec.world_size(), 4);
  EXPECT_EQ(ready.checked.world.world_size(), 4);
  EXPECT_EQ(ready.checked.world.topology().spec(), "g1n4");
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
  EXPECT_EQ(Arrive(rendezvous, again1.get(), kT0).status.code(),
            absl::StatusCode::kAlreadyExists);

  auto c3 = CompleteStep(rendezvous, spec(3), kT0);
  // Step 1 fell out of the ring: asking again opens (here: completes) a new
  // rendezvous, while steps 2 and 3 are still refused.
  auto reopened = Call(spec(1), 0);
  auto arrival = Arrive(rendezvous, reopened.get(), kT0);
  ASSERT_TRUE(arrival.status.ok()) << arrival.status;
  ASSERT_NE(arrival.ready, nullptr);
  EXPECT_EQ(arrival.ready->spec.step(), 1u);

  auto again3 = Call(spec(3), 0);
  EXPECT_EQ(Arrive(rendezvous, again3.get(), kT0).status.code(),
            absl::StatusCode::kAlreadyExists);
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
  return cases;
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
  EXPECT_EQ(a3.ready->checked.world.topology().spec(), "g1n4");
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

