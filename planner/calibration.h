#ifndef KNAPFORMER_PLANNER_CALIBRATION_H_
#define KNAPFORMER_PLANNER_CALIBRATION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/attention_mask.h"
#include "planner/measured_cost.h"
#include "planner/plan.h"

namespace knapformer {

// One measurement: a rank computed `linear` + `attention` units of work (the
// cost model's two terms with k = 1 and gamma = 1: 24*l*d^2 per token and
// 4*l^2*d per sequence, shared in a bag) in `seconds`.
struct WorkSample {
  double linear = 0;
  double attention = 0;
  double seconds = 0;
};

// The sample of one sequence of `length` tokens timed alone (the paper's
// calibration: latency of a transformer block per sequence length).
// Under a mask (null: full) the attention is that of the pairs it attends.
WorkSample SequenceSample(int64_t length, int64_t d_model, double seconds,
                          const AttentionMask* mask = nullptr);

// The work a plan gives each rank, by rank (seconds 0): linear units of the
// tokens it computes on, and its share of its bag's attention units.
// `masks` (null or empty: all full) as the plan was made with.
std::vector<WorkSample> RankWork(const Plan& plan, int64_t d_model,
                                 const RankMasks* masks = nullptr);

// seconds ~= k * (linear + gamma * attention), by least squares (the paper's
// fit), relative: each residual is divided by its measured time, since
// timing noise grows with the time. k converts cost units to seconds; gamma
// weighs attention.
struct CostFit {
  double k = 0;
  double gamma = 0;
  int64_t samples = 0;
  double rmse_seconds = 0;       // root mean square residual
  double r_squared = 0;          // 1 - SSE / SST (of seconds around their mean)
  double max_relative_error = 0;  // max |residual| / seconds
};

// InvalidArgument with fewer than 2 samples, a negative or non-finite value,
// or samples that cannot tell the two terms apart (collinear, e.g. one
// length only); FailedPrecondition when the fit gives k <= 0 or gamma < 0
// (the times do not grow with the work as the model says).
absl::StatusOr<CostFit> FitCostModel(const std::vector<WorkSample>& samples);

// k alone, with gamma given (the same relative least squares): for a table
// (below) where gamma is known, or where the times cannot tell the two terms
// apart. InvalidArgument without samples, for a bad value or gamma, or
// without work or time.
absl::StatusOr<CostFit> FitCostScale(const std::vector<WorkSample>& samples, double gamma);

// The measured cost model's attention table from the same samples (one
// sequence each, SequenceSample) and their fit: each sample's attention
// work is its time in units (seconds / fit.k) less its linear term, kept
// >= 0, averaged over the samples of equal pairs and made nondecreasing in
// the pairs by pooling adjacent violators (least squares). Samples without
// pairs carry no attention and are skipped. InvalidArgument when fit.k is
// not > 0, no sample has pairs, or they have more than
// MeasuredAttention::kMaxPoints different pair counts.
absl::StatusOr<MeasuredAttention> MeasuredAttentionFromSamples(
    const std::vector<WorkSample>& samples, const CostFit& fit, int64_t d_model);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_CALIBRATION_H_
