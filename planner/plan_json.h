#ifndef KNAPFORMER_PLANNER_PLAN_JSON_H_
#define KNAPFORMER_PLANNER_PLAN_JSON_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/balancer.h"
#include "planner/cost_model.h"
#include "planner/machine.h"
#include "planner/plan.h"
#include "planner/step_time.h"

namespace knapformer {

// The input of `knapformer plan`:
//   {"topology": "g1n2+g2n1+g4n1", "d_model": 3072, "gamma": 0.49,
//    "token_bytes": 6144, "ranks": [[l, l, ...], ...],
//    "masks": [[mask, mask, ...], ...]}
// topology and ranks are required; d_model defaults to 3072, gamma to 0.49
// and token_bytes (what one token occupies in the route, for moved_bytes)
// to 2 * d_model: one bf16 hidden state per token. masks, optional, gives
// every sequence's attention mask (masks[r][i] for ranks[r][i], in the forms
// of mask_json.h); without it every sequence attends fully.
// measured_attention, {"pairs": [...], "work": [...]} as `knapformer
// calibrate --table` writes it, is the measured cost model's table: given
// exactly when the plan is made with that model. rank_speeds, optional, one
// relative speed per rank (planner/rank_speeds.h), plans by time: the
// answer's "before" and "after" are then of time against the ideal, its
// "rank_speeds" the speeds normalized to mean 1.
struct PlanRequest {
  // The largest token_bytes accepted: 16 MiB a token is far past any model
  // (d_model 65536 in float64 is 512 KiB), and keeps the products in range.
  static constexpr int64_t kMaxTokenBytes = int64_t{1} << 24;

  std::string topology;
  int64_t d_model = 3072;
  double gamma = 0.49;
  int64_t token_bytes = 2 * 3072;
  // What prices auto's communication ("machine": {"gpus_per_node": 4, ...};
  // a field left out keeps planner/machine.h's default).
  Machine machine;
  RankLengths ranks;
  RankMasks masks;  // empty: all full
  std::optional<MeasuredAttention> measured_attention;
  std::vector<double> rank_speeds;  // empty: one speed
};

// What `knapformer calibrate --table` writes: a cost table for one d_model,
//   {"cost_model": "measured", "d_model": 64, "k": ..., "gamma": ...,
//    "measured_attention": {"pairs": [...], "work": [...]}}
// k (seconds per unit of work) and gamma are the fit it was made with, for
// reading; the planner uses d_model and the table.
struct CostTable {
  int64_t d_model;
  double k;
  double gamma;
  MeasuredAttention attention;
};
std::string CostTableToJson(const CostTable& table);
// InvalidArgument naming `source` and the field for a malformed table.
absl::StatusOr<CostTable> ParseCostTable(absl::string_view json_text, absl::string_view source);

// Parses and checks the JSON text. InvalidArgument naming the field ("ranks[3][1]:
// ...") for malformed JSON, a missing or unknown field, or a wrong type or value.
absl::StatusOr<PlanRequest> ParsePlanRequest(absl::string_view json_text);

// The plan as JSON: topology, world_size, d_model, gamma, token_bytes, chunks
// [{src_rank, seq_index, offset, length, dst_rank}], gpu_workload and
// gpu_workload_before per rank, total_tokens, moved_tokens, moved_bytes and
// balance figures; with `predicted` (the FLOP cost models), predicted_step:
// one block's forward on the slowest GPU priced on request.machine
// (seconds, compute_seconds, ulysses_seconds, route_seconds, slowest_rank),
// a model, not a measurement.
std::string PlanToJson(const PlanRequest& request, const Plan& plan, double lower_bound,
                       const PredictedStep* predicted = nullptr);

// One rank's slice as JSON: sends, recvs, compute_chunk_lengths, ulysses,
// and attention_masks (what its attention sees) in a plan made with masks.
std::string RankPlanToJson(const RankPlan& slice);

// `knapformer plan` (and knapformer.plan in Python): parses the request,
// plans it under `cost_kind` and `options`, validates the plan, and returns
// PlanToJson, or RankPlanToJson of `rank` when one is given. InvalidArgument
// naming the field for a bad request (e.g. "ranks: 3 ranks is not a
// multiple of the group size 8 ..."), or "rank: ..." for a rank outside the
// world; the planner's errors otherwise.
absl::StatusOr<std::string> PlanRequestToJson(absl::string_view request_json, CostKind cost_kind,
                                              const BalancerOptions& options,
                                              std::optional<int64_t> rank = std::nullopt);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_PLAN_JSON_H_
