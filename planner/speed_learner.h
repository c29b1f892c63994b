#ifndef KNAPFORMER_PLANNER_SPEED_LEARNER_H_
#define KNAPFORMER_PLANNER_SPEED_LEARNER_H_

// Each rank's relative compute speed, learned online from the times the
// ranks measure (SequenceBalancer::RecordComputeSeconds) and the work their
// plans gave them: what rank_speeds="learned" plans with (rank_speeds.h).
//
// The model is the calibration's (calibration.h) with a speed per rank:
//   seconds_r = k * (linear_r + gamma * attention_r) / speed_r.
// Within one step k cancels: a rank's rate (work per second) over the median
// rank's rate is its speed relative to the typical rank, whatever k is. So
// speeds are learned from the rates and gamma alone, and k and gamma are
// fitted from timings put back at speed 1 (AtUnitSpeed): the two fits
// alternate, each step, instead of a slow rank's times biasing gamma.
//
// Robust by construction, for plans that do not chase noise:
//  - smoothing: each rank's estimate moves `smoothing` of the way to the
//    step's measurement (an exponential average);
//  - a dead band: a planning speed is exactly 1 while the estimate is
//    within `dead_band` of 1, so a jitter of +-5% never moves a healthy
//    rank's share (the median of the rates is as steady; the band is 12%);
//  - a tolerance: outside the band, a planning speed follows the estimate
//    only when the two differ by more than `tolerance` (relative), so a
//    slow rank is planned to within 5% of its estimate without chasing
//    every step's noise;
//  - recovery: a rank back at full speed is back at 1 once its estimate is
//    within the band, in at most ceil(log(band / (1 - s)) / log(1 -
//    smoothing)) timed steps from a speed s: 2 from 0.6 with the defaults;
//  - a rank that sends no timing for `stale_steps` timed steps counts as 1;
//  - every estimate is clamped to [min_speed, max_speed] of the median.
// Deterministic: ranks that observe the same steps hold the same speeds, bit
// for bit (the client's local mode relies on it: every rank plans alike).
// Not thread-safe.

#include <cstdint>
#include <vector>

#include "planner/calibration.h"

namespace knapformer {

struct SpeedLearnerOptions {
  double smoothing = 0.5;
  double dead_band = 0.12;
  double tolerance = 0.05;
  double min_speed = 0.2;
  double max_speed = 5.0;
  int32_t stale_steps = 8;
};

class SpeedLearner {
 public:
  // REQUIRES: world_size >= 1; options in range (smoothing in (0, 1],
  // dead_band >= 0, tolerance >= 0, 0 < min_speed <= 1 <= max_speed, stale_steps >= 1).
  explicit SpeedLearner(int32_t world_size, SpeedLearnerOptions options = SpeedLearnerOptions());

  // One timed step: per rank the work its plan gave it (RankWork) and the
  // seconds it measured (<= 0 or not finite: it sent none), attention
  // weighed by `gamma`. A rank with no work tells nothing and is skipped. A
  // step with fewer than two ranks timed with work changes nothing but the
  // staleness count. REQUIRES: ranks.size() == world_size.
  void Observe(const std::vector<WorkSample>& ranks, double gamma);

  // The speeds to plan with, one per rank: 1 but where a rank's estimate
  // left the dead band.
  const std::vector<double>& speeds() const { return speeds_; }
  // The same, or empty when every one is 1: BalancerOptions::rank_speeds,
  // which plans exactly as FLOP-balanced when empty.
  std::vector<double> PlanningSpeeds() const;
  // The smoothed estimates, the figures to show and export.
  const std::vector<double>& estimates() const { return estimates_; }
  // Timed steps observed.
  int64_t steps() const { return steps_; }

  // `sample` of `rank` as a GPU at speed 1 would have timed it (its seconds
  // times the rank's estimate): what the job's k and gamma are fitted from.
  WorkSample AtUnitSpeed(int32_t rank, WorkSample sample) const;

 private:
  SpeedLearnerOptions options_;
  std::vector<double> estimates_;
  std::vector<double> speeds_;
  std::vector<int32_t> missed_;  // timed steps since the rank's last timing
  int64_t steps_ = 0;
};

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_SPEED_LEARNER_H_
