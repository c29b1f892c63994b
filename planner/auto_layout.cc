#include "planner/auto_layout.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "planner/parallel_for.h"
#include "planner/placement_bound.h"
#include "planner/rank_speeds.h"
#include "planner/replica_packer.h"
#include "planner/replica_solve.h"

namespace knapformer {
namespace {

constexpr absl::string_view kAuto = "auto";

bool IsPowerOfTwo(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

absl::Status SpecError(absl::string_view spec, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      "topology '", spec, "': ", what,
      " (grammar: auto or auto:max_bag=G:group=T, G a power of two)"));
}

// A candidate layout of one replica: bags per size, sizes ascending.
using BagCounts = std::map<int32_t, int32_t>;

std::string SpecOf(const BagCounts& counts) {
  std::string spec;
  for (const auto& [gpus, count] : counts) {
    if (count == 0) continue;
    if (!spec.empty()) spec += '+';
    absl::StrAppend(&spec, "g", gpus, "n", count);
  }
  return spec;
}

// Layouts shaped by the replica's data: a sequence heavier than one GPU's
// fair share needs the smallest bag size whose fair share holds it; each size
// gets as many bags as its sequences' workload fills at `fill` times the
// fair share, the largest sizes first, and the rest are one-GPU bags.
BagCounts DemandShaped(const std::vector<double>& workloads, double total, int32_t group,
                       int32_t max_bag, double fill) {
  const double fair = total / group;
  std::map<int32_t, double> area;  // size -> workload of the sequences needing it
  for (double w : workloads) {
    int32_t need = 1;
    while (need < max_bag && w > need * fair) need *= 2;
    if (need > 1) area[need] += w;
  }
  BagCounts counts;
  int32_t left = group;
  for (auto it = area.rbegin(); it != area.rend(); ++it) {
    const int32_t gpus = it->first;
    const double wanted = std::ceil(fill * it->second / (gpus * fair));
    const int32_t bags = static_cast<int32_t>(std::min<double>(wanted, left / gpus));
    counts[gpus] = bags;
    left -= bags * gpus;
  }
  counts[1] += left;
  return counts;
}

struct Candidate {
  const Topology* topology;
  double lower_bound;
  int32_t order;  // in `specs`: the one-size layouts, then the data-shaped
  // EveryPlacementSlower's answer for the best time it was last asked
  // with (0: not asked yet).
  double asked_with = 0;
  bool slower = false;
};

}  // namespace

bool AutoLayout::Matches(absl::string_view spec) {
  return spec == kAuto || absl::StartsWith(spec, "auto:");
}

absl::StatusOr<AutoLayout> AutoLayout::Parse(absl::string_view spec) {
  if (!Matches(spec)) return SpecError(spec, "not an auto layout");
  if (static_cast<int64_t>(spec.size()) > Topology::kMaxSpecLength) {
    return SpecError(spec, absl::StrCat("longer than ", Topology::kMaxSpecLength, " characters"));
  }
  AutoLayout layout;
  if (spec == kAuto) return layout;
  absl::string_view options = spec.substr(kAuto.size() + 1);
  bool seen_max_bag = false, seen_group = false;
  for (absl::string_view item : absl::StrSplit(options, ':')) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, '=');
    int64_t value = 0;
    if (kv.first.empty() || !absl::SimpleAtoi(kv.second, &value) || kv.second.empty() ||
        kv.second.front() == '+' || kv.second.front() == '-' || kv.second.front() == ' ') {
      return SpecError(spec, absl::StrCat("'", item, "' is not key=<positive integer>"));
    }
    if (kv.first == "max_bag") {
      if (seen_max_bag) return SpecError(spec, "max_bag given twice");
      seen_max_bag = true;
      if (!IsPowerOfTwo(value) || value > Topology::kMaxGroupSize) {
        return SpecError(spec, absl::StrCat("max_bag=", kv.second, " is not a power of two in [1, ",
                                            Topology::kMaxGroupSize, "]"));
      }
      layout.max_bag = static_cast<int32_t>(value);
    } else if (kv.first == "group") {
      if (seen_group) return SpecError(spec, "group given twice");
      seen_group = true;
      if (value < 1 || value > Topology::kMaxGroupSize) {
        return SpecError(spec, absl::StrCat("group=", kv.second, " is outside [1, ",
                                            Topology::kMaxGroupSize, "]"));
      }
      layout.group = static_cast<int32_t>(value);
    } else {
      return SpecError(spec, absl::StrCat("unknown key '", kv.first, "'"));
    }
  }
  return layout;
}

std::string AutoLayout::spec() const {
  std::string spec = absl::StrCat(kAuto, ":max_bag=", max_bag);
  if (group > 0) absl::StrAppend(&spec, ":group=", group);
  return spec;
}

std::string AutoLayout::SpecOn(const AutoShape& shape) const {
  AutoLayout named = *this;
  named.max_bag = shape.max_bag;
  return named.spec();
}

absl::StatusOr<AutoShape> AutoLayout::Resolve(int64_t world_size, const Machine& machine) const {
  if (world_size < 1 || world_size > Topology::kMaxGroupSize) {
    return absl::InvalidArgumentError(absl::StrCat("world_size: ", world_size,
                                                   " is outside [1, ", Topology::kMaxGroupSize,
                                                   "]"));
  }
  AutoShape shape;
  shape.group = group > 0 ? group : static_cast<int32_t>(world_size);
  if (world_size % shape.group != 0) {
    return absl::InvalidArgumentError(absl::StrCat("world_size: ", world_size,
                                                   " is not a multiple of the group size ",
                                                   shape.group, " of topology ", spec()));
  }
  const int32_t per_node = machine.gpus_per_node;
  const int32_t node = std::min(per_node, shape.group);
  if (per_node < 1 || shape.group % node != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topology ", spec(), ": a group of ", shape.group,
        " GPUs is not a whole number of nodes of ", per_node, " GPUs (machine.gpus_per_node)"));
  }
  // The largest bag size that divides the node: bags stay inside nodes.
  while (shape.max_bag * 2 <= max_bag && node % (shape.max_bag * 2) == 0) shape.max_bag *= 2;
  return shape;
}

absl::Status AutoLayout::CheckChosen(const World& world, const Machine& machine) const {
  absl::StatusOr<AutoShape> shape = Resolve(world.world_size(), machine);
  if (!shape.ok()) return shape.status();
  if (world.group_size() != shape->group) {
    return absl::InvalidArgumentError(absl::StrCat("layout ", world.spec(), ": groups of ",
                                                   world.group_size(), " ranks, ", spec(),
                                                   " makes groups of ", shape->group));
  }
  for (int32_t r = 0; r < world.num_replicas(); ++r) {
    for (const Bag& bag : world.replica_topology(r).bags()) {
      if (!IsPowerOfTwo(bag.gpus) || bag.gpus > shape->max_bag) {
        return absl::InvalidArgumentError(absl::StrCat(
            "layout ", world.spec(), ": replica ", r, " has a bag of ", bag.gpus,
            " GPUs; ", spec(), " uses powers of two up to ", shape->max_bag));
      }
    }
    if (world.uniform()) break;
  }
  return absl::OkStatus();
}

namespace {

// BalanceAuto's plan without plan.masks (BuildPlan leaves them to the caller).
absl::StatusOr<AutoPlan> AutoPlanWithoutMasks(const AutoLayout& layout, const CostModel& cost,
                                              const CommPrices& prices,
                                              const BalancerInput& input,
                                              const BalancerOptions& options) {
  absl::StatusOr<AutoShape> shape = layout.Resolve(input.world_size(), prices.machine());
  if (!shape.ok()) return shape.status();
  const int32_t group = shape->group;
  const int32_t max_bag = shape->max_bag;
  const int32_t ranks = input.world_size();
  const RankLengths& lengths = input.lengths();
  const RankMasks* masks = input.masks();
  if (absl::Status status = CheckRankSpeeds(options.rank_speeds, ranks); !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckThreads(options); !status.ok()) return status;
  const std::vector<double> speeds = NormalizedRankSpeeds(options.rank_speeds);
  std::vector<int32_t> first_sequence = internal::FirstSequences(lengths);
  std::vector<int32_t> bag_of(first_sequence.back(), -1);
  // One placement per candidate solved at once (below).
  std::vector<std::vector<int32_t>> trials(1, std::vector<int32_t>(first_sequence.back(), -1));

  // Parsed once: the homogeneous layouts serve every replica, the shaped
  // ones often repeat.
  std::map<std::string, Topology> topologies;
  auto topology_of = [&](const std::string& spec) -> const Topology* {
    auto it = topologies.find(spec);
    if (it == topologies.end()) it = topologies.emplace(spec, *Topology::Parse(spec)).first;
    return &it->second;
  };
  std::vector<std::string> homogeneous;
  for (int32_t g = 1; g <= max_bag; g *= 2) homogeneous.push_back(SpecOf({{g, group / g}}));

  std::vector<Topology> chosen;
  chosen.reserve(ranks / group);
  PredictedStep predicted;
  int32_t considered = 0, solved = 0;
  int64_t num_chunks = 0;  // the chosen placements' chunks
  std::vector<double> workloads;
  for (int32_t replica = 0; replica < ranks / group; ++replica) {
    const int32_t first_rank = replica * group;
    workloads.clear();
    double total = 0;
    int64_t tokens = 0;
    // The longest sequence and the one of the most attention (the same one
    // without masks), each a bound on what one GPU must hold alone.
    int64_t longest = 0, heaviest = 0;
    double longest_attention = 0, heaviest_attention = 0;
    for (int32_t rank = first_rank; rank < first_rank + group; ++rank) {
      for (size_t i = 0; i < lengths[rank].size(); ++i) {
        const int64_t length = lengths[rank][i];
        if (length == 0) continue;
        const double attention = cost.Attention(length, MaskOf(masks, rank, i));
        workloads.push_back(cost.Linear(length) + attention);
        total += workloads.back();
        tokens += length;
        if (length > longest || (length == longest && attention > longest_attention)) {
          longest = length;
          longest_attention = attention;
        }
        if (attention > heaviest_attention) {
          heaviest = length;
          heaviest_attention = attention;
        }
      }
    }
    // The replica's total speed, slowest and fastest GPU (normalized): what
    // its bounds divide by. One speed: group, 1, 1, so the bounds are the
    // FLOP ones exactly.
    double total_speed = group, slowest = 1, fastest = 1;
    if (!speeds.empty()) {
      total_speed = 0;
      slowest = fastest = speeds[first_rank];
      for (int32_t rank = first_rank; rank < first_rank + group; ++rank) {
        total_speed += speeds[rank];
        slowest = std::min(slowest, speeds[rank]);
        fastest = std::max(fastest, speeds[rank]);
      }
    }
    std::vector<std::string> specs = homogeneous;
    for (double fill : {1.0, 1.5}) {
      const std::string spec = SpecOf(DemandShaped(workloads, total, group, max_bag, fill));
      if (std::find(specs.begin(), specs.end(), spec) == specs.end()) specs.push_back(spec);
    }
    // Lower bounds, a hair low so that rounding never bounds out a winner.
    constexpr double kSlack = 1 - 1e-9;
    std::vector<Candidate> candidates;
    for (size_t i = 0; i < specs.size(); ++i) {
      const Topology* topology = topology_of(specs[i]);
      double least_ulysses = std::numeric_limits<double>::infinity();
      double longest_alone = std::numeric_limits<double>::infinity();
      double heaviest_alone = std::numeric_limits<double>::infinity();
      for (int32_t b = 0; b < topology->num_bags(); ++b) {
        const int32_t g = topology->bag(b).gpus;
        if (b > 0 && g == topology->bag(b - 1).gpus) continue;
        const double ulysses = prices.UlyssesPerToken(g, false);
        least_ulysses = std::min(least_ulysses, ulysses);
        longest_alone = std::min(
            longest_alone, ChunkAloneTime(cost, longest, longest_attention, g, ulysses, fastest));
        heaviest_alone = std::min(heaviest_alone, ChunkAloneTime(cost, heaviest, heaviest_attention,
                                                                 g, ulysses, fastest));
      }
      // The slowest GPU's time is at least the speed-weighted mean of all
      // (weights s / total_speed): total compute over total speed, plus
      // each GPU's Ulysses time weighted by a speed of at least `slowest`.
      const double mean =
          (total + slowest * least_ulysses * static_cast<double>(tokens)) / total_speed;
      candidates.push_back({topology,
                            std::max({mean, longest_alone, heaviest_alone}) * kSlack,
                            static_cast<int32_t>(i)});
    }
    // The one-size layouts first, each kind by its bound: a data-shaped
    // layout that loses usually loses by its packing, which only
    // EveryPlacementSlower sees, and only against a time already solved.
    // The order changes what is solved, never what is chosen (below).
    const int32_t one_size = static_cast<int32_t>(homogeneous.size());
    std::stable_sort(candidates.begin(), candidates.end(),
                     [one_size](const Candidate& a, const Candidate& b) {
                       const bool a_shaped = a.order >= one_size;
                       const bool b_shaped = b.order >= one_size;
                       if (a_shaped != b_shaped) return b_shaped;
                       return a.lower_bound < b.lower_bound;
                     });
    considered += static_cast<int32_t>(candidates.size());
    // One sort for all the candidates: the order does not depend on the
    // layout (each packer takes a copy and adds its home bags).
    const SortedSequences sorted = internal::SortReplicaSequences(
        cost, lengths, first_rank, group, first_sequence, masks);
    const Candidate* best = nullptr;
    PredictedStep best_step;
    int64_t best_chunks = 0;
    absl::Status first_error;
    // A candidate is skipped when the best so far rules it out: its lower
    // bound, or a packing argument, proves it slower. Both only grow
    // stricter as the best falls, so whatever is skipped would lose, and
    // the choice is the fastest candidate (ties: the earliest in `specs`)
    // in any order. Candidates are solved in waves of up to `threads`,
    // the next ones the best so far does not rule out, and their results
    // taken in order as one thread would have solved them: a candidate
    // that an earlier one of its wave rules out is dropped unused. So the
    // choice, `solved` included, is the same for any thread count.
    const int32_t threads = internal::SolverThreads(
        options, first_sequence[first_rank + group] - first_sequence[first_rank]);
    while (static_cast<int32_t>(trials.size()) < threads) trials.push_back(trials[0]);
    struct Outcome {
      absl::StatusOr<int64_t> chunks;  // AssignReplicaBags' answer
      PredictedStep step;
    };
    std::vector<Outcome> outcomes;
    auto ruled_out = [&](Candidate& candidate) {
      if (best == nullptr) return false;
      if (candidate.lower_bound >= best_step.time) return true;
      if (candidate.asked_with != best_step.time) {
        candidate.asked_with = best_step.time;
        candidate.slower = EveryPlacementSlower(*candidate.topology, sorted.table, cost, prices,
                                                fastest, best_step.time);
      }
      return candidate.slower;
    };
    std::vector<size_t> wave;
    for (size_t next = 0; next < candidates.size();) {
      wave.clear();
      for (; next < candidates.size() && static_cast<int32_t>(wave.size()) < threads; ++next) {
        if (!ruled_out(candidates[next])) wave.push_back(next);
      }
      if (wave.empty()) break;
      outcomes.assign(wave.size(), Outcome());
      internal::ParallelFor(static_cast<int32_t>(wave.size()), threads, [&](int32_t i) {
        const Candidate& candidate = candidates[wave[i]];
        std::vector<int32_t>& trial = trials[i];
        outcomes[i].chunks = internal::AssignReplicaBags(*candidate.topology, options, sorted,
                                                         first_rank, first_sequence, trial);
        if (outcomes[i].chunks.ok()) {
          outcomes[i].step = PredictReplica(*candidate.topology, first_rank, lengths,
                                            first_sequence, trial, cost, prices, masks, speeds);
        }
      });
      for (size_t i = 0; i < wave.size(); ++i) {
        Candidate& candidate = candidates[wave[i]];
        if (ruled_out(candidate)) continue;
        ++solved;
        if (!outcomes[i].chunks.ok()) {
          if (first_error.ok()) first_error = outcomes[i].chunks.status();
          continue;
        }
        const PredictedStep& step = outcomes[i].step;
        if (best == nullptr || step.time < best_step.time ||
            (step.time == best_step.time && candidate.order < best->order)) {
          best = &candidate;
          best_step = step;
          best_chunks = *outcomes[i].chunks;
          std::copy(trials[i].begin() + first_sequence[first_rank],
                    trials[i].begin() + first_sequence[first_rank + group],
                    bag_of.begin() + first_sequence[first_rank]);
        }
      }
    }
    if (best == nullptr) return first_error;
    chosen.push_back(*best->topology);
    num_chunks += best_chunks;
    predicted = replica == 0 ? best_step : Slower(predicted, best_step);
  }
  absl::StatusOr<World> world = World::FromReplicas(std::move(chosen));
  if (!world.ok()) return world.status();
  absl::StatusOr<Plan> plan =
      internal::BuildPlan(*world, cost, lengths, options, std::move(first_sequence), bag_of,
                          num_chunks, masks);
  if (!plan.ok()) return plan.status();
  return AutoPlan{*std::move(plan), *std::move(world), predicted, considered, solved};
}

}  // namespace

absl::StatusOr<AutoPlan> BalanceAuto(const AutoLayout& layout, const CostModel& cost,
                                     const CommPrices& prices, const BalancerInput& input,
                                     const BalancerOptions& options) {
  absl::StatusOr<AutoPlan> planned = AutoPlanWithoutMasks(layout, cost, prices, input, options);
  if (planned.ok() && input.masks() != nullptr) planned->plan.masks = *input.masks();
  return planned;
}

absl::StatusOr<AutoPlan> BalanceAuto(const AutoLayout& layout, const CostModel& cost,
                                     const CommPrices& prices, BalancerInput&& input,
                                     const BalancerOptions& options) {
  absl::StatusOr<AutoPlan> planned = AutoPlanWithoutMasks(layout, cost, prices, input, options);
  if (planned.ok()) planned->plan.masks = std::move(input).TakeMasks();
  return planned;
}

absl::StatusOr<AutoPlan> BalanceAuto(const AutoLayout& layout, int64_t world_size,
                                     const CostModel& cost, const CommPrices& prices,
                                     const RankLengths& lengths,
                                     const BalancerOptions& options, const RankMasks* masks) {
  if (world_size < 0 || world_size > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size: ", world_size, " is outside [0, 2^31)"));
  }
  absl::StatusOr<BalancerInput> input =
      BalancerInput::Check(static_cast<int32_t>(world_size), lengths,
                           masks ? *masks : RankMasks(), options.limits);
  if (!input.ok()) return input.status();
  return BalanceAuto(layout, cost, prices, *std::move(input), options);
}

}  // namespace knapformer
