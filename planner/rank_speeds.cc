#include "planner/rank_speeds.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace knapformer {

absl::Status CheckRankSpeeds(const std::vector<double>& speeds, int64_t world_size,
                             absl::string_view field) {
  if (speeds.empty()) return absl::OkStatus();
  if (static_cast<int64_t>(speeds.size()) != world_size) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", speeds.size(),
                                                   " speeds for a world of ", world_size,
                                                   " ranks (give one per rank, or none)"));
  }
  for (size_t rank = 0; rank < speeds.size(); ++rank) {
    if (!std::isfinite(speeds[rank]) || speeds[rank] <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, "[", rank, "] is ", speeds[rank], ": a speed must be finite and > 0"));
    }
  }
  const auto [slowest, fastest] = std::minmax_element(speeds.begin(), speeds.end());
  if (*fastest > *slowest * kMaxRankSpeedRatio) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": rank ", fastest - speeds.begin(), " at ", *fastest, " is over ",
        kMaxRankSpeedRatio, " times rank ", slowest - speeds.begin(), " at ", *slowest,
        " (a GPU that slow belongs out of the job)"));
  }
  return absl::OkStatus();
}

std::vector<double> NormalizedRankSpeeds(const std::vector<double>& speeds) {
  if (speeds.empty() ||
      std::all_of(speeds.begin(), speeds.end(), [&](double s) { return s == speeds[0]; })) {
    return {};
  }
  double sum = 0;
  for (double s : speeds) sum += s;
  const double mean = sum / static_cast<double>(speeds.size());
  std::vector<double> normalized(speeds.size());
  for (size_t i = 0; i < speeds.size(); ++i) normalized[i] = speeds[i] / mean;
  return normalized;
}

double SlowestSpeed(const std::vector<double>& speeds, int32_t first_rank, int32_t gpus) {
  double slowest = speeds[first_rank];
  for (int32_t p = 1; p < gpus; ++p) slowest = std::min(slowest, speeds[first_rank + p]);
  return slowest;
}

ReplicaBags BagsOf(const Topology& topology, int32_t first_rank,
                   const std::vector<double>& speeds) {
  std::vector<int32_t> gpus(topology.num_bags());
  for (const Bag& bag : topology.bags()) gpus[bag.id] = bag.gpus;
  if (speeds.empty()) return ReplicaBags(std::move(gpus));
  std::vector<double> pace(topology.num_bags());
  for (const Bag& bag : topology.bags()) {
    pace[bag.id] = SlowestSpeed(speeds, first_rank + bag.first_rank, bag.gpus);
  }
  const double fastest = *std::max_element(pace.begin(), pace.end());
  if (std::all_of(pace.begin(), pace.end(), [&](double p) { return p == fastest; })) {
    return ReplicaBags(std::move(gpus));
  }
  std::vector<double> speed(topology.num_bags());
  for (int32_t b = 0; b < topology.num_bags(); ++b) {
    // The fastest bags exactly at their size.
    speed[b] = pace[b] == fastest ? gpus[b] : gpus[b] * (pace[b] / fastest);
  }
  return ReplicaBags(std::move(gpus), std::move(speed));
}

std::vector<double> TimePerRank(const Plan& plan, const std::vector<double>& speeds) {
  std::vector<double> time = plan.workload_after;
  if (speeds.empty()) return time;
  const std::vector<double> normalized = NormalizedRankSpeeds(speeds);
  if (normalized.empty()) return time;
  for (size_t bag = 0; bag < plan.bag_gpus.size(); ++bag) {
    const int32_t first = plan.bag_first_rank[bag], gpus = plan.bag_gpus[bag];
    const double slowest = SlowestSpeed(normalized, first, gpus);
    for (int32_t p = 0; p < gpus; ++p) time[first + p] /= slowest;
  }
  return time;
}

std::vector<double> TimeAtHome(const Plan& plan, const std::vector<double>& speeds) {
  std::vector<double> time = plan.workload_before;
  if (speeds.empty()) return time;
  const std::vector<double> normalized = NormalizedRankSpeeds(speeds);
  if (normalized.empty()) return time;
  for (size_t rank = 0; rank < time.size(); ++rank) time[rank] /= normalized[rank];
  return time;
}

absl::StatusOr<std::vector<double>> ParseRankSpeeds(absl::string_view text, int64_t world_size,
                                                    absl::string_view field) {
  std::vector<double> speeds;
  const std::vector<absl::string_view> items = absl::StrSplit(text, ',');
  const bool by_rank = absl::StrContains(text, ':');
  if (by_rank) speeds.assign(world_size, 1.0);
  std::vector<char> named(by_rank ? world_size : 0, 0);
  for (absl::string_view item : items) {
    double speed = 0;
    if (by_rank) {
      const std::vector<absl::string_view> parts = absl::StrSplit(item, ':');
      int64_t rank = -1;
      if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &rank) ||
          !absl::SimpleAtod(parts[1], &speed)) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": '", item, "' is not RANK:SPEED (every item is, once one is)"));
      }
      if (rank < 0 || rank >= world_size) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": rank ", rank, " in '", item,
                                                       "' is outside [0, ", world_size, ")"));
      }
      if (named[rank]) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": rank ", rank, " is named twice"));
      }
      named[rank] = 1;
      speeds[rank] = speed;
    } else {
      if (!absl::SimpleAtod(item, &speed)) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": '", item, "' is not a number"));
      }
      speeds.push_back(speed);
    }
  }
  if (absl::Status status = CheckRankSpeeds(speeds, world_size, field); !status.ok()) {
    return status;
  }
  return speeds;
}

}  // namespace knapformer
