#ifndef KNAPFORMER_PLANNER_REFINE_H_
#define KNAPFORMER_PLANNER_REFINE_H_

#include <cstdint>
#include <vector>

#include "planner/replica_bags.h"
#include "planner/sequence_table.h"

namespace knapformer {

// Local refinement of a bag assignment, a bag's load = its time,
// assigned / speed (replica_bags.h).
// Each round takes the most loaded bag H that is not yet known to be stuck and
// the least loaded bag L, and applies the single move (a sequence from H to L)
// or swap (a heavier sequence of H for a lighter one of L) that lowers
// max(load H, load L) the most; when none does, H is stuck and skipped from
// then on. A sequence only goes to a bag of at most its length in GPUs
// (sequences shorter than the smallest bag stay among the smallest bags).
// The sorted vector of loads only decreases, so max/mean never gets worse.
//
// `bag[i]` is the bag of sequence i of `sequences`, updated in place;
// `replica` the bags' sizes (ascending) and speeds; `assigned[b]` bag b's workload,
// kept up to date. Deterministic: the same input gives the same rounds; the
// heaviest and lightest bags tie by bag id, moves by sequence id, and swaps
// go to the first found in the bags' member order.
//
// `partners` > 1: when the most loaded bag of all has no change with L, the
// next least loaded bags are tried in turn, up to `partners` in all, before
// it counts as stuck (coarse workloads, such as block-causal video, often
// level only with a bag other than the least loaded one). Bags below it,
// once it is stuck, try L alone: the maximum is then final.
void RefineBags(const ReplicaBags& replica, int32_t max_rounds,
                const SequenceTable& sequences, std::vector<int32_t>& bag,
                std::vector<double>& assigned, int32_t partners = 1);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_REFINE_H_
