#ifndef KNAPFORMER_PLANNER_MULTIFIT_H_
#define KNAPFORMER_PLANNER_MULTIFIT_H_

#include <cstdint>
#include <vector>

#include "planner/replica_bags.h"

namespace knapformer {

// MULTIFIT (Coffman, Garey and Johnson, SIAM J. Comput. 7(1), 1978): the
// least per-GPU capacity at which first-fit decreasing packs every sequence,
// found by bisection. Where a GPU's share is a few coarse sequences
// (block-causal video in one-GPU bags), it levels bags that the greedy's
// "least loaded bag" rule (LPT) leaves apart, since it fills each bag up to
// the capacity with the heaviest sequence that still fits.
//
// `workload[k]` is in descending order; sequence k may go to the bags
// [first_usable[k], last_usable[k]]; `replica` holds the bags' sizes and
// speeds (replica_bags.h). Tries up to `rounds` capacities in [lo, hi] of
// time (a bag of speed s holds capacity * s of workload), bisecting until the
// interval is within 1e-4 of its upper end. On success (some capacity packed
// everything) `bags[k]` and `assigned[b]` hold the packing of the least
// capacity that worked and it returns true; else they are untouched. A
// capacity's packing stops where the sequences left surely fit, and only
// the least capacity that packed is packed whole: the answer is the one
// whole packings at every capacity would give.
// `min_gain` > 0: first packs at capacity hi / (1 + min_gain) and gives up
// (false) when that fails, so that a bisection that could gain less than
// min_gain costs one packing, not `rounds` (where it packs, the result is
// the same as with 0). Deterministic; O(rounds * S * log B).
bool Multifit(const ReplicaBags& replica, const std::vector<double>& workload,
              const std::vector<int32_t>& first_usable, const std::vector<int32_t>& last_usable,
              double lo, double hi, int32_t rounds, double min_gain,
              std::vector<int32_t>& bags, std::vector<double>& assigned);

// REQUIRES: sizes ascending (bags sorted by size, as topologies are).
// Bags of one size and speed are interchangeable in a packing: renumbers them
// within each (size, speed) so that a bag keeps the tokens of the sequences it is home to
// (`home_bag[k]`), greedily, the pair (packed bag, home bag) with the most
// tokens first, ties by bag ids; bags left over keep their order. `bags` and
// `assigned` are renumbered in place; every load stays the same, since a
// packed bag moves whole to a bag of its size and speed. O(S log S + B log B).
void RenumberTowardHomes(const ReplicaBags& replica, const std::vector<int64_t>& length,
                         const std::vector<int32_t>& home_bag, std::vector<int32_t>& bags,
                         std::vector<double>& assigned);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_MULTIFIT_H_
