#ifndef KNAPFORMER_CLIENT_STEP_PLAN_H_
#define KNAPFORMER_CLIENT_STEP_PLAN_H_

// One rank's plan of a step as PlannerClient returns it, and how it is made
// from each kind of plan: a whole plan solved here, rank 0's group answer
// from the service, or this rank's own answer in per-rank mode.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "knapformer/v1/planner.pb.h"
#include "planner/attention_mask.h"
#include "planner/balancer.h"
#include "planner/measured_cost.h"
#include "planner/plan.h"

namespace knapformer {

namespace client {
class StepOutcome;
}  // namespace client
struct Gathered;  // client/rank_report.h

enum class PlanSource { kService, kLocal };
const char* PlanSourceName(PlanSource source);

// One rank's plan for one step, and how it was made.
struct StepPlan {
  RankPlan plan;
  PlanSource source = PlanSource::kLocal;
  double max_over_mean_before = 1;
  double max_over_mean_after = 1;
  int64_t total_tokens = 0;
  int64_t moved_tokens = 0;
  // The bags the step was planned on (v1::Balance.layout): under topology
  // "auto", the layout the planner chose for this step.
  std::string layout;
  // One transformer block's forward on the slowest GPU, compute plus
  // communication, as the planner predicts it (0 when it does not).
  double predicted_step_seconds = 0;
  // Every rank's cost-model workload (by rank of the group) without
  // balancing and under this plan: what WIR and max/mean are computed from.
  std::vector<double> workload_before;
  std::vector<double> workload_after;
  // The whole group's plan where this rank has it: planned locally, or from
  // the service in group mode (per-rank mode's answers are one rank's
  // slice; null then). Shared so that keeping it costs no copy.
  std::shared_ptr<const Plan> whole;
  // Steps of this client planned locally although a service is configured,
  // this one included, and why the last of them was.
  int64_t local_steps = 0;
  std::string local_reason;
  // Under StepSpec.use_fitted_gamma: why the service's fitted gamma did not
  // plan this step (too few timings, a failed fit, a local plan); empty
  // when it did.
  std::string gamma_note;
  // The gamma the step was planned with, when the service says (under
  // use_fitted_gamma); 0 = the spec's.
  double gamma_used = 0;
  // The measured model's attention table the service fitted and planned
  // the step with (under use_fitted_gamma), when it did and sent a valid
  // one (Balance.fitted_attention_table).
  std::optional<MeasuredAttention> fitted_table;
  // The relative speeds the step was planned with (planner/rank_speeds.h),
  // normalized to mean 1; empty: one speed (FLOP-balanced). With speeds,
  // max_over_mean_before/after are of time against the ideal.
  std::vector<double> rank_speeds;
  // Whether the step was requested ahead (PlannerClient::Prefetch).
  bool prefetched = false;
  // Wall time this rank spent in Plan for the step: what the step waited
  // for its plan (the answer, or what is left of a prefetched one, and the
  // collectives that agree on it).
  double wait_seconds = 0;
  // Of wait_seconds, the time this rank was blocked on the service's answer
  // (0 where it asked nothing: in group mode every rank but rank 0, which
  // wait for rank 0 in its broadcast instead).
  double service_wait_seconds = 0;
};

// "speeds: rank 3 0.60, rank 7 0.80": the ranks slower than the fastest,
// each relative to it, the four slowest and how many more ("speeds: all
// alike" when none is). REQUIRES: `speeds` non-empty.
std::string SpeedsText(const std::vector<double>& speeds);

// The opt-in per-step log line (PlannerClientOptions::log_steps), e.g.
// "step 12: planner service, g1n2+g2n1+g4n1, max/mean 1.83 -> 1.01, moved
// 123456 of 400000 tokens (30.9%), plan wait 1.2 ms"; a local plan made
// although a service is configured adds how many so far and why.
std::string StepLine(uint64_t step, const StepPlan& plan);

// `rank`'s StepPlan from the whole plan, its figures from the plan's
// workloads.
StepPlan StepPlanOf(Plan plan, int32_t rank, PlanSource source);

// `rank`'s StepPlan of `spec` solved here from every rank's lengths and
// masks, with `balancer` (the client's options for local planning; the
// spec's own settings applied): every rank computes the identical plan.
// The planner's errors, naming the spec's field.
absl::StatusOr<StepPlan> SolveStepLocally(const v1::StepSpec& spec, const RankLengths& lengths,
                                          const RankMasks& masks, const BalancerOptions& balancer,
                                          int32_t rank);

// `rank`'s StepPlan from the service's answer to the group (group mode):
// the plan rebuilt from its chunk table and checked against every rank's
// lengths. Internal (Unimplemented for a service that ignored the masks)
// naming the problem when the answer is not a valid plan of the step.
absl::StatusOr<StepPlan> StepPlanOfGroupAnswer(const v1::StepSpec& spec, const Gathered& gathered,
                                               const v1::PlanGroupResponse& response, int32_t rank);

// This rank's StepPlan from its own answer (per-rank mode), with every
// rank's workloads from the outcomes all ranks reported (by rank).
StepPlan StepPlanOfRankAnswer(const v1::PlanResponse& response, RankPlan plan,
                              const std::vector<client::StepOutcome>& outcomes);

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_STEP_PLAN_H_
