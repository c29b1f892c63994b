#ifndef KNAPFORMER_PLANNER_BAG_MEMBERS_H_
#define KNAPFORMER_PLANNER_BAG_MEMBERS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

namespace knapformer {
namespace internal {

// The sequences of every bag, for the passes that move a few sequences
// between a few of thousands of bags (refinement, repair). Built in O(S + B)
// as one flat array (a counting sort, no allocation per bag); a bag gets a
// vector of its own only when it first changes, so the cost follows the
// bags touched, not the bags that exist.
class BagMembers {
 public:
  struct Span {
    const int32_t* first;
    const int32_t* last;
    const int32_t* begin() const { return first; }
    const int32_t* end() const { return last; }
    bool empty() const { return first == last; }
  };

  // Sequence i (0 <= i < n) is in bag bag_of(i); each bag lists its
  // sequences in increasing i.
  template <typename BagOf>
  BagMembers(int32_t num_bags, int32_t n, BagOf bag_of)
      : begin_(num_bags + 1, 0), flat_(n), own_(num_bags), owned_(num_bags, 0) {
    for (int32_t i = 0; i < n; ++i) ++begin_[bag_of(i) + 1];
    for (int32_t b = 0; b < num_bags; ++b) begin_[b + 1] += begin_[b];
    std::vector<int32_t> next(begin_.begin(), begin_.end() - 1);
    for (int32_t i = 0; i < n; ++i) flat_[next[bag_of(i)]++] = i;
  }

  Span Get(int32_t bag) const {
    if (owned_[bag]) return {own_[bag].data(), own_[bag].data() + own_[bag].size()};
    return {flat_.data() + begin_[bag], flat_.data() + begin_[bag + 1]};
  }

  // The bag's list, to reorder or edit in place.
  std::vector<int32_t>& Mutable(int32_t bag) {
    if (!owned_[bag]) {
      own_[bag].assign(flat_.begin() + begin_[bag], flat_.begin() + begin_[bag + 1]);
      owned_[bag] = 1;
    }
    return own_[bag];
  }

  void Remove(int32_t bag, int32_t i) {
    std::vector<int32_t>& list = Mutable(bag);
    list.erase(std::find(list.begin(), list.end(), i));
  }

  // Inserts i before the first member that does not come before it in
  // `order` (a strict weak order the list is sorted by).
  template <typename Order>
  void Insert(int32_t bag, int32_t i, Order order) {
    std::vector<int32_t>& list = Mutable(bag);
    list.insert(std::lower_bound(list.begin(), list.end(), i, order), i);
  }

 private:
  std::vector<int32_t> begin_;  // bag b's flat members: [begin_[b], begin_[b + 1])
  std::vector<int32_t> flat_;
  std::vector<std::vector<int32_t>> own_;
  std::vector<char> owned_;
};

}  // namespace internal
}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_BAG_MEMBERS_H_
