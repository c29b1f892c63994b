// The topology grammar ("g1n2+g2n1+g4n1"): any text either parses or is an
// InvalidArgument with a message; a parsed topology's canonical spec parses
// to itself; a world of it places every rank in exactly one bag, and
// Locate/RankOf are inverses.
#include <cstddef>
#include <cstdint>
#include <string>

#include "planner/topology.h"
#include "tests/fuzz/fuzz_check.h"

namespace knapformer::fuzz {
namespace {

void CheckWorld(const Topology& topology, int64_t world_size) {
  absl::StatusOr<World> world = World::Create(topology, world_size);
  Require(world.ok(), "a multiple of the group size makes a world", world.status().ToString());
  for (int32_t rank = 0; rank < world->world_size(); ++rank) {
    const RankLocation where = world->Locate(rank);
    Require(where.replica >= 0 && where.replica < world->num_replicas(), "replica in range");
    Require(where.bag >= 0 && where.bag < topology.num_bags(), "bag in range");
    Require(where.position >= 0 && where.position < topology.bag(where.bag).gpus,
            "position within the bag");
    Require(world->RankOf(where) == rank, "RankOf inverts Locate");
  }
}

}  // namespace
}  // namespace knapformer::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace knapformer;
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<Topology> topology = Topology::Parse(text);
  if (!topology.ok()) {
    fuzz::Require(absl::IsInvalidArgument(topology.status()) &&
                      !topology.status().message().empty(),
                  "a refused spec is InvalidArgument with a message",
                  topology.status().ToString());
    return 0;
  }
  absl::StatusOr<Topology> again = Topology::Parse(topology->spec());
  fuzz::Require(again.ok() && again->spec() == topology->spec(),
                "the canonical spec parses to itself", topology->spec());
  fuzz::Require(topology->group_size() >= 1, "a group has a GPU");
  if (topology->group_size() <= 4096) {
    fuzz::CheckWorld(*topology, topology->group_size());
    fuzz::CheckWorld(*topology, 2 * int64_t{topology->group_size()});
  }
  fuzz::Require(!World::Create(*topology, topology->group_size() + 1).ok() ||
                    topology->group_size() == 1,
                "a world that is not a multiple of the group size is refused");
  return 0;
}
