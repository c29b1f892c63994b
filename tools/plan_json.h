#ifndef KNAPFORMER_TOOLS_PLAN_JSON_H_
#define KNAPFORMER_TOOLS_PLAN_JSON_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/balancer.h"
#include "planner/plan.h"

namespace knapformer {

// The input of `knapformer plan`:
//   {"topology": "g1n2+g2n1+g4n1", "d_model": 3072, "gamma": 0.49,
//    "ranks": [[l, l, ...], ...]}
// topology and ranks are required; d_model defaults to 3072 and gamma to 0.49.
struct PlanRequest {
  std::string topology;
  int64_t d_model = 3072;
  double gamma = 0.49;
  RankLengths ranks;
};

// Parses and checks the JSON text. InvalidArgument naming the field ("ranks[3][1]:
// ...") for malformed JSON, a missing or unknown field, or a wrong type or value.
absl::StatusOr<PlanRequest> ParsePlanRequest(absl::string_view json_text);

// The plan as JSON: topology, world_size, d_model, gamma, chunks
// [{src_rank, seq_index, offset, length, dst_rank}], gpu_workload and
// gpu_workload_before per rank, moved_tokens, total_tokens and balance figures.
std::string PlanToJson(const PlanRequest& request, const Plan& plan, double lower_bound);

// One rank's slice as JSON: sends, recvs, compute_chunk_lengths, ulysses.
std::string RankPlanToJson(const RankPlan& slice);

}  // namespace knapformer

#endif  // KNAPFORMER_TOOLS_PLAN_JSON_H_
