#include "planner/balancer.h"
#include "planner/replica_solve.h"

#include <algorithm>
#include <limits>
#include <queue>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "planner/locality.h"
#include "planner/min_tree.h"
#include "planner/multifit.h"
#include "planner/refine.h"
#include "planner/sequence_table.h"
#include "planner/token_cap.h"

namespace knapformer {
namespace internal {

absl::Status CheckBalancerInput(int32_t world_size, const RankLengths& lengths,
                                const BalancerLimits& limits) {
  if (static_cast<int64_t>(lengths.size()) != world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ranks: got sequence lengths for ", lengths.size(), " ranks, world_size is ",
        world_size));
  }
  int64_t sequences = 0;
  for (size_t rank = 0; rank < lengths.size(); ++rank) {
    sequences += static_cast<int64_t>(lengths[rank].size());
    if (sequences > limits.max_sequences) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "ranks: more than ", limits.max_sequences, " sequences in the world"));
    }
    for (size_t i = 0; i < lengths[rank].size(); ++i) {
      const int64_t length = lengths[rank][i];
      if (length < 0 || length > CostModel::kMaxLength) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ranks[", rank, "][", i, "]: sequence length ", length, " is outside [0, ",
            CostModel::kMaxLength, "]"));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<int32_t> FirstSequences(const RankLengths& lengths) {
  std::vector<int32_t> first(lengths.size() + 1);
  int32_t count = 0;
  for (size_t rank = 0; rank < lengths.size(); ++rank) {
    first[rank] = count;
    count += static_cast<int32_t>(lengths[rank].size());
  }
  first[lengths.size()] = count;
  return first;
}

namespace {

// Bags refinement tries for the busiest bag under masks (refine.h). Masked
// workloads are coarse (a block-causal clip costs up to a GPU's share) and
// often level only with a bag other than the least loaded. On the video
// stream in 2-GPU bags (tools/simulate, 10 steps, 256 GPUs) max/mean was
// 1.0121 with 1 partner, 1.0105 with 8, 1.0037 with 32 and 1.0012 with
// every bag, whose planning took twice 32's time and moved 99.6% of the
// tokens (87.6% with 32).
// Unmasked plans keep the single partner, so that they stay exactly as
// they were before masks.
constexpr int32_t kMaskedRefinePartners = 32;

// Capacities MULTIFIT tries under masks: the bisection's interval shrinks
// 2^16-fold; 30 gave the same max/mean on the video stream.
constexpr int32_t kMultifitRounds = 16;
// Nor is it tried when the plan is within this share of the simple lower
// bound, the mean and the heaviest sequence per GPU (most layouts of the
// masked streams): it could gain no more, and costs 15-25% more planning
// time there. The packing terms of the published bound
// (packing_bound.h) would cost more than MULTIFIT itself.
constexpr double kMultifitMinGap = 1e-3;

// Partners RepairToLimit tries per bag over the locality limit: enough to
// find a fitting move or swap among nearly level bags (4 did in every
// benchmark case, 2 did not), few enough to cost little.
constexpr int32_t kRepairPartners = 8;

// Stable LSD radix sort by key descending; keys are lengths in [0, 2^31].
template <typename T, typename KeyFn>
void SortByLengthDescending(std::vector<T>& items, KeyFn key) {
  constexpr int kBits = 11;
  constexpr uint32_t kBuckets = 1u << kBits;
  uint64_t all_bits = 0;
  for (const T& item : items) all_bits |= static_cast<uint64_t>(key(item));
  std::vector<T> scratch(items.size());
  std::vector<uint32_t> count(kBuckets);
  for (int shift = 0; shift < 33 && (all_bits >> shift) != 0; shift += kBits) {
    std::fill(count.begin(), count.end(), 0);
    // Descending: bucket by the complement of the digit.
    auto digit = [&](const T& item) {
      return (kBuckets - 1) - static_cast<uint32_t>((static_cast<uint64_t>(key(item)) >> shift) &
                                                    (kBuckets - 1));
    };
    for (const T& item : items) ++count[digit(item)];
    uint32_t sum = 0;
    for (uint32_t& c : count) {
      const uint32_t n = c;
      c = sum;
      sum += n;
    }
    for (const T& item : items) scratch[count[digit(item)]++] = item;
    items.swap(scratch);
  }
}

// ResourceExhausted naming the sequence that fits under no bag's token cap.
absl::Status CapError(const std::vector<int32_t>& first_sequence, int32_t id, int64_t length,
                      int64_t cap, int64_t used, int64_t room) {
  const int32_t rank = static_cast<int32_t>(
      std::upper_bound(first_sequence.begin(), first_sequence.end(), id) -
      first_sequence.begin() - 1);
  return absl::ResourceExhaustedError(absl::StrCat(
      "max_tokens_per_gpu: sequence ", id - first_sequence[rank], " of rank ", rank, " (", length,
      " tokens) fits in no bag under the cap of ", cap, " tokens per GPU (its replica holds ",
      used, " tokens in ", room, " tokens of capacity)"));
}

}  // namespace

absl::Status AssignReplicaBags(const Topology& topology, const CostModel& cost,
                               const BalancerOptions& options, const RankLengths& lengths,
                               int32_t first_rank, const std::vector<int32_t>& first_sequence,
                               std::vector<int32_t>& bag_of, const RankMasks* masks) {
  const int32_t group = topology.group_size();
  const int32_t num_bags = topology.num_bags();
  // 16 bytes, so the sort moves little; the length is looked up by id.
  struct Item {
    double workload;
    int32_t id;        // global sequence id
    int32_t home_bag;  // the bag of its source rank
  };
  const int32_t first_id = first_sequence[first_rank];
  std::vector<Item> items;
  items.reserve(first_sequence[first_rank + group] - first_id);
  std::vector<int64_t> length_of(first_sequence[first_rank + group] - first_id);
  double total = 0;
  for (int32_t rank = first_rank; rank < first_rank + group; ++rank) {
    for (size_t i = 0; i < lengths[rank].size(); ++i) {
      const int64_t length = lengths[rank][i];
      if (length == 0) continue;
      const double workload = cost.Workload(length, MaskOf(masks, rank, i));
      total += workload;
      items.push_back({workload, first_sequence[rank] + static_cast<int32_t>(i),
                       topology.BagOfRank(rank - first_rank)});
      length_of[first_sequence[rank] + i - first_id] = length;
    }
  }
  if (items.empty()) return absl::OkStatus();
  // Workload never falls as length grows (it grows strictly under the
  // transformer and linear models; the uniform one prices all alike), so
  // (length desc, id asc) orders by workload descending; a stable radix sort
  // on lengths of items already in id order gives it in O(S), several times
  // faster than std::sort here.
  // Masks that are all full price exactly as none: the unmasked order and
  // refinement, so that the plan is exactly the unmasked one.
  bool masked = false;
  if (masks != nullptr && !masks->empty()) {
    for (int32_t rank = first_rank; rank < first_rank + group && !masked; ++rank) {
      for (const AttentionMask& mask : (*masks)[rank]) {
        if (mask.kind != AttentionMask::Kind::kFull) {
          masked = true;
          break;
        }
      }
    }
  }
  if (!masked) {
    SortByLengthDescending(items,
                           [&](const Item& item) { return length_of[item.id - first_id]; });
  } else {
    // Under masks a longer sequence may cost less (causal vs full): sort by
    // workload itself, ties by length (the linear part, for the uniform
    // model) and id, as unmasked plans are ordered.
    std::sort(items.begin(), items.end(), [&](const Item& a, const Item& b) {
      if (a.workload != b.workload) return a.workload > b.workload;
      const int64_t la = length_of[a.id - first_id], lb = length_of[b.id - first_id];
      if (la != lb) return la > lb;
      return a.id < b.id;
    });
  }
  // From here on every per-sequence vector is indexed by position in this
  // order: the table's.
  const int32_t n = static_cast<int32_t>(items.size());
  SequenceTable table;
  table.workload.resize(n);
  table.length.resize(n);
  table.id.resize(n);
  table.home_bag.resize(n);
  for (int32_t k = 0; k < n; ++k) {
    table.workload[k] = items[k].workload;
    table.length[k] = length_of[items[k].id - first_id];
    table.id[k] = items[k].id;
    table.home_bag[k] = items[k].home_bag;
  }
  std::vector<Item>().swap(items);
  std::vector<int64_t>().swap(length_of);
  const std::vector<double>& workload = table.workload;
  const std::vector<int64_t>& length = table.length;
  const std::vector<int32_t>& home_bag = table.home_bag;

  const double target = total / group;  // fair share of one GPU
  std::vector<int32_t> gpus(num_bags);
  for (int32_t b = 0; b < num_bags; ++b) gpus[b] = topology.bag(b).gpus;
  // Bags are sorted by size, so eligibility is decided per size class: the
  // classes a sequence can use are always a contiguous run of classes, hence
  // a contiguous run of bags [first_usable, last_usable]. Classes not larger
  // than the sequence form a prefix, those with enough capacity a suffix.
  std::vector<int32_t> class_gpus, class_first, class_last;
  for (int32_t b = 0; b < num_bags; ++b) {
    if (b == 0 || gpus[b] != gpus[b - 1]) {
      class_gpus.push_back(gpus[b]);
      class_first.push_back(b);
      class_last.push_back(b);
    }
    class_last.back() = b;
  }
  std::vector<int32_t> first_usable(n), last_usable(n);
  for (int32_t k = 0; k < n; ++k) {
    int32_t hi = static_cast<int32_t>(std::upper_bound(class_gpus.begin(), class_gpus.end(),
                                                       length[k]) -
                                      class_gpus.begin()) -
                 1;
    int32_t lo;
    if (hi < 0) {
      lo = hi = 0;  // shorter than the smallest bag: use the smallest bags
    } else {
      lo = static_cast<int32_t>(
          std::partition_point(class_gpus.begin(), class_gpus.end(),
                               [&](int32_t g) { return g * target < workload[k]; }) -
          class_gpus.begin());
      if (lo > hi) lo = hi;  // too big for any: the largest usable bags
    }
    first_usable[k] = class_first[lo];
    last_usable[k] = class_last[hi];
  }
  // A hard cap on tokens per GPU: chunking spreads a bag's tokens over its
  // GPUs to within one token, so a bag of G GPUs may hold cap * G tokens.
  const int64_t cap = options.max_tokens_per_gpu;
  auto tokens_of = [&](const std::vector<int32_t>& bags) {
    std::vector<int64_t> tokens(num_bags, 0);
    for (int32_t k = 0; k < n; ++k) {
      if (bags[k] >= 0) tokens[bags[k]] += length[k];
    }
    return tokens;
  };
  auto fits_cap = [&](const std::vector<int32_t>& bags) {
    if (cap <= 0) return true;
    const std::vector<int64_t> tokens = tokens_of(bags);
    for (int32_t b = 0; b < num_bags; ++b) {
      if (tokens[b] > TokenCapOfBag(cap, gpus[b])) return false;
    }
    return true;
  };
  // Local refinement of a packing (refine.h), in place.
  auto refine = [&](std::vector<int32_t>& bags, std::vector<double>& assigned) {
    if (options.refine_rounds <= 0) return;
    // Refinement balances workload only: under a cap, undo it if it broke one.
    std::vector<int32_t> bags_before = cap > 0 ? bags : std::vector<int32_t>();
    std::vector<double> assigned_before = cap > 0 ? assigned : std::vector<double>();
    RefineBags(gpus, options.refine_rounds, table, bags, assigned,
               masked ? kMaskedRefinePartners : 1);
    if (cap > 0 && !fits_cap(bags)) {
      bags.swap(bags_before);
      assigned.swap(assigned_before);
    }
  };
  int32_t unplaced = -1;  // the first item a pack could not place under the cap
  // Places every sequence without a bag yet (-1), heaviest first, on top of
  // what `assigned` holds. The paper's greedy (home_cap 0): the usable bag
  // of lowest occupancy. Home-first (home_cap > 0): its home bag while that
  // is usable and stays at or under home_cap per GPU, else the same. Under
  // a cap on tokens, only bags with room count: the least occupied usable
  // bag with room, else the least occupied bag with room among all the
  // sequence's bag sizes (below its usable range too); false, setting
  // `unplaced`, when no bag has room.
  auto pack = [&](double home_cap, std::vector<int32_t>& bags, std::vector<double>& assigned) {
    std::vector<int64_t> tokens = cap > 0 ? tokens_of(bags) : std::vector<int64_t>();
    auto room_of = [&](int32_t b) { return TokenCapOfBag(cap, gpus[b]) - tokens[b]; };
    auto room_for = [&](int32_t b, int64_t tokens_needed) {
      return cap <= 0 || tokens_needed <= room_of(b);
    };
    // Dividing by one is exact, and skipping it takes a division's latency
    // off every update in one-GPU bags.
    auto occupancy_of = [&](int32_t b) {
      return gpus[b] == 1 ? assigned[b] : assigned[b] / gpus[b];
    };
    std::vector<double> keys(num_bags);
    for (int32_t b = 0; b < num_bags; ++b) keys[b] = occupancy_of(b);
    internal::MinTree occupancy(keys);
    // A placement marks its bag stale instead of updating the tree: keys
    // only grow, so a stale key is a lower bound, and a minimum whose key is
    // current is the true minimum. A bag is updated when it surfaces as the
    // minimum, once for however many sequences it took in the meantime.
    std::vector<char> stale(num_bags, 0);
    // Under a cap, a bag that surfaces without room for the sequence is
    // parked: its key becomes +inf, so the tree stops offering it, and it
    // waits in a heap by room. Lengths only fall from one sequence to the
    // next (unmasked; under masks the order is by workload, and a bag may be
    // parked and unparked again without taking one: still correct, as every
    // unparking rechecks the room), so it comes back once its room fits the
    // current one; it can only be parked again after taking a sequence.
    // O((S + B) log B) in all,
    // where scanning every bag whenever the least occupied one was full cost
    // O(S * B) (240 ms at 4096 ranks under a binding cap).
    constexpr double kParked = std::numeric_limits<double>::infinity();
    std::vector<char> parked(num_bags, 0);
    std::priority_queue<std::pair<int64_t, int32_t>> parked_by_room;
    // The least occupied bag in [lo, hi] with room for sequence k; -1 if none.
    auto least_occupied = [&](int32_t lo, int32_t hi, int32_t k) {
      for (;;) {
        const int32_t b = occupancy.ArgMin(lo, hi);
        if (parked[b]) return -1;  // +inf is the minimum: all parked
        if (stale[b]) {
          occupancy.Set(b, occupancy_of(b));
          stale[b] = 0;
        } else if (!room_for(b, length[k])) {
          occupancy.Set(b, kParked);
          parked[b] = 1;
          parked_by_room.emplace(room_of(b), b);
        } else {
          return b;
        }
      }
    };
    for (int32_t k = 0; k < n; ++k) {
      if (bags[k] >= 0) continue;
      while (!parked_by_room.empty() && parked_by_room.top().first >= length[k]) {
        const int32_t b = parked_by_room.top().second;
        parked_by_room.pop();
        occupancy.Set(b, occupancy_of(b));
        parked[b] = 0;
      }
      int32_t bag = -1;
      if (home_cap > 0) {
        const int32_t home = home_bag[k];
        if (home >= first_usable[k] && home <= last_usable[k] &&
            (assigned[home] + workload[k]) / gpus[home] <= home_cap &&
            room_for(home, length[k])) {
          bag = home;
        }
      }
      if (bag < 0) bag = least_occupied(first_usable[k], last_usable[k], k);
      if (bag < 0 && first_usable[k] > 0) bag = least_occupied(0, last_usable[k], k);
      if (bag < 0) {
        unplaced = k;
        return false;
      }
      if (cap > 0) tokens[bag] += length[k];
      assigned[bag] += workload[k];
      stale[bag] = 1;
      bags[k] = bag;
    }
    return true;
  };
  auto max_per_gpu = [&](const std::vector<double>& assigned) {
    double worst = 0;
    for (int32_t b = 0; b < num_bags; ++b) worst = std::max(worst, assigned[b] / gpus[b]);
    return worst;
  };
  // Tokens a placement sends to other ranks, bounded both ways: in its home
  // bag a sequence's source rank keeps floor(l/G) or ceil(l/G) of its
  // tokens, as the chunk rotation (phase 2) decides; the bound is the most
  // moved with `at_least` false, the least with it true.
  auto moved_tokens = [&](const std::vector<int32_t>& bags, bool at_least) {
    int64_t moved = 0;
    for (int32_t k = 0; k < n; ++k) {
      const int32_t g = gpus[bags[k]];
      const int64_t kept = bags[k] != home_bag[k] ? 0
                           : at_least             ? (length[k] + g - 1) / g
                                                  : length[k] / g;
      moved += length[k] - kept;
    }
    return moved;
  };

  std::vector<int32_t> chosen(n, -1);
  std::vector<double> assigned(num_bags, 0.0);
  if (!pack(0, chosen, assigned)) {
    int64_t used = 0;
    for (int32_t k = 0; k < n; ++k) used += length[k];
    return CapError(first_sequence, table.id[unplaced], length[unplaced], cap, used,
                    TokenCapOfBag(cap, group));
  }
  refine(chosen, assigned);
  double planned_max = max_per_gpu(assigned);
  // Under masks, a GPU's share may be a few coarse sequences (block-causal
  // video in one-GPU bags), which the greedy leaves apart and pairwise
  // refinement cannot level: MULTIFIT (multifit.h), refined the same way, is
  // taken when it is strictly better. Video, 20 steps (tools/simulate):
  // g1n256 max/mean 1.0337 -> 1.0117 (bound 1.0075), g1n32 1.0595 -> 1.0545
  // (bound 1.0458), planning about twice as long there. Unmasked plans and
  // plans under a token cap stay as they were.
  double lowest = target;  // no packing's maximum per GPU is below this
  if (masked && cap <= 0) {
    for (int32_t k = 0; k < n; ++k) lowest = std::max(lowest, workload[k] / gpus[last_usable[k]]);
  }
  if (masked && cap <= 0 && planned_max > lowest * (1 + kMultifitMinGap)) {
    std::vector<int32_t> packed;
    std::vector<double> packed_assigned;
    if (Multifit(gpus, workload, first_usable, last_usable, lowest, planned_max,
                 kMultifitRounds, packed, packed_assigned)) {
      refine(packed, packed_assigned);
      const double packed_max = max_per_gpu(packed_assigned);
      if (packed_max < planned_max) {
        RenumberTowardHomes(gpus, length, home_bag, packed, packed_assigned);
        chosen.swap(packed);
        assigned.swap(packed_assigned);
        planned_max = packed_max;
      }
    }
  }
  // Greedy packing can lose to the data as it came (LPT is only a 4/3
  // approximation). Leaving every sequence in its source rank's bag never
  // exceeds the unbalanced maximum (a bag's GPUs share its ranks' work), so
  // fall back to it when it is strictly better: never worse than no balancing.
  std::vector<double> home(num_bags, 0.0);
  for (int32_t k = 0; k < n; ++k) home[home_bag[k]] += workload[k];
  const double home_max = max_per_gpu(home);
  if (home_max < planned_max) {
    std::vector<int32_t> home_bags(n);
    for (int32_t k = 0; k < n; ++k) home_bags[k] = home_bag[k];
    if (fits_cap(home_bags)) {
      chosen.swap(home_bags);
      planned_max = home_max;
    }
  }

  if (options.locality) {
    // The locality candidate: home-first packing with homes capped at the
    // balanced maximum (a sequence stays home while that keeps its bag under
    // it, else the greedy's choice), then repaired (locality.h) where a bag
    // ends over the limit: refinement would level the heaviest bags with
    // the lightest, moving home sequences away for balance nobody asked
    // for, and leave thousands of bags a hair over. Taken when within the
    // slack of the balanced maximum, never over the all-home maximum (the
    // guard's promise: never worse than no balancing), and surely moving
    // fewer tokens than the balanced plan (its most against the balanced
    // plan's least).
    double limit = planned_max * (1 + options.locality_slack);
    // Below the balanced maximum only when the all-home placement broke the
    // token cap: then it is no alternative, and only the slack bounds.
    if (home_max >= planned_max) limit = std::min(limit, home_max);
    std::vector<int32_t> near_home(n, -1);
    std::vector<double> near_assigned(num_bags, 0.0);
    if (pack(planned_max, near_home, near_assigned)) {
      bool within = max_per_gpu(near_assigned) <= limit;
      if (!within &&
          RepairToLimit(gpus, limit, cap, kRepairPartners, table, near_home, near_assigned)) {
        within = max_per_gpu(near_assigned) <= limit && fits_cap(near_home);
      }
      if (within && moved_tokens(near_home, /*at_least=*/false) <
                        moved_tokens(chosen, /*at_least=*/true)) {
        chosen.swap(near_home);
      }
    }
  }
  for (int32_t k = 0; k < n; ++k) bag_of[table.id[k]] = chosen[k];
  return absl::OkStatus();
}

Plan EmptyPlanOf(const World& world) {
  Plan plan;
  plan.world_size = world.world_size();
  plan.topology = world.spec();
  plan.bags_per_replica = world.uniform() ? world.topology().num_bags() : 0;
  plan.bag_first_rank.resize(world.total_bags());
  plan.bag_gpus.resize(world.total_bags());
  for (int32_t replica = 0; replica < world.num_replicas(); ++replica) {
    for (const Bag& bag : world.replica_topology(replica).bags()) {
      const int32_t global = world.first_bag(replica) + bag.id;
      plan.bag_first_rank[global] = replica * world.group_size() + bag.first_rank;
      plan.bag_gpus[global] = bag.gpus;
    }
  }
  return plan;
}

absl::StatusOr<Plan> BuildPlan(const World& world, const CostModel& cost,
                               const RankLengths& lengths, const BalancerLimits& limits,
                               std::vector<int32_t> first_sequence,
                               const std::vector<int32_t>& bag_of, const RankMasks* masks) {
  const int32_t world_size = world.world_size();
  const int32_t group = world.group_size();
  const int32_t total_bags = world.total_bags();

  Plan plan = EmptyPlanOf(world);
  plan.rank_first_sequence = std::move(first_sequence);
  if (masks != nullptr) plan.masks = *masks;
  const int32_t num_sequences = plan.rank_first_sequence[world_size];

  // Chunk count first, so an oversized plan fails before it is allocated.
  int64_t num_chunks = 0;
  for (int32_t rank = 0; rank < world_size; ++rank) {
    const Topology& topology = world.replica_topology(rank / group);
    const int32_t base = plan.rank_first_sequence[rank];
    for (size_t i = 0; i < lengths[rank].size(); ++i) {
      const int32_t bag = bag_of[base + i];
      if (bag >= 0) num_chunks += std::min<int64_t>(lengths[rank][i], topology.bag(bag).gpus);
    }
  }
  if (num_chunks > limits.max_chunks) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "plan: ", num_chunks, " chunks exceed the limit of ", limits.max_chunks));
  }

  // Phase 2: chunks, in (src_rank, seq_index, offset) order.
  plan.sequences.resize(num_sequences);
  plan.chunks.resize(num_chunks);
  int32_t next_chunk = 0;
  plan.workload_before.assign(world_size, 0.0);
  plan.workload_after.assign(world_size, 0.0);
  std::vector<int32_t> rotation(total_bags, 0);  // position of the next extra token
  std::vector<double> bag_attention(total_bags, 0.0);
  for (int32_t rank = 0; rank < world_size; ++rank) {
    const int32_t first_bag = world.first_bag(rank / group);
    const int32_t base = plan.rank_first_sequence[rank];
    for (size_t i = 0; i < lengths[rank].size(); ++i) {
      const int64_t length = lengths[rank][i];
      PlacedSequence& seq = plan.sequences[base + i];
      seq.src_rank = rank;
      seq.seq_index = static_cast<int32_t>(i);
      seq.length = length;
      seq.first_chunk = next_chunk;
      const AttentionMask* mask = MaskOf(masks, rank, i);
      plan.workload_before[rank] += cost.Workload(length, mask);
      if (bag_of[base + i] < 0) continue;
      const int32_t bag = first_bag + bag_of[base + i];
      const int32_t gpus = plan.bag_gpus[bag];
      seq.bag = bag;
      const int64_t share = length / gpus;
      const int32_t extra = static_cast<int32_t>(length % gpus);
      const int32_t start = rotation[bag];
      int64_t offset = 0;
      for (int32_t position = 0; position < gpus; ++position) {
        int32_t turn = position - start;  // (position - start) mod gpus, without a division
        if (turn < 0) turn += gpus;
        const int64_t chunk_length = share + (turn < extra ? 1 : 0);
        if (chunk_length == 0) continue;
        const int32_t dst = plan.bag_first_rank[bag] + position;
        plan.chunks[next_chunk++] = Chunk{rank, seq.seq_index, offset, chunk_length, dst};
        plan.workload_after[dst] += cost.Linear(chunk_length);
        offset += chunk_length;
      }
      rotation[bag] = (start + extra) % gpus;
      seq.num_chunks = next_chunk - seq.first_chunk;
      bag_attention[bag] += cost.Attention(length, mask);
    }
  }
  for (int32_t bag = 0; bag < total_bags; ++bag) {
    const double per_gpu = bag_attention[bag] / plan.bag_gpus[bag];
    for (int32_t p = 0; p < plan.bag_gpus[bag]; ++p) {
      plan.workload_after[plan.bag_first_rank[bag] + p] += per_gpu;
    }
  }

  plan.IndexBags();
  return plan;
}

}  // namespace internal

absl::StatusOr<Plan> BalanceGreedy(const World& world, const CostModel& cost,
                                   const RankLengths& lengths,
                                   const BalancerOptions& options, const RankMasks* masks) {
  if (absl::Status status =
          internal::CheckBalancerInput(world.world_size(), lengths, options.limits);
      !status.ok()) {
    return status;
  }
  if (masks != nullptr) {
    if (absl::Status status = CheckRankMasks(lengths, *masks); !status.ok()) return status;
  }
  std::vector<int32_t> first_sequence = internal::FirstSequences(lengths);
  // Phase 1: replica-relative bag per sequence.
  std::vector<int32_t> bag_of(first_sequence.back(), -1);
  const int32_t group = world.group_size();
  for (int32_t replica = 0; replica < world.num_replicas(); ++replica) {
    absl::Status assigned =
        internal::AssignReplicaBags(world.replica_topology(replica), cost, options, lengths,
                                    replica * group, first_sequence, bag_of, masks);
    if (!assigned.ok()) return assigned;
  }
  return internal::BuildPlan(world, cost, lengths, options.limits, std::move(first_sequence),
                             bag_of, masks);
}

}  // namespace knapformer
