#ifndef KNAPFORMER_PLANNER_PLAN_FINGERPRINT_H_
#define KNAPFORMER_PLANNER_PLAN_FINGERPRINT_H_

// In per-rank mode every rank gets its own share of the step's plan from the
// service. Each share can be well formed while the shares disagree (two
// receive chunk lengths swapped with their total kept, a bag member with
// another chunk table): the exchanges would then mix sequences without any
// count noticing. A fingerprint is what one rank's share says, folded into a
// few numbers that travel in the step's outcome all-gather; from everyone's,
// every rank decides alike whether the shares agree.
//
// The route: a rank's sends to each peer and its receives from each peer
// are hashed per ordered pair (sender, receiver, then each chunk's sequence
// index, offset, length and attention mask), and the rank adds up the
// hashes of the pairs it sends on and, separately, of those it receives on.
// When every pair agrees, the world's two sums are equal; a pair that
// disagrees makes them differ (but for a 2^-64 chance). Bags: each member
// hashes its view of the bag (its ranks, its sequences' chunk tables and
// masks), which every other member must share.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "planner/attention_mask.h"
#include "planner/plan.h"

namespace knapformer {

struct PlanFingerprint {
  uint64_t sent = 0;      // the sum of the hashes of the pairs it sends on
  uint64_t expected = 0;  // of the pairs it receives on
  int32_t bag_first = 0;  // its bag, as its share says
  int32_t bag_gpus = 1;
  uint64_t bag = 0;  // the hash of its view of the bag
};

// The fingerprint of `plan`, this rank's share; `masks`: the masks of this
// rank's own sequences as it gave them (empty: none given).
PlanFingerprint FingerprintOf(const RankPlan& plan, const std::vector<AttentionMask>& masks);

// Ok when the shares whose fingerprints these are (by rank) agree; else
// FailedPrecondition saying which part disagrees, to follow "plans that"
// ("disagree on the route: ...", "disagree on the bag of ranks 4..7: ...",
// "put rank 3 in a bag of ranks ..."), the same on every rank.
absl::Status CheckFingerprints(const std::vector<PlanFingerprint>& fingerprints);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_PLAN_FINGERPRINT_H_
