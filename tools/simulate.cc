#include "tools/simulate.h"

#include <chrono>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "planner/balance_stats.h"
#include "planner/balancer.h"
#include "planner/cost_model.h"
#include "planner/data_stream.h"
#include "planner/topology.h"
#include "planner/validate.h"

namespace knapformer {
namespace {

Summary Summarize(const std::vector<double>& values) {
  Summary summary;
  if (values.empty()) return summary;
  double sum = 0;
  summary.max = values[0];
  for (double v : values) {
    sum += v;
    summary.max = std::max(summary.max, v);
  }
  summary.mean = sum / values.size();
  double squares = 0;
  for (double v : values) squares += (v - summary.mean) * (v - summary.mean);
  summary.stddev = std::sqrt(squares / values.size());
  return summary;
}

std::string Ratio(double value) {
  return std::isfinite(value) ? absl::StrFormat("%.4f", value) : std::string("inf");
}

// 1234567 -> "1.23M": decimal prefixes, three significant digits.
std::string Decimal(double value) {
  const char* prefixes[] = {"", "k", "M", "G", "T", "P"};
  int p = 0;
  while (std::abs(value) >= 999.5 && p < 5) {
    value /= 1000;
    ++p;
  }
  return absl::StrCat(absl::StrFormat(p == 0 ? "%.0f" : "%.3g", value), prefixes[p]);
}

std::string Cell(const Summary& s) {
  return absl::StrCat(Ratio(s.mean), " ±", Ratio(s.stddev), " ^", Ratio(s.max));
}

}  // namespace

absl::StatusOr<std::vector<TopologyResult>> Simulate(const SimulateOptions& options) {
  if (options.steps < 1 || options.steps > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--steps: must be in [1, 1000000], got ", options.steps));
  }
  if (options.topologies.empty()) {
    return absl::InvalidArgumentError("--topology: at least one topology is required");
  }
  std::string codes = ScenarioCodes(options.data);
  if (codes.empty()) codes = options.data;
  auto parsed = ParseDataCodes(codes);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--data: ", parsed.status().message(), " (or a scenario: low-res, mixed-res, joint)"));
  }
  auto stream = DataStream::Create(*std::move(parsed), options.world, options.seed);
  if (!stream.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--world: ", stream.status().message()));
  }
  auto cost = CostModel::Create(options.d_model, options.gamma, options.cost_model);
  if (!cost.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", cost.status().message()));
  }

  std::vector<World> worlds;
  for (const std::string& spec : options.topologies) {
    auto topology = Topology::Parse(spec);
    if (!topology.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--", topology.status().message()));
    }
    auto world = World::Create(*std::move(topology), options.world);
    if (!world.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--topology ", spec, ": ", world.status().message()));
    }
    worlds.push_back(*std::move(world));
  }

  if (options.max_tokens_per_gpu < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-tokens-per-gpu: must be >= 0 (0 = no cap), got ", options.max_tokens_per_gpu));
  }
  const int64_t token_bytes = options.TokenBytes();
  if (token_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--token-bytes: must be >= 0, got ", token_bytes));
  }
  BalancerOptions balancer_options;
  balancer_options.refine_rounds = options.refine_rounds;
  balancer_options.locality = options.locality;
  balancer_options.max_tokens_per_gpu = options.max_tokens_per_gpu;
  struct Samples {
    std::vector<double> wir_before, wir_after, mom_before, mom_after, bound, micros, moved,
        moved_tokens, moved_bytes;
  };
  std::vector<Samples> samples(worlds.size());
  for (int64_t step = 0; step < options.steps; ++step) {
    const RankLengths lengths = stream->Batch(step);
    for (size_t t = 0; t < worlds.size(); ++t) {
      const auto start = std::chrono::steady_clock::now();
      auto plan = BalanceGreedy(worlds[t], *cost, lengths, balancer_options);
      const auto stop = std::chrono::steady_clock::now();
      if (!plan.ok()) {
        return absl::Status(plan.status().code(),
                            absl::StrCat("step ", step, ", topology ", worlds[t].topology().spec(),
                                         ": ", plan.status().message()));
      }
      if (absl::Status valid = ValidatePlan(*plan, worlds[t], lengths); !valid.ok()) {
        return valid;
      }
      const BalanceStats before = ComputeBalanceStats(plan->workload_before);
      const BalanceStats after = ComputeBalanceStats(plan->workload_after);
      Samples& s = samples[t];
      s.wir_before.push_back(before.wir);
      s.wir_after.push_back(after.wir);
      s.mom_before.push_back(before.max_over_mean);
      s.mom_after.push_back(after.max_over_mean);
      s.bound.push_back(MaxOverMeanLowerBound(worlds[t], *cost, lengths));
      s.micros.push_back(std::chrono::duration<double, std::micro>(stop - start).count());
      const int64_t total = plan->TotalTokens();
      const int64_t moved = plan->MovedTokens();
      s.moved.push_back(total > 0 ? static_cast<double>(moved) / total : 0.0);
      s.moved_tokens.push_back(static_cast<double>(moved));
      s.moved_bytes.push_back(static_cast<double>(plan->MovedBytes(token_bytes)));
    }
  }

  std::vector<TopologyResult> results;
  for (size_t t = 0; t < worlds.size(); ++t) {
    TopologyResult result;
    result.topology = worlds[t].topology().spec();
    result.wir_before = Summarize(samples[t].wir_before);
    result.wir_after = Summarize(samples[t].wir_after);
    result.max_over_mean_before = Summarize(samples[t].mom_before);
    result.max_over_mean_after = Summarize(samples[t].mom_after);
    result.lower_bound = Summarize(samples[t].bound);
    result.plan_micros = Summarize(samples[t].micros);
    result.moved_fraction = Summarize(samples[t].moved);
    result.moved_tokens = Summarize(samples[t].moved_tokens);
    result.moved_bytes = Summarize(samples[t].moved_bytes);
    results.push_back(result);
  }
  return results;
}

std::string FormatSimulation(const SimulateOptions& options,
                             const std::vector<TopologyResult>& results) {
  std::string codes = ScenarioCodes(options.data);
  std::string out = absl::StrCat(
      "data ", options.data, codes.empty() ? "" : absl::StrCat(" (", codes, ")"),
      "\nworld ", options.world, ", ", options.steps, " steps, seed ", options.seed,
      ", cost model ", CostKindName(options.cost_model), ", d_model ", options.d_model,
      ", gamma ", options.gamma, ", refine rounds ",
      options.refine_rounds,
      options.refine_rounds == 0 && !options.locality ? " (the paper's greedy)" : "",
      ", locality ", options.locality ? "on" : "off",
      options.max_tokens_per_gpu > 0
          ? absl::StrCat(", at most ", options.max_tokens_per_gpu, " tokens per GPU")
          : "",
      "\n", "token bytes ", options.TokenBytes(),
      options.token_bytes.has_value() ? "" : " (2 x d_model: one bf16 hidden state)",
      "; moved = sent to another rank by the route (the reverse route sends it back)\n",
      "figures: mean ±std ^max over steps; WIR = max/min per-GPU workload; "
      "bound = lowest max/mean any plan can reach\n\n");
  constexpr char kRow[] = "%-16s %-30s %-30s %-10s %-10s %-8s %-7s %-8s %-8s %s\n";
  absl::StrAppend(&out, absl::StrFormat(kRow, "topology", "WIR before", "WIR after", "max/mean",
                                        "max/mean", "bound", "moved", "moved", "moved",
                                        "plan us"));
  absl::StrAppend(&out, absl::StrFormat(kRow, "", "", "", "before", "after", "", "share",
                                        "tok/step", "B/step", "mean/max"));
  for (const TopologyResult& r : results) {
    absl::StrAppend(
        &out, absl::StrFormat(kRow, r.topology, Cell(r.wir_before), Cell(r.wir_after),
                              Ratio(r.max_over_mean_before.mean),
                              Ratio(r.max_over_mean_after.mean), Ratio(r.lower_bound.mean),
                              absl::StrFormat("%.1f%%", 100 * r.moved_fraction.mean),
                              Decimal(r.moved_tokens.mean), Decimal(r.moved_bytes.mean),
                              absl::StrFormat("%.0f/%.0f", r.plan_micros.mean,
                                              r.plan_micros.max)));
  }
  return out;
}

}  // namespace knapformer
