#ifndef KNAPFORMER_TOOLS_SIMULATE_H_
#define KNAPFORMER_TOOLS_SIMULATE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/balancer.h"
#include "planner/lengths_file.h"
#include "planner/machine.h"

namespace knapformer {

struct SimulateOptions {
  // A scenario name or comma-separated data codes; phases of a stream that
  // changes over the steps joined by ';' (each takes an equal share of the
  // steps, in order), or "curriculum" (low-res;mixed-res;joint). Or, alone,
  // a masked stream (planner/masked_stream.h: video-blockcausal,
  // interleaved, llm-packed), which needs the transformer cost model and
  // adds the comparison of TopologyResult's masked fields.
  std::string data = "mixed-res";
  // A user's own data instead (planner/lengths_file.h; `simulate --lengths
  // FILE`): its samples, dealt and batched as the user's loader does, one
  // phase; `data` then names the file. Masks in the file make it a masked
  // stream (the transformer cost model, the masked comparison).
  std::optional<LengthsFile> lengths;
  LoaderBatching batching;  // exactly one field > 0 with `lengths`
  bool shuffle = true;
  int64_t world = 32;
  // Fixed specs and "auto" layouts (planner/auto_layout.h). Empty: the
  // world's one-size layouts up to bags of 8 (HomogeneousSpecs), and auto.
  std::vector<std::string> topologies;
  // Prices the communication of the predicted step time (transformer model
  // only); auto chooses layouts with it.
  Machine machine;
  int64_t steps = 20;
  uint64_t seed = 0;
  int64_t d_model = 3072;
  double gamma = 0.49;
  GreedyRule greedy = BalancerOptions().greedy;
  // 0, with greedy kLeastOccupied and locality off = the paper's greedy exactly.
  int32_t refine_rounds = BalancerOptions().refine_rounds;
  bool locality = BalancerOptions().locality;
  int64_t max_tokens_per_gpu = 0;  // 0 = no cap
  CostKind cost_model = CostKind::kTransformer;
  // With kMeasured: its table (--cost-table, what calibrate --table wrote).
  std::optional<MeasuredAttention> measured_attention;
  // The file --cost-table named: the advice's trainer arguments load it.
  std::string cost_table_path;
  // Bytes one token occupies in the route's all-to-all, for the moved-bytes
  // figures; unset = 2 * d_model (one bf16 hidden state per token).
  std::optional<int64_t> token_bytes;
  // Relative speed per GPU (planner/rank_speeds.h; --rank-speeds): plans
  // balance time, and every figure is of time, workload over speed, against
  // the ideal (total workload over total speed). Empty: one speed.
  std::vector<double> rank_speeds;

  int64_t TokenBytes() const { return token_bytes.value_or(2 * d_model); }
};

// Mean, population standard deviation and maximum over steps.
struct Summary {
  double mean = 0;
  double stddev = 0;
  double max = 0;
};

struct TopologyResult {
  std::string topology;          // canonical spec
  Summary wir_before;            // max/min per GPU without balancing
  Summary wir_after;             // with the greedy plan
  Summary max_over_mean_before;
  Summary max_over_mean_after;
  Summary lower_bound;           // best max/mean any plan could reach
  Summary plan_micros;           // wall time of one BalanceGreedy call
  Summary moved_fraction;        // tokens sent to another rank / all tokens
  Summary moved_tokens;          // tokens sent to another rank, per step
  Summary moved_bytes;           // moved_tokens * token bytes, per step (one way)
  // Predicted time of one transformer block's forward pass on the slowest
  // GPU, compute + Ulysses + route (planner/step_time.h), in seconds, and
  // that GPU's communication share; empty without the transformer model.
  bool predicted = false;
  Summary step_seconds;
  Summary comm_share;
  // The same without balancing: the slowest GPU's compute on its own
  // sequences (nothing moves), so step_seconds_before / step_seconds is what
  // balancing on this topology buys.
  Summary step_seconds_before;
  // The same per phase of the data (one entry per phase).
  std::vector<Summary> phase_step_seconds;
  // Share of the GPUs in bags of each size (index log2 G), mean over steps.
  std::vector<double> gpus_in_bags_of_size;
  // Masked streams only (planner/masked_stream.h): the true max/mean, the
  // per-GPU work priced with the masks, of three plans of each step: made
  // with the masks (what every figure above is about, so masked_true ==
  // max_over_mean_after), mask-blind (the transformer cost without masks)
  // and by token counts (the linear cost). Under auto the token-count plan
  // takes the layout the mask-blind auto chose: without the transformer
  // cost it has no step time to choose one by.
  bool masked = false;
  Summary masked_true;
  Summary blind_true;
  Summary tokens_true;
  // With rank speeds: the max/mean by time of the plan made without them
  // (balanced by FLOPs) on the same layout, beside max_over_mean_after.
  Summary flops_balanced;
};

// The phases of the data: SimulateOptions::data's ';'-separated parts, with
// "curriculum" standing for low-res;mixed-res;joint; a lengths file is one.
std::vector<std::string> DataPhases(const SimulateOptions& options);

// Runs the greedy planner on `steps` batches of the data stream for every
// topology, validating each plan (an invalid plan is an Internal error).
// InvalidArgument for a bad option, naming it; a planner error (a token cap
// no placement meets) names the step and topology.
absl::StatusOr<std::vector<TopologyResult>> Simulate(const SimulateOptions& options);

// The human-readable table printed by `knapformer simulate`.
std::string FormatSimulation(const SimulateOptions& options,
                             const std::vector<TopologyResult>& results);

}  // namespace knapformer

#endif  // KNAPFORMER_TOOLS_SIMULATE_H_
