#include "planner/topology.h"

#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace knapformer {
namespace {

// Parses the digits at the front of `text` (advancing it) into a value in
// [1, limit]. `what` names the number in error messages.
absl::StatusOr<int64_t> ConsumeCount(absl::string_view& text,
                                     absl::string_view term, const char* what,
                                     int64_t limit) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') {
    ++digits;
  }
  if (digits == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("topology term '", term, "': expected digits for ", what,
                     " (term grammar g{G}n{N})"));
  }
  int64_t value = 0;
  for (size_t i = 0; i < digits; ++i) {
    value = value * 10 + (text[i] - '0');
    if (value > limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("topology term '", term, "': ", what, " exceeds the limit of ",
                       limit));
    }
  }
  if (value == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("topology term '", term, "': ", what, " must be at least 1"));
  }
  text.remove_prefix(digits);
  return value;
}

}  // namespace

absl::StatusOr<Topology> Topology::Parse(absl::string_view spec) {
  if (spec.empty()) {
    return absl::InvalidArgumentError(
        "topology: empty spec (expected g{G}n{N} terms joined by '+', e.g. "
        "g1n2+g2n1+g4n1)");
  }
  if (static_cast<int64_t>(spec.size()) > kMaxSpecLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topology: spec has ", spec.size(), " characters, the limit is ", kMaxSpecLength));
  }
  std::map<int64_t, int64_t> bags_by_size;  // G -> N, merged and ordered
  int64_t group_size = 0;
  for (absl::string_view term : absl::StrSplit(spec, '+')) {
    if (term.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "topology '", spec, "': empty term (a '+' at the start, the end, or twice)"));
    }
    absl::string_view rest = term;
    if (rest.front() != 'g') {
      return absl::InvalidArgumentError(absl::StrCat(
          "topology term '", term, "': must start with 'g' (term grammar g{G}n{N})"));
    }
    rest.remove_prefix(1);
    auto gpus = ConsumeCount(rest, term, "G (GPUs per bag)", kMaxGroupSize);
    if (!gpus.ok()) return gpus.status();
    if (rest.empty() || rest.front() != 'n') {
      return absl::InvalidArgumentError(absl::StrCat(
          "topology term '", term, "': expected 'n' after G (term grammar g{G}n{N})"));
    }
    rest.remove_prefix(1);
    auto count = ConsumeCount(rest, term, "N (number of bags)", kMaxGroupSize);
    if (!count.ok()) return count.status();
    if (!rest.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "topology term '", term, "': unexpected trailing '", rest,
          "' (term grammar g{G}n{N})"));
    }
    group_size += *gpus * *count;
    if (group_size > kMaxGroupSize) {
      return absl::InvalidArgumentError(absl::StrCat(
          "topology '", spec, "': more than ", kMaxGroupSize, " GPUs in the group"));
    }
    bags_by_size[*gpus] += *count;
  }

  Topology topology;
  topology.group_size_ = static_cast<int32_t>(group_size);
  topology.rank_to_bag_.reserve(group_size);
  int32_t next_rank = 0;
  for (const auto& [gpus, count] : bags_by_size) {
    if (!topology.spec_.empty()) topology.spec_ += '+';
    absl::StrAppend(&topology.spec_, "g", gpus, "n", count);
    for (int64_t i = 0; i < count; ++i) {
      Bag bag;
      bag.id = static_cast<int32_t>(topology.bags_.size());
      bag.gpus = static_cast<int32_t>(gpus);
      bag.first_rank = next_rank;
      topology.bags_.push_back(bag);
      topology.rank_to_bag_.insert(topology.rank_to_bag_.end(), gpus, bag.id);
      next_rank += bag.gpus;
    }
  }
  return topology;
}

absl::StatusOr<World> World::Create(Topology topology, int64_t world_size) {
  const int64_t group = topology.group_size();
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size: must be at least 1, got ", world_size));
  }
  if (world_size > Topology::kMaxGroupSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "world_size: ", world_size, " exceeds the limit of ", Topology::kMaxGroupSize));
  }
  if (world_size % group != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "world_size: ", world_size, " is not a multiple of the group size ", group,
        " of topology ", topology.spec()));
  }
  World world;
  world.spec_ = topology.spec();
  world.topologies_.push_back(std::move(topology));
  world.world_size_ = static_cast<int32_t>(world_size);
  return world;
}

absl::StatusOr<World> World::FromLayout(absl::string_view layout, int64_t world_size) {
  if (!absl::StrContains(layout, ';')) {
    absl::StatusOr<Topology> topology = Topology::Parse(layout);
    if (!topology.ok()) return topology.status();
    return Create(*std::move(topology), world_size);
  }
  std::vector<Topology> replicas;
  for (absl::string_view spec : absl::StrSplit(layout, ';')) {
    absl::StatusOr<Topology> topology = Topology::Parse(spec);
    if (!topology.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("layout: replica ", replicas.size(), ": ",
                                                     topology.status().message()));
    }
    replicas.push_back(*std::move(topology));
  }
  const int64_t ranks = static_cast<int64_t>(replicas.size()) * replicas.front().group_size();
  if (ranks != world_size) {
    return absl::InvalidArgumentError(absl::StrCat("layout: ", replicas.size(),
                                                   " replicas of ", replicas.front().group_size(),
                                                   " ranks are ", ranks, ", not world_size ",
                                                   world_size));
  }
  return FromReplicas(std::move(replicas));
}

absl::StatusOr<World> World::FromReplicas(std::vector<Topology> replicas) {
  if (replicas.empty()) {
    return absl::InvalidArgumentError("replicas: a world needs at least one replica");
  }
  const int64_t group = replicas.front().group_size();
  if (static_cast<int64_t>(replicas.size()) * group > Topology::kMaxGroupSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replicas: ", replicas.size(), " replicas of ", group, " ranks exceed the limit of ",
        Topology::kMaxGroupSize, " ranks"));
  }
  bool same = true;
  for (size_t r = 0; r < replicas.size(); ++r) {
    if (replicas[r].group_size() != group) {
      return absl::InvalidArgumentError(absl::StrCat(
          "replicas[", r, "]: topology ", replicas[r].spec(), " has ", replicas[r].group_size(),
          " ranks, replica 0's has ", group));
    }
    same = same && replicas[r].spec() == replicas.front().spec();
  }
  const int64_t world_size = static_cast<int64_t>(replicas.size()) * group;
  if (same) return Create(std::move(replicas.front()), world_size);
  World world;
  world.world_size_ = static_cast<int32_t>(world_size);
  world.first_bag_.reserve(replicas.size() + 1);
  int32_t bags = 0;
  for (const Topology& topology : replicas) {
    world.first_bag_.push_back(bags);
    bags += topology.num_bags();
    if (!world.spec_.empty()) world.spec_ += ';';
    world.spec_ += topology.spec();
  }
  world.first_bag_.push_back(bags);
  world.topologies_ = std::move(replicas);
  return world;
}

RankLocation World::Locate(int32_t rank) const {
  const int32_t group = group_size();
  RankLocation location;
  location.replica = rank / group;
  const Topology& topology = replica_topology(location.replica);
  const int32_t group_rank = rank % group;
  location.bag = topology.BagOfRank(group_rank);
  location.position = group_rank - topology.bag(location.bag).first_rank;
  return location;
}

int32_t World::RankOf(const RankLocation& location) const {
  return location.replica * group_size() +
         replica_topology(location.replica).bag(location.bag).first_rank + location.position;
}

std::vector<std::string> HomogeneousSpecs(int64_t world_size, int32_t max_bag) {
  std::vector<std::string> specs;
  for (int64_t g = 1; g <= max_bag && g <= world_size; g *= 2) {
    if (world_size % g == 0) specs.push_back(absl::StrCat("g", g, "n", world_size / g));
  }
  return specs;
}

}  // namespace knapformer
