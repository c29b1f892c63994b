#ifndef KNAPFORMER_PLANNER_BALANCER_H_
#define KNAPFORMER_PLANNER_BALANCER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/attention_mask.h"
#include "planner/balancer_input.h"
#include "planner/balancer_options.h"
#include "planner/cost_model.h"
#include "planner/plan.h"
#include "planner/topology.h"

namespace knapformer {

// InvalidArgument naming `threads` unless options.threads is in
// [1, BalancerOptions::kMaxThreads].
absl::Status CheckThreads(const BalancerOptions& options);

namespace internal {

// Below this many sequences a step is solved on the caller's thread alone:
// starting a thread costs tens of microseconds, a whole solve of 4096
// sequences about a millisecond.
inline constexpr int64_t kParallelMinSequences = 4096;

// The threads to solve `sequences` sequences with: options.threads, or 1
// below kParallelMinSequences.
int32_t SolverThreads(const BalancerOptions& options, int64_t sequences);

}  // namespace internal

// The paper's greedy planner (KnapFormer section 3.3), run independently in
// every replica of the topology:
//  1. Bags. Sequences sorted by length descending (so by workload; ties:
//     global id) go one by one to the eligible bag of lowest occupancy
//     (assigned / capacity, capacity = GPUs * total/GPUs; ties: lowest bag
//     id). Eligible: a bag whose capacity can hold the sequence and whose GPU
//     count does not exceed its length; a sequence bigger than every eligible
//     capacity goes to the largest eligible bags; one shorter than the
//     smallest bag goes to the smallest bags (some of their GPUs then hold
//     none of its tokens). Under max_tokens_per_gpu only bags with room for
//     the sequence's tokens count: the eligible one of lowest occupancy with
//     room, else the bag of lowest occupancy with room among all of at most
//     its largest eligible size.
//  2. Chunks. A sequence in a G-GPU bag is cut into G contiguous chunks, chunk
//     i on the bag's i-th GPU, lengths differing by at most one token; the
//     positions that get the extra tokens rotate within the bag so every GPU
//     ends up with the same token count to within one.
//  3. Route: every chunk goes from its source rank to its GPU in one all-to-all.
// Then options.refine_rounds of local refinement (refine.h), and a guard: if
// leaving every sequence in its source rank's bag has a lower maximum per-GPU
// load, that assignment is used, so max/mean is never worse than no balancing.
// Then, with options.locality, a home-first packing repaired to within
// options.locality_slack of that maximum and to at most the all-home maximum
// (locality.h), when it surely moves fewer tokens than the balanced one.
// Empty sequences get no chunk and no bag. Runs in O(S + S log B + C) for S
// sequences, B bags and C chunks (a radix sort orders the sequences; under a
// cap, O((S + B) log B) for the packing), plus the
// refinement rounds (each O(n log n) in the sequences of two bags, at most
// options.refine_rounds per replica) and, with locality, one more packing
// and the repair (locality.h).
//
// Attention masks: `masks` (attention_mask.h; null or empty: every sequence
// attends fully) price each sequence's attention by the pairs it attends.
// Sequences then go heaviest first by that workload (ties: the longer, then
// the lower global id), a second radix sort. Without masks the plan is
// exactly the unmasked one.
//
// options.threads: replicas are solved at once (from kParallelMinSequences
// sequences); the plan is the same for any count.
//
// Errors: InvalidArgument if the input is of another world size or
// options.threads is out of range; ResourceExhausted past
// options.limits.max_chunks or a token cap no bag meets.
absl::StatusOr<Plan> BalanceGreedy(const World& world, const CostModel& cost,
                                   const BalancerInput& input,
                                   const BalancerOptions& options = BalancerOptions());

// The same for a caller done with the input's masks: they move into the plan
// instead of being copied (the copy was 5-15% of planning masked data from
// 16,384 GPUs up, bench/planner_curve). `input` keeps its lengths.
absl::StatusOr<Plan> BalanceGreedy(const World& world, const CostModel& cost,
                                   BalancerInput&& input,
                                   const BalancerOptions& options = BalancerOptions());

// The same for lengths and masks not yet checked: BalancerInput::Check's
// errors first (a length outside [0, CostModel::kMaxLength], a malformed
// mask naming masks[rank][i], more than options.limits.max_sequences).
absl::StatusOr<Plan> BalanceGreedy(const World& world, const CostModel& cost,
                                   const RankLengths& lengths,
                                   const BalancerOptions& options = BalancerOptions(),
                                   const RankMasks* masks = nullptr);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_BALANCER_H_
