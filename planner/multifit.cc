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

// Where first-fit decreasing can no longer fail, so that a bisection,
// which only asks whether a capacity packs, may stop packing there.
//
// The sequences from k on may all use the bags U = [max first_usable,
// min last_usable] of k and after. If first fit fails on a sequence j >= k,
// every bag of U then has room below w_j <= w_k: U's room sums to below
// |U| w_k. Since k, the placements took at most the workload left at k
// (less w_j) out of U's room. So if U's room at k, less the workload left,
// is at least |U| w_k, no later sequence fails: first fit packs them all.
// Why: in the masked mix at 65,536 GPUs a packing that succeeds took 7 ms
// and one that fails 0.3-1.6 ms (it fails on the heavy sequences), and a
// bisection succeeded 4-5 times to keep one packing, the last.
//
// Checked every kStride sequences, on runs of bags ("segments") between
// the ends of the usable ranges, so that U's room is a sum over a few
// segments. Kept for every capacity of one bisection.
class FitCertainty {
 public:
  static constexpr size_t kStride = 64;

  FitCertainty(const ReplicaBags& replica, const std::vector<double>& workload,
               const std::vector<int32_t>& first_usable, const std::vector<int32_t>& last_usable)
      : segment_of_(replica.size()) {
    const int32_t num_bags = replica.size();
    // One pass from the last sequence back: where segments start, and per
    // check the common range (as bags, first > last when empty) and the
    // workload left.
    std::vector<char> starts(num_bags + 1, 0);
    starts[0] = 1;
    const size_t checks = (workload.size() + kStride - 1) / kStride;
    first_segment_.resize(checks);
    last_segment_.resize(checks);
    workload_left_.resize(checks);
    int32_t first = 0, last = num_bags - 1;
    double left = 0;
    for (size_t k = workload.size(); k-- > 0;) {
      starts[first_usable[k]] = 1;
      starts[last_usable[k] + 1] = 1;
      first = std::max(first, first_usable[k]);
      last = std::min(last, last_usable[k]);
      left += workload[k];
      if (k % kStride == 0) {
        first_segment_[k / kStride] = first;
        last_segment_[k / kStride] = last;
        workload_left_[k / kStride] = left;
      }
    }
    for (int32_t b = 0; b < num_bags; ++b) {
      if (starts[b]) {
        speed_.push_back(0);
        bags_.push_back(0);
      }
      segment_of_[b] = static_cast<int32_t>(speed_.size()) - 1;
      speed_.back() += replica.speed[b];
      ++bags_.back();
    }
    for (size_t check = 0; check < checks; ++check) {
      if (first_segment_[check] > last_segment_[check]) {
        first_segment_[check] = 1;  // an empty run of segments
        last_segment_[check] = 0;
      } else {
        first_segment_[check] = segment_of_[first_segment_[check]];
        last_segment_[check] = segment_of_[last_segment_[check]];
      }
    }
  }

  int32_t num_segments() const { return static_cast<int32_t>(speed_.size()); }
  int32_t segment_of(int32_t bag) const { return segment_of_[bag]; }

  // Whether first fit at `capacity` surely places sequence k (a multiple of
  // kStride) and every one after it, `placed[s]` being the workload placed
  // in segment s before k.
  bool Certain(size_t k, double capacity, const std::vector<double>& placed,
               double heaviest_left) const {
    const size_t check = k / kStride;
    double room = 0, full = 0, bags = 0;
    for (int32_t s = first_segment_[check]; s <= last_segment_[check]; ++s) {
      room += capacity * speed_[s] - placed[s];
      full += capacity * speed_[s];
      bags += bags_[s];
    }
    // A margin far above the rounding of the sums and of the rooms first
    // fit compares (each a few ulps of a bag's capacity).
    constexpr double kMargin = 1e-9;
    return bags > 0 && room - workload_left_[check] - bags * heaviest_left >= full * kMargin;
  }

 private:
  std::vector<int32_t> segment_of_;
  std::vector<double> speed_;  // per segment: its bags' speeds summed
  std::vector<double> bags_;   // per segment: how many bags
  // Per check (k / kStride): U as a range of segments (empty: first > last)
  // and the workload of sequences k and after.
  std::vector<int32_t> first_segment_, last_segment_;
  std::vector<double> workload_left_;
};

enum class Fit {
  kFails,   // some sequence found no bag with room
  kFits,    // every sequence would fit (FitCertainty); the packing is partial
  kPacked,  // every sequence placed
};

// First-fit decreasing at `capacity`. With `certainty`, may stop with kFits
// where it can no longer fail; without, places every sequence or fails.
Fit FirstFitDecreasing(const ReplicaBags& replica, const std::vector<double>& workload,
                       const std::vector<int32_t>& first_usable,
                       const std::vector<int32_t>& last_usable, double capacity,
                       const FitCertainty* certainty, std::vector<int32_t>& bags,
                       std::vector<double>& assigned) {
  const int32_t num_bags = replica.size();
  std::vector<double> room(num_bags);
  for (int32_t b = 0; b < num_bags; ++b) room[b] = capacity * replica.speed[b];
  RoomTree tree(room);
  bags.assign(workload.size(), -1);
  assigned.assign(num_bags, 0.0);
  std::vector<double> placed(certainty != nullptr ? certainty->num_segments() : 0, 0.0);
  for (size_t k = 0; k < workload.size(); ++k) {
    if (certainty != nullptr && k % FitCertainty::kStride == 0 &&
        certainty->Certain(k, capacity, placed, workload[k])) {
      return Fit::kFits;
    }
    const int32_t b = tree.FirstWithRoom(first_usable[k], last_usable[k], workload[k]);
    if (b < 0) return Fit::kFails;
    bags[k] = b;
    assigned[b] += workload[k];
    room[b] -= workload[k];
    tree.Set(b, room[b]);
    if (certainty != nullptr) placed[certainty->segment_of(b)] += workload[k];
  }
  return Fit::kPacked;
}

}  // namespace

bool Multifit(const ReplicaBags& replica, const std::vector<double>& workload,
              const std::vector<int32_t>& first_usable, const std::vector<int32_t>& last_usable,
              double lo, double hi, int32_t rounds, double min_gain,
              std::vector<int32_t>& bags, std::vector<double>& assigned) {
  std::vector<int32_t> trial_bags;
  std::vector<double> trial_assigned;
  const FitCertainty certainty(replica, workload, first_usable, last_usable);
  // One packing first at the least gain worth having: where it fails, the
  // bisection could only find packings less than min_gain better than hi
  // (first-fit decreasing fails at every lower capacity but for rare
  // anomalies), and the other rounds are saved. Where it packs, the
  // bisection runs as without it, so that it finds the same packing.
  if (min_gain > 0 &&
      FirstFitDecreasing(replica, workload, first_usable, last_usable, hi / (1 + min_gain),
                         &certainty, trial_bags, trial_assigned) == Fit::kFails) {
    return false;
  }
  // The bisection only asks whether each capacity packs; the packing of
  // the least that did is made once at the end, unless its probe made it.
  // `packed`: the least capacity that packed so far was packed whole;
  // `kept`: bags holds some capacity's whole packing.
  bool found = false, packed = false, kept = false;
  for (int32_t round = 0; round < rounds && hi - lo > hi * kResolution; ++round) {
    const double capacity = lo + (hi - lo) / 2;
    const Fit fit = FirstFitDecreasing(replica, workload, first_usable, last_usable, capacity,
                                       &certainty, trial_bags, trial_assigned);
    if (fit == Fit::kFails) {
      lo = capacity;
      continue;
    }
    found = true;
    hi = capacity;
    packed = fit == Fit::kPacked;
    if (packed) {
      bags.swap(trial_bags);
      assigned.swap(trial_assigned);
      kept = true;
    }
  }
  if (found && !packed) {
    // FitCertainty proved that this packs. Were that proof wrong, the
    // answer would be the least whole packing found (if any), never a
    // partial one.
    if (FirstFitDecreasing(replica, workload, first_usable, last_usable, hi, nullptr,
                           trial_bags, trial_assigned) != Fit::kPacked) {
      return kept;
    }
    bags.swap(trial_bags);
    assigned.swap(trial_assigned);
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
