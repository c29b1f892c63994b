#include "planner/calibration.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "planner/least_squares.h"

namespace knapformer {

WorkSample SequenceSample(int64_t length, int64_t d_model, double seconds,
                          const AttentionMask* mask) {
  const double l = static_cast<double>(length);
  const double d = static_cast<double>(d_model);
  const double attention =
      mask == nullptr ? 4.0 * l * l * d : 4.0 * AttendedPairs(length, *mask) * d;
  return {24.0 * l * d * d, attention, seconds};
}

std::vector<WorkSample> RankWork(const Plan& plan, int64_t d_model, const RankMasks* masks) {
  const double d = static_cast<double>(d_model);
  std::vector<WorkSample> work(plan.world_size);
  for (const Chunk& chunk : plan.chunks) {
    work[chunk.dst_rank].linear += 24.0 * static_cast<double>(chunk.length) * d * d;
  }
  for (const PlacedSequence& seq : plan.sequences) {
    if (seq.bag < 0) continue;
    const double l = static_cast<double>(seq.length);
    const AttentionMask* mask = MaskOf(masks, seq.src_rank, seq.seq_index);
    const double attention =
        mask == nullptr ? 4.0 * l * l * d : 4.0 * AttendedPairs(seq.length, *mask) * d;
    const int32_t gpus = plan.bag_gpus[seq.bag];
    const double share = attention / gpus;
    for (int32_t p = 0; p < gpus; ++p) work[plan.bag_first_rank[seq.bag] + p].attention += share;
  }
  return work;
}

namespace {

// The fit of seconds ~= a * linear + b * attention: k, gamma and how well it
// explains the samples.
CostFit FitFigures(const std::vector<WorkSample>& samples, double a, double b) {
  CostFit fit;
  fit.k = a;
  fit.gamma = b / a;
  fit.samples = static_cast<int64_t>(samples.size());
  double sse = 0, mean = 0;
  for (const WorkSample& s : samples) mean += s.seconds;
  mean /= static_cast<double>(samples.size());
  double sst = 0;
  for (const WorkSample& s : samples) {
    const double residual = s.seconds - (a * s.linear + b * s.attention);
    sse += residual * residual;
    sst += (s.seconds - mean) * (s.seconds - mean);
    if (s.seconds > 0) {
      fit.max_relative_error = std::max(fit.max_relative_error, std::abs(residual) / s.seconds);
    }
  }
  fit.rmse_seconds = std::sqrt(sse / static_cast<double>(samples.size()));
  fit.r_squared = sst > 0 ? 1 - sse / sst : 1;
  return fit;
}

absl::Status CheckSamples(const std::vector<WorkSample>& samples) {
  for (size_t i = 0; i < samples.size(); ++i) {
    const WorkSample& s = samples[i];
    if (!std::isfinite(s.linear) || !std::isfinite(s.attention) || !std::isfinite(s.seconds) ||
        s.linear < 0 || s.attention < 0 || s.seconds < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("samples[", i, "]: values must be finite and >= 0"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CostFit> FitCostScale(const std::vector<WorkSample>& samples, double gamma) {
  if (samples.empty()) return absl::InvalidArgumentError("samples: need at least 1 to fit k");
  if (!std::isfinite(gamma) || gamma < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gamma: must be a finite number >= 0, got ", gamma));
  }
  if (absl::Status checked = CheckSamples(samples); !checked.ok()) return checked;
  // Relative least squares in k alone: minimizes sum ((k * x - t) / t)^2.
  NormalEquations equations(1);
  for (const WorkSample& s : samples) {
    const double w = s.seconds > 0 ? 1.0 / (s.seconds * s.seconds) : 1.0;
    equations.AddRow({s.linear + gamma * s.attention}, s.seconds, w);
  }
  const absl::StatusOr<std::vector<double>> solved = equations.Solve();
  if (!solved.ok() || !((*solved)[0] > 0)) {
    return absl::InvalidArgumentError("samples: no work or no time to fit k to");
  }
  const double k = (*solved)[0];
  return FitFigures(samples, k, k * gamma);
}

absl::StatusOr<CostFit> FitCostModel(const std::vector<WorkSample>& samples) {
  if (samples.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("samples: need at least 2 to fit k and gamma, got ", samples.size()));
  }
  if (absl::Status checked = CheckSamples(samples); !checked.ok()) return checked;
  // Columns scaled to their largest value, so that the 2x2 normal equations
  // stay well conditioned (the raw terms reach 1e20).
  double scale_linear = 0, scale_attention = 0;
  for (const WorkSample& s : samples) {
    scale_linear = std::max(scale_linear, s.linear);
    scale_attention = std::max(scale_attention, s.attention);
  }
  if (scale_linear == 0 || scale_attention == 0) {
    return absl::InvalidArgumentError("samples: no work in one of the two terms");
  }
  // Relative least squares (each residual divided by its time): timing
  // noise is proportional to the time, and plain least squares would let
  // the longest sequences decide alone. A zero time gets weight 1.
  NormalEquations equations(2);
  for (const WorkSample& s : samples) {
    const double w = s.seconds > 0 ? 1.0 / (s.seconds * s.seconds) : 1.0;
    equations.AddRow({s.linear / scale_linear, s.attention / scale_attention}, s.seconds, w);
  }
  // Singular (relative to the columns' norms: det <= 1e-12 * xx * yy) where
  // the two columns are proportional.
  const absl::StatusOr<std::vector<double>> solved = equations.Solve();
  if (!solved.ok()) {
    return absl::InvalidArgumentError(
        "samples: the linear and attention terms are proportional (e.g. a single sequence "
        "length); time at least two different lengths");
  }
  const double a = (*solved)[0] / scale_linear;     // seconds per linear unit
  const double b = (*solved)[1] / scale_attention;  // seconds per attention unit
  if (!(a > 0) || b < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fit: k = ", a, ", k * gamma = ", b,
        "; the times do not grow with the work as 24*l*d^2 + gamma*4*l^2*d says"));
  }
  return FitFigures(samples, a, b);
}

absl::StatusOr<MeasuredAttention> MeasuredAttentionFromSamples(
    const std::vector<WorkSample>& samples, const CostFit& fit, int64_t d_model) {
  if (!std::isfinite(fit.k) || fit.k <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("fit.k: must be a finite number > 0, got ", fit.k));
  }
  if (d_model < 1) {
    return absl::InvalidArgumentError(absl::StrCat("d_model: must be >= 1, got ", d_model));
  }
  // Pairs -> (sum of work, samples).
  std::map<double, std::pair<double, int>> by_pairs;
  for (const WorkSample& s : samples) {
    const double pairs = s.attention / (4.0 * static_cast<double>(d_model));
    if (!std::isfinite(pairs) || !(pairs > 0)) continue;
    auto& [sum, count] = by_pairs[pairs];
    sum += std::max(0.0, s.seconds / fit.k - s.linear);
    ++count;
  }
  if (by_pairs.empty()) {
    return absl::InvalidArgumentError("samples: none attends any pairs; nothing to tabulate");
  }
  if (by_pairs.size() > static_cast<size_t>(MeasuredAttention::kMaxPoints)) {
    return absl::InvalidArgumentError(
        absl::StrCat("samples: ", by_pairs.size(),
                     " different attention sizes, over the table's limit of ",
                     MeasuredAttention::kMaxPoints));
  }
  // Pool adjacent violators: blocks of points whose means increase.
  struct Block {
    double mean;
    double weight;
    int points;
  };
  std::vector<double> pairs;
  std::vector<Block> blocks;
  for (const auto& [p, sum_count] : by_pairs) {
    pairs.push_back(p);
    blocks.push_back(
        {sum_count.first / sum_count.second, static_cast<double>(sum_count.second), 1});
    while (blocks.size() > 1 && blocks[blocks.size() - 2].mean > blocks.back().mean) {
      const Block last = blocks.back();
      blocks.pop_back();
      Block& prev = blocks.back();
      prev.mean = (prev.mean * prev.weight + last.mean * last.weight) / (prev.weight + last.weight);
      prev.weight += last.weight;
      prev.points += last.points;
    }
  }
  std::vector<double> work;
  for (const Block& block : blocks) work.insert(work.end(), block.points, block.mean);
  return MeasuredAttention::Create(std::move(pairs), std::move(work), "measured_attention");
}

}  // namespace knapformer
