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

// A world of `world_size` ranks partitioned into world_size / group_size
// replicas of `topology`; replica r owns ranks [r*T, (r+1)*T).
class World {
 public:
  // InvalidArgument unless world_size >= 1 and a multiple of the group size.
  static absl::StatusOr<World> Create(Topology topology, int64_t world_size);

  const Topology& topology() const { return topology_; }
  int32_t world_size() const { return world_size_; }
  int32_t num_replicas() const { return world_size_ / topology_.group_size(); }

  // REQUIRES: 0 <= rank < world_size().
  RankLocation Locate(int32_t rank) const;
  // Inverse of Locate. REQUIRES: a valid location.
  int32_t RankOf(const RankLocation& location) const;

 private:
  World(Topology topology, int32_t world_size)
      : topology_(std::move(topology)), world_size_(world_size) {}

  Topology topology_;
  int32_t world_size_;
};

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_TOPOLOGY_H_
