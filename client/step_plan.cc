#include "client/step_plan.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/rank_report.h"
#include "planner/balance_stats.h"
#include "planner/plan_from_chunks.h"
#include "planner/rank_speeds.h"
#include "planner/step_solve.h"
#include "proto/plan_proto.h"
#include "proto/step_problem.h"

namespace knapformer {
namespace {

// The service's fitted table, when it sent one that is a valid table (it
// only informs the caller, so a malformed one is dropped, not an error).
std::optional<MeasuredAttention> FittedTableOf(const v1::Balance& balance) {
  if (!balance.has_fitted_attention_table()) return std::nullopt;
  absl::StatusOr<MeasuredAttention> valid = MeasuredAttentionFromProto(
      balance.fitted_attention_table(), "balance.fitted_attention_table");
  if (!valid.ok()) return std::nullopt;
  return *std::move(valid);
}

}  // namespace

std::string SpeedsText(const std::vector<double>& speeds) {
  const double fastest = *std::max_element(speeds.begin(), speeds.end());
  std::vector<int32_t> off;
  for (size_t r = 0; r < speeds.size(); ++r) {
    if (speeds[r] / fastest < 0.995) off.push_back(static_cast<int32_t>(r));
  }
  if (off.empty()) return "speeds: all alike";
  std::stable_sort(off.begin(), off.end(),
                   [&](int32_t a, int32_t b) { return speeds[a] < speeds[b]; });
  constexpr size_t kShown = 4;
  std::string out = "speeds:";
  for (size_t i = 0; i < off.size() && i < kShown; ++i) {
    absl::StrAppend(&out, i ? "," : "",
                    absl::StrFormat(" rank %d %.2f", off[i], speeds[off[i]] / fastest));
  }
  if (off.size() > kShown) absl::StrAppend(&out, " and ", off.size() - kShown, " more");
  return out;
}


const char* PlanSourceName(PlanSource source) {
  return source == PlanSource::kService ? "planner service" : "local planner";
}

std::string StepLine(uint64_t step, const StepPlan& plan) {
  std::string line = absl::StrFormat(
      "step %d: %s, %s, max/mean %.2f -> %.2f, moved %d of %d tokens (%.1f%%), plan wait %.1f ms",
      step, PlanSourceName(plan.source), plan.layout.empty() ? "-" : plan.layout,
      plan.max_over_mean_before, plan.max_over_mean_after, plan.moved_tokens, plan.total_tokens,
      plan.total_tokens > 0 ? 100.0 * plan.moved_tokens / plan.total_tokens : 0.0,
      plan.wait_seconds * 1e3);
  if (!plan.rank_speeds.empty()) absl::StrAppend(&line, ", ", SpeedsText(plan.rank_speeds));
  if (plan.source == PlanSource::kLocal && plan.local_steps > 0) {
    absl::StrAppend(&line, " (", plan.local_steps, " steps planned locally so far: ",
                    plan.local_reason, ")");
  }
  return line;
}

StepPlan StepPlanOf(Plan plan, int32_t rank, PlanSource source) {
  StepPlan result;
  result.plan = plan.Slice(rank);
  result.source = source;
  result.max_over_mean_before = ComputeBalanceStats(plan.workload_before).max_over_mean;
  result.max_over_mean_after = ComputeBalanceStats(plan.workload_after).max_over_mean;
  result.total_tokens = plan.TotalTokens();
  result.moved_tokens = plan.MovedTokens();
  result.layout = plan.topology;
  result.workload_before = plan.workload_before;
  result.workload_after = plan.workload_after;
  result.whole = std::make_shared<const Plan>(std::move(plan));
  return result;
}

absl::StatusOr<StepPlan> SolveStepLocally(const v1::StepSpec& spec, const RankLengths& lengths,
                                          const RankMasks& masks, const BalancerOptions& balancer,
                                          int32_t rank) {
  auto problem = StepProblemOf(spec);
  if (!problem.ok()) return problem.status();
  if (absl::Status locality = CheckLocality(spec); !locality.ok()) return locality;
  // The step's one check: each rank checked only its own masks.
  auto input = BalancerInput::Check(spec.world_size(), lengths, masks, balancer.limits);
  if (!input.ok()) return input.status();
  auto solved = SolveStep(*problem, problem->cost, *std::move(input),
                          BalancerOptionsForSpec(balancer, spec), spec.token_bytes());
  if (!solved.ok()) return solved.status();
  // By time on speeds, against the ideal.
  const PlanBalance balance = BalanceOf(solved->plan, balancer.rank_speeds);
  StepPlan step = StepPlanOf(std::move(solved->plan), rank, PlanSource::kLocal);
  step.predicted_step_seconds = solved->predicted_seconds;
  step.rank_speeds = NormalizedRankSpeeds(balancer.rank_speeds);
  step.max_over_mean_before = balance.before.max_over_mean;
  step.max_over_mean_after = balance.after.max_over_mean;
  return step;
}

absl::StatusOr<StepPlan> StepPlanOfGroupAnswer(const v1::StepSpec& spec, const Gathered& gathered,
                                               const v1::PlanGroupResponse& response,
                                               int32_t rank) {
  if (response.job_id() != spec.job_id() || response.step() != spec.step()) {
    return absl::InternalError(absl::StrCat("the answer is for job '", response.job_id(), "' step ",
                                            response.step(), ", not job '", spec.job_id(),
                                            "' step ", spec.step()));
  }
  auto chunks = ChunksFromProto(response.chunks());
  if (!chunks.ok()) return chunks.status();
  auto problem = StepProblemOf(spec);
  if (!problem.ok()) return problem.status();
  auto world = WorldOfLayout(*problem, response.balance().layout());
  if (!world.ok()) return world.status();
  if (!gathered.masks.empty() && !response.balance().attention_masks()) {
    // A service from before masks ignores them: its plan is mask-blind.
    return absl::UnimplementedError("the service ignored the attention masks (it predates them)");
  }
  auto plan =
      PlanFromChunks(*world, problem->cost, gathered.lengths, *std::move(chunks), &gathered.masks);
  if (!plan.ok()) return plan.status();
  const int world_size = spec.world_size();
  if (response.workload_before_size() != world_size ||
      response.workload_after_size() != world_size) {
    return absl::InternalError(absl::StrCat("the answer has ", response.workload_before_size(),
                                            " and ", response.workload_after_size(),
                                            " workloads for ", world_size, " ranks"));
  }
  // The service's workloads: under a fitted gamma they are not this
  // rank's cost model's. Its max/mean figures are computed from them, as
  // the service computes them (BalanceToProto).
  plan->workload_before.assign(response.workload_before().begin(),
                               response.workload_before().end());
  plan->workload_after.assign(response.workload_after().begin(), response.workload_after().end());
  StepPlan step = StepPlanOf(*std::move(plan), rank, PlanSource::kService);
  if (!response.balance().rank_speeds().empty()) {
    // Planned by speed: the service's figures are of time.
    step.rank_speeds.assign(response.balance().rank_speeds().begin(),
                            response.balance().rank_speeds().end());
    step.max_over_mean_before = response.balance().max_over_mean_before();
    step.max_over_mean_after = response.balance().max_over_mean_after();
  }
  step.predicted_step_seconds = response.balance().predicted_step_seconds();
  step.gamma_note = response.balance().gamma_note();
  step.gamma_used = response.balance().gamma_used();
  step.fitted_table = FittedTableOf(response.balance());
  return step;
}

StepPlan StepPlanOfRankAnswer(const v1::PlanResponse& response, RankPlan plan,
                              const std::vector<client::StepOutcome>& outcomes) {
  StepPlan result;
  result.plan = std::move(plan);
  result.source = PlanSource::kService;
  result.max_over_mean_before = response.balance().max_over_mean_before();
  result.max_over_mean_after = response.balance().max_over_mean_after();
  result.total_tokens = response.balance().total_tokens();
  result.moved_tokens = response.balance().moved_tokens();
  result.layout = response.balance().layout();
  result.predicted_step_seconds = response.balance().predicted_step_seconds();
  result.gamma_note = response.balance().gamma_note();
  result.gamma_used = response.balance().gamma_used();
  result.fitted_table = FittedTableOf(response.balance());
  for (const client::StepOutcome& outcome : outcomes) {
    result.workload_before.push_back(outcome.workload_before());
    result.workload_after.push_back(outcome.workload_after());
  }
  return result;
}

}  // namespace knapformer
