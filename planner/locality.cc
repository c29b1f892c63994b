#include "planner/locality.h"

#include <algorithm>
#include <functional>
#include <iterator>
#include <set>
#include <utility>

#include "planner/bag_members.h"
#include "planner/token_cap.h"

namespace knapformer {
namespace {

// Moves and swaps one over bag may take before the repair gives up on it.
constexpr int32_t kMaxActionsPerBag = 8;
// Once an action ends the excess, partners past this many are not searched
// for a cheaper one: on the benchmark's 4096 ranks that search cost 0.9 ms
// and saved 0.3% of the tokens.
constexpr int32_t kEnoughPartners = 2;

}  // namespace

bool RepairToLimit(const ReplicaBags& replica, double limit_per_gpu,
                   int64_t max_tokens_per_gpu, int32_t partners, const SequenceTable& sequences,
                   std::vector<int32_t>& bag, std::vector<double>& assigned) {
  const int32_t num_bags = replica.size();
  const std::vector<int32_t>& gpus = replica.gpus;
  const std::vector<double>& workload = sequences.workload;
  std::vector<double> cap(num_bags);
  std::vector<int32_t> over;
  for (int32_t b = 0; b < num_bags; ++b) {
    cap[b] = limit_per_gpu * replica.speed[b];
    if (assigned[b] > cap[b]) over.push_back(b);
  }
  if (over.empty()) return true;
  auto fits = [&](int32_t i, int32_t b) {
    const int64_t length = sequences.length[i];
    return gpus[b] <= length || (length < gpus[0] && gpus[b] == gpus[0]);
  };
  auto moved = [&](int32_t i, int32_t b) {
    return MovedTokens(sequences.length[i], sequences.home_bag[i], b, gpus);
  };
  // Every list in increasing position: heaviest first.
  internal::BagMembers members(num_bags, sequences.size(), [&](int32_t i) { return bag[i]; });
  // (-room, bag), the most room first; built from a sorted vector in linear
  // time, where inserting bag by bag is not.
  std::vector<std::pair<double, int32_t>> rooms;
  for (int32_t b = 0; b < num_bags; ++b) {
    if (assigned[b] < cap[b]) rooms.emplace_back(assigned[b] - cap[b], b);
  }
  std::sort(rooms.begin(), rooms.end());
  std::set<std::pair<double, int32_t>> by_room(rooms.begin(), rooms.end());
  // The worst excess first, while the rooms are widest.
  std::sort(over.begin(), over.end(), [&](int32_t x, int32_t y) {
    const double ex = assigned[x] - cap[x], ey = assigned[y] - cap[y];
    return ex > ey || (ex == ey && x < y);
  });

  // Tokens per bag, kept only under a token cap.
  std::vector<int64_t> tokens(max_tokens_per_gpu > 0 ? num_bags : 0, 0);
  if (max_tokens_per_gpu > 0) {
    for (int32_t i = 0; i < sequences.size(); ++i) tokens[bag[i]] += sequences.length[i];
  }
  auto tokens_fit = [&](int32_t b, int64_t added) {
    return max_tokens_per_gpu <= 0 || added <= 0 ||
           tokens[b] + added <= TokenCapOfBag(max_tokens_per_gpu, gpus[b]);
  };
  auto relocate = [&](int32_t i, int32_t from, int32_t to) {
    if (max_tokens_per_gpu > 0) {
      tokens[from] -= sequences.length[i];
      tokens[to] += sequences.length[i];
    }
    members.Remove(from, i);
    members.Insert(to, i, std::less<int32_t>());
    bag[i] = to;
    assigned[from] -= workload[i];
    assigned[to] += workload[i];
  };
  for (const int32_t heavy : over) {
    for (int32_t action = 0; action < kMaxActionsPerBag; ++action) {
      const double excess = assigned[heavy] - cap[heavy];
      if (excess <= 0) break;
      // The action: `out` leaves `heavy` for `partner`, `back` (or -1)
      // comes the other way. One that ends the excess and adds the fewest
      // moved tokens; else the one that cuts the excess most.
      struct Action {
        int32_t out = -1, back = -1, partner = -1;
        double cut = 0;
        int64_t cost = 0;
      };
      Action best;
      auto consider = [&](int32_t out, int32_t back, int32_t partner, double cut) {
        const int64_t shifted = sequences.length[out] - (back >= 0 ? sequences.length[back] : 0);
        if (!tokens_fit(partner, shifted) || !tokens_fit(heavy, -shifted)) return;
        int64_t cost = moved(out, partner) - moved(out, heavy);
        if (back >= 0) cost += moved(back, heavy) - moved(back, partner);
        const bool ends = cut >= excess;
        const bool best_ends = best.out >= 0 && best.cut >= excess;
        if (best.out < 0 || (ends && !best_ends) || (ends && best_ends && cost < best.cost) ||
            (!ends && !best_ends && cut > best.cut)) {
          best = {out, back, partner, cut, cost};
        }
      };
      int32_t tried = 0;
      // Partners by room, until an action that ends the excess adds no
      // moved tokens or has been compared across kEnoughPartners.
      for (auto it = by_room.begin();
           it != by_room.end() && tried < partners &&
           !(best.out >= 0 && best.cut >= excess &&
             (best.cost <= 0 || tried >= kEnoughPartners));
           ++it, ++tried) {
        const int32_t partner = it->second;
        const double room = -it->first;
        // Lightest first.
        const auto theirs_begin = std::make_reverse_iterator(members.Get(partner).end());
        const auto theirs_end = std::make_reverse_iterator(members.Get(partner).begin());
        for (const int32_t out : members.Get(heavy)) {
          if (!fits(out, partner)) continue;
          const double w = workload[out];
          if (w <= room) consider(out, -1, partner, w);
          // Swaps cut w - w_back: at most the room, and positive.
          auto back = std::lower_bound(theirs_begin, theirs_end, w - room,
                                       [&](int32_t j, double x) { return workload[j] < x; });
          for (; back != theirs_end && workload[*back] < w; ++back) {
            if (!fits(*back, heavy)) continue;
            const double cut = w - workload[*back];
            consider(out, *back, partner, cut);
            if (cut < excess) break;  // the largest cut short of the excess: smaller follow
          }
        }
      }
      if (best.out < 0) return false;
      by_room.erase({assigned[best.partner] - cap[best.partner], best.partner});
      relocate(best.out, heavy, best.partner);
      if (best.back >= 0) relocate(best.back, best.partner, heavy);
      if (assigned[best.partner] < cap[best.partner]) {
        by_room.emplace(assigned[best.partner] - cap[best.partner], best.partner);
      }
    }
    if (assigned[heavy] > cap[heavy]) return false;
    by_room.emplace(assigned[heavy] - cap[heavy], heavy);
  }
  return true;
}

}  // namespace knapformer
