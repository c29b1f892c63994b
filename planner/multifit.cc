#include "planner/multifit.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

namespace knapformer {
namespace {

// The bisection stops once its interval is this share of its upper end: a
// packing it could still find would be at most that much better. Rounds
// then follow the gap, not the world: a plan 0.2% over the simple bound
// (refinement's rounds spread over thousands of bags) takes 5 packings, a
// 24% gap (mixed bag sizes, block-causal video) 12, where every bisection
// took all 16 before.
constexpr double kResolution = 1e-4;

// Room left in each bag, and the first bag of a range with at least some
// room: a tree of fan-out 8 whose node holds its children's largest room.
// A node's 8 children are adjacent (one cache line), so a query reads
// about 2 log8(B) lines, where a binary tree's descent waited on log2(B)
// dependent loads, one per level: first-fit decreasing was 62% of
// planning the masked mix in g1+g2+g4 at 65,536 GPUs (bench/planner_curve).
class RoomTree {
 public:
  explicit RoomTree(const std::vector<double>& room) {
    // levels_[0] the bags, each level padded to whole groups of kFanOut
    // with -inf (which fits nothing), up to a level of one group.
    size_t size = room.size();
    do {
      size = (size + kFanOut - 1) / kFanOut * kFanOut;
      levels_.emplace_back(size, -std::numeric_limits<double>::infinity());
      size /= kFanOut;
    } while (levels_.back().size() > kFanOut);
    std::copy(room.begin(), room.end(), levels_[0].begin());
    for (size_t level = 1; level < levels_.size(); ++level) {
      // Nodes past the children below (padding) stay -inf.
      for (size_t node = 0; node * kFanOut < levels_[level - 1].size(); ++node) {
        levels_[level][node] = MaxOfChildren(level, node);
      }
    }
  }

  // Room only falls (a bag takes an item): once an ancestor keeps its
  // value, another child holds its maximum, and so do all above it.
  void Set(int32_t index, double room) {
    size_t node = static_cast<size_t>(index);
    levels_[0][node] = room;
    for (size_t level = 1; level < levels_.size(); ++level) {
      node /= kFanOut;
      const double value = MaxOfChildren(level, node);
      if (levels_[level][node] == value) break;
      levels_[level][node] = value;
    }
  }

  // The first bag in [lo, hi] whose room is at least `need`; -1 if none.
  // From lo = 0 (every sequence that may use the smallest bags), down
  // from the top; else up from lo, each level's siblings to the right of
  // the path, until one has the room, then down. Each step finds its
  // child among 8 with one compare of all 8 (Fits), where a scan, child by
  // child, mispredicted a branch on every level.
  int32_t FirstWithRoom(int32_t lo, int32_t hi, double need) const {
    size_t node = static_cast<size_t>(lo);
    size_t level = 0;
    if (lo == 0) {
      level = levels_.size() - 1;  // one group
      const uint32_t fits = Fits(levels_[level].data(), need);
      if (fits == 0) return -1;
      node = static_cast<size_t>(__builtin_ctz(fits));
    } else {
      for (;; ++level) {
        // Past a level's end there is nothing to the right above it either.
        if (level == levels_.size() || node >= levels_[level].size()) return -1;
        const size_t first = node / kFanOut * kFanOut;
        const uint32_t fits =
            Fits(&levels_[level][first], need) & (~uint32_t{0} << (node - first));
        if (fits != 0) {
          node = first + static_cast<size_t>(__builtin_ctz(fits));
          break;
        }
        node = first / kFanOut + 1;  // the next node to the right, one level up
      }
    }
    // A node's room is its largest child's, so one child has it.
    for (; level > 0; --level) {
      node *= kFanOut;
      node += static_cast<size_t>(__builtin_ctz(Fits(&levels_[level - 1][node], need)));
    }
    return node <= static_cast<size_t>(hi) ? static_cast<int32_t>(node) : -1;
  }

 private:
  static constexpr size_t kFanOut = 8;

  // Bit i set when group[i] >= need, for a group of kFanOut rooms.
  static uint32_t Fits(const double* group, double need) {
    static_assert(kFanOut == 8, "Fits compares 8 rooms");
#if defined(__SSE2__)
    const __m128d at_least = _mm_set1_pd(need);
    auto pair = [&](int i) {
      return static_cast<uint32_t>(
          _mm_movemask_pd(_mm_cmpge_pd(_mm_loadu_pd(group + i), at_least)));
    };
    return pair(0) | pair(2) << 2 | pair(4) << 4 | pair(6) << 6;
#else
    uint32_t fits = 0;
    for (size_t i = 0; i < kFanOut; ++i) fits |= uint32_t{group[i] >= need} << i;
    return fits;
#endif
  }

  double MaxOfChildren(size_t level, size_t node) const {
    const double* c = &levels_[level - 1][node * kFanOut];
    // Pairwise, so that the maxima do not wait on one another.
    return std::max(std::max(std::max(c[0], c[1]), std::max(c[2], c[3])),
                    std::max(std::max(c[4], c[5]), std::max(c[6], c[7])));
  }

  std::vector<std::vector<double>> levels_;
};

bool FirstFitDecreasing(const ReplicaBags& replica, const std::vector<double>& workload,
                        const std::vector<int32_t>& first_usable,
                        const std::vector<int32_t>& last_usable, double capacity,
                        std::vector<int32_t>& bags, std::vector<double>& assigned) {
  const int32_t num_bags = replica.size();
  std::vector<double> room(num_bags);
  for (int32_t b = 0; b < num_bags; ++b) room[b] = capacity * replica.speed[b];
  RoomTree tree(room);
  bags.assign(workload.size(), -1);
  assigned.assign(num_bags, 0.0);
  for (size_t k = 0; k < workload.size(); ++k) {
    const int32_t b = tree.FirstWithRoom(first_usable[k], last_usable[k], workload[k]);
    if (b < 0) return false;
    bags[k] = b;
    assigned[b] += workload[k];
    room[b] -= workload[k];
    tree.Set(b, room[b]);
  }
  return true;
}

}  // namespace

bool Multifit(const ReplicaBags& replica, const std::vector<double>& workload,
              const std::vector<int32_t>& first_usable, const std::vector<int32_t>& last_usable,
              double lo, double hi, int32_t rounds, double min_gain,
              std::vector<int32_t>& bags, std::vector<double>& assigned) {
  std::vector<int32_t> trial_bags;
  std::vector<double> trial_assigned;
  // One packing first at the least gain worth having: where it fails, the
  // bisection could only find packings less than min_gain better than hi
  // (first-fit decreasing fails at every lower capacity but for rare
  // anomalies), and the other rounds are saved. Where it packs, the
  // bisection runs as without it, so that it finds the same packing.
  if (min_gain > 0 && !FirstFitDecreasing(replica, workload, first_usable, last_usable,
                                          hi / (1 + min_gain), trial_bags, trial_assigned)) {
    return false;
  }
  bool found = false;
  for (int32_t round = 0; round < rounds && hi - lo > hi * kResolution; ++round) {
    const double capacity = lo + (hi - lo) / 2;
    if (FirstFitDecreasing(replica, workload, first_usable, last_usable, capacity, trial_bags,
                           trial_assigned)) {
      bags.swap(trial_bags);
      assigned.swap(trial_assigned);
      found = true;
      hi = capacity;
    } else {
      lo = capacity;
    }
  }
  return found;
}

void RenumberTowardHomes(const ReplicaBags& replica, const std::vector<int64_t>& length,
                         const std::vector<int32_t>& home_bag, std::vector<int32_t>& bags,
                         std::vector<double>& assigned) {
  const int32_t num_bags = replica.size();
  // Bags that can trade places: one size and one speed.
  auto alike = [&](int32_t a, int32_t b) {
    return replica.gpus[a] == replica.gpus[b] && replica.speed[a] == replica.speed[b];
  };
  // (packed bag, home bag, tokens), summed per pair.
  std::vector<std::tuple<int32_t, int32_t, int64_t>> pairs;
  for (size_t k = 0; k < bags.size(); ++k) {
    const int32_t home = home_bag[k];
    if (bags[k] >= 0 && alike(bags[k], home)) pairs.emplace_back(bags[k], home, length[k]);
  }
  std::sort(pairs.begin(), pairs.end());
  std::vector<std::tuple<int64_t, int32_t, int32_t>> by_tokens;  // (-tokens, packed, home)
  for (size_t i = 0; i < pairs.size();) {
    const auto [packed, home, tokens] = pairs[i];
    int64_t sum = 0;
    for (; i < pairs.size() && std::get<0>(pairs[i]) == packed && std::get<1>(pairs[i]) == home;
         ++i) {
      sum += std::get<2>(pairs[i]);
    }
    by_tokens.emplace_back(-sum, packed, home);
  }
  std::sort(by_tokens.begin(), by_tokens.end());
  std::vector<int32_t> renumbered(num_bags, -1);
  std::vector<char> taken(num_bags, 0);
  for (const auto& [negative_tokens, packed, home] : by_tokens) {
    if (renumbered[packed] >= 0 || taken[home]) continue;
    renumbered[packed] = home;
    taken[home] = 1;
  }
  // The rest in order, within their (size, speed): each one's untaken bags
  // match its packed bags without a number in count.
  std::map<std::pair<int32_t, double>, std::vector<int32_t>> untaken;  // in descending order
  for (int32_t b = num_bags - 1; b >= 0; --b) {
    if (!taken[b]) untaken[{replica.gpus[b], replica.speed[b]}].push_back(b);
  }
  for (int32_t packed = 0; packed < num_bags; ++packed) {
    if (renumbered[packed] >= 0) continue;
    std::vector<int32_t>& free = untaken[{replica.gpus[packed], replica.speed[packed]}];
    renumbered[packed] = free.back();
    free.pop_back();
  }
  for (int32_t& bag : bags) {
    if (bag >= 0) bag = renumbered[bag];
  }
  std::vector<double> moved(num_bags);
  for (int32_t b = 0; b < num_bags; ++b) moved[renumbered[b]] = assigned[b];
  assigned.swap(moved);
}

}  // namespace knapformer
