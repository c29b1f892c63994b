#include "planner/balancer.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "planner/locality.h"
#include "planner/min_tree.h"
#include "planner/refine.h"

namespace knapformer {
namespace {

absl::Status CheckInput(const World& world, const RankLengths& lengths,
                        const BalancerLimits& limits) {
  if (static_cast<int64_t>(lengths.size()) != world.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ranks: got sequence lengths for ", lengths.size(), " ranks, world_size is ",
        world.world_size()));
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

// Phase 1 for one replica: picks a group-relative bag id for every non-empty
// sequence of ranks [first_rank, first_rank + group).
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

absl::Status AssignBags(const Topology& topology, const CostModel& cost,
                        const BalancerOptions& options, const RankLengths& lengths,
                        int32_t first_rank, const std::vector<int32_t>& first_sequence,
                        std::vector<int32_t>& bag_of) {
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
      const double workload = cost.Workload(length);
      total += workload;
      items.push_back({workload, first_sequence[rank] + static_cast<int32_t>(i),
                       topology.BagOfRank(rank - first_rank)});
      length_of[first_sequence[rank] + i - first_id] = length;
    }
  }
  if (items.empty()) return absl::OkStatus();
  // Workload grows strictly with length, so (workload desc, id asc) is
  // (length desc, id asc): a stable radix sort on lengths of items already in
  // id order gives it in O(S), several times faster than std::sort here.
  SortByLengthDescending(items, [&](const Item& item) { return length_of[item.id - first_id]; });

  const double target = total / group;  // fair share of one GPU
  std::vector<int32_t> gpus(num_bags);
  for (int32_t b = 0; b < num_bags; ++b) gpus[b] = topology.bag(b).gpus;
  // Bags are sorted by size, so eligibility is decided per size class: the
  // classes a sequence can use are always a contiguous run of classes.
  std::vector<int32_t> class_gpus, class_first, class_last;
  for (int32_t b = 0; b < num_bags; ++b) {
    if (b == 0 || gpus[b] != gpus[b - 1]) {
      class_gpus.push_back(gpus[b]);
      class_first.push_back(b);
      class_last.push_back(b);
    }
    class_last.back() = b;
  }
  // A hard cap on tokens per GPU: chunking spreads a bag's tokens over its
  // GPUs to within one token, so a bag of G GPUs may hold cap * G tokens.
  const int64_t cap = options.max_tokens_per_gpu;
  auto fits_cap = [&](const std::vector<int32_t>& bags) {
    if (cap <= 0) return true;
    std::vector<int64_t> tokens(num_bags, 0);
    for (const Item& item : items) {
      tokens[bags[item.id - first_id]] += length_of[item.id - first_id];
    }
    for (int32_t b = 0; b < num_bags; ++b) {
      if (tokens[b] > cap * gpus[b]) return false;
    }
    return true;
  };
  // Local refinement of a packing (refine.h), in place.
  auto refine = [&](std::vector<int32_t>& bags, std::vector<double>& assigned) {
    if (options.refine_rounds <= 0) return;
    // Refinement balances workload only: under a cap, undo it if it broke one.
    std::vector<int32_t> bags_before = cap > 0 ? bags : std::vector<int32_t>();
    std::vector<double> assigned_before = cap > 0 ? assigned : std::vector<double>();
    std::vector<RefineItem> refine_items;
    refine_items.reserve(items.size());
    for (const Item& item : items) {
      refine_items.push_back({item.workload, item.id, length_of[item.id - first_id],
                              bags[item.id - first_id]});
    }
    RefineBags(gpus, options.refine_rounds, refine_items, assigned);
    for (const RefineItem& item : refine_items) bags[item.id - first_id] = item.bag;
    if (cap > 0 && !fits_cap(bags)) {
      bags.swap(bags_before);
      assigned.swap(assigned_before);
    }
  };
  int32_t unplaced = -1;  // the first item a pack could not place under the cap
  // The paper's greedy (home_cap 0): every sequence to the eligible bag of
  // lowest occupancy. Home-first (home_cap > 0): to its home bag while that
  // is eligible and stays at or under home_cap per GPU, else the same. Fills
  // `bags` (by id - first_id) and `assigned`; false (setting `unplaced`) when
  // a sequence fits no bag's token cap.
  auto pack = [&](double home_cap, std::vector<int32_t>& bags, std::vector<double>& assigned) {
    assigned.assign(num_bags, 0.0);
    std::vector<int64_t> tokens(cap > 0 ? num_bags : 0, 0);
    auto room_for = [&](int32_t b, int64_t length) {
      return cap <= 0 || tokens[b] + length <= cap * gpus[b];
    };
    internal::MinTree occupancy(num_bags);  // key: assigned / gpus, all 0 at first
    for (const Item& item : items) {
      const int64_t length = length_of[item.id - first_id];
      // Classes not larger than the sequence form a prefix [0, hi], those with
      // enough capacity a suffix [lo, k).
      int32_t hi = static_cast<int32_t>(std::upper_bound(class_gpus.begin(), class_gpus.end(),
                                                         length) -
                                        class_gpus.begin()) -
                   1;
      int32_t lo;
      if (hi < 0) {
        lo = hi = 0;  // shorter than the smallest bag: use the smallest bags
      } else {
        lo = static_cast<int32_t>(
            std::partition_point(class_gpus.begin(), class_gpus.end(),
                                 [&](int32_t g) { return g * target < item.workload; }) -
            class_gpus.begin());
        if (lo > hi) lo = hi;  // too big for any: the largest usable bags
      }
      int32_t bag = -1;
      if (home_cap > 0) {
        const int32_t home = item.home_bag;
        if (home >= class_first[lo] && home <= class_last[hi] &&
            (assigned[home] + item.workload) / gpus[home] <= home_cap &&
            room_for(home, length)) {
          bag = home;
        }
      }
      if (bag < 0) bag = occupancy.ArgMin(class_first[lo], class_last[hi]);
      if (!room_for(bag, length)) {
        // Under a cap: the least occupied bag of any usable size with room
        // (a scan, but only when the cap binds).
        bag = -1;
        for (int32_t b = 0; b <= class_last[hi]; ++b) {
          if (room_for(b, length) && (bag < 0 || assigned[b] / gpus[b] < assigned[bag] / gpus[bag])) {
            bag = b;
          }
        }
        if (bag < 0) {
          unplaced = static_cast<int32_t>(&item - items.data());
          return false;
        }
      }
      if (cap > 0) tokens[bag] += length;
      assigned[bag] += item.workload;
      occupancy.Set(bag, assigned[bag] / gpus[bag]);
      bags[item.id - first_id] = bag;
    }
    return true;
  };
  auto max_per_gpu = [&](const std::vector<double>& assigned) {
    double worst = 0;
    for (int32_t b = 0; b < num_bags; ++b) worst = std::max(worst, assigned[b] / gpus[b]);
    return worst;
  };
  auto moved_tokens = [&](const std::vector<int32_t>& bags) {
    int64_t moved = 0;
    for (const Item& item : items) {
      moved += MovedTokens(length_of[item.id - first_id], item.home_bag,
                           bags[item.id - first_id], gpus);
    }
    return moved;
  };

  std::vector<int32_t> chosen(length_of.size(), -1);  // by id - first_id
  std::vector<double> assigned;
  if (!pack(0, chosen, assigned)) {
    int64_t used = 0;
    for (const Item& item : items) used += length_of[item.id - first_id];
    const Item& item = items[unplaced];
    return CapError(first_sequence, item.id, length_of[item.id - first_id], cap, used,
                    cap * group);
  }
  refine(chosen, assigned);
  double planned_max = max_per_gpu(assigned);
  // Greedy packing can lose to the data as it came (LPT is only a 4/3
  // approximation). Leaving every sequence in its source rank's bag never
  // exceeds the unbalanced maximum (a bag's GPUs share its ranks' work), so
  // fall back to it when it is strictly better: never worse than no balancing.
  std::vector<double> home(num_bags, 0.0);
  for (const Item& item : items) home[item.home_bag] += item.workload;
  if (max_per_gpu(home) < planned_max) {
    std::vector<int32_t> home_bags(length_of.size(), -1);
    for (const Item& item : items) home_bags[item.id - first_id] = item.home_bag;
    if (fits_cap(home_bags)) {
      chosen.swap(home_bags);
      planned_max = max_per_gpu(home);
    }
  }

  if (options.locality) {
    // Candidates that keep more tokens home: home-first packing with homes
    // capped at the fair share and at the balanced maximum (refined only
    // when over the limit), and shedding from a home placement. The one
    // moving the fewest tokens within the slack of the balanced maximum wins.
    const double limit = planned_max * (1 + options.locality_slack);
    int64_t best_moved = moved_tokens(chosen);
    std::vector<int32_t> near_home(length_of.size(), -1);
    std::vector<double> near_assigned;
    for (const double home_cap : {target, planned_max}) {
      if (!pack(home_cap, near_home, near_assigned)) continue;
      if (max_per_gpu(near_assigned) > limit) refine(near_home, near_assigned);
      const int64_t moved = moved_tokens(near_home);
      if (max_per_gpu(near_assigned) <= limit && moved < best_moved) {
        chosen = near_home;
        best_moved = moved;
      }
    }
    std::vector<LocalityItem> shed;
    shed.reserve(items.size());
    for (const Item& item : items) {
      shed.push_back({item.workload, item.id, length_of[item.id - first_id], item.home_bag,
                      chosen[item.id - first_id]});
    }
    if (PlaceNearHome(gpus, limit, shed)) {  // only when it moves fewer than `chosen`
      for (const LocalityItem& item : shed) near_home[item.id - first_id] = item.bag;
      if (fits_cap(near_home)) chosen.swap(near_home);
    }
  }
  for (const Item& item : items) bag_of[item.id] = chosen[item.id - first_id];
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Plan> BalanceGreedy(const World& world, const CostModel& cost,
                                   const RankLengths& lengths,
                                   const BalancerOptions& options) {
  const BalancerLimits& limits = options.limits;
  if (absl::Status status = CheckInput(world, lengths, limits); !status.ok()) {
    return status;
  }
  const Topology& topology = world.topology();
  const int32_t world_size = world.world_size();
  const int32_t group = topology.group_size();
  const int32_t num_bags = topology.num_bags();
  const int32_t replicas = world.num_replicas();

  Plan plan;
  plan.world_size = world_size;
  plan.topology = topology.spec();
  plan.bags_per_replica = num_bags;

  plan.rank_first_sequence.resize(world_size + 1);
  int32_t num_sequences = 0;
  for (int32_t rank = 0; rank < world_size; ++rank) {
    plan.rank_first_sequence[rank] = num_sequences;
    num_sequences += static_cast<int32_t>(lengths[rank].size());
  }
  plan.rank_first_sequence[world_size] = num_sequences;

  // Phase 1: group-relative bag per sequence.
  std::vector<int32_t> bag_of(num_sequences, -1);
  for (int32_t replica = 0; replica < replicas; ++replica) {
    absl::Status assigned = AssignBags(topology, cost, options, lengths, replica * group,
                                       plan.rank_first_sequence, bag_of);
    if (!assigned.ok()) return assigned;
  }

  // Global bags.
  const int32_t total_bags = replicas * num_bags;
  plan.bag_first_rank.resize(total_bags);
  plan.bag_gpus.resize(total_bags);
  for (int32_t replica = 0; replica < replicas; ++replica) {
    for (const Bag& bag : topology.bags()) {
      plan.bag_first_rank[replica * num_bags + bag.id] = replica * group + bag.first_rank;
      plan.bag_gpus[replica * num_bags + bag.id] = bag.gpus;
    }
  }

  // Chunk count first, so an oversized plan fails before it is allocated.
  int64_t num_chunks = 0;
  for (int32_t rank = 0; rank < world_size; ++rank) {
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
    const int32_t replica = rank / group;
    const int32_t base = plan.rank_first_sequence[rank];
    for (size_t i = 0; i < lengths[rank].size(); ++i) {
      const int64_t length = lengths[rank][i];
      PlacedSequence& seq = plan.sequences[base + i];
      seq.src_rank = rank;
      seq.seq_index = static_cast<int32_t>(i);
      seq.length = length;
      seq.first_chunk = next_chunk;
      plan.workload_before[rank] += cost.Workload(length);
      if (bag_of[base + i] < 0) continue;
      const int32_t bag = replica * num_bags + bag_of[base + i];
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
      bag_attention[bag] += cost.Attention(length);
    }
  }
  for (int32_t bag = 0; bag < total_bags; ++bag) {
    const double per_gpu = bag_attention[bag] / plan.bag_gpus[bag];
    for (int32_t p = 0; p < plan.bag_gpus[bag]; ++p) {
      plan.workload_after[plan.bag_first_rank[bag] + p] += per_gpu;
    }
  }

  // Bag index: a counting sort keeps sequences in id ((src_rank, seq_index)) order.
  plan.bag_begin.assign(total_bags + 1, 0);
  for (const PlacedSequence& seq : plan.sequences) {
    if (seq.bag >= 0) ++plan.bag_begin[seq.bag + 1];
  }
  for (int32_t b = 0; b < total_bags; ++b) plan.bag_begin[b + 1] += plan.bag_begin[b];
  plan.bag_sequences.resize(plan.bag_begin[total_bags]);
  {
    std::vector<int32_t> next(plan.bag_begin.begin(), plan.bag_begin.end() - 1);
    for (int32_t s = 0; s < num_sequences; ++s) {
      const int32_t bag = plan.sequences[s].bag;
      if (bag >= 0) plan.bag_sequences[next[bag]++] = s;
    }
  }
  return plan;
}

}  // namespace knapformer
