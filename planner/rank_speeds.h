#ifndef KNAPFORMER_PLANNER_RANK_SPEEDS_H_
#define KNAPFORMER_PLANNER_RANK_SPEEDS_H_

// Relative compute speeds per rank: what lets the planner balance time, not
// FLOPs. A rank at speed s computes a workload w in w / s; a multi-GPU bag
// runs at its slowest GPU's pace (replica_bags.h). Speeds are relative, of
// any scale: only their ratios change a plan. Figures in time divide by the
// world's mean speed, so that all-equal speeds give exactly the workloads.
// An empty vector means every rank at one speed: plans are then exactly the
// FLOP-balanced ones, bit for bit.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/plan.h"
#include "planner/replica_bags.h"
#include "planner/topology.h"

namespace knapformer {

// The fastest rank may be at most this many times the slowest: a GPU a
// hundred times slower than its peers is broken and belongs out of the job,
// not balanced around (it would hold under 1% of a share).
inline constexpr double kMaxRankSpeedRatio = 100.0;

// InvalidArgument naming `field` unless `speeds` is empty or has
// `world_size` entries, each finite and > 0, the largest at most
// kMaxRankSpeedRatio times the smallest.
absl::Status CheckRankSpeeds(const std::vector<double>& speeds, int64_t world_size,
                             absl::string_view field = "rank_speeds");

// `speeds` divided by their mean; empty when they are empty or all one
// value (one speed: figures then are exactly the workloads', not a last
// digit off). REQUIRES: checked.
std::vector<double> NormalizedRankSpeeds(const std::vector<double>& speeds);

// The slowest of the `gpus` speeds from `first_rank`: the pace of the bag
// they form. REQUIRES: in range.
double SlowestSpeed(const std::vector<double>& speeds, int32_t first_rank, int32_t gpus);

// The bags of the replica of `topology` whose ranks start at `first_rank`,
// as its packing sees them: scale-free, each bag's speed its size times
// its slowest GPU's speed over the fastest such speed of the replica (the
// fastest bags at their size). Exactly their sizes when `speeds` is empty
// or every bag's slowest GPU has one speed, which then plans exactly as no
// speeds.
ReplicaBags BagsOf(const Topology& topology, int32_t first_rank,
                   const std::vector<double>& speeds);

// Each rank's predicted compute time under `plan`: its workload_after over
// its bag's slowest normalized speed (every GPU of a bag waits for that one).
// With no speeds, exactly workload_after. REQUIRES: checked speeds, of the
// plan's world.
std::vector<double> TimePerRank(const Plan& plan, const std::vector<double>& speeds);

// Each rank's time computing its own sequences, unmoved (no balancing):
// workload_before over its own normalized speed.
std::vector<double> TimeAtHome(const Plan& plan, const std::vector<double>& speeds);

// The parseable form of speeds on the command line and in the docs:
// "0.6,1,1,1" or, for a few ranks of an otherwise even world, "R:F,R:F"
// (rank R at speed F, every other rank at 1). InvalidArgument naming
// `field` and the item on a malformed list, a rank outside [0, world_size),
// a rank named twice, or the checks above.
absl::StatusOr<std::vector<double>> ParseRankSpeeds(absl::string_view text, int64_t world_size,
                                                    absl::string_view field);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_RANK_SPEEDS_H_
