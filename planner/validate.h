#ifndef KNAPFORMER_PLANNER_VALIDATE_H_
#define KNAPFORMER_PLANNER_VALIDATE_H_

#include "absl/status/status.h"
#include "planner/balancer.h"
#include "planner/plan.h"
#include "planner/topology.h"

namespace knapformer {

// Checks that `plan` is a correct plan of `lengths` on `world`:
//  - every token of every sequence lands exactly once: the chunks of a
//    sequence are non-empty, contiguous, in order, and cover [0, length);
//  - the chunks of a sequence stay in one bag of the source's replica, at most
//    one per GPU, in bag-position order;
//  - empty sequences have no chunk; the indexes and per-rank workloads agree
//    with the chunks.
// Returns Internal naming the first violation. Cost O(S + C).
absl::Status ValidatePlan(const Plan& plan, const World& world, const RankLengths& lengths);

// Checks every rank's slice against the others: the sends of each rank are
// exactly the receives addressed to it by its peers, the receives of a
// multi-GPU bag member follow its bag's Ulysses order, and the reverse route
// puts back every token of every sequence of each rank exactly once.
// Cost O(C log C); meant for tests.
absl::Status ValidateSlices(const Plan& plan, const RankLengths& lengths);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_VALIDATE_H_
