// The planning-latency curve: per step planning time (mean and p99) and plan
// quality of every layout family from 32 to 65,536 GPUs, on plain and masked
// data. Figures only, nothing is asserted (docs/planner.md publishes them).
//
//   bazel build -c opt //bench:planner_curve && bazel-bin/bench/planner_curve
//     [--min-gpus 32] [--max-gpus 65536] [--families g1,g2,g4,g8,mixed,auto]
//     [--data plain,masked] [--threads 1] [--refine-rounds 256] [--locality on]
//     [--greedy earliest-finish]
//
// --threads N lets the solver use N threads (BalancerOptions::threads:
// auto's candidate layouts at once; the plans are the same for any N).
//
// The data: 4 samples per GPU, as a loader of mixed captions, images and
// video clips deals them: 35% captions (16..400 tokens), 50% images (256,
// 1024, 4096 or 16384 visual tokens, aspect 0.96..1.04, and a caption of up
// to 392 tokens), 15% video clips (a caption prefix of 32..256 tokens, then
// 16..32 latent frames of 256, 1024 or 2304 tokens). "masked" gives the
// captions a causal mask and the clips MAGI-1's block-causal one (the
// prefix causal, then one full span per chunk of 6 frames, each attending
// to everything before it); "plain" is the same lengths, all attending
// fully. Step s of rank r depends only on (seed, s, r).
//
// Each row plans `steps` distinct steps (fewer as the world grows, at least
// 8) after one untimed warm-up, timing what the service does with a step's
// input: its check (BalancerInput::Check, the step's lengths and masks
// moved in) and BalanceGreedy / BalanceAuto taking it (its masks move into
// the plan), each plan's chunk table given back to a ChunkTableCache for
// the next (what the service does once it has answered; outside the
// time). `knapformer simulate` keeps each step's input for its next
// layout, so it times a copy of it too. Columns: mean and p99 (nearest
// rank) of the step's planning time, the mean over this family's previous
// row (the doubling ratio), the plan's max/mean per-GPU workload (mean over
// steps), the lower bound of max/mean any plan could reach
// (MaxOverMeanLowerBound; for auto, of the layout it chose), and the tokens
// moved to other ranks.

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/args.h"
#include "common/malloc_policy.h"
#include "common/sample_stats.h"
#include "planner/auto_layout.h"
#include "planner/balance_stats.h"
#include "planner/balancer.h"
#include "planner/chunk_table_cache.h"
#include "planner/cost_model.h"
#include "planner/machine.h"
#include "planner/splitmix64.h"
#include "planner/topology.h"

namespace knapformer {
namespace {

constexpr int64_t kSamplesPerGpu = 4;
constexpr int64_t kDModel = 3072;
constexpr double kGamma = 0.49;
// Planned GPUs per row (steps x GPUs), so that the whole curve takes minutes
// (the bound, computed beside each plan, costs more than the plan): 200
// steps up to 2048 GPUs, 8 at 65,536.
constexpr int64_t kGpuStepsPerRow = 1 << 19;
constexpr int64_t kMinSteps = 8;
constexpr int64_t kMaxSteps = 200;

constexpr int64_t kVisualTokens[] = {256, 1024, 4096, 16384};
constexpr int64_t kFrameTokens[] = {256, 1024, 2304};
constexpr int64_t kFramesPerChunk = 6;

struct Step {
  RankLengths lengths;
  RankMasks masks;  // empty for plain data
};

// One sample's tokens, and its mask when masked.
int64_t DrawSample(SplitMix64& rng, bool masked, AttentionMask& mask) {
  const double kind = rng.Uniform();
  mask = AttentionMask::Full();
  if (kind < 0.35) {
    if (masked) mask = AttentionMask::Causal();
    return 16 + static_cast<int64_t>(rng.Below(385));
  }
  if (kind < 0.85) {
    const int64_t visual = kVisualTokens[rng.Below(4)];
    const double aspect = 0.96 + 0.08 * rng.Uniform();
    return static_cast<int64_t>(static_cast<double>(visual) * aspect) +
           static_cast<int64_t>(rng.Below(393));
  }
  const int64_t prefix = 32 + static_cast<int64_t>(rng.Below(225));
  const int64_t frames = 16 + static_cast<int64_t>(rng.Below(17));
  const int64_t frame_tokens = kFrameTokens[rng.Below(3)];
  if (masked) {
    std::vector<MaskSpan> spans = {{prefix, /*causal=*/true}};
    for (int64_t f = 0; f < frames; f += kFramesPerChunk) {
      spans.push_back({std::min(kFramesPerChunk, frames - f) * frame_tokens, false});
    }
    mask = AttentionMask::Spans(std::move(spans));
  }
  return prefix + frames * frame_tokens;
}

Step MakeStep(int64_t gpus, int64_t step, bool masked, uint64_t seed) {
  Step out;
  out.lengths.resize(gpus);
  if (masked) out.masks.resize(gpus);
  for (int64_t rank = 0; rank < gpus; ++rank) {
    SplitMix64 rng(seed ^ (static_cast<uint64_t>(step) * 0x9E3779B97F4A7C15ull) ^
                   (static_cast<uint64_t>(rank) << 32));
    rng.Next();
    for (int64_t i = 0; i < kSamplesPerGpu; ++i) {
      AttentionMask mask;
      out.lengths[rank].push_back(DrawSample(rng, masked, mask));
      if (masked) out.masks[rank].push_back(std::move(mask));
    }
  }
  return out;
}

// The fixed layout of `family` on `gpus` GPUs, one replica of them all.
std::string FixedSpec(const std::string& family, int64_t gpus) {
  if (family == "mixed") return absl::StrCat("g1n", gpus / 4, "+g2n", gpus / 8, "+g4n", gpus / 8);
  const int64_t bag = family[1] - '0';
  return absl::StrCat(family, "n", gpus / bag);
}

struct Row {
  std::vector<double> seconds;
  double max_over_mean = 0, bound = 0, moved = 0;
};

absl::Status RunRow(const std::string& family, bool masked, int64_t gpus,
                    const BalancerOptions& options, const CostModel& cost,
                    const CommPrices& prices, uint64_t seed, Row& row) {
  const int64_t steps = std::clamp(kGpuStepsPerRow / gpus, kMinSteps, kMaxSteps);
  std::optional<World> fixed;
  if (family != "auto") {
    absl::StatusOr<Topology> topology = Topology::Parse(FixedSpec(family, gpus));
    if (!topology.ok()) return topology.status();
    absl::StatusOr<World> world = World::Create(*topology, gpus);
    if (!world.ok()) return world.status();
    fixed = *std::move(world);
  }
  for (int64_t s = -1; s < steps; ++s) {  // step -1: the untimed warm-up
    Step step = MakeStep(gpus, s + 1, masked, seed);
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<Plan> plan;
    std::optional<World> chosen;
    absl::StatusOr<BalancerInput> input =
        BalancerInput::Check(static_cast<int32_t>(gpus), std::move(step.lengths),
                             std::move(step.masks), options.limits);
    if (!input.ok()) return input.status();
    if (fixed.has_value()) {
      plan = BalanceGreedy(*fixed, cost, std::move(*input), options);
    } else {
      absl::StatusOr<AutoPlan> automatic =
          BalanceAuto(AutoLayout(), cost, prices, std::move(*input), options);
      if (!automatic.ok()) return automatic.status();
      plan = std::move(automatic->plan);
      chosen = std::move(automatic->world);
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!plan.ok()) return plan.status();
    if (s >= 0) {
      row.seconds.push_back(seconds);
      row.max_over_mean += ComputeBalanceStats(plan->workload_after).max_over_mean / steps;
      // The input kept its lengths; its masks are the plan's now.
      row.bound += MaxOverMeanLowerBound(chosen.has_value() ? *chosen : *fixed, cost,
                                         input->lengths(), plan->MasksOrNull()) /
                   steps;
      row.moved += static_cast<double>(plan->MovedTokens()) /
                   static_cast<double>(plan->TotalTokens()) / steps;
    }
    // As the service does once it has answered.
    options.chunk_tables->GiveBack(std::move(plan->chunks));
  }
  return absl::OkStatus();
}

const std::vector<OptionSpec>& Options() {
  static const std::vector<OptionSpec> options = {
      {"min-gpus", "N", "32", "the smallest world (a power of two, at least 32)"},
      {"max-gpus", "N", "65536", "the largest world"},
      {"families", "LIST", "g1,g2,g4,g8,mixed,auto", "layout families"},
      {"data", "LIST", "plain,masked", "data kinds"},
      {"greedy", "RULE", GreedyRuleName(BalancerOptions().greedy),
       "BalancerOptions::greedy (earliest-finish or least-occupied)"},
      {"refine-rounds", "N", "256", "BalancerOptions::refine_rounds"},
      {"locality", "on|off", "on", "BalancerOptions::locality"},
      {"seed", "N", "0", "data seed"},
      {"threads", "N", "1", "BalancerOptions::threads (the plans are the same for any)"},
  };
  return options;
}

int Run(int argc, char** argv) {
  const std::vector<std::string> argv_list(argv + 1, argv + argc);
  if (Args::WantsHelp(argv_list)) {
    std::printf("%s", FormatUsage("planner_curve [options]",
                                  "Planning time and quality from 32 to 65,536 GPUs.", Options())
                          .c_str());
    return 0;
  }
  absl::StatusOr<Args> args = Args::ParseOptions(argv_list, Options());
  if (!args.ok()) {
    std::fprintf(stderr, "planner_curve: %s\n", std::string(args.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<int64_t> min_gpus = args->GetInt("min-gpus", 32, 32, 1 << 20);
  absl::StatusOr<int64_t> max_gpus = args->GetInt("max-gpus", 65536, 32, 1 << 20);
  absl::StatusOr<int64_t> refine = args->GetInt("refine-rounds", 256, 0, 1 << 20);
  absl::StatusOr<bool> locality = args->GetOnOff("locality", true);
  absl::StatusOr<GreedyRule> greedy =
      ParseGreedyRule(args->GetString("greedy", GreedyRuleName(BalancerOptions().greedy)),
                      "--greedy");
  absl::StatusOr<int64_t> seed = args->GetInt("seed", 0, 0, INT64_MAX);
  absl::StatusOr<int64_t> threads =
      args->GetInt("threads", 1, 1, BalancerOptions::kMaxThreads);
  for (const absl::Status& status :
       {min_gpus.status(), max_gpus.status(), greedy.status(), refine.status(),
        locality.status(), seed.status(), threads.status()}) {
    if (!status.ok()) {
      std::fprintf(stderr, "planner_curve: %s\n", std::string(status.message()).c_str());
      return 2;
    }
  }
  if ((*min_gpus & (*min_gpus - 1)) != 0) {
    std::fprintf(stderr, "planner_curve: --min-gpus: %lld is not a power of two\n",
                 static_cast<long long>(*min_gpus));
    return 2;
  }
  const std::vector<std::string> families =
      absl::StrSplit(args->GetString("families", "g1,g2,g4,g8,mixed,auto"), ',');
  const std::vector<std::string> data =
      absl::StrSplit(args->GetString("data", "plain,masked"), ',');
  for (const std::string& family : families) {
    if (family != "g1" && family != "g2" && family != "g4" && family != "g8" &&
        family != "mixed" && family != "auto") {
      std::fprintf(stderr, "planner_curve: --families: unknown family '%s'\n", family.c_str());
      return 2;
    }
  }
  for (const std::string& kind : data) {
    if (kind != "plain" && kind != "masked") {
      std::fprintf(stderr, "planner_curve: --data: unknown kind '%s'\n", kind.c_str());
      return 2;
    }
  }
  if (absl::Status retained = RetainFreedMemory(); !retained.ok()) {
    std::fprintf(stderr, "planner_curve: %s\n", std::string(retained.message()).c_str());
    return 1;
  }
  const CostModel cost = *CostModel::Create(kDModel, kGamma);
  const CommPrices prices = *CommPrices::Create(Machine(), cost);
  BalancerOptions options;
  options.greedy = *greedy;
  options.refine_rounds = static_cast<int32_t>(*refine);
  options.locality = *locality;
  options.threads = static_cast<int32_t>(*threads);
  ChunkTableCache chunk_tables;  // as the service keeps one
  options.chunk_tables = &chunk_tables;

  std::printf("%-7s %-6s %7s %10s %10s %8s %10s %8s %7s\n", "data", "family", "GPUs",
              "mean ms", "p99 ms", "x prev", "max/mean", "bound", "moved");
  for (const std::string& kind : data) {
    for (const std::string& family : families) {
      double previous = 0;
      for (int64_t gpus = *min_gpus; gpus <= *max_gpus; gpus *= 2) {
        Row row;
        if (absl::Status status = RunRow(family, kind == "masked", gpus, options, cost, prices,
                                         static_cast<uint64_t>(*seed), row);
            !status.ok()) {
          std::fprintf(stderr, "planner_curve: %s %s %lld GPUs: %s\n", kind.c_str(),
                       family.c_str(), static_cast<long long>(gpus),
                       std::string(status.message()).c_str());
          return 1;
        }
        double mean = 0;
        for (double s : row.seconds) mean += s / static_cast<double>(row.seconds.size());
        const double p99 = Percentile(row.seconds, 0.99);
        std::printf("%-7s %-6s %7lld %10.3f %10.3f %8s %10.6f %8.6f %6.1f%%\n", kind.c_str(),
                    family.c_str(), static_cast<long long>(gpus), mean * 1e3, p99 * 1e3,
                    previous > 0 ? absl::StrFormat("%.2f", mean / previous).c_str() : "",
                    row.max_over_mean, row.bound, 100 * row.moved);
        std::fflush(stdout);
        previous = mean;
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace knapformer

int main(int argc, char** argv) { return knapformer::Run(argc, argv); }
