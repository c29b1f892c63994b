#include "planner/balance_stats.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <vector>

#include "planner/packing_bound.h"

namespace knapformer {

BalanceStats ComputeBalanceStats(const std::vector<double>& workload) {
  BalanceStats stats;
  if (workload.empty()) return stats;
  double sum = 0;
  stats.max = workload[0];
  stats.min = workload[0];
  for (double w : workload) {
    sum += w;
    stats.max = std::max(stats.max, w);
    stats.min = std::min(stats.min, w);
  }
  stats.mean = sum / static_cast<double>(workload.size());
  if (stats.max == 0) return stats;  // nothing to do anywhere: balanced
  stats.wir = stats.min > 0 ? stats.max / stats.min : std::numeric_limits<double>::infinity();
  stats.max_over_mean = stats.max / stats.mean;
  return stats;
}

double MaxOverMeanLowerBound(const World& world, const CostModel& cost,
                             const RankLengths& lengths, const RankMasks* masks) {
  const int32_t group = world.group_size();
  double total = 0;
  double bound = 0;
  std::vector<double> workloads;
  for (int32_t replica = 0; replica < world.num_replicas(); ++replica) {
    const Topology& topology = world.replica_topology(replica);
    const int64_t gpus = topology.max_bag_gpus();
    double replica_total = 0;
    workloads.clear();
    for (int32_t rank = replica * group; rank < (replica + 1) * group; ++rank) {
      for (size_t i = 0; i < lengths[rank].size(); ++i) {
        const int64_t length = lengths[rank][i];
        const AttentionMask* mask = MaskOf(masks, rank, i);
        const double workload = cost.Workload(length, mask);
        replica_total += workload;
        if (length > 0) workloads.push_back(workload);
        const int64_t largest_chunk = (length + gpus - 1) / gpus;
        bound = std::max(bound, cost.Linear(largest_chunk) + cost.Attention(length, mask) / gpus);
      }
    }
    total += replica_total;
    bound = std::max(bound, replica_total / group);
    if (topology.bags().front().gpus == gpus) {
      std::sort(workloads.begin(), workloads.end(), std::greater<double>());
      bound = UniformBagsLowerBound(workloads, topology.num_bags(),
                                    static_cast<int32_t>(gpus), bound);
    }
  }
  if (total == 0) return 1.0;
  return bound / (total / world.world_size());
}

}  // namespace knapformer
