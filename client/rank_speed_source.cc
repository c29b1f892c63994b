#include "client/rank_speed_source.h"

#include <algorithm>
#include <cstdint>

#include "planner/rank_speeds.h"

namespace knapformer {

absl::Status RankSpeedSource::Check(const PlannerClientOptions& options, int world_size) {
  if (options.learn_rank_speeds && !options.balancer.rank_speeds.empty()) {
    return absl::InvalidArgumentError(
        "rank_speeds: declared speeds and learned ones; give one (\"learned\" or a list)");
  }
  if (absl::Status speeds = CheckRankSpeeds(options.balancer.rank_speeds, world_size);
      !speeds.ok()) {
    return speeds;
  }
  if ((options.learn_rank_speeds || !options.balancer.rank_speeds.empty()) &&
      options.mode != PlannerMode::kGroup) {
    return absl::InvalidArgumentError(
        "rank_speeds: needs group mode (the default), whose all-gather brings every rank's "
        "timing and whose request carries the speeds; per-rank mode sends none");
  }
  return absl::OkStatus();
}

RankSpeedSource::RankSpeedSource(const PlannerClientOptions& options, int world_size)
    : declared_(options.balancer.rank_speeds) {
  if (options.learn_rank_speeds) learner_.emplace(world_size);
}

std::vector<double> RankSpeedSource::Speeds() const {
  return learner_.has_value() ? learner_->PlanningSpeeds() : declared_;
}

void RankSpeedSource::Learn(const v1::StepSpec& spec, const Gathered& gathered,
                            const GroupRequests& work) {
  if (!learner_.has_value() || !gathered.any_timing) return;
  // Timings of one step normally; one observation per step they name.
  std::vector<uint64_t> steps;
  for (const v1::StepTiming& timing : gathered.timings) {
    if (timing.compute_seconds() > 0 &&
        std::find(steps.begin(), steps.end(), timing.step()) == steps.end()) {
      steps.push_back(timing.step());
    }
  }
  for (uint64_t step : steps) {
    const std::vector<WorkSample>* kept = work.WorkOf(step);
    if (kept == nullptr || kept->size() != gathered.timings.size()) continue;
    std::vector<WorkSample> samples = *kept;
    for (size_t r = 0; r < samples.size(); ++r) {
      const v1::StepTiming& timing = gathered.timings[r];
      samples[r].seconds = timing.step() == step ? timing.compute_seconds() : 0;
    }
    learner_->Observe(samples, spec.gamma());
  }
}

}  // namespace knapformer
