#include "tools/simulate.h"

#include <chrono>
#include <cmath>
#include <map>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "planner/advice.h"
#include "planner/auto_layout.h"
#include "planner/balance_stats.h"
#include "planner/balancer.h"
#include "planner/cost_model.h"
#include "planner/data_stream.h"
#include "planner/masked_stream.h"
#include "planner/plan_from_chunks.h"
#include "planner/rank_speeds.h"
#include "planner/step_time.h"
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

struct Layout {
  std::string name;
  std::optional<World> fixed;
  AutoLayout automatic;
};

// One step's data; masks empty for the paper's streams.
struct StepData {
  RankLengths lengths;
  RankMasks masks;
};

// The true max/mean of `plan`, a plan of `world` made without masks: its
// chunk table re-priced with them.
absl::StatusOr<double> TrueMaxOverMean(const Plan& plan, const World& world,
                                       const CostModel& cost, const StepData& data) {
  KF_ASSIGN_OR_RETURN(const Plan priced,
                      PlanFromChunks(world, cost, data.lengths, plan.chunks, &data.masks));
  return ComputeBalanceStats(priced.workload_after).max_over_mean;
}

struct Baselines {
  double blind = 0;   // true max/mean of the mask-blind plan
  double tokens = 0;  // true max/mean of the token-count plan
};

// What planners that do not see the masks reach on a masked step, by the
// GPUs' true work: today's planner (the transformer cost) and one that
// balances token counts (the linear cost), on the layout the former chose.
absl::StatusOr<Baselines> MaskBlindBaselines(const Layout& layout, int64_t world_size,
                                             const CostModel& cost, const CommPrices& prices,
                                             const BalancerOptions& balancer_options,
                                             const StepData& data) {
  std::optional<Plan> blind;
  std::optional<AutoPlan> automatic;
  if (layout.fixed.has_value()) {
    KF_ASSIGN_OR_RETURN(blind,
                        BalanceGreedy(*layout.fixed, cost, data.lengths, balancer_options));
  } else {
    KF_ASSIGN_OR_RETURN(automatic, BalanceAuto(layout.automatic, world_size, cost, prices,
                                               data.lengths, balancer_options));
    blind = std::move(automatic->plan);
  }
  const World& world = automatic.has_value() ? automatic->world : *layout.fixed;
  KF_ASSIGN_OR_RETURN(const CostModel linear,
                      CostModel::Create(cost.d_model(), cost.gamma(), CostKind::kLinear));
  KF_ASSIGN_OR_RETURN(const Plan tokens,
                      BalanceGreedy(world, linear, data.lengths, balancer_options));
  Baselines out;
  KF_ASSIGN_OR_RETURN(out.blind, TrueMaxOverMean(*blind, world, cost, data));
  KF_ASSIGN_OR_RETURN(out.tokens, TrueMaxOverMean(tokens, world, cost, data));
  return out;
}

// InvalidArgument unless a masked stream in `phases` is the whole of --data
// and the cost model is the transformer's (the true work is priced by it).
absl::Status CheckMaskedData(const SimulateOptions& options,
                             const std::vector<std::string>& phases) {
  for (const std::string& phase : phases) {
    if (IsMaskedScenario(phase) && phases.size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--data: the masked stream ", phase, " cannot be a phase; give it alone"));
    }
  }
  if (IsMaskedScenario(options.data) && !PricedInFlops(options.cost_model)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cost-model ", CostKindName(options.cost_model), ": the masked stream ", options.data,
        " compares plans by the pairs they attend; use --cost-model transformer or measured"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> DataPhases(const SimulateOptions& options) {
  if (options.lengths.has_value()) return {options.data};
  const std::string& data = options.data;
  return absl::StrSplit(data == "curriculum" ? "low-res;mixed-res;joint" : data, ';');
}

absl::StatusOr<std::vector<TopologyResult>> Simulate(const SimulateOptions& options) {
  if (options.steps < 1 || options.steps > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--steps: must be in [1, 1000000], got ", options.steps));
  }
  std::vector<std::string> topologies = options.topologies;
  if (topologies.empty()) {
    topologies = HomogeneousSpecs(options.world, AutoLayout::kDefaultMaxBag);
    topologies.push_back("auto");
  }
  const std::vector<std::string> phases = DataPhases(options);
  if (static_cast<int64_t>(phases.size()) > options.steps) {
    return absl::InvalidArgumentError(absl::StrCat("--data: ", phases.size(),
                                                   " phases need at least as many --steps"));
  }
  std::optional<LengthsStream> user;
  if (options.lengths.has_value()) {
    auto stream = LengthsStream::Create(*options.lengths, options.world, options.batching,
                                        options.seed, options.shuffle);
    if (!stream.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--lengths: ", stream.status().message()));
    }
    user = *std::move(stream);
    if (options.lengths->masked > 0 && !PricedInFlops(options.cost_model)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--cost-model ", CostKindName(options.cost_model), ": ", options.data, " has masks ",
          "and is compared by the pairs they attend; use --cost-model transformer or measured"));
    }
  } else if (absl::Status checked = CheckMaskedData(options, phases); !checked.ok()) {
    return checked;
  }
  std::optional<MaskedStream> masked;
  if (!user.has_value() && IsMaskedScenario(options.data)) {
    auto stream = MaskedStream::Create(options.data, options.world, options.seed);
    if (!stream.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--world: ", stream.status().message()));
    }
    masked = *std::move(stream);
  }
  std::vector<DataStream> streams;
  // With masks: the plans priced and compared with them.
  const bool with_masks =
      masked.has_value() || (user.has_value() && options.lengths->masked > 0);
  for (const std::string& phase :
       masked.has_value() || user.has_value() ? std::vector<std::string>() : phases) {
    std::string codes = ScenarioCodes(phase);
    if (codes.empty()) codes = phase;
    auto parsed = ParseDataCodes(codes);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--data: ", parsed.status().message(),
                       " (or a scenario: low-res, mixed-res, joint, curriculum, "
                       "video-blockcausal, interleaved, llm-packed)"));
    }
    auto stream = DataStream::Create(*std::move(parsed), options.world, options.seed);
    if (!stream.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--world: ", stream.status().message()));
    }
    streams.push_back(*std::move(stream));
  }
  auto cost = CostModel::Create(
      options.d_model, options.gamma, options.cost_model,
      options.measured_attention.has_value() ? &*options.measured_attention : nullptr);
  if (!cost.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", cost.status().message()));
  }
  const int64_t token_bytes = options.TokenBytes();
  if (token_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--token-bytes: must be >= 0, got ", token_bytes));
  }
  // Communication is priced for the FLOP models only (transformer, measured).
  std::optional<CommPrices> prices;
  if (PricedInFlops(options.cost_model)) {
    auto created = CommPrices::Create(options.machine, *cost, token_bytes);
    if (!created.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--", created.status().message()));
    }
    prices = *std::move(created);
  }

  std::vector<Layout> layouts;
  for (const std::string& spec : topologies) {
    if (spec.empty()) {
      return absl::InvalidArgumentError(
          "--topology: an empty entry (give specs separated by commas, or leave the flag out "
          "for the world's defaults)");
    }
    Layout layout;
    if (AutoLayout::Matches(spec)) {
      auto parsed = AutoLayout::Parse(spec);
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("--", parsed.status().message()));
      }
      if (!prices.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--topology ", spec, ": auto prices communication, which needs --cost-model "
            "transformer"));
      }
      layout.automatic = *parsed;
      // Named by the bags it may use on this world (max_bag cut to what
      // divides a node, or the group).
      auto shape = parsed->Resolve(options.world, options.machine);
      if (!shape.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--topology ", spec, ": ", shape.status().message()));
      }
      layout.name = parsed->SpecOn(*shape);
    } else {
      auto topology = Topology::Parse(spec);
      if (!topology.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("--", topology.status().message()));
      }
      auto world = World::Create(*std::move(topology), options.world);
      if (!world.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--topology ", spec, ": ", world.status().message()));
      }
      layout.name = world->spec();
      layout.fixed = *std::move(world);
    }
    layouts.push_back(std::move(layout));
  }

  if (options.max_tokens_per_gpu < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-tokens-per-gpu: must be >= 0 (0 = no cap), got ", options.max_tokens_per_gpu));
  }
  if (absl::Status status = CheckRankSpeeds(options.rank_speeds, options.world, "--rank-speeds");
      !status.ok()) {
    return status;
  }
  const std::vector<double>& speeds = options.rank_speeds;
  const std::vector<double> normalized = NormalizedRankSpeeds(speeds);
  BalancerOptions balancer_options;
  balancer_options.greedy = options.greedy;
  balancer_options.refine_rounds = options.refine_rounds;
  balancer_options.locality = options.locality;
  balancer_options.max_tokens_per_gpu = options.max_tokens_per_gpu;
  // The same without speeds: the FLOP-balanced plan they are compared with.
  const BalancerOptions flops_options = balancer_options;
  balancer_options.rank_speeds = speeds;
  struct Samples {
    std::vector<double> wir_before, wir_after, mom_before, mom_after, bound, micros, moved,
        moved_tokens, moved_bytes, seconds, comm_share, seconds_before, blind_true, tokens_true,
        flops_balanced;
    std::vector<std::vector<double>> phase_seconds;
    std::vector<double> gpus_by_size = std::vector<double>(21, 0.0);
  };
  std::vector<Samples> samples(layouts.size());
  for (Samples& s : samples) s.phase_seconds.resize(phases.size());
  for (int64_t step = 0; step < options.steps; ++step) {
    const size_t phase = static_cast<size_t>(step * static_cast<int64_t>(phases.size()) /
                                             options.steps);
    StepData data;
    if (masked.has_value()) {
      MaskedStream::Step batch = masked->Batch(step);
      data = {std::move(batch.lengths), std::move(batch.masks)};
    } else if (user.has_value()) {
      LengthsStream::Step batch = user->Batch(step);
      data = {std::move(batch.lengths), std::move(batch.masks)};
    } else {
      data.lengths = streams[phase].Batch(step);
    }
    const RankLengths& lengths = data.lengths;
    // Null for the paper's streams: planned exactly as without masks.
    const RankMasks* masks = with_masks ? &data.masks : nullptr;
    for (size_t t = 0; t < layouts.size(); ++t) {
      const Layout& layout = layouts[t];
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<Plan> plan;
      std::optional<World> chosen_world;  // auto's layout of this step
      if (layout.fixed.has_value()) {
        plan = BalanceGreedy(*layout.fixed, *cost, lengths, balancer_options, masks);
      } else {
        auto chosen = BalanceAuto(layout.automatic, options.world, *cost, *prices, lengths,
                                  balancer_options, masks);
        if (chosen.ok()) {
          plan = std::move(chosen->plan);
          chosen_world = std::move(chosen->world);
        } else {
          plan = chosen.status();
        }
      }
      const auto stop = std::chrono::steady_clock::now();
      if (!plan.ok()) {
        return absl::Status(plan.status().code(),
                            absl::StrCat("step ", step, ", topology ", layout.name, ": ",
                                         plan.status().message()));
      }
      const World& world = chosen_world.has_value() ? *chosen_world : *layout.fixed;
      if (absl::Status valid = ValidatePlan(*plan, world, lengths); !valid.ok()) {
        return valid;
      }
      // With speeds, figures of time against the ideal.
      const auto [before, after] = BalanceOf(*plan, speeds);
      Samples& s = samples[t];
      if (!speeds.empty()) {
        absl::StatusOr<Plan> flops;
        std::optional<World> flops_world;
        if (layout.fixed.has_value()) {
          flops = BalanceGreedy(*layout.fixed, *cost, lengths, flops_options, masks);
        } else {
          auto chosen = BalanceAuto(layout.automatic, options.world, *cost, *prices, lengths,
                                    flops_options, masks);
          if (chosen.ok()) {
            flops = std::move(chosen->plan);
          } else {
            flops = chosen.status();
          }
        }
        if (!flops.ok()) {
          return absl::Status(flops.status().code(),
                              absl::StrCat("step ", step, ", topology ", layout.name,
                                           " (FLOP-balanced): ", flops.status().message()));
        }
        s.flops_balanced.push_back(
            ComputeTimeStats(TimePerRank(*flops, speeds), after.mean).max_over_mean);
      }
      s.wir_before.push_back(before.wir);
      s.wir_after.push_back(after.wir);
      s.mom_before.push_back(before.max_over_mean);
      s.mom_after.push_back(after.max_over_mean);
      s.bound.push_back(MaxOverMeanLowerBound(world, *cost, lengths, masks, speeds));
      s.micros.push_back(std::chrono::duration<double, std::micro>(stop - start).count());
      const int64_t total = plan->TotalTokens();
      const int64_t moved = plan->MovedTokens();
      s.moved.push_back(total > 0 ? static_cast<double>(moved) / total : 0.0);
      s.moved_tokens.push_back(static_cast<double>(moved));
      s.moved_bytes.push_back(static_cast<double>(plan->MovedBytes(token_bytes)));
      if (prices.has_value()) {
        const PredictedStep predicted =
            PredictStep(*plan, world, lengths, *cost, *prices, masks, normalized);
        const double seconds = predicted.time / options.machine.flops_per_second;
        s.seconds.push_back(seconds);
        s.phase_seconds[phase].push_back(seconds);
        s.comm_share.push_back(
            predicted.time > 0 ? (predicted.ulysses + predicted.route) / predicted.time : 0.0);
        s.seconds_before.push_back(before.max / options.machine.flops_per_second);
      }
      if (with_masks) {
        auto baselines =
            MaskBlindBaselines(layout, options.world, *cost, *prices, balancer_options, data);
        if (!baselines.ok()) {
          return absl::Status(baselines.status().code(),
                              absl::StrCat("step ", step, ", topology ", layout.name,
                                           " (mask-blind): ", baselines.status().message()));
        }
        s.blind_true.push_back(baselines->blind);
        s.tokens_true.push_back(baselines->tokens);
      }
      for (int32_t gpus : plan->bag_gpus) {
        int size_class = 0;
        while ((1 << (size_class + 1)) <= gpus && size_class < 20) ++size_class;
        s.gpus_by_size[size_class] +=
            static_cast<double>(gpus) / options.world / static_cast<double>(options.steps);
      }
    }
  }

  std::vector<TopologyResult> results;
  for (size_t t = 0; t < layouts.size(); ++t) {
    TopologyResult result;
    result.topology = layouts[t].name;
    result.wir_before = Summarize(samples[t].wir_before);
    result.wir_after = Summarize(samples[t].wir_after);
    result.max_over_mean_before = Summarize(samples[t].mom_before);
    result.max_over_mean_after = Summarize(samples[t].mom_after);
    result.lower_bound = Summarize(samples[t].bound);
    result.plan_micros = Summarize(samples[t].micros);
    result.moved_fraction = Summarize(samples[t].moved);
    result.moved_tokens = Summarize(samples[t].moved_tokens);
    result.moved_bytes = Summarize(samples[t].moved_bytes);
    result.predicted = prices.has_value();
    result.step_seconds = Summarize(samples[t].seconds);
    result.comm_share = Summarize(samples[t].comm_share);
    result.step_seconds_before = Summarize(samples[t].seconds_before);
    for (const std::vector<double>& phase : samples[t].phase_seconds) {
      result.phase_step_seconds.push_back(Summarize(phase));
    }
    result.masked = with_masks;
    if (result.masked) {
      result.masked_true = result.max_over_mean_after;
      result.blind_true = Summarize(samples[t].blind_true);
      result.tokens_true = Summarize(samples[t].tokens_true);
    }
    result.flops_balanced = Summarize(samples[t].flops_balanced);
    result.gpus_in_bags_of_size = samples[t].gpus_by_size;
    while (!result.gpus_in_bags_of_size.empty() && result.gpus_in_bags_of_size.back() == 0) {
      result.gpus_in_bags_of_size.pop_back();
    }
    results.push_back(result);
  }
  return results;
}

namespace {

// WIR, max/mean and the bound of each topology: the paper's streams.
std::string BalanceTable(const std::vector<TopologyResult>& results) {
  std::string out;
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

// With rank speeds: each layout's plan by time against the same layout's
// FLOP-balanced plan, both timed on the speeds.
std::string SpeedTable(const std::vector<TopologyResult>& results) {
  std::string out =
      "\nby time on these speeds: the plans above (speed-aware) and the plans made without "
      "the speeds (FLOP-balanced)\n";
  constexpr char kRow[] = "%-16s %-12s %-8s %-14s %s\n";
  absl::StrAppend(&out, absl::StrFormat(kRow, "topology", "speed-aware", "bound",
                                        "FLOP-balanced", "speed-aware buys"));
  for (const TopologyResult& r : results) {
    absl::StrAppend(
        &out, absl::StrFormat(kRow, r.topology, Ratio(r.max_over_mean_after.mean),
                              Ratio(r.lower_bound.mean), Ratio(r.flops_balanced.mean),
                              absl::StrFormat("%.3fx", r.flops_balanced.mean /
                                                           r.max_over_mean_after.mean)));
  }
  return out;
}

// The true max/mean of the plans made by token counts, mask-blind and with
// the masks: the masked streams.
std::string MaskedTable(const std::vector<TopologyResult>& results) {
  std::string out =
      "true max/mean = max/mean of the per-GPU work priced with the masks, of plans made by\n"
      "token counts (linear cost), mask-blind (transformer cost, no masks) and with the masks;\n"
      "all other figures are of the plans made with the masks\n\n";
  constexpr char kRow[] = "%-16s %-9s %-9s %-10s %-20s %-8s %-7s %-8s %-8s %s\n";
  absl::StrAppend(&out, absl::StrFormat(kRow, "topology", "max/mean", "true", "true",
                                        "true max/mean", "bound", "moved", "moved", "moved",
                                        "plan us"));
  absl::StrAppend(&out, absl::StrFormat(kRow, "", "before", "tokens", "mask-blind",
                                        "masked (mean ^max)", "", "share", "tok/step", "B/step",
                                        "mean/max"));
  for (const TopologyResult& r : results) {
    absl::StrAppend(
        &out, absl::StrFormat(kRow, r.topology, Ratio(r.max_over_mean_before.mean),
                              Ratio(r.tokens_true.mean), Ratio(r.blind_true.mean),
                              absl::StrCat(Ratio(r.masked_true.mean), " ^",
                                           Ratio(r.masked_true.max)),
                              Ratio(r.lower_bound.mean),
                              absl::StrFormat("%.1f%%", 100 * r.moved_fraction.mean),
                              Decimal(r.moved_tokens.mean), Decimal(r.moved_bytes.mean),
                              absl::StrFormat("%.0f/%.0f", r.plan_micros.mean,
                                              r.plan_micros.max)));
  }
  return out;
}

// Which row to use, by predicted step time (planner/advice.h), what it
// buys against the same step without balancing, and the trainer's
// arguments that plan as simulate planned.
std::string Advice(const SimulateOptions& options, const std::vector<TopologyResult>& results) {
  std::vector<AdviceRow> rows;
  for (const TopologyResult& r : results) {
    rows.push_back({r.topology, CostKindName(options.cost_model), r.step_seconds.mean,
                    r.step_seconds_before.mean});
  }
  AdviceWording wording;
  wording.seconds_note = " (predicted for the machine above)";
  wording.baseline = "the same step without balancing";
  const std::string machine = MachineArgument(options.machine);
  wording.trainer_arguments = absl::StrCat("gamma=", absl::StrFormat("%.10g", options.gamma),
                                           machine.empty() ? "" : ", ", machine);
  if (!options.cost_table_path.empty()) {
    // A Python string literal (CEscape's escapes are Python's too); a table
    // read from standard input has no file to name.
    wording.measured_arguments = absl::StrCat(
        "cost_table=json.load(open(\"",
        options.cost_table_path == "-" ? "<the table given on stdin, saved to a file>"
                                       : absl::CEscape(options.cost_table_path),
        "\"))");
  }
  const std::string line = TopologyAdvice(rows, wording);
  return line.empty() ? "" : absl::StrCat("\n", line, "\n");
}

// Each topology's predicted step time: what a user picks a topology by.
std::string PredictedTable(const SimulateOptions& options,
                           const std::vector<TopologyResult>& results) {
  std::string out;
  const std::vector<std::string> phases = DataPhases(options);
  const Machine& m = options.machine;
  absl::StrAppend(
      &out, "\npredicted time of one block's forward pass on the slowest GPU (compute + Ulysses + "
            "route; ",
      absl::StrFormat("%.4g", m.flops_per_second / 1e12), " TFLOP/s, ",
      absl::StrFormat("%.4g", m.intra_node_bytes_per_second / 1e9), " GB/s in a node of ",
      m.gpus_per_node, ", ", absl::StrFormat("%.4g", m.inter_node_bytes_per_second / 1e9),
      " GB/s across, ", m.element_bytes, "-byte elements, route over ", m.blocks_per_route,
      " blocks); x = against the best row",
      results.front().masked ? "; the plans made with the masks, priced with them" : "",
      "\n");
  double best = 0;
  std::vector<double> phase_best(phases.size(), 0.0);
  for (const TopologyResult& r : results) {
    if (best == 0 || r.step_seconds.mean < best) best = r.step_seconds.mean;
    for (size_t p = 0; p < phases.size() && p < r.phase_step_seconds.size(); ++p) {
      const double v = r.phase_step_seconds[p].mean;
      if (phase_best[p] == 0 || v < phase_best[p]) phase_best[p] = v;
    }
  }
  auto timed = [](double seconds, double against) {
    return absl::StrFormat("%.1fus %.3fx", seconds * 1e6, against > 0 ? seconds / against : 1.0);
  };
  std::string header = absl::StrFormat("%-16s %-17s %-6s %-11s %-6s", "topology",
                                       "whole stream", "comm", "unbalanced", "buys");
  if (phases.size() > 1) {
    for (const std::string& phase : phases) {
      absl::StrAppend(&header, absl::StrFormat(" %-17s", phase.substr(0, 17)));
    }
  }
  absl::StrAppend(&out, header, " GPUs in bags of 1/2/4/8/...\n");
  for (const TopologyResult& r : results) {
    std::string row = absl::StrFormat(
        "%-16s %-17s %-6s %-11s %-6s", r.topology, timed(r.step_seconds.mean, best),
        absl::StrFormat("%.1f%%", 100 * r.comm_share.mean),
        absl::StrFormat("%.1fus", r.step_seconds_before.mean * 1e6),
        absl::StrFormat("%.2fx", r.step_seconds.mean > 0
                                     ? r.step_seconds_before.mean / r.step_seconds.mean
                                     : 1.0));
    if (phases.size() > 1) {
      for (size_t p = 0; p < phases.size(); ++p) {
        absl::StrAppend(&row, absl::StrFormat(" %-17s", timed(r.phase_step_seconds[p].mean,
                                                              phase_best[p])));
      }
    }
    std::string bags;
    for (size_t size = 0; size < r.gpus_in_bags_of_size.size(); ++size) {
      absl::StrAppend(&bags, size ? "/" : " ",
                      absl::StrFormat("%.0f%%", 100 * r.gpus_in_bags_of_size[size]));
    }
    absl::StrAppend(&out, row, bags, "\n");
  }
  absl::StrAppend(&out, Advice(options, results));
  return out;
}

// The header's line on the speeds: how many GPUs at each speed.
std::string SpeedsLine(const std::vector<double>& speeds) {
  std::map<double, int64_t> count;
  for (double s : speeds) ++count[s];
  std::string out = "rank speeds ";
  bool first = true;
  for (const auto& [speed, ranks] : count) {
    absl::StrAppend(&out, first ? "" : ", ", absl::StrFormat("%g", speed), " x", ranks);
    first = false;
  }
  absl::StrAppend(&out, ": plans balance time (workload / speed; a bag at its slowest GPU's "
                        "pace), and WIR, max/mean and bound are of time against the ideal, "
                        "total workload / total speed\n");
  return out;
}

}  // namespace

std::string FormatSimulation(const SimulateOptions& options,
                             const std::vector<TopologyResult>& results) {
  // The codes of a paper's scenario, or what a masked stream holds.
  std::string codes;
  if (options.lengths.has_value()) {
    const LengthsFile& file = *options.lengths;
    codes = absl::StrCat(file.samples.size(), " samples",
                         file.masked > 0 ? absl::StrCat(", ", file.masked, " with masks") : "",
                         "; ", options.batching.ToString(), ", ",
                         options.shuffle ? absl::StrCat("shuffled with seed ", options.seed)
                                         : "in the file's order");
    const int64_t over = options.batching.tokens_per_gpu > 0
                             ? file.SamplesLongerThan(options.batching.tokens_per_gpu)
                             : 0;
    if (over > 0) absl::StrAppend(&codes, "; ", over, " samples over the budget, each alone");
  } else {
    codes = ScenarioCodes(options.data);
    if (codes.empty()) codes = MaskedScenarioSummary(options.data);
  }
  std::string out = absl::StrCat(
      "data ", options.data, codes.empty() ? "" : absl::StrCat(" (", codes, ")"),
      "\nworld ", options.world, ", ", options.steps, " steps, seed ", options.seed,
      ", cost model ", CostKindName(options.cost_model), ", d_model ", options.d_model,
      options.measured_attention.has_value()
          ? absl::StrCat(" (attention measured at ", options.measured_attention->pairs().size(),
                         " sizes)")
          : absl::StrCat(", gamma ", options.gamma),
      ", greedy ", GreedyRuleName(options.greedy), ", refine rounds ", options.refine_rounds,
      options.greedy == GreedyRule::kLeastOccupied && options.refine_rounds == 0 &&
              !options.locality
          ? " (the paper's greedy)"
          : "",
      ", locality ", options.locality ? "on" : "off",
      options.max_tokens_per_gpu > 0
          ? absl::StrCat(", at most ", options.max_tokens_per_gpu, " tokens per GPU")
          : "",
      "\n", "token bytes ", options.TokenBytes(),
      options.token_bytes.has_value() ? "" : " (2 x d_model: one bf16 hidden state)",
      "; moved = sent to another rank by the route (the reverse route sends it back)\n",
      "figures: mean ±std ^max over steps; WIR = max/min per-GPU workload; "
      "bound = lowest max/mean any plan can reach\n",
      options.rank_speeds.empty() ? "" : SpeedsLine(options.rank_speeds), "\n");
  const bool masked = !results.empty() && results.front().masked;
  absl::StrAppend(&out, masked ? MaskedTable(results) : BalanceTable(results));
  if (!options.rank_speeds.empty()) absl::StrAppend(&out, SpeedTable(results));
  if (results.empty() || !results.front().predicted) return out;
  absl::StrAppend(&out, PredictedTable(options, results));
  return out;
}

}  // namespace knapformer
