#ifndef KNAPFORMER_PLANNER_LOCALITY_H_
#define KNAPFORMER_PLANNER_LOCALITY_H_

#include <cstdint>
#include <vector>

#include "planner/replica_bags.h"
#include "planner/sequence_table.h"

namespace knapformer {

// Tokens a sequence of `length` tokens sends to other ranks when computed in
// `bag` (gpus[bag] GPUs): all of them, except in its home bag, where its
// source rank keeps about its 1/G share.
inline int64_t MovedTokens(int64_t length, int32_t home_bag, int32_t bag,
                           const std::vector<int32_t>& gpus) {
  return bag == home_bag ? length - length / gpus[bag] : length;
}

// Brings every bag to at most `limit_per_gpu` of time (assigned[b] <=
// limit_per_gpu * speed[b], replica_bags.h), for a placement that is over it in some bags
// (a home-first packing): per bag over the limit, worst first, up to 8
// moves or swaps, each with one of the `partners` bags that have the most
// room, keeping the partner under the limit. Each step takes an action that
// ends the bag's excess adding the fewest moved tokens (once one is found,
// the search stops at the second partner searched, or at once if it adds
// none), else the one that cuts the excess most. Refinement (refine.h)
// levels the heaviest bag against the lightest only, and moves home
// sequences away for balance no one asked for; here any bag with room can
// take the difference.
//
// `bag[i]` is the bag of sequence i of `sequences`. Returns true, with `bag`
// and `assigned` updated, when every bag ends under the limit; false when
// one cannot be brought under it (`bag` and `assigned` are then partly
// changed: the caller drops them). A
// sequence only goes to a bag of at most its length in GPUs (or, shorter
// than the smallest bag, to the smallest bags), as in refinement, and with
// max_tokens_per_gpu > 0 no action adds tokens to a bag of G GPUs beyond
// G * max_tokens_per_gpu.
// `replica` holds the bags' sizes (ascending) and speeds. O(S + B log B + A * P * s log s) for S
// sequences, B bags, A actions, P partners and s sequences per bag.
bool RepairToLimit(const ReplicaBags& replica, double limit_per_gpu,
                   int64_t max_tokens_per_gpu, int32_t partners, const SequenceTable& sequences,
                   std::vector<int32_t>& bag, std::vector<double>& assigned);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_LOCALITY_H_
