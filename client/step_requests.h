#ifndef KNAPFORMER_CLIENT_STEP_REQUESTS_H_
#define KNAPFORMER_CLIENT_STEP_REQUESTS_H_

// What a PlannerClient sends the service at a step: each rank's own request
// (per-rank mode), or rank 0's for the whole group (group mode) with the
// ranks' timings of earlier steps and the work those steps' plans gave
// them, so that whichever replica gets a timing can fit gamma with it.

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "client/rank_report.h"
#include "client/step_plan.h"
#include "knapformer/v1/planner.pb.h"
#include "planner/attention_mask.h"
#include "planner/calibration.h"
#include "planner/measured_fit.h"

namespace knapformer {

// `spec` with `incarnation` unless it sets its own.
v1::StepSpec WithIncarnation(const v1::StepSpec& spec, uint64_t incarnation);

// Rank `rank`'s request: its lengths, their masks and its timing of an
// earlier step (`previous`, optional).
v1::PlanRequest RankRequest(const v1::StepSpec& spec, uint64_t incarnation, int rank,
                            const std::vector<int64_t>& lengths,
                            const std::vector<AttentionMask>& masks,
                            const v1::StepTiming* previous);

// Group mode, rank 0: the group's requests, and the work of recent steps'
// plans that rides with the ranks' timings. Not thread-safe.
class GroupRequests {
 public:
  // The group's request: every rank's lengths and masks, every rank's
  // timing (when any rank sent one) with the work its step's plan gave that
  // rank, where that step is among the kept ones, and the ranks' speeds
  // (declared or learned; empty: one speed).
  v1::PlanGroupRequest Request(const v1::StepSpec& spec, uint64_t incarnation,
                               const Gathered& gathered,
                               const std::vector<double>& rank_speeds = {}) const;

  // After `step` of `spec` was planned: once the ranks send timings (this
  // step's `gathered` has some, or an earlier one had), keeps the work its
  // plan gives every rank, for the last kKeptSteps steps, and under the
  // measured cost model with use_fitted_gamma each rank's attention by grid
  // point (the service fits the table from them). Where `keep` (rank 0 in
  // group mode, every rank when the ranks learn speeds); `from_the_start`
  // keeps it before any timing came too (the learner uses the first one);
  // a plan without the whole group's (step.whole) is skipped.
  void KeepWork(const v1::StepSpec& spec, const Gathered& gathered, const StepPlan& step,
                bool keep, bool from_the_start = false);

  // The work kept for `step`, per rank; null when not kept.
  const std::vector<WorkSample>* WorkOf(uint64_t step) const;

  static constexpr size_t kKeptSteps = 16;

 private:
  struct StepWork {
    uint64_t step = 0;
    std::vector<WorkSample> work;
    std::vector<PairWeights> weights;  // empty but for the measured table's fit
  };
  bool ranks_send_timings_ = false;
  std::deque<StepWork> recent_work_;
};

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_STEP_REQUESTS_H_
