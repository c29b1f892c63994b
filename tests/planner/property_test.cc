// Property tests over thousands of random worlds: every plan validates (every
// token lands once, chunks stay in their bag), slices agree with each other,
// plans are deterministic, never worse than no balancing on max/mean, never
// better than the lower bound, and the refinement never loses to the paper's
// greedy on max/mean.

#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/balance_stats.h"
#include "planner/balancer.h"
#include "planner/validate.h"

namespace knapformer {
namespace {

struct Case {
  std::string spec;
  int64_t world_size;
  RankLengths lengths;
  int64_t d_model;
  double gamma;
};

Case RandomCase(std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  static const int kSizes[] = {1, 2, 3, 4, 8};
  Case c;
  const int terms = static_cast<int>(pick(1, 4));
  int64_t group = 0;
  for (int t = 0; t < terms; ++t) {
    const int gpus = kSizes[pick(0, 4)];
    const int count = static_cast<int>(pick(1, 4));
    c.spec += absl::StrCat(t ? "+" : "", "g", gpus, "n", count);
    group += gpus * count;
  }
  c.world_size = group * pick(1, 3);
  const int max_sequences = static_cast<int>(pick(0, 8));
  c.lengths.resize(c.world_size);
  for (auto& rank : c.lengths) {
    const int n = static_cast<int>(pick(0, max_sequences));
    for (int i = 0; i < n; ++i) {
      const int64_t kind = pick(0, 99);
      if (kind < 8) {
        rank.push_back(0);
      } else if (kind < 30) {
        rank.push_back(pick(1, 10));  // around and below bag sizes
      } else if (kind < 98) {
        rank.push_back(pick(1, 20000));
      } else {
        rank.push_back(pick(1, CostModel::kMaxLength));
      }
    }
  }
  static const int64_t kDims[] = {1, 64, 3072, 65536};
  static const double kGammas[] = {0.0, 0.49, 1.0, 3.0};
  c.d_model = kDims[pick(0, 3)];
  c.gamma = kGammas[pick(0, 3)];
  return c;
}

TEST(PlannerPropertyTest, RandomWorldsGiveValidDeterministicNeverWorsePlans) {
  std::mt19937_64 rng(20260508);
  constexpr int kCases = 3000;
  int multi_gpu_bags = 0, short_sequences = 0, idle_gpus = 0, fewer_moved = 0;
  for (int n = 0; n < kCases; ++n) {
    const Case c = RandomCase(rng);
    SCOPED_TRACE(absl::StrCat("case ", n, ": ", c.spec, " world ", c.world_size, " d ",
                              c.d_model, " gamma ", c.gamma));
    auto topology = Topology::Parse(c.spec);
    ASSERT_TRUE(topology.ok()) << topology.status();
    auto world = World::Create(*topology, c.world_size);
    ASSERT_TRUE(world.ok()) << world.status();
    const CostModel cost = *CostModel::Create(c.d_model, c.gamma);

    auto plan = BalanceGreedy(*world, cost, c.lengths);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_TRUE(ValidatePlan(*plan, *world, c.lengths).ok())
        << ValidatePlan(*plan, *world, c.lengths);
    ASSERT_TRUE(ValidateSlices(*plan, c.lengths).ok()) << ValidateSlices(*plan, c.lengths);

    auto again = BalanceGreedy(*world, cost, c.lengths);
    ASSERT_TRUE(again.ok());
    ASSERT_EQ(plan->chunks.size(), again->chunks.size());
    for (size_t i = 0; i < plan->chunks.size(); ++i) {
      const Chunk& a = plan->chunks[i];
      const Chunk& b = again->chunks[i];
      ASSERT_TRUE(a.src_rank == b.src_rank && a.seq_index == b.seq_index &&
                  a.offset == b.offset && a.length == b.length && a.dst_rank == b.dst_rank)
          << "chunk " << i << " differs between two runs";
    }
    ASSERT_EQ(plan->workload_after, again->workload_after);

    const BalanceStats before = ComputeBalanceStats(plan->workload_before);
    const BalanceStats after = ComputeBalanceStats(plan->workload_after);
    EXPECT_LE(after.max, before.max * (1 + 1e-9)) << "worse than no balancing";
    const double bound = MaxOverMeanLowerBound(*world, cost, c.lengths);
    EXPECT_GE(after.max_over_mean, bound * (1 - 1e-9)) << "below the lower bound";

    BalancerOptions balanced;  // without locality
    balanced.locality = false;
    auto refined = BalanceGreedy(*world, cost, c.lengths, balanced);
    ASSERT_TRUE(refined.ok());
    ASSERT_TRUE(ValidatePlan(*refined, *world, c.lengths).ok());
    BalancerOptions paper = balanced;
    paper.refine_rounds = 0;
    auto greedy = BalanceGreedy(*world, cost, c.lengths, paper);
    ASSERT_TRUE(greedy.ok());
    ASSERT_TRUE(ValidatePlan(*greedy, *world, c.lengths).ok());
    // Refinement lowers the bag-level maximum; per-GPU figures may differ by
    // the one-token rounding of chunks inside a bag.
    const double slack = cost.Linear(1) * 1.000001;
    const double refined_max = ComputeBalanceStats(refined->workload_after).max;
    EXPECT_LE(refined_max, ComputeBalanceStats(greedy->workload_after).max + slack);
    // Locality (the default) stays within its 0.05% of the balanced maximum
    // (plus that rounding) and never moves more tokens.
    EXPECT_LE(after.max, refined_max * (1 + BalancerOptions().locality_slack) + slack);
    EXPECT_LE(plan->MovedTokens(), refined->MovedTokens());
    fewer_moved += plan->MovedTokens() < refined->MovedTokens();

    multi_gpu_bags += topology->max_bag_gpus() > 1;
    for (const PlacedSequence& s : plan->sequences) {
      short_sequences += s.bag >= 0 && s.length < plan->bag_gpus[s.bag];
    }
    idle_gpus += after.min == 0 && after.max > 0;
  }
  // The generator must actually reach the corner cases it claims to cover.
  EXPECT_GT(multi_gpu_bags, kCases / 2);
  EXPECT_GT(short_sequences, 50);
  EXPECT_GT(idle_gpus, 50);
  EXPECT_GT(fewer_moved, kCases / 4);  // locality does something
}

// The greedy as balancer_options.h words `rule`, by a scan over every bag
// per sequence (O(S * B), nothing shared with the planner's trees, lazy
// updates, parking or size-class ranges), then the guard against doing
// worse than leaving the data where it is. Under a token cap (cap > 0) only
// bags with room count: the usable ones first, then every bag of at most
// the sequence's usable size; nullopt when a sequence fits nowhere.
std::optional<std::vector<int32_t>> NaiveGreedyBags(const World& world, const CostModel& cost,
                                                    const RankLengths& lengths, GreedyRule rule,
                                                    int64_t cap = 0) {
  const Topology& topology = world.topology();
  const int32_t group = topology.group_size();
  const int32_t num_bags = topology.num_bags();
  std::vector<int32_t> bags;  // global bag per sequence, -1 for empty ones
  int32_t smallest = topology.bag(0).gpus;
  for (int32_t first = 0; first < world.world_size(); first += group) {
    struct Seq {
      double workload;
      int64_t length;
      size_t index;  // in `bags`
    };
    std::vector<Seq> seqs;
    double total = 0;
    for (int32_t rank = first; rank < first + group; ++rank) {
      for (int64_t length : lengths[rank]) {
        bags.push_back(-1);
        if (length == 0) continue;
        seqs.push_back({cost.Workload(length), length, bags.size() - 1});
        total += cost.Workload(length);
      }
    }
    std::stable_sort(seqs.begin(), seqs.end(),
                     [](const Seq& a, const Seq& b) { return a.workload > b.workload; });
    const double target = total / group;
    std::vector<double> assigned(num_bags, 0.0);
    std::vector<int64_t> tokens(num_bags, 0);
    auto room_for = [&](const Bag& bag, int64_t length) {
      return cap <= 0 || tokens[bag.id] + length <= cap * bag.gpus;
    };
    for (const Seq& seq : seqs) {
      // Not more GPUs than tokens (or the smallest bags for a shorter one);
      // among those, capacity for it, else the largest of them.
      int32_t max_gpus = 0;
      for (const Bag& bag : topology.bags()) {
        if (bag.gpus <= seq.length) max_gpus = std::max(max_gpus, bag.gpus);
      }
      if (max_gpus == 0) max_gpus = smallest;
      int32_t min_gpus = max_gpus;
      for (const Bag& bag : topology.bags()) {
        if (bag.gpus <= max_gpus && bag.gpus * target >= seq.workload) {
          min_gpus = std::min(min_gpus, bag.gpus);
        }
      }
      int32_t best = -1;
      for (const int32_t lowest : {min_gpus, 0}) {
        // The least occupied bag of each size (the lowest id of equals) ...
        std::map<int32_t, int32_t> least;  // size -> bag
        for (const Bag& bag : topology.bags()) {
          if (bag.gpus < lowest || bag.gpus > max_gpus || !room_for(bag, seq.length)) continue;
          auto it = least.find(bag.gpus);
          if (it == least.end() || assigned[bag.id] / bag.gpus < assigned[it->second] / bag.gpus) {
            least[bag.gpus] = bag.id;
          }
        }
        // ... then the least occupied of those, or the one where the
        // sequence ends first (the smaller size of equals).
        const double added = rule == GreedyRule::kEarliestFinish ? seq.workload : 0.0;
        double best_key = 0;
        for (const auto& [gpus, bag] : least) {
          const double key = (assigned[bag] + added) / gpus;
          if (best < 0 || key < best_key) {
            best = bag;
            best_key = key;
          }
        }
        if (best >= 0) break;
      }
      if (best < 0) return std::nullopt;
      assigned[best] += seq.workload;
      tokens[best] += seq.length;
      bags[seq.index] = first / group * num_bags + best;
    }
    // The guard: every sequence in its source rank's bag, when that has the
    // lower maximum per GPU.
    std::vector<double> home(num_bags, 0.0);
    std::vector<int32_t> home_bags;
    for (int32_t rank = first; rank < first + group; ++rank) {
      for (int64_t length : lengths[rank]) {
        const int32_t bag = topology.BagOfRank(rank - first);
        home[bag] += cost.Workload(length);
        home_bags.push_back(length == 0 ? -1 : first / group * num_bags + bag);
      }
    }
    std::vector<int64_t> home_tokens(num_bags, 0);
    for (int32_t rank = first; rank < first + group; ++rank) {
      for (int64_t length : lengths[rank]) home_tokens[topology.BagOfRank(rank - first)] += length;
    }
    double greedy_max = 0, home_max = 0;
    bool home_fits = true;
    for (const Bag& bag : topology.bags()) {
      greedy_max = std::max(greedy_max, assigned[bag.id] / bag.gpus);
      home_max = std::max(home_max, home[bag.id] / bag.gpus);
      home_fits = home_fits && (cap <= 0 || home_tokens[bag.id] <= cap * bag.gpus);
    }
    if (home_max < greedy_max && home_fits) {
      std::copy(home_bags.begin(), home_bags.end(), bags.end() - home_bags.size());
    }
  }
  return bags;
}

// Whether `plan` puts every sequence in the bag the naive scan gives it.
::testing::AssertionResult SameBags(const Plan& plan, const std::vector<int32_t>& expected) {
  if (plan.sequences.size() != expected.size()) {
    return ::testing::AssertionFailure() << plan.sequences.size() << " sequences, the scan has "
                                         << expected.size();
  }
  for (size_t s = 0; s < expected.size(); ++s) {
    if (plan.sequences[s].bag != expected[s]) {
      return ::testing::AssertionFailure() << "sequence " << s << ": bag "
                                           << plan.sequences[s].bag << ", the scan gives "
                                           << expected[s];
    }
  }
  return ::testing::AssertionSuccess();
}

// Both rules, on layouts of one size and of several (where they differ:
// the generator must reach such cases).
TEST(PlannerPropertyTest, TheGreedyIsExactlyTheDocumentedRule) {
  std::mt19937_64 rng(20261123);
  int rules_differ = 0;
  for (int n = 0; n < 1000; ++n) {
    const Case c = RandomCase(rng);
    SCOPED_TRACE(absl::StrCat("case ", n, ": ", c.spec, " world ", c.world_size));
    const World world = *World::Create(*Topology::Parse(c.spec), c.world_size);
    const CostModel cost = *CostModel::Create(c.d_model, c.gamma);
    std::vector<int32_t> expected[2];
    int i = 0;
    for (const GreedyRule rule : {GreedyRule::kEarliestFinish, GreedyRule::kLeastOccupied}) {
      SCOPED_TRACE(GreedyRuleName(rule));
      BalancerOptions greedy;
      greedy.greedy = rule;
      greedy.refine_rounds = 0;
      greedy.locality = false;
      auto plan = BalanceGreedy(world, cost, c.lengths, greedy);
      ASSERT_TRUE(plan.ok()) << plan.status();
      expected[i] = *NaiveGreedyBags(world, cost, c.lengths, rule);
      ASSERT_TRUE(SameBags(*plan, expected[i++]));
    }
    rules_differ += expected[0] != expected[1];
  }
  EXPECT_GT(rules_differ, 50);
}

// Tokens on the most loaded GPU of `plan`.
int64_t PeakTokens(const Plan& plan) {
  const std::vector<int64_t> tokens = plan.TokensPerRank();
  return *std::max_element(tokens.begin(), tokens.end());
}

// A cap the (n % 50)-th fiftieth of the way from the tokens of a replica
// spread evenly over its GPUs (no cap below can be met) up to `peak`;
// nullopt when the even spread already reaches it.
std::optional<int64_t> CapTowardPeak(const World& world, const RankLengths& lengths, int64_t peak,
                                     int n) {
  const int32_t group = world.topology().group_size();
  int64_t floor = 1;
  for (int64_t first = 0; first < world.world_size(); first += group) {
    int64_t tokens = 0;
    for (int64_t rank = first; rank < first + group; ++rank) {
      for (int64_t length : lengths[rank]) tokens += length;
    }
    floor = std::max(floor, (tokens + group - 1) / group);
  }
  if (floor >= peak) return std::nullopt;
  return floor + (peak - floor) * (n % 50) / 50;
}

// Under a token cap, each rule is the same scan restricted to bags with
// room: the planner's parked bags (a heap by room beside the trees) must
// give exactly the bags, and refuse exactly when, the scan does.
TEST(PlannerPropertyTest, TheGreedyUnderACapIsExactlyTheDocumentedRule) {
  for (const GreedyRule rule : {GreedyRule::kEarliestFinish, GreedyRule::kLeastOccupied}) {
    SCOPED_TRACE(GreedyRuleName(rule));
    std::mt19937_64 rng(20261124);
    BalancerOptions greedy;
    greedy.greedy = rule;
    greedy.refine_rounds = 0;
    greedy.locality = false;
    int met = 0, refused = 0;
    for (int n = 0; n < 1500; ++n) {
      const Case c = RandomCase(rng);
      SCOPED_TRACE(absl::StrCat("case ", n, ": ", c.spec, " world ", c.world_size));
      const World world = *World::Create(*Topology::Parse(c.spec), c.world_size);
      const CostModel cost = *CostModel::Create(c.d_model, c.gamma);
      auto free_plan = BalanceGreedy(world, cost, c.lengths, greedy);
      ASSERT_TRUE(free_plan.ok());
      const std::optional<int64_t> cap =
          CapTowardPeak(world, c.lengths, PeakTokens(*free_plan), n);
      if (!cap) continue;
      BalancerOptions capped = greedy;
      capped.max_tokens_per_gpu = *cap;
      auto plan = BalanceGreedy(world, cost, c.lengths, capped);
      const auto expected =
          NaiveGreedyBags(world, cost, c.lengths, rule, capped.max_tokens_per_gpu);
      ASSERT_EQ(plan.ok(), expected.has_value()) << plan.status();
      if (!plan.ok()) {
        ++refused;
        continue;
      }
      ++met;
      ASSERT_TRUE(SameBags(*plan, *expected));
    }
    EXPECT_GT(met, 100);
    EXPECT_GT(refused, 100);
  }
}

// A cap below what the uncapped plan needs is either met on every GPU or
// refused with an error naming it; never exceeded.
TEST(PlannerPropertyTest, TheTokenCapIsNeverExceeded) {
  std::mt19937_64 rng(20261122);
  constexpr int kCases = 1500;
  int met = 0, refused = 0, binding = 0;
  for (int n = 0; n < kCases; ++n) {
    const Case c = RandomCase(rng);
    SCOPED_TRACE(absl::StrCat("case ", n, ": ", c.spec, " world ", c.world_size));
    auto world = World::Create(*Topology::Parse(c.spec), c.world_size);
    ASSERT_TRUE(world.ok());
    const CostModel cost = *CostModel::Create(c.d_model, c.gamma);
    auto free_plan = BalanceGreedy(*world, cost, c.lengths);
    ASSERT_TRUE(free_plan.ok());
    const int64_t most = PeakTokens(*free_plan);
    const std::optional<int64_t> cap = CapTowardPeak(*world, c.lengths, most, n);
    if (!cap) continue;
    BalancerOptions options;
    options.max_tokens_per_gpu = *cap;
    auto plan = BalanceGreedy(*world, cost, c.lengths, options);
    if (!plan.ok()) {
      EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
      EXPECT_THAT(std::string(plan.status().message()),
                  ::testing::HasSubstr(absl::StrCat("under the cap of ",
                                                    options.max_tokens_per_gpu,
                                                    " tokens per GPU")));
      ++refused;
      continue;
    }
    ASSERT_TRUE(ValidatePlan(*plan, *world, c.lengths).ok()) << ValidatePlan(*plan, *world, c.lengths);
    for (int64_t tokens : plan->TokensPerRank()) {
      ASSERT_LE(tokens, options.max_tokens_per_gpu);
    }
    ++met;
    binding += options.max_tokens_per_gpu < most;
  }
  EXPECT_GT(met, 100);
  EXPECT_GT(refused, 100);
  EXPECT_GT(binding, 100);  // caps below the free plan's peak that were met
}

}  // namespace
}  // namespace knapformer
