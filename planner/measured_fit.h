#ifndef KNAPFORMER_PLANNER_MEASURED_FIT_H_
#define KNAPFORMER_PLANNER_MEASURED_FIT_H_

#include <array>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/attention_mask.h"
#include "planner/calibration.h"
#include "planner/measured_cost.h"
#include "planner/plan.h"

namespace knapformer {

// The measured cost model's attention table fitted from whole steps, as the
// planner service sees them: a rank's time of a step, not one sequence's.
//
// Why it can be done: with the table's points fixed on a grid, a sequence's
// attention work (interpolated linearly between the two points around its
// pairs) is linear in the points' values. So is a rank's step, the sum over
// its sequences (each by its share of the bag's heads). A rank's step is
// then sum_j weight_j * T_j, where weight_j is how much of its attention
// falls on grid point j, and many steps of varied lengths determine T by
// least squares, as `calibrate --table` determines it from one sequence at
// a time.
//
// The grid: attended pairs 4^j (sequences of 2^j tokens), j = 0 .. 31.
inline constexpr int kPairGridPoints = 32;
// A rank's step's attention by grid point (float: the weights are sums of
// fractions of sequences, and a timing window keeps thousands of them).
using PairWeights = std::array<float, kPairGridPoints>;

// The pairs of grid point j: 4^j.
double PairGridPoint(int j);

// Each rank's PairWeights under `plan` (by rank), its share of each of its
// bag's sequences spread over the two grid points around the sequence's
// attended pairs. `masks` (null or empty: all full) as the plan was made
// with.
std::vector<PairWeights> RankPairWeights(const Plan& plan, const RankMasks* masks = nullptr);

// One rank's step: its work (WorkSample: linear units and seconds; the
// attention term is not used here) and its attention by grid point.
struct StepSample {
  WorkSample work;
  PairWeights weights{};
};

// The attention table that, with the linear term priced at `k` seconds per
// unit (CostFit::k, fitted from the same steps), best explains the steps'
// seconds: least squares relative to each step's time, as FitCostModel,
// constrained to work >= 0 and nondecreasing in the pairs (nonnegative
// increments, Lawson-Hanson). Work in the transformer model's units
// (seconds / k), as MeasuredAttention expects; points only at the grid
// points some step attends around, so that between the table's points every
// value is what the steps measured.
//
// `prior` (optional; the table the job started from) is the shape the fit
// keeps where the steps cannot tell: scaled to explain the steps best (a
// table from another device, or a gamma line, may be off by a factor
// throughout), a point 100% off it costs what one step 0.1% off its time
// costs, so the steps decide wherever they can.
// Why: steps of one length between two grid points fix one mix of the
// two points, not each; without a prior the fit may leave the upper point
// flat, and every longer sequence would be priced as if it were no longer.
//
// InvalidArgument: k not finite and > 0, a sample not finite or negative,
// no step with attention, or fewer steps than 2 per table point (too few to
// fit the points: the caller keeps waiting for steps of more lengths).
absl::StatusOr<MeasuredAttention> FitMeasuredAttentionFromSteps(
    const std::vector<StepSample>& steps, double k, const MeasuredAttention* prior = nullptr);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_MEASURED_FIT_H_
