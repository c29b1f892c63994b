#include "planner/step_time.h"

#include <algorithm>

#include "planner/bag_split.h"
#include "planner/rank_speeds.h"

namespace knapformer {

PredictedStep PredictReplica(const Topology& topology, int32_t first_rank,
                             const RankLengths& lengths,
                             const std::vector<int32_t>& first_sequence,
                             const std::vector<int32_t>& bag_of, const CostModel& cost,
                             const CommPrices& prices, const RankMasks* masks,
                             const std::vector<double>& speeds) {
  const int32_t group = topology.group_size();
  const int32_t num_bags = topology.num_bags();
  struct BagState {
    int64_t shares = 0;    // sum of floor(l / G) over its sequences
    int64_t extras = 0;    // sum of l mod G: handed out cyclically from position 0
    int32_t rotation = 0;  // position of the next extra token
    double attention = 0;
    int64_t in_intra = 0;  // tokens that come from other ranks of its node
    int64_t in_inter = 0;  // ... and from other nodes
  };
  std::vector<BagState> bags(num_bags);
  // Per bag, once: whether a token sent to it from a rank of node `node`
  // crosses nodes (the bag spans nodes, or lies in another node). Per
  // sequence these were divisions, with the lengths' a third of predicting
  // a step (perf, `auto` at 65,536 GPUs).
  std::vector<int32_t> bag_node(num_bags);
  std::vector<char> bag_crosses(num_bags);
  for (const Bag& bag : topology.bags()) {
    bag_node[bag.id] = prices.NodeOf(first_rank + bag.first_rank);
    bag_crosses[bag.id] = prices.CrossesNodes(first_rank + bag.first_rank, bag.gpus);
  }
  std::vector<int64_t> out_intra(group, 0), out_inter(group, 0);
  for (int32_t rank = first_rank; rank < first_rank + group; ++rank) {
    const int32_t base = first_sequence[rank];
    const int32_t node = prices.NodeOf(rank);
    for (size_t i = 0; i < lengths[rank].size(); ++i) {
      const int32_t b = bag_of[base + i];
      if (b < 0) continue;
      const int64_t length = lengths[rank][i];
      const Bag& bag = topology.bag(b);
      const int32_t gpus = bag.gpus;
      BagState& state = bags[b];
      const BagSplit split = SplitOverBag(length, gpus);
      // The chunk the source keeps when it is a GPU of the bag.
      int64_t kept = 0;
      const int32_t position = rank - first_rank - bag.first_rank;
      if (position >= 0 && position < gpus) kept = ChunkAt(split, position, state.rotation, gpus);
      state.rotation = NextRotation(state.rotation, split, gpus);
      state.shares += split.share;
      state.extras += split.extra;
      state.attention += cost.Attention(length, MaskOf(masks, rank, i));
      const int64_t moved = length - kept;
      const bool inter = node != bag_node[b] || bag_crosses[b];
      (inter ? out_inter : out_intra)[rank - first_rank] += moved;
      (inter ? state.in_inter : state.in_intra) += moved;
    }
  }
  PredictedStep slowest;
  bool first = true;
  for (const Bag& bag : topology.bags()) {
    const BagState& state = bags[bag.id];
    const int32_t gpus = bag.gpus;
    const int32_t bag_first = first_rank + bag.first_rank;
    const double ulysses_price = prices.UlyssesPerToken(gpus, bag_crosses[bag.id]);
    const double attention = state.attention / gpus;
    const double in_intra = static_cast<double>(state.in_intra) / gpus;
    const double in_inter = static_cast<double>(state.in_inter) / gpus;
    // The bag runs at its slowest GPU's pace.
    const double slowest_speed = speeds.empty() ? 1.0 : SlowestSpeed(speeds, bag_first, gpus);
    for (int32_t p = 0; p < gpus; ++p) {
      const int64_t tokens = TokensAt(state.shares, state.extras, gpus, p);
      const int32_t local = bag.first_rank + p;
      double compute = cost.Linear(tokens) + attention;
      if (slowest_speed != 1.0) compute /= slowest_speed;
      const double ulysses = ulysses_price * static_cast<double>(tokens);
      const double route =
          prices.RoutePerToken(false) *
              std::max(static_cast<double>(out_intra[local]), in_intra) +
          prices.RoutePerToken(true) * std::max(static_cast<double>(out_inter[local]), in_inter);
      const double time = compute + ulysses + route;
      slowest.max_compute = std::max(slowest.max_compute, compute);
      if (first || time > slowest.time) {
        first = false;
        slowest.time = time;
        slowest.compute = compute;
        slowest.ulysses = ulysses;
        slowest.route = route;
        slowest.slowest_rank = first_rank + local;
      }
    }
  }
  return slowest;
}

PredictedStep Slower(const PredictedStep& earlier, const PredictedStep& later) {
  PredictedStep slower = later.time > earlier.time ? later : earlier;
  slower.max_compute = std::max(earlier.max_compute, later.max_compute);
  return slower;
}

PredictedStep PredictStep(const Plan& plan, const World& world, const RankLengths& lengths,
                          const CostModel& cost, const CommPrices& prices,
                          const RankMasks* masks, const std::vector<double>& speeds) {
  const int32_t group = world.group_size();
  std::vector<int32_t> bag_of(plan.sequences.size(), -1);
  for (size_t id = 0; id < plan.sequences.size(); ++id) {
    const PlacedSequence& seq = plan.sequences[id];
    if (seq.bag >= 0) bag_of[id] = seq.bag - world.first_bag(seq.src_rank / group);
  }
  PredictedStep slowest;
  for (int32_t replica = 0; replica < world.num_replicas(); ++replica) {
    const PredictedStep step =
        PredictReplica(world.replica_topology(replica), replica * group, lengths,
                       plan.rank_first_sequence, bag_of, cost, prices, masks, speeds);
    slowest = replica == 0 ? step : Slower(slowest, step);
  }
  return slowest;
}

}  // namespace knapformer
