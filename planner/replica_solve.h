#ifndef KNAPFORMER_PLANNER_REPLICA_SOLVE_H_
#define KNAPFORMER_PLANNER_REPLICA_SOLVE_H_

// The balancer's two phases as separate steps, for planners that choose each
// replica's topology themselves (auto_layout.h): phase 1 per replica, then
// one plan for the whole world. REQUIRES of every function: its lengths and
// masks are a BalancerInput's (checked once, balancer_input.h).

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "planner/attention_mask.h"
#include "planner/balancer_options.h"
#include "planner/cost_model.h"
#include "planner/plan.h"
#include "planner/sequence_table.h"
#include "planner/topology.h"

namespace knapformer {
namespace internal {

// Global id of each rank's first sequence (rank-major), and the total last.
std::vector<int32_t> FirstSequences(const RankLengths& lengths);

// Phase 1 of BalanceGreedy for the replica of `topology` that starts at
// `first_rank`, whose sequences SortReplicaSequences (replica_packer.h)
// gave as `sorted`: sets bag_of[id], for every non-empty sequence id of
// its ranks, to a bag id of `topology` (replica-relative), and returns the
// chunks that placement makes (BuildPlan's num_chunks, summed over the
// replicas). ResourceExhausted naming the sequence that fits under no
// bag's token cap.
absl::StatusOr<int64_t> AssignReplicaBags(const Topology& topology,
                                          const BalancerOptions& options,
                                          SortedSequences sorted, int32_t first_rank,
                                          const std::vector<int32_t>& first_sequence,
                                          std::vector<int32_t>& bag_of);

// A plan of `world` with no sequences yet: its size, layout spec and global
// bag tables (bag_first_rank, bag_gpus).
Plan EmptyPlanOf(const World& world);

// Sets plan.workload_after: each rank's `tokens_after` priced once
// (cost.Linear), plus its 1/G of its bag's `bag_attention`. BuildPlan and
// PlanFromChunks both end with it, so a plan and its rebuild from the chunk
// table agree to the bit. REQUIRES: plan's bag tables set (EmptyPlanOf),
// one entry of tokens_after per rank and of bag_attention per bag.
void PriceWorkloadAfter(const CostModel& cost, const std::vector<int64_t>& tokens_after,
                        const std::vector<double>& bag_attention, Plan& plan);

// Phase 2: the plan (chunks, workloads, indexes) of replica-relative bags
// `bag_of` on `world`, `masks` pricing the workloads; `num_chunks` is what
// AssignReplicaBags returned for those bags, summed (counted there from
// the packer's contiguous table: a pass over every rank's lengths here was
// 6% of planning masked data in g8 at 65,536 GPUs). A count that does not
// match is an internal error, never a write past the table. plan.masks is left
// empty for the caller to fill: by a move where it owns the input (one
// copy of every mask less, 9% of planning masked data in g1 at 65,536
// GPUs was copying them twice). The chunk table comes from
// options.chunk_tables when it has one with room. ResourceExhausted past
// options.limits.max_chunks.
absl::StatusOr<Plan> BuildPlan(const World& world, const CostModel& cost,
                               const RankLengths& lengths, const BalancerOptions& options,
                               std::vector<int32_t> first_sequence,
                               const std::vector<int32_t>& bag_of, int64_t num_chunks,
                               const RankMasks* masks = nullptr);

}  // namespace internal
}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_REPLICA_SOLVE_H_
