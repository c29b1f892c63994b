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

  // The first change for `heavy` with the bags of [first, last), (load, id)
  // ascending: the least loaded first, then the next ones up to `partners`;
  // `light` is its partner, -1 if none.
  auto level = [&](int32_t heavy, auto first, auto last, int32_t& light) {
    light = -1;
    Change change;
    int32_t tried = 0;
    for (auto it = first; it != last && tried < std::max(1, partners); ++it) {
      if (it->second == heavy) break;  // the rest are at least as loaded
      ++tried;
      change = best_change(heavy, it->second);
      if (change.found()) {
        light = it->second;
        break;
      }
    }
    return change;
  };

  if (max_rounds <= 0) return;
  std::vector<std::pair<double, int32_t>> by_load(num_bags);
  for (int32_t b = 0; b < num_bags; ++b) by_load[b] = {load(b), b};
  {
    // The first round needs only the heaviest bag and the few lightest.
    // Where it finds nothing (a plan at its bound, whose heaviest bag is one
    // sequence: g1, g2 and g4 on the bench's data), refinement ends without
    // ordering every bag, which was 15% of planning g1 at 65,536 GPUs.
    const int32_t heavy = std::max_element(by_load.begin(), by_load.end())->second;
    // One more than `partners`: the heaviest may be among them.
    const auto lightest = by_load.begin() + std::min<int64_t>(std::max(1, partners) + 1, num_bags);
    std::partial_sort(by_load.begin(), lightest, by_load.end());
    if (heavy == by_load.front().second) return;
    int32_t light;
    level(heavy, by_load.begin(), lightest, light);
    if (light < 0) return;
  }
  // Built from a sorted vector: linear, where inserting bag by bag is not.
  std::sort(by_load.begin(), by_load.end());
  std::set<std::pair<double, int32_t>> order(by_load.begin(), by_load.end());
  // The rounds, the first one again (it finds the same change).
  for (int32_t round = 0; round < max_rounds; ++round) {
    const int32_t heavy = order.rbegin()->second;
    if (heavy == order.begin()->second) break;
    int32_t light;
    const Change change = level(heavy, order.begin(), order.end(), light);
    // The heaviest bag can gain nothing with its partners, so refinement
    // ends: the maximum is where it stays. It once went on to level the
    // bags below, each in turn until it too gained nothing, which never
    // lowered the maximum (a bag found stuck was never tried again) and
    // cost a search of every partner per bag: quadratic in the bags up to
    // `partners` of them, 2.6-2.7x per doubling of the masked layouts from
    // 64 to 512 GPUs (bench/planner_curve).
    if (light < 0) break;

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
