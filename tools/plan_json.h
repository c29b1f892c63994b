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
//    "token_bytes": 6144, "ranks": [[l, l, ...], ...]}
// topology and ranks are required; d_model defaults to 3072, gamma to 0.49
// and token_bytes (what one token occupies in the route, for moved_bytes)
// to 2 * d_model: one bf16 hidden state per token.
struct PlanRequest {
  // The largest token_bytes accepted: 16 MiB a token is far past any model
  // (d_model 65536 in float64 is 512 KiB), and keeps the products in range.
  static constexpr int64_t kMaxTokenBytes = int64_t{1} << 24;

  std::string topology;
  int64_t d_model = 3072;
  double gamma = 0.49;
  int64_t token_bytes = 2 * 3072;
  RankLengths ranks;
};

// Parses and checks the JSON text. InvalidArgument naming the field ("ranks[3][1]:
// ...") for malformed JSON, a missing or unknown field, or a wrong type or value.
absl::StatusOr<PlanRequest> ParsePlanRequest(absl::string_view json_text);

// The plan as JSON: topology, world_size, d_model, gamma, token_bytes, chunks
// [{src_rank, seq_index, offset, length, dst_rank}], gpu_workload and
// gpu_workload_before per rank, total_tokens, moved_tokens, moved_bytes and
// balance figures.
std::string PlanToJson(const PlanRequest& request, const Plan& plan, double lower_bound);

// One rank's slice as JSON: sends, recvs, compute_chunk_lengths, ulysses.
std::string RankPlanToJson(const RankPlan& slice);

}  // namespace knapformer

#endif  // KNAPFORMER_TOOLS_PLAN_JSON_H_
