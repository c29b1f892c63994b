#include "planner/speed_learner.h"

#include <algorithm>
#include <cmath>

namespace knapformer {

SpeedLearner::SpeedLearner(int32_t world_size, SpeedLearnerOptions options)
    : options_(options),
      estimates_(world_size, 1.0),
      speeds_(world_size, 1.0),
      missed_(world_size, 0) {}

void SpeedLearner::Observe(const std::vector<WorkSample>& ranks, double gamma) {
  const int32_t world = static_cast<int32_t>(estimates_.size());
  std::vector<double> rate(world, 0.0);  // work per second; 0: not timed
  std::vector<double> timed;
  for (int32_t r = 0; r < world; ++r) {
    const WorkSample& s = ranks[r];
    const double work = s.linear + gamma * s.attention;
    if (std::isfinite(s.seconds) && s.seconds > 0 && std::isfinite(work) && work > 0) {
      rate[r] = work / s.seconds;
      timed.push_back(rate[r]);
    }
  }
  for (int32_t r = 0; r < world; ++r) {
    const bool sent = std::isfinite(ranks[r].seconds) && ranks[r].seconds > 0;
    missed_[r] = sent ? 0 : missed_[r] + 1;
    if (missed_[r] >= options_.stale_steps) estimates_[r] = speeds_[r] = 1.0;
  }
  if (timed.size() < 2) return;
  ++steps_;
  // The median rate: the typical rank, which one slow rank cannot move.
  const size_t middle = timed.size() / 2;
  std::nth_element(timed.begin(), timed.begin() + middle, timed.end());
  double median = timed[middle];
  if (timed.size() % 2 == 0) {
    median = (median + *std::max_element(timed.begin(), timed.begin() + middle)) / 2;
  }
  for (int32_t r = 0; r < world; ++r) {
    if (rate[r] <= 0) continue;
    const double measured =
        std::clamp(rate[r] / median, options_.min_speed, options_.max_speed);
    double& estimate = estimates_[r];
    estimate += options_.smoothing * (measured - estimate);
    double& speed = speeds_[r];
    if (std::abs(estimate - 1.0) <= options_.dead_band) {
      speed = 1.0;
    } else if (std::abs(estimate / speed - 1.0) > options_.tolerance) {
      speed = estimate;
    }
  }
}

std::vector<double> SpeedLearner::PlanningSpeeds() const {
  for (double s : speeds_) {
    if (s != 1.0) return speeds_;
  }
  return {};
}

WorkSample SpeedLearner::AtUnitSpeed(int32_t rank, WorkSample sample) const {
  sample.seconds *= estimates_[rank];
  return sample;
}

}  // namespace knapformer
