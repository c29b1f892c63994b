#ifndef KNAPFORMER_PLANNER_LOCALITY_H_
#define KNAPFORMER_PLANNER_LOCALITY_H_

#include <cstdint>
#include <vector>

namespace knapformer {

struct LocalityItem {
  double workload = 0;
  int32_t id = 0;        // global sequence id: the deterministic tie-break
  int64_t length = 0;    // tokens
  int32_t home_bag = 0;  // the bag of its source rank
  int32_t bag = 0;       // the balancer's choice; rewritten when a better one is found
};

// Tokens a sequence of `length` tokens sends to other ranks when computed in
// `bag` (gpus[bag] GPUs): all of them, except in its home bag, where its
// source rank keeps about its 1/G share.
inline int64_t MovedTokens(int64_t length, int32_t home_bag, int32_t bag,
                           const std::vector<int32_t>& gpus) {
  return bag == home_bag ? length - length / gpus[bag] : length;
}

// Locality-aware placement of one replica's sequences. Keeps every sequence
// in its home bag where the bag may hold it, then sheds from each bag whose
// per-GPU load exceeds `limit_per_gpu` (per bag, the fewest tokens: the
// smallest sequence that covers the excess, else the largest and again), and
// places what was shed, heaviest first, in the eligible bag with the least
// room that still fits (best fit keeps large gaps for large sequences).
// Eligible bags are the balancer's: at most the sequence's length in GPUs,
// or the smallest bags for a shorter one.
//
// Succeeds, rewriting each item's bag, only when every sequence fits under
// the limit and the placement moves fewer tokens than the items' current
// bags; otherwise leaves the items alone and returns false. O(S log S + S
// log B). `gpus[b]` is the size of bag b, ascending.
bool PlaceNearHome(const std::vector<int32_t>& gpus, double limit_per_gpu,
                   std::vector<LocalityItem>& items);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_LOCALITY_H_
