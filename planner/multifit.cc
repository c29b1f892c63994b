#include "planner/multifit.h"

#include <algorithm>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

namespace knapformer {
namespace {

// Room left in each bag, and the first bag of a range with at least some room.
class RoomTree {
 public:
  explicit RoomTree(const std::vector<double>& room) : n_(static_cast<int32_t>(room.size())) {
    while (size_ < n_) size_ *= 2;
    nodes_.assign(2 * size_, -std::numeric_limits<double>::infinity());
    for (int32_t i = 0; i < n_; ++i) nodes_[size_ + i] = room[i];
    for (int32_t node = size_ - 1; node >= 1; --node) Pull(node);
  }

  void Set(int32_t index, double room) {
    int32_t node = index + size_;
    nodes_[node] = room;
    for (node /= 2; node >= 1; node /= 2) Pull(node);
  }

  // The first bag in [lo, hi] whose room is at least `need`; -1 if none.
  int32_t FirstWithRoom(int32_t lo, int32_t hi, double need) const {
    return Find(1, 0, size_ - 1, lo, hi, need);
  }

 private:
  void Pull(int32_t node) { nodes_[node] = std::max(nodes_[2 * node], nodes_[2 * node + 1]); }

  int32_t Find(int32_t node, int32_t begin, int32_t end, int32_t lo, int32_t hi,
               double need) const {
    if (end < lo || begin > hi || nodes_[node] < need) return -1;
    if (begin == end) return begin;
    const int32_t middle = begin + (end - begin) / 2;
    const int32_t left = Find(2 * node, begin, middle, lo, hi, need);
    return left >= 0 ? left : Find(2 * node + 1, middle + 1, end, lo, hi, need);
  }

  int32_t n_;
  int32_t size_ = 1;
  std::vector<double> nodes_;
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
              double lo, double hi, int32_t rounds, std::vector<int32_t>& bags,
              std::vector<double>& assigned) {
  std::vector<int32_t> trial_bags;
  std::vector<double> trial_assigned;
  bool found = false;
  for (int32_t round = 0; round < rounds && lo < hi; ++round) {
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
