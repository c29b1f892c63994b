#include "planner/locality.h"

#include <algorithm>
#include <iterator>
#include <set>
#include <tuple>
#include <utility>

namespace knapformer {
namespace {

bool Eligible(int64_t length, int32_t bag_gpus, int32_t smallest_gpus) {
  return bag_gpus <= length || bag_gpus == smallest_gpus;
}

bool HeavierFirst(const LocalityItem* a, const LocalityItem* b) {
  return std::tie(b->workload, a->id) < std::tie(a->workload, b->id);
}

}  // namespace

bool PlaceNearHome(const std::vector<int32_t>& gpus, double limit_per_gpu,
                   std::vector<LocalityItem>& items) {
  const int32_t num_bags = static_cast<int32_t>(gpus.size());
  if (num_bags == 0 || items.empty()) return false;
  const int32_t smallest = gpus.front();
  std::vector<double> load(num_bags, 0.0), cap(num_bags);
  for (int32_t b = 0; b < num_bags; ++b) cap[b] = limit_per_gpu * gpus[b];

  // 1. Home where allowed.
  std::vector<int32_t> placed(items.size(), -1);
  std::vector<std::vector<LocalityItem*>> at_home(num_bags);
  std::vector<LocalityItem*> shed;
  for (LocalityItem& item : items) {
    if (Eligible(item.length, gpus[item.home_bag], smallest)) {
      at_home[item.home_bag].push_back(&item);
      load[item.home_bag] += item.workload;
    } else {
      shed.push_back(&item);
    }
  }

  // 2. Shed from overloaded bags, as few tokens as possible.
  for (int32_t b = 0; b < num_bags; ++b) {
    if (load[b] <= cap[b]) continue;
    std::vector<LocalityItem*>& here = at_home[b];
    std::sort(here.begin(), here.end(), [](const LocalityItem* x, const LocalityItem* y) {
      return std::tie(x->workload, x->id) < std::tie(y->workload, y->id);
    });
    while (load[b] > cap[b] && !here.empty()) {
      const double excess = load[b] - cap[b];
      auto it = std::lower_bound(here.begin(), here.end(), excess,
                                 [](const LocalityItem* x, double w) { return x->workload < w; });
      if (it == here.end()) it = std::prev(here.end());  // none covers it alone: the largest
      load[b] -= (*it)->workload;
      shed.push_back(*it);
      here.erase(it);
    }
  }

  // 3. Best fit for what was shed, heaviest first. Per size class, bags by
  // (room, id): the fitting bag with the least room is a lower_bound.
  std::vector<int32_t> class_gpus, class_of(num_bags);
  for (int32_t b = 0; b < num_bags; ++b) {
    if (b == 0 || gpus[b] != gpus[b - 1]) class_gpus.push_back(gpus[b]);
    class_of[b] = static_cast<int32_t>(class_gpus.size()) - 1;
  }
  std::vector<std::set<std::pair<double, int32_t>>> room(class_gpus.size());
  for (int32_t b = 0; b < num_bags; ++b) room[class_of[b]].insert({cap[b] - load[b], b});
  std::sort(shed.begin(), shed.end(), HeavierFirst);
  std::vector<std::pair<LocalityItem*, int32_t>> moves;
  moves.reserve(shed.size());
  for (LocalityItem* item : shed) {
    std::pair<double, int32_t> best = {0, -1};
    for (size_t c = 0; c < class_gpus.size(); ++c) {
      if (!Eligible(item->length, class_gpus[c], smallest)) break;  // classes ascend
      auto it = room[c].lower_bound({item->workload, -1});
      if (it != room[c].end() && (best.second < 0 || *it < best)) best = *it;
    }
    if (best.second < 0) return false;  // does not fit under the limit
    const int32_t b = best.second;
    room[class_of[b]].erase(best);
    load[b] += item->workload;
    room[class_of[b]].insert({cap[b] - load[b], b});
    moves.push_back({item, b});
  }

  // 4. Only if it moves fewer tokens than the current placement.
  int64_t before = 0, after = 0;
  auto moved = [&](const LocalityItem& item, int32_t bag) {
    return MovedTokens(item.length, item.home_bag, bag, gpus);
  };
  for (const LocalityItem& item : items) before += moved(item, item.bag);
  for (int32_t b = 0; b < num_bags; ++b) {
    for (const LocalityItem* item : at_home[b]) after += moved(*item, b);
  }
  for (const auto& [item, b] : moves) after += moved(*item, b);
  if (after >= before) return false;
  for (int32_t b = 0; b < num_bags; ++b) {
    for (LocalityItem* item : at_home[b]) item->bag = b;
  }
  for (const auto& [item, b] : moves) item->bag = b;
  return true;
}

}  // namespace knapformer
