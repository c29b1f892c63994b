#ifndef KNAPFORMER_PLANNER_MIN_TREE_H_
#define KNAPFORMER_PLANNER_MIN_TREE_H_

#include <cstdint>
#include <cstring>
#include <vector>

namespace knapformer {
namespace internal {

// A tournament tree answering "which index has the smallest key" in O(1),
// ties going to the lowest index; keys change in O(log n). This is what
// turns the greedy's scan over all bags into O(log B) per sequence: one
// tree per bag size, whose root is the least occupied bag of that size.
//
// Keys must be >= 0 (loads): the bits of a non-negative double order like the
// double, so (key, index) packs into one 128-bit integer and every comparison
// is a branch-free min.
class MinTree {
 public:
  // REQUIRES: every key >= 0. O(n).
  explicit MinTree(const std::vector<double>& keys) {
    const int32_t n = static_cast<int32_t>(keys.size());
    while (size_ < n) size_ *= 2;
    nodes_.assign(2 * size_, ~Packed{0});  // padding past n: larger than any node
    for (int32_t i = 0; i < n; ++i) nodes_[size_ + i] = Pack(keys[i], i);
    for (int32_t node = size_ - 1; node >= 1; --node) Pull(node);
  }

  // REQUIRES: key >= 0.
  void Set(int32_t index, double key) {
    // The new minimum of each ancestor is carried in a register: only the
    // siblings are loaded, and their addresses do not depend on the
    // comparisons, so the loads overlap instead of waiting on each store.
    int32_t node = index + size_;
    Packed value = Pack(key, index);
    nodes_[node] = value;
    for (; node > 1; node /= 2) {
      value = Min(value, nodes_[node ^ 1]);
      nodes_[node / 2] = value;
    }
  }

  // The index of the smallest key of all. REQUIRES: n > 0.
  int32_t ArgMin() const { return Index(nodes_[1]); }
  // The smallest key of all. REQUIRES: n > 0.
  double MinKey() const {
    const uint64_t bits = static_cast<uint64_t>(nodes_[1] >> 32);
    double key;
    std::memcpy(&key, &bits, sizeof(key));
    return key;
  }

 private:
  using Packed = unsigned __int128;

  static Packed Pack(double key, int32_t index) {
    uint64_t bits;
    std::memcpy(&bits, &key, sizeof(bits));
    return (static_cast<Packed>(bits) << 32) | static_cast<uint32_t>(index);
  }
  static int32_t Index(Packed node) { return static_cast<int32_t>(static_cast<uint32_t>(node)); }
  static Packed Min(Packed a, Packed b) { return a < b ? a : b; }
  void Pull(int32_t node) { nodes_[node] = Min(nodes_[2 * node], nodes_[2 * node + 1]); }

  int32_t size_ = 1;
  std::vector<Packed> nodes_;
};

}  // namespace internal
}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_MIN_TREE_H_
