#include "planner/refine.h"

#include <algorithm>
#include <set>
#include <utility>

#include "planner/bag_members.h"

namespace knapformer {
namespace {

// A change must beat the current maximum by this relative margin, so rounding
// noise can never make two bags trade a sequence back and forth.
constexpr double kMinGain = 1e-12;

}  // namespace

void RefineBags(const ReplicaBags& replica, int32_t max_rounds,
                const SequenceTable& sequences, std::vector<int32_t>& bag,
                std::vector<double>& assigned, int32_t partners) {
  const int32_t num_bags = replica.size();
  if (num_bags < 2) return;
  const std::vector<int32_t>& gpus = replica.gpus;
  const std::vector<double>& speed = replica.speed;
  const std::vector<double>& workload = sequences.workload;
  const std::vector<int32_t>& id = sequences.id;
  internal::BagMembers members(num_bags, sequences.size(), [&](int32_t i) { return bag[i]; });
  auto load = [&](int32_t b) { return assigned[b] / speed[b]; };
  auto fits = [&](int32_t i, int32_t b) {
    const int64_t length = sequences.length[i];
    return gpus[b] <= length || (length < gpus[0] && gpus[b] == gpus[0]);
  };
  // Built from a sorted vector: linear, where inserting bag by bag is not.
  std::vector<std::pair<double, int32_t>> by_load(num_bags);
  for (int32_t b = 0; b < num_bags; ++b) by_load[b] = {load(b), b};
  std::sort(by_load.begin(), by_load.end());
  std::set<std::pair<double, int32_t>> order(by_load.begin(), by_load.end());
  std::vector<char> stuck(num_bags, 0);

  // The best move or swap between `heavy` and `light`, or none.
  struct Change {
    int32_t move_item = -1, swap_heavy = -1, swap_light = -1;
    bool found() const { return move_item >= 0 || swap_heavy >= 0; }
  };
  auto best_change = [&](int32_t heavy, int32_t light) {
    const double heavy_load = load(heavy);
    const double light_load = load(light);
    Change change;
    // Best single move.
    double best = heavy_load * (1 - kMinGain);
    for (int32_t i : members.Get(heavy)) {
      if (!fits(i, light)) continue;
      const double peak = std::max(heavy_load - workload[i] / speed[heavy],
                                   light_load + workload[i] / speed[light]);
      if (peak < best ||
          (peak == best && change.move_item >= 0 && id[i] < id[change.move_item])) {
        best = peak;
        change.move_item = i;
      }
    }
    // Best swap. peak(delta) is convex in delta = a - b and smallest when both
    // bags end level, at delta*; so for each a only the two sequences of the
    // light bag around a - delta* can be best: O(n log n), not O(n^2).
    const double level_delta =
        (heavy_load - light_load) / (1.0 / speed[heavy] + 1.0 / speed[light]);
    // A bag stays sorted until it takes a sequence (relocate appends), and
    // the lightest bags are tried round after round: checking first is
    // O(n), sorting again O(n log n) with two loads per comparison.
    std::vector<int32_t>& candidates = members.Mutable(light);
    auto lighter = [&](int32_t x, int32_t y) {
      if (workload[x] != workload[y]) return workload[x] < workload[y];
      return id[x] < id[y];
    };
    if (!std::is_sorted(candidates.begin(), candidates.end(), lighter)) {
      std::sort(candidates.begin(), candidates.end(), lighter);
    }
    for (int32_t i : members.Get(heavy)) {
      if (!fits(i, light)) continue;
      const double want = workload[i] - level_delta;
      auto it = std::lower_bound(candidates.begin(), candidates.end(), want,
                                 [&](int32_t j, double w) { return workload[j] < w; });
      for (auto probe : {it, it == candidates.begin() ? candidates.end() : it - 1}) {
        if (probe == candidates.end()) continue;
        const int32_t j = *probe;
        if (workload[j] >= workload[i] || !fits(j, heavy)) continue;
        const double delta = workload[i] - workload[j];
        const double peak =
            std::max(heavy_load - delta / speed[heavy], light_load + delta / speed[light]);
        if (peak < best) {
          best = peak;
          change.swap_heavy = i;
          change.swap_light = j;
        }
      }
    }
    return change;
  };

  for (int32_t round = 0; round < max_rounds; ++round) {
    int32_t heavy = -1;
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      if (!stuck[it->second]) {
        heavy = it->second;
        break;
      }
    }
    if (heavy < 0 || heavy == order.begin()->second) break;
    // The least loaded bag first, then the next ones up to `partners`, for
    // the heaviest bag of all, whose load is the plan's maximum. Once it is
    // stuck the maximum is final (it is never tried again, and a change
    // leaves both its bags below the larger load they had), and the bags
    // below it are levelled with the least loaded bag alone: searching
    // every partner for each of them in turn, until each was stuck, never
    // changed the maximum and was quadratic in the bags up to `partners` of
    // them: 2.6-3.1x per doubling of the masked layouts from 64 to 512 GPUs
    // (bench/planner_curve).
    const int32_t tries = heavy == order.rbegin()->second ? std::max(1, partners) : 1;
    int32_t light = -1;
    Change change;
    int32_t tried = 0;
    for (auto it = order.begin(); it != order.end() && tried < tries; ++it) {
      if (it->second == heavy) break;  // the rest are at least as loaded
      ++tried;
      change = best_change(heavy, it->second);
      if (change.found()) {
        light = it->second;
        break;
      }
    }
    if (light < 0) {
      stuck[heavy] = 1;
      continue;
    }

    order.erase({load(heavy), heavy});
    order.erase({load(light), light});
    auto relocate = [&](int32_t i, int32_t from, int32_t to) {
      members.Remove(from, i);
      members.Mutable(to).push_back(i);
      bag[i] = to;
      assigned[from] -= workload[i];
      assigned[to] += workload[i];
    };
    if (change.swap_heavy >= 0) {
      relocate(change.swap_heavy, heavy, light);
      relocate(change.swap_light, light, heavy);
    } else {
      relocate(change.move_item, heavy, light);
    }
    order.emplace(load(heavy), heavy);
    order.emplace(load(light), light);
  }
}

}  // namespace knapformer
