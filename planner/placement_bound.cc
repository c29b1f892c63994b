#include "planner/placement_bound.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <vector>

namespace knapformer {
namespace {

// The time proved is a hair above the one asked: every sum here and in
// PredictReplica rounds (relative error far below this), and a layout
// predicted exactly as fast as the best must not be skipped (auto takes
// the earlier of a tie).
constexpr double kMargin = 1e-9;

}  // namespace

bool EveryPlacementSlower(const Topology& topology, const SequenceTable& table,
                          const CostModel& cost, const CommPrices& prices, double fastest,
                          double time) {
  if (!(time > 0) || !(fastest > 0) || table.size() == 0) return false;
  const double t = time * (1 + kMargin);
  // The bag sizes ascending, each with its count and Ulysses price (the
  // lower of within and across nodes: a bound, wherever the bag lies).
  std::map<int32_t, int64_t> count_of;
  for (const Bag& bag : topology.bags()) ++count_of[bag.gpus];
  const int32_t sizes = static_cast<int32_t>(count_of.size());
  std::vector<int32_t> gpus;
  std::vector<int64_t> bags;
  std::vector<double> price;
  for (const auto& [g, n] : count_of) {
    gpus.push_back(g);
    bags.push_back(n);
    price.push_back(std::min(prices.UlyssesPerToken(g, false), prices.UlyssesPerToken(g, true)));
  }
  // What the bags of each size and all larger ones hold below t: volume,
  // and one big sequence each.
  std::vector<double> room(sizes + 1, 0);
  std::vector<int64_t> slots(sizes + 1, 0);
  for (int32_t c = sizes - 1; c >= 0; --c) {
    room[c] = room[c + 1] + static_cast<double>(bags[c]) * gpus[c] * t;
    slots[c] = slots[c + 1] + bags[c];
  }
  // A sequence that may use the smallest size and is big in none adds to
  // the smallest size's volume only. With a linear price per token p > 0
  // (l <= w / p), its chunk alone in G GPUs takes at most
  // (w / G + p) / fastest + U(G) * (w / (p * G) + 1) and its bag share
  // w / fastest + U(G) * w / p: below these workloads it is screened out.
  const double per_token = cost.Linear(1);
  double screen = -std::numeric_limits<double>::infinity();
  if (per_token > 0) {
    const double g0 = gpus[0];
    screen = (t - per_token / fastest - price[0]) /
             (1 / (g0 * fastest) + price[0] / (per_token * g0));
    for (int32_t c = 0; c < sizes; ++c) {
      screen = std::min(screen, gpus[c] * t / 2 / (1 / fastest + price[c] / per_token));
    }
    screen *= 1 - kMargin;
  }
  double workload = 0, tokens = 0;  // of all
  std::vector<double> forced(sizes, 0);     // volume that may use no size below c
  std::vector<int64_t> big_above(sizes, 0);  // ... and is big in every size from c up
  std::vector<int64_t> big_at(sizes, 0);     // smallest size c and big there
  std::vector<std::vector<double>> spill(sizes);  // the latter's volume in size c + 1
  std::vector<char> big(sizes);
  const int32_t n = table.size();
  for (int32_t k = 0; k < n; ++k) {
    const double w = table.workload[k];
    const int64_t l = table.length[k];
    workload += w;
    tokens += static_cast<double>(l);
    if (w < screen) continue;
    const double attention = w - cost.Linear(l);
    int32_t smallest = 0;
    for (; smallest < sizes; ++smallest) {
      if (ChunkAloneTime(cost, l, attention, gpus[smallest], price[smallest], fastest) < t) {
        break;
      }
    }
    if (smallest == sizes) return true;  // too slow in every size
    // Its compute and Ulysses time in a bag of size c, summed over the
    // bag's GPUs: what it takes of that bag's G * t.
    auto volume = [&](int32_t c) { return w / fastest + price[c] * static_cast<double>(l); };
    for (int32_t c = 0; c < sizes; ++c) big[c] = volume(c) > gpus[c] * t / 2;
    for (int32_t c = 1; c <= smallest; ++c) forced[c] += volume(c);
    int32_t from = sizes;  // big in every size from `from` up
    while (from > 0 && big[from - 1]) --from;
    for (int32_t c = from; c <= smallest; ++c) ++big_above[c];
    if (big[smallest]) {
      ++big_at[smallest];
      if (smallest + 1 < sizes) {
        spill[smallest].push_back(volume(smallest + 1));
      }
    }
  }
  forced[0] = workload / fastest + price[0] * tokens;
  for (int32_t c = 0; c < sizes; ++c) {
    if (forced[c] > room[c] || big_above[c] > slots[c]) return true;
    const int64_t spilled = big_at[c] - bags[c];
    if (spilled > 0 && c + 1 < sizes) {
      std::vector<double>& volumes = spill[c];
      std::nth_element(volumes.begin(), volumes.begin() + (spilled - 1), volumes.end());
      double least = 0;
      for (int64_t i = 0; i < spilled; ++i) least += volumes[i];
      if (forced[c + 1] + least > room[c + 1]) return true;
    }
  }
  return false;
}

}  // namespace knapformer
