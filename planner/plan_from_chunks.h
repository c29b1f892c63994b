#ifndef KNAPFORMER_PLANNER_PLAN_FROM_CHUNKS_H_
#define KNAPFORMER_PLANNER_PLAN_FROM_CHUNKS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "planner/balancer.h"
#include "planner/cost_model.h"
#include "planner/plan.h"
#include "planner/topology.h"

namespace knapformer {

// The whole Plan (indexes, workloads under `cost`) of a chunk table another
// process solved: what a rank rebuilds from the table a group leader got
// from the planner service, so that it can take its own slice without
// solving. `chunks` must be in (src_rank, seq_index, offset) order, as
// Plan::chunks is. Internal naming the first problem unless the result is a
// valid plan of `lengths` on `world` (ValidatePlan): the table is someone
// else's, and a wrong one must never route a token. Cost O(S + C).
// `masks` (null or empty: all full) price the workloads. REQUIRES: masks
// accepted by CheckRankMasks (the ranks check their own where they enter
// them, PlannerClient::Plan; the table is checked here, the masks are not
// checked again).
absl::StatusOr<Plan> PlanFromChunks(const World& world, const CostModel& cost,
                                    const RankLengths& lengths, std::vector<Chunk> chunks,
                                    const RankMasks* masks = nullptr);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_PLAN_FROM_CHUNKS_H_
