#ifndef KNAPFORMER_PLANNER_TOPOLOGY_H_
#define KNAPFORMER_PLANNER_TOPOLOGY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace knapformer {

// A compute bag: `gpus` GPUs that process their sequences together (Ulysses
// sequence parallelism when gpus > 1). Ranks are relative to the group.
struct Bag {
  int32_t id = 0;          // index in the group, ascending with bag size
  int32_t gpus = 0;        // GPUs in the bag (G)
  int32_t first_rank = 0;  // group-relative rank of the bag's first GPU
};

// The balancing group described by a spec such as "g1n2+g2n1+g4n1": N bags of
// G GPUs for each `g{G}n{N}` term.
//
// Grammar (strict, no spaces): spec := term ('+' term)* ;
//   term := 'g' uint 'n' uint, both >= 1 and without a sign or leading '+'.
// Terms with the same G are merged (g1n2+g1n6 == g1n8): the bag layout only
// depends on how many bags of each size there are. Bags are laid out by size
// ascending, ids and GPU ranks contiguous in that order, as the paper's
// reference does: g1n2+g2n1+g4n1 -> bag0=[0], bag1=[1], bag2=[2,3], bag3=[4..7].
//
// Immutable and cheap to copy for small specs; thread-compatible.
class Topology {
 public:
  // Limits that keep every derived quantity far from int32 overflow.
  static constexpr int64_t kMaxGroupSize = 1 << 20;  // GPUs in one group
  static constexpr int64_t kMaxSpecLength = 4096;    // characters

  // Parses `spec`. Errors are InvalidArgument naming the offending term.
  static absl::StatusOr<Topology> Parse(absl::string_view spec);

  // Canonical spec: merged terms, sizes ascending ("g1n2+g2n1+g4n1").
  const std::string& spec() const { return spec_; }

  int32_t group_size() const { return group_size_; }
  int32_t num_bags() const { return static_cast<int32_t>(bags_.size()); }
  const std::vector<Bag>& bags() const { return bags_; }
  const Bag& bag(int32_t id) const { return bags_[id]; }
  int32_t max_bag_gpus() const { return bags_.back().gpus; }

  // Bag id of a group-relative rank. REQUIRES: 0 <= group_rank < group_size().
  int32_t BagOfRank(int32_t group_rank) const { return rank_to_bag_[group_rank]; }

 private:
  Topology() = default;

  std::string spec_;
  int32_t group_size_ = 0;
  std::vector<Bag> bags_;
  std::vector<int32_t> rank_to_bag_;
};

// Where a global rank sits in a world made of replicas of one group.
struct RankLocation {
  int32_t replica = 0;   // which copy of the group
  int32_t bag = 0;       // bag id within the group
  int32_t position = 0;  // index of the GPU within its bag
};

// A world of ranks partitioned into replicas of `group_size` ranks; replica r
// owns ranks [r*T, (r+1)*T) and is balanced on its own. Uniform: every
// replica has one topology (a fixed spec). Per replica: each has its own
// (a layout chosen per step, planner/auto_layout.h). Global bag ids number
// the bags replica by replica: replica r's bag b is first_bag(r) + b.
class World {
 public:
  // InvalidArgument unless world_size >= 1 and a multiple of the group size.
  static absl::StatusOr<World> Create(Topology topology, int64_t world_size);
  // One topology per replica, all of one group size. InvalidArgument unless
  // `replicas` is non-empty, every one has the first one's group size, and
  // the world stays within Topology::kMaxGroupSize ranks.
  static absl::StatusOr<World> FromReplicas(std::vector<Topology> replicas);
  // The world whose spec() is `layout` on `world_size` ranks: one spec that
  // every replica has, or one per replica joined by ';' (what an answer of
  // the service names, Plan::topology). InvalidArgument naming the replica
  // whose spec is bad, or a count of specs that does not fit world_size.
  static absl::StatusOr<World> FromLayout(absl::string_view layout, int64_t world_size);

  // Whether every replica has the same topology.
  bool uniform() const { return topologies_.size() == 1; }
  // The topology of every replica. REQUIRES: uniform().
  const Topology& topology() const { return topologies_.front(); }
  const Topology& replica_topology(int32_t replica) const {
    return uniform() ? topologies_.front() : topologies_[replica];
  }
  // The layout: the topology's spec when uniform (or every replica's is the
  // same), else each replica's spec in replica order, joined by ';'.
  const std::string& spec() const { return spec_; }

  int32_t world_size() const { return world_size_; }
  int32_t group_size() const { return topologies_.front().group_size(); }
  int32_t num_replicas() const { return world_size_ / group_size(); }
  int32_t total_bags() const { return first_bag(num_replicas()); }
  // Global id of replica r's bag 0; first_bag(num_replicas()) is total_bags().
  int32_t first_bag(int32_t replica) const {
    return uniform() ? replica * topologies_.front().num_bags() : first_bag_[replica];
  }

  // REQUIRES: 0 <= rank < world_size().
  RankLocation Locate(int32_t rank) const;
  // Inverse of Locate. REQUIRES: a valid location.
  int32_t RankOf(const RankLocation& location) const;

 private:
  World() = default;

  std::vector<Topology> topologies_;  // one if uniform, else one per replica
  std::vector<int32_t> first_bag_;    // per replica + 1 when not uniform
  std::string spec_;
  int32_t world_size_ = 0;
};

// The one-size layouts of a world of `world_size` ranks, one group: "g1nW",
// "g2nW/2", ... for every power of two G up to `max_bag` that divides the
// world. What the command line compares by default, at any --world.
std::vector<std::string> HomogeneousSpecs(int64_t world_size, int32_t max_bag);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_TOPOLOGY_H_
